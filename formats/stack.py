"""Patterns over an outer axis, stacked along the rows: the matrix of a structure (r, i, j).

An operator whose row axis sits under a dense axis (relations ``r``, graphs of a batch:
``op.dense_fixed("i", parent=R)``) reads one pattern per ``r``. Stacking them along the rows
(row ``r * n + i``) makes that one ordinary matrix, so every format family holds it: CSR is
CSR per relation, hyb buckets the (r, i) segments by length (SparseTIR's ELL3D-style RGCN
layout), bsr blocks within each relation's rows when ``n`` is a multiple of the block rows.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import scipy.sparse as sp


def stack_rows(matrices, types: Optional[Sequence[int]] = None, outer: Optional[int] = None) -> sp.csr_matrix:
    """The stacked matrix (``outer * n`` rows) of

    * a list of ``outer`` matrices of one shape (n x m), one per outer coordinate, or
    * one matrix and ``types``, an outer coordinate per stored entry in canonical CSR order
      (edge types, in [0, outer)): entry (i, j) of type t goes to row ``t * n + i``.
    Explicit zeros stay entries."""
    if types is None:
        if outer is not None:
            raise ValueError("outer is given with types (one per entry); a list of matrices sets it by its length")
        if isinstance(matrices, (sp.spmatrix, sp.sparray, np.ndarray)) or not len(matrices):
            raise ValueError("matrices should be a non-empty list of matrices (one per outer coordinate), or one "
                             "matrix with types=")
        mats = [sp.csr_matrix(m) for m in matrices]
        shapes = {m.shape for m in mats}
        if len(shapes) != 1:
            raise ValueError(f"matrices should share one shape (n x m), got {sorted(shapes)}")
        return sp.csr_matrix(sp.vstack(mats, format="csr"))
    m = sp.csr_matrix(matrices)  # types follow its stored entries in CSR order
    t = np.asarray(types)
    if t.shape != (m.nnz,):
        raise ValueError(f"types should hold one outer coordinate per stored entry ({m.nnz}, CSR order), "
                         f"got shape {t.shape}")
    if not np.issubdtype(t.dtype, np.integer):
        raise TypeError(f"types should be integers (edge types), got {t.dtype}")
    if outer is None or isinstance(outer, bool) or not isinstance(outer, (int, np.integer)) or outer < 1:
        raise ValueError(f"outer should be the number of types (a positive int), got {outer!r}")
    if m.nnz and (t.min() < 0 or t.max() >= outer):
        bad = int(t[(t < 0) | (t >= outer)][0])
        raise ValueError(f"types holds {bad}, out of range for outer={outer}")
    n = m.shape[0]
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(m.indptr)) + t.astype(np.int64) * n
    out = sp.csr_matrix((m.data, (rows, m.indices)), shape=(outer * n, m.shape[1]))
    out.sum_duplicates()  # an (i, j) stored twice with one type is one entry, as in the matrix
    out.sort_indices()
    return out


def unstack_rows(stacked, outer: int):
    """The ``outer`` matrices of a stacked one (the inverse of ``stack_rows(list)``)."""
    m = sp.csr_matrix(stacked)
    if m.shape[0] % outer:
        raise ValueError(f"a stacked matrix of {m.shape[0]} rows does not split into {outer} equal blocks")
    n = m.shape[0] // outer
    return [m[r * n:(r + 1) * n] for r in range(outer)]
