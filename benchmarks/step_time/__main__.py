"""``python -m benchmarks.step_time``: runs the step-time benchmark (see the package docstring)."""

from absl import app, flags

from benchmarks import step_time
from benchmarks.step_time import cli

__doc__ = step_time.__doc__  # absl prints the main module's docstring for --help
flags.adopt_module_key_flags(cli)  # ... and the main module's key flags

if __name__ == "__main__":
    app.run(cli.main)
