"""Type tests for settings of the data generators (integers and reals, never ``bool``).

``is_int`` accepts anything usable as an index (Python and NumPy integers);
``is_real`` accepts Python and NumPy integers and floats.  Both reject
``True``/``False``, so a flag passed by mistake as a size is an error.

Example::

    >>> is_int(np.int64(3)), is_int(True), is_int(3.0), is_real(np.float32(0.5))
    (True, False, False, True)
"""

from __future__ import annotations

import operator

import numpy as np


def is_int(value) -> bool:
    """True for an integer (``operator.index`` works) that is not a ``bool``."""
    if isinstance(value, bool):
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def is_real(value) -> bool:
    """True for a Python or NumPy int or float that is not a ``bool``."""
    return not isinstance(value, bool) and isinstance(value, (int, float, np.integer, np.floating))
