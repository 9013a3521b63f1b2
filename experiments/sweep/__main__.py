"""``python -m experiments.sweep [--flags]``: the utility sweep; see :mod:`.cli`."""
import sys

from experiments.sweep.cli import main

if __name__ == "__main__":
    sys.exit(main())
