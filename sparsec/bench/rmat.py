"""R-MAT power-law graphs (Chakrabarti, Zhan & Faloutsos 2004) from a fixed seed.

    from sparsec.bench.rmat import rmat
    a = rmat(16, 1_000_000, seed=16)      # or: python benchmarks/data/rmat.py SCALE NNZ

:func:`rmat` draws edges of a ``2**scale`` x ``2**scale`` adjacency matrix: at each of the
``scale`` bit levels (most significant first) an edge falls into the top-left, top-right,
bottom-left or bottom-right quadrant with probabilities ``a, b, c, d = 1 - a - b - c``
(Graph500 defaults 0.57, 0.19, 0.19, 0.05). Unlike the Graph500 reference it adds no
per-level noise to ``a..d`` and does not permute the vertex labels (pass
``permute=True`` for a seeded random relabelling), so the heaviest rows and columns are
the lowest ids. Self-loops are kept, the graph is directed (not symmetrised).

Exact size: edges are drawn in batches (numpy ``Generator(PCG64(seed))``); ids
``>= rows`` are dropped (``rows`` may be less than ``2**scale``: the suite's 1,000,000-row
graph is scale 20, 1,048,576 ids, with the ids >= 1,000,000 dropped -- that removes only
~0.25 % of the draws since high ids are rare under R-MAT, and keeps the degree
distribution of scale 20); duplicates collapse; the result keeps the ``nnz`` distinct
entries drawn first (ties impossible: each entry has one first draw), drawing further
batches while fewer than ``nnz`` distinct entries exist. Everything depends on
``(scale, rows, nnz, seed, a, b, c)`` only, so the same arguments give the same matrix.

Cost: one vectorised pass per bit level over int64 arrays; peak memory is about
``3 x m x 8`` bytes for a batch of ``m`` draws (row ids, column ids, float64 uniforms)
plus the sort of the batch's keys, ``m`` ~ 1.1-1.3 x ``nnz``. Measured for scale 20,
1,000,000 rows, 30,000,000 non-zeros on 2 CPU cores: 22 s and 1.6 GB peak resident memory
(``/usr/bin/time -v``); saving it compressed (``save_npz``) takes another ~14 s, 71 MB.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = ["rmat", "rmat_keys"]

GRAPH500 = (0.57, 0.19, 0.19)


def _draw(gen: np.random.Generator, scale: int, m: int, a: float, b: float, c: float):
    """``m`` R-MAT draws -> (row ids, column ids), int64, in [0, 2**scale)."""
    src = np.zeros(m, dtype=np.int64)
    dst = np.zeros(m, dtype=np.int64)
    ab, abc = a + b, a + b + c
    r = np.empty(m, dtype=np.float64)
    lo = np.empty(m, dtype=bool)
    hi = np.empty(m, dtype=bool)
    for level in range(scale):
        bit = np.int64(1) << np.int64(scale - 1 - level)
        gen.random(out=r)
        # quadrant: [0,a) top-left, [a,a+b) top-right, [a+b,a+b+c) bottom-left, rest bottom-right
        np.greater_equal(r, ab, out=hi)  # bottom half: row bit set
        np.add(src, bit, out=src, where=hi)
        np.greater_equal(r, abc, out=lo)  # bottom-right
        np.greater_equal(r, a, out=hi)
        np.less(r, ab, out=hi, where=hi)  # top-right: a <= r < a+b
        np.logical_or(hi, lo, out=hi)  # right half: column bit set
        np.add(dst, bit, out=dst, where=hi)
    return src, dst


def rmat_keys(scale: int, nnz: int, seed: int, a: float = 0.57, b: float = 0.19, c: float = 0.19,
              rows: int | None = None) -> np.ndarray:
    """The ``nnz`` distinct entries of :func:`rmat` as sorted int64 keys ``row * rows + col``."""
    n_ids = 1 << scale
    rows = n_ids if rows is None else int(rows)
    if not (0 < rows <= n_ids):
        raise ValueError(f"rows={rows} must be in 1..2**scale={n_ids}")
    if not (0 <= nnz <= rows * rows):
        raise ValueError(f"nnz={nnz} must be in 0..rows**2={rows * rows}")
    if min(a, b, c) < 0 or a + b + c > 1:
        raise ValueError(f"bad R-MAT probabilities a={a} b={b} c={c}")

    gen = np.random.Generator(np.random.PCG64(seed))
    have = np.empty(0, dtype=np.int64)  # sorted distinct keys kept so far
    rate = 0.95  # guess of distinct-and-in-range entries per draw; refined per batch
    while have.size < nnz:
        need = nnz - have.size
        m = int(need / max(rate, 1e-3) * 1.05) + 1024
        src, dst = _draw(gen, scale, m, a, b, c)
        if rows < n_ids:
            keep = (src < rows) & (dst < rows)
            src, dst = src[keep], dst[keep]
            del keep
        src *= rows
        src += dst  # key = row * rows + col, in place
        del dst
        keys, first = np.unique(src, return_index=True)  # first draw of each distinct key
        del src
        if have.size:
            pos = np.searchsorted(have, keys)
            new = have[np.minimum(pos, have.size - 1)] != keys
            keys, first = keys[new], first[new]
            del pos, new
        rate = keys.size / m
        if keys.size > need:  # keep the `need` drawn first
            cut = np.partition(first, need - 1)[need - 1]
            keys = keys[first <= cut]
        del first
        have = np.concatenate([have, keys])
        have.sort(kind="stable")  # two sorted runs: timsort merges them
        del keys
    return have


def rmat(scale: int, nnz: int, seed: int, a: float = 0.57, b: float = 0.19, c: float = 0.19,
         rows: int | None = None, permute: bool = False) -> sp.csr_matrix:
    """A ``rows`` x ``rows`` R-MAT adjacency matrix (``rows`` defaults to ``2**scale``)
    with exactly ``nnz`` distinct entries, float32 values 1.0, canonical CSR (sorted
    column indices, int32 indices while they fit). See the module docstring."""
    n = (1 << scale) if rows is None else int(rows)
    keys = rmat_keys(scale, nnz, seed, a, b, c, rows=n)
    r, cols = np.divmod(keys, max(n, 1))
    del keys
    if permute:  # seeded relabelling of the vertices (rows and columns alike)
        perm = np.random.Generator(np.random.PCG64([seed, 1])).permutation(n)
        r, cols = perm[r], perm[cols]
        order = np.lexsort((cols, r))
        r, cols = r[order], cols[order]
        del order
    idx_dtype = np.int32 if max(n, nnz) < 2**31 else np.int64
    indptr = np.zeros(n + 1, dtype=idx_dtype)
    np.cumsum(np.bincount(r, minlength=n), out=indptr[1:])
    del r
    out = sp.csr_matrix(
        (np.ones(cols.size, dtype=np.float32), cols.astype(idx_dtype), indptr), shape=(n, n)
    )
    out.has_sorted_indices = True
    out.has_canonical_format = True
    return out
