"""``python -m experiments.frontier --output_dir=DIR [--scale=S] [--adafest_heatmap]``: see :mod:`.cli`."""
import sys

from experiments.frontier.cli import main

if __name__ == "__main__":
    sys.exit(main())
