"""Vector-wise N:M in the layout the gathered Tensor Core SpMM reads (schedules.tc_pipeline).

A row vector of V consecutive rows shares one set of at most N kept columns in every window
of M columns (NM-SpMM's vector-wise N:M). Stored as:

* ``cols`` (Mp / V, Kc) int32: per row vector, the kept columns of window 0, then window 1,
  ... (N per window, increasing inside a window; a window with fewer than N kept columns
  is padded with other columns of the window, whose values are 0), then zeros up to Kc;
* ``values`` (Mp, Kc) float16/bfloat16: row r's values at its vector's ``cols``.

Mp is M rounded up to V and Kc = ceil(K / M) * N rounded up to 32 (:data:`KC_PACK`), so a
kernel walks Kc in whole 32-deep pipeline stages and loads 8 values at once (arrays given
from elsewhere need only a multiple of 16, :data:`KC_ALIGN`). ``values @ B[cols]`` per
vector is the product, which is why only N/M of B's rows are ever read.
"""
from __future__ import annotations

import numpy as np

KC_ALIGN = 16  # a gathered row length the kernels take: whole 16-deep k-steps
# ... and the one packing produces: whole stages of two k-steps. A 1:10 768-column layer packs
# 77 slots into 96 rather than 80, and its 3072 x 768 up-projection at 4096 tokens took 20.5
# against 24.5 us (H200, benchmarks/results/ffn_parity_H200.json): a part-stage tail costs more
# than the zero slots
KC_PACK = 32


def _check(dense, n: int, m: int, vec: int):
    if dense.ndim != 2:
        raise ValueError(f"the weight should be a 2-D matrix, got shape {dense.shape}")
    for name, v in (("n", n), ("m", m), ("vec", vec)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} should be a positive int, got {v!r}")
    if n > m:
        raise ValueError(f"N={n} should not exceed M={m}")


def gathered_row_length(cols: int, n: int, m: int) -> int:
    """The gathered row length of a ``cols``-column matrix packed as vector-wise N:M: N slots
    per window of M columns, padded to a multiple of KC_PACK."""
    return -(-(-(-int(cols) // m) * n) // KC_PACK) * KC_PACK


def pack(dense, *, n: int, m: int, vec: int, dtype: str = "float16"):
    """``(values, cols)`` of a vector-wise N:M matrix (zeros where pruned); ValueError naming
    the row vector and window where more than N columns are used."""
    dense = np.asarray(dense)
    _check(dense, n, m, vec)
    rows, k = dense.shape
    mp = -(-rows // vec) * vec
    nw = -(-k // m)
    padded = np.zeros((mp, nw * m), dtype=dense.dtype)
    padded[:rows, :k] = dense
    used = (padded != 0).reshape(mp // vec, vec, nw, m).any(axis=1)  # (vectors, windows, m)
    count = used.sum(axis=2)
    if (count > n).any():
        rv, w = np.argwhere(count > n)[0]
        raise ValueError(f"row vector {rv} (rows {rv * vec}..{rv * vec + vec - 1}) uses {count[rv, w]} columns "
                         f"in window {w} (columns {w * m}..{w * m + m - 1}), more than N={n} of M={m}")
    # kept offsets first (increasing), then the unused ones: the first N are the slots
    order = np.argsort(~used, axis=2, kind="stable")[:, :, :n]
    cols = (np.arange(nw)[None, :, None] * m + order).reshape(mp // vec, nw * n)
    cols = np.minimum(cols, k - 1)  # a partial last window pads with in-range columns (value 0)
    kc = gathered_row_length(k, n, m)
    cols_p = np.zeros((mp // vec, kc), dtype=np.int32)
    cols_p[:, : nw * n] = cols
    gathered = np.take_along_axis(padded[:, :k].reshape(mp // vec, vec, k), cols[:, None, :].repeat(vec, 1), axis=2)
    slot_used = np.take_along_axis(used, order, axis=2).reshape(mp // vec, 1, nw * n)
    values = np.zeros((mp, kc), dtype=dtype)
    values[:, : nw * n] = np.where(slot_used, gathered, 0).reshape(mp, nw * n).astype(dtype)
    return values, cols_p


def check(values, cols, shape, vec: int):
    """ValueError naming the first problem of ``(values, cols)`` that would make the kernel
    compute something else than the matrix of logical ``shape``: wrong array shapes, a
    row length that is not a multiple of 16, or a column outside 0..K-1."""
    rows, k = shape
    mp = -(-rows // vec) * vec
    if values.ndim != 2 or values.shape[0] != mp or values.shape[1] % KC_ALIGN:
        raise ValueError(f"values should be ({mp}, a multiple of {KC_ALIGN}) for {rows} rows in vectors of {vec}, "
                         f"got {values.shape}")
    if cols.shape != (mp // vec, values.shape[1]):
        raise ValueError(f"cols should be {(mp // vec, values.shape[1])} (one row per vector), got {cols.shape}")
    bad = np.argwhere((cols < 0) | (cols >= k))
    if bad.size:
        rv, slot = bad[0]
        raise ValueError(f"cols[{rv}, {slot}] = {cols[rv, slot]} is outside the {k} columns of B")


def unpack(values, cols, shape, vec: int) -> np.ndarray:
    """The dense float64 matrix ``pack`` was given (for checks)."""
    rows, k = shape
    out = np.zeros((values.shape[0], k + 1))
    for rv in range(cols.shape[0]):
        r = slice(rv * vec, rv * vec + vec)
        np.add.at(out[r], (slice(None), cols[rv]), values[r].astype(np.float64))
    return out[:rows, :k]


def prune(w, *, n: int, m: int, vec: int) -> np.ndarray:
    """``w`` with all but the N columns of largest L1 norm over each row vector zeroed in
    every window of M (``formats.nm.prune``'s vector-wise rule)."""
    from . import nm

    _, keep = nm.prune(np.asarray(w, dtype=np.float32), n=n, m=m, vec=vec)
    return np.where(keep, w, 0).astype(np.asarray(w).dtype)
