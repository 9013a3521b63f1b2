"""A ``.npy`` file written chunk by chunk, and the SHA-256 of a ``.npy`` file's data bytes.

:class:`NpyAppender` writes the header for 0 rows, appends each chunk's raw
bytes (hashing them on the way) and, at :meth:`NpyAppender.close`, rewrites
the header in place with the final row count.  This works because NumPy pads
a version-1.0 header so that its length does not change while the first
dimension grows (``numpy.lib.format``: room for 21 digits); the length is
checked anyway.  Memory is one chunk; the file is never copied.  The result
is byte-identical to ``np.save`` of the concatenated chunks.

Used by :mod:`tfdp_sparse.data.criteo_prepare` (writing) and
:mod:`tfdp_sparse.data.prepared` (verifying).  Reference: the NPY format,
NEP 1 (https://numpy.org/neps/nep-0001-npy-format.html).

Example::

    >>> w = NpyAppender("/tmp/x.npy", "<f4", (13,))
    >>> w.append(np.zeros((2, 13), np.float32)); w.append(np.ones((1, 13), np.float32))
    >>> entry = w.close()
    >>> np.load("/tmp/x.npy").shape, entry["shape"], entry["sha256"] == sha256_of_npy_data("/tmp/x.npy")
    ((3, 13), [3, 13], True)
"""

from __future__ import annotations

import hashlib
import os
from typing import Union

import numpy as np

_HASH_BLOCK = 1 << 22


class NpyAppender:
    """A ``.npy`` file grown chunk by chunk; the header gets the real row count at :meth:`close`.

    Example: ``w = NpyAppender(p, "<f4", (13,)); w.append(x); w.close()``
    leaves ``np.load(p)`` equal to ``x`` and returns its manifest entry.
    """

    def __init__(self, path: str, dtype, tail: tuple[int, ...]):
        self.path, self.dtype, self.tail = path, np.dtype(dtype), tuple(tail)
        self.rows = 0
        self._digest = hashlib.sha256()
        self._file = open(path, "wb")
        self._header_len = self._write_header()

    def _write_header(self) -> int:
        self._file.seek(0)
        header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False,
                  "shape": (self.rows,) + self.tail}
        np.lib.format.write_array_header_1_0(self._file, header)
        return self._file.tell()

    def append(self, chunk: np.ndarray) -> None:
        chunk = np.ascontiguousarray(chunk, dtype=self.dtype)
        if chunk.shape[1:] != self.tail:
            raise ValueError(f"{self.path}: chunk shape {chunk.shape} does not end in {self.tail}")
        data = memoryview(chunk).cast("B")
        self._file.write(data)
        self._digest.update(data)
        self.rows += chunk.shape[0]

    def close(self) -> dict:
        """Write the final header, fsync, close; the array's manifest entry."""
        if self._write_header() != self._header_len:  # numpy pads for growth; never expected
            raise RuntimeError(f"{self.path}: the .npy header changed length; cannot finish in place")
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        return {"file": os.path.basename(self.path), "dtype": self.dtype.str,
                "shape": [self.rows, *self.tail], "sha256": self._digest.hexdigest()}

    def abort(self) -> None:
        self._file.close()


def sha256_of_npy_data(path: Union[str, os.PathLike]) -> str:
    """SHA-256 (hex) of the data bytes of a ``.npy`` file (everything after its header).

    Example: for ``np.save(p, np.arange(3, dtype="<i4"))`` this is
    ``hashlib.sha256(np.arange(3, dtype="<i4").tobytes()).hexdigest()``.
    """
    with open(os.fspath(path), "rb") as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            np.lib.format.read_array_header_1_0(f)
        else:
            np.lib.format.read_array_header_2_0(f)
        digest = hashlib.sha256()
        for block in iter(lambda: f.read(_HASH_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()
