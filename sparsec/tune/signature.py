"""Matrix identity and statistics for tuning records.

A tuning record is only reusable for the matrix it was measured on, so every record carries
``matrix_signature(m)``: a content hash of the matrix's shape, sparsity pattern and values
in canonical CSR form (``sparsec.formats.convert.canonical_csr``: duplicates summed, column
indices sorted per row). Equivalent inputs -- COO or CSR, sorted or not, with or without
duplicates, int32 or int64 index arrays, float32 or float64 values -- hash the same, and
changing one stored value changes the hash. Explicit zeros are stored entries (a kernel loads
them), so they are part of the pattern.

``matrix_stats(m)`` (``sparsec.formats.stats.matrix_stats``, re-exported here) summarises the
structure that decides which format and schedule win; the cost model (issue 5) learns from
these, and they make a log readable without the matrix.
"""
from __future__ import annotations

import hashlib

import numpy as np

from ..formats.convert import canonical_csr
from ..formats.stats import BLOCK_SIZES, matrix_stats  # noqa: F401  (re-exported: records and the tuner use them)

SIGNATURE_PREFIX = "m-"
SIGNATURE_VERSION = b"sparsec-matrix-signature-v1"
_CHUNK = 1 << 22  # elements hashed per step, so int32 -> int64 conversion never copies it all


def _hash_array(h, a: np.ndarray, dtype) -> None:
    """Feed ``a`` to ``h`` as little-endian ``dtype`` bytes, chunk by chunk. Values are
    normalised so that a stored -0.0 and 0.0 hash alike."""
    dt = np.dtype(dtype).newbyteorder("<")
    for start in range(0, a.size, _CHUNK):
        part = np.ascontiguousarray(a[start:start + _CHUNK], dtype=dt)
        if dt.kind in "fc":
            part = part + dt.type(0)
        h.update(part.data)


def matrix_signature(m) -> str:
    """A stable 16-hex-digit content hash of ``m``, prefixed ``"m-"``.

    Index arrays hash as int64 and values as float64, so the
    signature names the matrix, not its storage types; the record's ``dtype`` field says which
    precision was measured. Integer and bool values hash as their float64 values."""
    c = canonical_csr(m, any_real=True)  # float values keep their dtype: duplicates sum in it
    h = hashlib.blake2b(digest_size=8)
    h.update(SIGNATURE_VERSION)
    h.update(np.asarray(c.shape, dtype="<i8").tobytes())
    _hash_array(h, c.indptr, np.int64)
    _hash_array(h, c.indices, np.int64)
    _hash_array(h, c.data, np.float64)
    return SIGNATURE_PREFIX + h.hexdigest()
