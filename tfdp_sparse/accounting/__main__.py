"""`python -m tfdp_sparse.accounting`: see `tfdp_sparse.accounting.cli`.

Example (DP-SGD on MNIST, Abadi et al. 2016)::

    python -m tfdp_sparse.accounting --noise_multiplier 1.1 --batch_size 256 \\
        --num_examples 60000 --steps 14062 --delta 1e-5
"""
import sys

from tfdp_sparse.accounting.cli import main

if __name__ == "__main__":
    sys.exit(main())
