"""Attention masks as sparse matrices, for the ``attention`` library operator.

A mask is a scipy CSR matrix whose stored entries are the (query, key) pairs that attend
and whose values scale the scores (1/sqrt(head dim) for scaled dot-product attention).
Several heads share one kernel launch by folding them into the rows: the mask repeats
once per head (block-diagonally, or interleaved by position) and Q, K, V stack as
(heads * length, head dim).
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = ["longformer", "fold_heads", "LAYOUTS"]


def longformer(length: int, window: int, global_tokens: int = 0, heads: int = 1, value: float = 1.0,
               dtype=np.float32, layout: str = "head-major") -> sp.csr_matrix:
    """Longformer's sliding window plus global attention, as a CSR mask.

    Query i attends key j when ``|i - j| <= window`` (the band, ``window`` keys on each
    side) or when either is one of the first ``global_tokens`` positions (global tokens
    attend to everything and everything attends to them). Every stored value is ``value``.
    With ``heads`` > 1 the pattern repeats for every head, ``heads * length`` square, in the
    row order ``layout`` names (:func:`fold_heads`: block-diagonal by default)."""
    for name, v, least in (("length", length, 1), ("window", window, 0), ("global_tokens", global_tokens, 0),
                           ("heads", heads, 1)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < least:
            raise ValueError(f"{name} should be an int >= {least}, got {v!r}")
    if global_tokens > length:
        raise ValueError(f"global_tokens should be at most length ({length}), got {global_tokens}")
    if not np.isfinite(value):
        raise ValueError(f"value should be finite, got {value!r}")
    i = np.arange(length, dtype=np.int64)
    lo = np.maximum(i - window, 0)
    hi = np.minimum(i + window + 1, length)
    band_rows = np.repeat(i, hi - lo)
    band_cols = np.arange(band_rows.size) - np.repeat(np.cumsum(hi - lo) - (hi - lo), hi - lo) + lo[band_rows]
    g = np.arange(global_tokens, dtype=np.int64)
    rows = np.concatenate([band_rows, np.repeat(g, length), np.tile(i, global_tokens)])  # band, global rows,
    cols = np.concatenate([band_cols, np.tile(i, global_tokens), np.repeat(g, length)])  # global columns
    pattern = sp.csr_matrix((np.ones(rows.size, np.int8), (rows, cols)), shape=(length, length))
    pattern.sum_duplicates()  # an entry both in the band and global is one entry
    mask = sp.csr_matrix((np.full(pattern.nnz, value, dtype=dtype), pattern.indices.astype(np.int32),
                          pattern.indptr.astype(np.int32)), shape=(length, length))
    return fold_heads(mask, heads, layout)


LAYOUTS = ("head-major", "interleaved")


def fold_heads(mask, heads: int, layout: str = "head-major") -> sp.csr_matrix:
    """One head's square CSR ``mask`` repeated for ``heads`` heads, folded into one matrix so
    that a single operator call covers every head (head h's queries attend head h's keys).

    ``head-major``: the block-diagonal matrix; row ``h * L + i`` is head h's query i, so Q, K
    and V stack as (heads, L, d) viewed as (heads * L, d). ``interleaved``: row ``i * heads + h``;
    Q, K and V are (L, heads, d) viewed as (L * heads, d), the layout a projection to
    heads * d features writes, with no transpose. Why both: the rows' order is the order in
    which the GPU kernels take them, and interleaved puts the long rows of every head's global
    tokens first, where they overlap with the rest instead of finishing last."""
    mask = sp.csr_matrix(mask)
    if mask.shape[0] != mask.shape[1]:
        raise ValueError(f"mask should be square (queries x keys of one head), got {mask.shape}")
    if not isinstance(heads, (int, np.integer)) or isinstance(heads, bool) or heads < 1:
        raise ValueError(f"heads should be an int >= 1, got {heads!r}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout should be one of {LAYOUTS}, got {layout!r}")
    n, nnz = mask.shape[0], mask.nnz
    if heads * max(n, nnz) > np.iinfo(np.int32).max:
        raise ValueError(f"{heads} heads of {n} x {n} with {nnz} entries do not fit int32 indices")
    if not mask.has_sorted_indices:
        mask = mask.sorted_indices()  # a copy: the caller's matrix stays as it was
    if heads == 1:
        return mask
    h = np.arange(heads, dtype=np.int64)
    if layout == "head-major":
        indices = (mask.indices[None, :] + h[:, None] * n).ravel()
        indptr = np.append((mask.indptr[None, :-1] + h[:, None] * nnz).ravel(), heads * nnz)
        data = np.tile(mask.data, heads)
    else:  # row i * heads + h holds row i's entries at columns j * heads + h
        lens = np.repeat(np.diff(mask.indptr), heads)
        indptr = np.concatenate([[0], np.cumsum(lens)])
        src = np.repeat(np.repeat(mask.indptr[:-1], heads) - indptr[:-1], lens) + np.arange(indptr[-1])
        indices = mask.indices[src] * heads + np.repeat(np.tile(h, n), lens)
        data = mask.data[src]
    return sp.csr_matrix((data, indices.astype(np.int32), indptr.astype(np.int32)), shape=(heads * n, heads * n))
