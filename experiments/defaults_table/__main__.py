"""``python -m experiments.defaults_table``: see the package docstring."""
from experiments.defaults_table.cli import main

if __name__ == "__main__":
    main()
