"""The one place that computes sparsity statistics: row-length spread, empty rows, column
spread, block fill.

Row-length skew and padding are what decide between formats and schedules (ELL pads to the
longest row, BSR fills blocks, hyb splits long rows), so the default format rule
(``choose.default_format``), every format's ``stats``, the tuner's cost model and tuning
records all read the same numbers, computed here:

    row_length_stats(lengths)  the row_len_* keys, from entries per row
    row_stats(m)               rows, cols, nnz, density, row_len_*, empty_row_frac of a matrix
    matrix_stats(m)            row_stats plus col_span_mean and block_fill_<b> (the tuner's)
    summarize(inst, lengths)   a converted matrix's stats: row_len_* plus stored, padding, bytes

All are vectorised: a 1M-row, 30M-entry matrix takes a few seconds.
"""
from __future__ import annotations

from typing import Dict, Sequence, Tuple

import numpy as np
import scipy.sparse as sp

from .convert import Canonical, canonical_csr

BLOCK_SIZES = (4, 16, 32)


def row_length_stats(lengths) -> Dict[str, float]:
    """``row_len_mean``, ``row_len_p50``/``p90``/``p99`` (linear-interpolated percentiles),
    ``row_len_max`` and ``row_len_cv`` (std / mean; 0 without entries) of the entries per row;
    all 0.0 when there are no rows."""
    lengths = np.asarray(lengths, dtype=np.float64)
    if not lengths.size:
        return dict.fromkeys(("row_len_mean", "row_len_p50", "row_len_p90", "row_len_p99", "row_len_max",
                              "row_len_cv"), 0.0)
    mean = float(lengths.mean())
    p50, p90, p99 = (float(v) for v in np.quantile(lengths, [0.5, 0.9, 0.99]))
    return {"row_len_mean": mean, "row_len_p50": p50, "row_len_p90": p90, "row_len_p99": p99,
            "row_len_max": float(lengths.max()), "row_len_cv": float(lengths.std() / mean) if mean > 0 else 0.0}


def row_stats(m) -> Dict[str, float]:
    """Row-length statistics of a matrix (anything ``canonical_csr`` accepts): ``rows``,
    ``cols``, ``nnz``, ``density`` (nnz / (rows * cols)), ``row_length_stats``' keys and
    ``empty_row_frac`` (the fraction of rows without entries). What ``default_format`` reads."""
    c = canonical_csr(m, any_real=True)  # only the pattern counts: integer values are fine
    rows, cols = (int(d) for d in c.shape)
    lengths = np.diff(c.indptr)
    return {"rows": rows, "cols": cols, "nnz": c.nnz, "density": c.nnz / (rows * cols) if rows and cols else 0.0,
            **row_length_stats(lengths),
            "empty_row_frac": float(np.count_nonzero(lengths == 0) / rows) if rows else 0.0}


def matrix_stats(m) -> Dict[str, float]:
    """Structure statistics of ``m``, JSON-ready (plain ints and floats): ``row_stats`` and

    * ``col_span_mean``: over non-empty rows, the mean of (last column - first column + 1)
      / cols -- how much of the dense operand one row's gathers range over (small: local,
      banded rows; 1: rows touching both ends); 0 without entries;
    * ``block_fill_<b>`` for b in 4, 16, 32: nnz / (stored b x b blocks * b * b), the
      fraction of a BSR:bxb matrix's values that are real entries; 0 without entries.

    The tuner's cost model learns from these, and tuning records carry them."""
    c = canonical_csr(m, any_real=True)  # only the pattern counts: integer values are fine
    stats = row_stats(c)
    nnz, cols = c.nnz, c.shape[1]
    if nnz:
        full = np.diff(c.indptr) > 0
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


def _block_counts(c: Canonical) -> Dict[int, int]:
    """Number of stored ``b x b`` blocks for each size in ``BLOCK_SIZES`` (see :func:`block_counts`)."""
    return block_counts(c.indptr, c.indices, c.shape[1], BLOCK_SIZES)


def block_counts(indptr: np.ndarray, indices: np.ndarray, ncols: int, sizes: Sequence[int]) -> Dict[int, int]:
    """Number of stored ``b x b`` blocks (blocks holding at least one entry, explicit zeros
    included) of a CSR pattern for each b in ``sizes``; a block at the matrix edge counts as a
    full block, as BSR stores it. Counted by scipy's ``csr_count_blocks`` (what ``tobsr``
    sizes its arrays with: one pass over the entries with a marker per block column, no
    sort; 5x faster than coarsening with a sort per block row on a 1M-entry R-MAT); where a
    scipy lacks that private routine, by coarsening (sizes ascending, each dividing the next)."""
    try:
        from scipy.sparse._sparsetools import csr_count_blocks
    except ImportError:  # a scipy without the routine: the sorting way
        return _block_counts_by_coarsening(indptr, indices, ncols, sizes)
    dtype = np.result_type(indptr.dtype, indices.dtype)
    indptr, indices = indptr.astype(dtype, copy=False), indices.astype(dtype, copy=False)
    nrows = indptr.size - 1
    return {int(b): int(csr_count_blocks(nrows, int(ncols), int(b), int(b), indptr, indices)) for b in sizes}


def _block_counts_by_coarsening(indptr: np.ndarray, indices: np.ndarray, ncols: int,
                                sizes: Sequence[int]) -> Dict[int, int]:
    """:func:`block_counts` by coarsening: each size coarsens the previous one's blocks
    (scipy's C++ sort per block row)."""
    counts, size = {}, 1
    for b in sizes:
        if b % size:
            raise ValueError(f"block sizes must divide each other, got {tuple(sizes)}")
        indptr, indices, ncols = _coarsen(indptr, indices, ncols, b // size)
        size = b
        counts[b] = int(indices.size)
    return counts


def summarize(inst, row_lengths: np.ndarray) -> dict:
    """Common statistics of ``inst``; ``row_lengths`` counts real entries per logical row."""
    rows, cols = inst.shape
    nbytes = sum(int(a.nbytes) for a in inst.arrays.values()) + int(inst.data.nbytes)
    lengths = row_length_stats(row_lengths)
    return {
        "format": inst.format.spec,
        "rows": int(rows),
        "cols": int(cols),
        "nnz": int(inst.nnz),
        "stored": int(inst.stored),
        "padding_ratio": float(inst.stored / inst.nnz) if inst.nnz else 1.0,
        "density": float(inst.nnz / (rows * cols)) if rows * cols else 0.0,
        **{k: lengths[k] for k in ("row_len_mean", "row_len_max", "row_len_p50", "row_len_p90", "row_len_p99",
                                   "row_len_cv")},
        "bytes": nbytes,
    }


def row_lengths_from_coords(inst) -> np.ndarray:
    """Entries per logical row, counting only slots that hold a source non-zero position."""
    rows, _ = inst.stored_coords()
    return np.bincount(rows[rows >= 0], minlength=inst.shape[0])[: inst.shape[0]]
