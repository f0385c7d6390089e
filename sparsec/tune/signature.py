"""Matrix identity and statistics for tuning records.

A tuning record is only reusable for the matrix it was measured on, so every record carries
``matrix_signature(m)``: a content hash of the matrix's shape, sparsity pattern and values
in canonical CSR form (duplicates summed, column indices sorted per row). Equivalent inputs --
COO or CSR, sorted or not, with or without duplicates, int32 or int64 index arrays, float32
or float64 values -- hash the same, and changing one stored value changes the hash. Explicit
zeros are stored entries (a kernel loads them), so they are part of the pattern.

``matrix_stats(m)`` summarises the structure that decides which format and schedule win (row
length spread, empty rows, column spread, how densely small blocks would be filled); the cost
model (issue 5) learns from these, and they make a log readable without the matrix. Both
functions are vectorised: a 1M-row, 30M-entry matrix takes a few seconds.
"""
from __future__ import annotations

import hashlib
from typing import Dict, Tuple

import numpy as np
import scipy.sparse as sp

SIGNATURE_PREFIX = "m-"
SIGNATURE_VERSION = b"sparsec-matrix-signature-v1"
BLOCK_SIZES = (4, 16, 32)
_CHUNK = 1 << 22  # elements hashed per step, so int32 -> int64 conversion never copies it all


def canonical_csr(m) -> sp.csr_matrix:
    """``m`` (any scipy sparse matrix or array, or a dense array) as canonical CSR. A CSR
    input already canonical is returned without copying; otherwise the caller's matrix is
    left untouched."""
    if sp.issparse(m) and m.format == "csr":
        c = m if isinstance(m, sp.csr_matrix) else sp.csr_matrix(m)
        if c.has_canonical_format:
            return c
        c = c.copy()
    else:
        c = sp.csr_matrix(m)  # a conversion: a fresh matrix we may modify in place
    c.sum_duplicates()  # sorts indices first; keeps explicit zeros
    return c


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

    Index arrays hash as int64 and values as float64 (complex128 for complex matrices), so the
    signature names the matrix, not its storage types; the record's ``dtype`` field says which
    precision was measured."""
    c = canonical_csr(m)
    h = hashlib.blake2b(digest_size=8)
    h.update(SIGNATURE_VERSION)
    h.update(np.asarray(c.shape, dtype="<i8").tobytes())
    _hash_array(h, c.indptr, np.int64)
    _hash_array(h, c.indices, np.int64)
    _hash_array(h, c.data, np.complex128 if np.iscomplexobj(c.data) else np.float64)
    return SIGNATURE_PREFIX + h.hexdigest()


def _coarsen(indptr: np.ndarray, indices: np.ndarray, ncols: int, f: int
             ) -> Tuple[np.ndarray, np.ndarray, int]:
    """The pattern of ``f x f`` blocks of a canonical CSR pattern: (indptr, indices, ncols) of
    the block matrix, canonical again, so block sizes chain (4 -> 16 -> 32) and each step
    reads only the previous step's blocks. scipy's C++ sum_duplicates does the per-block-row
    sort; the int8 ones never overflow because a block collects at most f*f <= 16 entries
    per step (and csr_sum_duplicates keeps zero sums anyway)."""
    nrows = indptr.size - 1
    brows, bcols = -(-nrows // f), -(-ncols // f)
    bptr = indptr[::f].copy()  # a view would let sum_duplicates rewrite the caller's indptr
    if bptr.size < brows + 1:
        bptr = np.append(bptr, indptr[-1])
    b = sp.csr_matrix((np.ones(indices.size, np.int8), indices // f, bptr), shape=(brows, bcols))
    b.sum_duplicates()
    return b.indptr, b.indices, bcols


def _block_counts(c: sp.csr_matrix) -> Dict[int, int]:
    """Number of stored ``b x b`` blocks (blocks holding at least one entry) for each size in
    ``BLOCK_SIZES``; a block at the matrix edge counts as a full block, as BSR stores it."""
    counts = {}
    indptr, indices, ncols, size = c.indptr, c.indices, c.shape[1], 1
    for b in BLOCK_SIZES:
        if b % size:
            raise ValueError(f"block sizes must divide each other, got {BLOCK_SIZES}")
        indptr, indices, ncols = _coarsen(indptr, indices, ncols, b // size)
        size = b
        counts[b] = int(indices.size)
    return counts


def matrix_stats(m) -> Dict[str, float]:
    """Structure statistics of ``m``, JSON-ready (plain ints and floats):

    * ``rows``, ``cols``, ``nnz``, ``density`` (nnz / (rows * cols));
    * row lengths: ``row_len_mean``, ``row_len_p50``/``p90``/``p99`` (linear-interpolated
      percentiles), ``row_len_max``, ``row_len_cv`` (std / mean; 0 when there are no
      entries) -- the first, max and cv keys match ``formats.choose.row_stats``, so these
      stats feed ``default_format`` directly;
    * ``empty_row_frac``: the fraction of rows without entries;
    * ``col_span_mean``: over non-empty rows, the mean of (last column - first column + 1)
      / cols -- how much of the dense operand one row's gathers range over (small: local,
      banded rows; 1: rows touching both ends); 0 without entries;
    * ``block_fill_<b>`` for b in 4, 16, 32: nnz / (stored b x b blocks * b * b), the
      fraction of a BSR:bxb matrix's values that are real entries; 0 without entries.
    """
    c = canonical_csr(m)
    rows, cols = (int(d) for d in c.shape)
    nnz = int(c.nnz)
    lengths = np.diff(c.indptr)
    stats: Dict[str, float] = {"rows": rows, "cols": cols, "nnz": nnz,
                               "density": nnz / (rows * cols) if rows and cols else 0.0}
    if rows:
        mean = float(lengths.mean())
        p50, p90, p99 = (float(q) for q in np.percentile(lengths, [50, 90, 99]))
        stats.update(row_len_mean=mean, row_len_p50=p50, row_len_p90=p90, row_len_p99=p99,
                     row_len_max=float(lengths.max()),
                     row_len_cv=float(lengths.std() / mean) if mean > 0 else 0.0,
                     empty_row_frac=float(np.count_nonzero(lengths == 0) / rows))
    else:
        stats.update(row_len_mean=0.0, row_len_p50=0.0, row_len_p90=0.0, row_len_p99=0.0,
                     row_len_max=0.0, row_len_cv=0.0, empty_row_frac=0.0)
    if nnz:
        full = lengths > 0
        first = c.indices[c.indptr[:-1][full]].astype(np.int64)
        last = c.indices[c.indptr[1:][full] - 1].astype(np.int64)
        stats["col_span_mean"] = float(np.mean(last - first + 1) / cols)
        for b, count in _block_counts(c).items():
            stats[f"block_fill_{b}"] = nnz / (count * b * b)
    else:
        stats["col_span_mean"] = 0.0
        for b in BLOCK_SIZES:
            stats[f"block_fill_{b}"] = 0.0
    return stats
