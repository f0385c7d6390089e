"""N:M: at most N non-zeros in every window of M consecutive columns of a row.

The columns of A are the reduction dimension of SpMM (C = A @ B), so N:M balances
the work of every window: each window stores exactly N slots, and a kernel reads
N rows of B per window instead of M. General N:M (2:4, 1:4, 2:8, 1:8, 4:16, ...) is
supported, element-wise (V = 1) or vector-wise (V > 1: V consecutive rows share one
pattern, NM-SpMM / nmSPARSE style).

Axis chains (lowering reads exactly these; positions compose as in ``formats.axes``)::

    V = 1   i  DenseFixed(dim=0)                      pos_i = i          (rows)
            w  DenseFixed(dim=1, scale=M, extent=None) pos_w = pos_i*nW + w
            s  SparseFixed(dim=1, width=N, "indices")  pos_s = pos_w*N + s
    V > 1   io DenseFixed(dim=0, scale=V)              pos_io = io        (ceil(rows/V))
            w  DenseFixed(dim=1, scale=M, extent=None) pos_w = pos_io*nW + w
            s  SparseFixed(dim=1, width=N, "indices")  pos_s = pos_w*N + s
            ii DenseFixed(dim=0, extent=V)             pos_ii = pos_s*V + ii

with nW = ceil(cols / M) windows per row. ``indices[pos_s]`` is the in-window offset
0..M-1 (column = w*M + offset), or -1 for an unused slot (the window holds fewer than N
non-zeros; its value is 0). Within a window, real offsets are strictly increasing and
unused slots follow them. ``data`` is flat: ``data[pos_s]`` (V = 1) or
``data[pos_s*V + ii]`` (V > 1). Rows past the edge of the last row vector and columns
of the last, partial window past ``cols`` are never real entries.

Padding (``formats.base``): an unused slot (index -1) is padding; so, for V > 1, is the value
of a row of the vector that lacks a column another of its rows has (``from_matrix`` stores
the union of the V rows' columns). Those are marked by ``arrays["valid"]``, the format's
``slot_mask`` (uint8, laid out like ``data``; V > 1 only). ``prune`` keeps whole column
vectors, so every in-range value of a kept vector is an entry there.

Parameters are ``(("n", N), ("m", M))``, plus ``("vec", V)`` when V > 1.
Spec grammar (``parse_spec``): ``N <sep> M [<sep> VEC]`` where ``<sep>`` is ``:`` or
``,`` and VEC is ``V``, ``vV``, ``v=V`` or ``vec=V`` -- ``nm:2:4``, ``nm:1:8``,
``nm:2:4:v4``, ``nm:1:8,v=4``, and ``nm:2,4,4`` (the text ``Format.spec`` writes).
``make_format("nm", n=2, m=4, vec=4)`` is the keyword form.

Run-time extents: ``{"i": rows, "w": nW}`` or ``{"io": ceil(rows/V), "w": nW}``.
``nnz`` counts the source entries the instance holds: the input's stored entries for
``from_matrix`` (vector-wise storage may add explicit zeros for rows of a vector that
lack a column another row has), the kept entries for ``prune``.

2:4 hardware layout (``mma_values``, ``mma_meta`` in ``inst.arrays``)
---------------------------------------------------------------------
For N=2, M=4, V=1 and float16 values, the instance also holds the compressed operand
and metadata of NVIDIA's ``mma.sp`` in the layout CUTLASS's sparse GEMM (and PyTorch's
``sparse_semi_structured_from_dense_cutlass``) use. They are attached only when rows is
a positive multiple of 32 and cols a positive multiple of 64 (the smallest sparse
operand PyTorch's CUTLASS backend accepts for 16-bit values); otherwise they are
skipped (``mma_skip_reason`` says why). The encoder itself (``encode_mma``) needs only
rows % 32 == 0 and cols % 32 == 0 (metadata columns come in interleaved pairs; PyTorch's
encoder checks only cols % 16 but indexes out of bounds for an odd number of them).

* ``mma_values``: float16, shape (rows, cols/2), row-major, not reordered. Group g
  (columns 4g..4g+3) of row r contributes two values: ``mma_values[r, 2g + t] =
  A[r, 4g + e_t]`` where e_0 < e_1 are the in-group indices chosen below.
* Logical metadata word ``E[r, c]`` (16 bits, c < cols/16) covers row r, columns
  16c..16c+15, i.e. groups 4c+j for j = 0..3: bits 4j..4j+1 hold e_0 and bits
  4j+2..4j+3 hold e_1 of group 4c+j. A group with two non-zeros stores their indices;
  a group with fewer pads with the choice CUTLASS/PyTorch make (the nibble depends only
  on which of the 4 slots are non-zero: ``_NIBBLE`` below; e.g. an empty group is
  0b1110 = indices {2, 3}, a lone slot 0 is 0b1000 = {0, 2}).
* ``mma_meta``: int16, shape (rows, cols/16) -- the same words permuted into CUTLASS's
  ``ColumnMajorInterleaved<2>`` order with rows interleaved in blocks of 32 and 2x2
  tiles transposed. Writing r = 32*b + 8*q + p (0 <= q < 4, 0 <= p < 8), word E[r, c]
  sits at flat index::

        (c // 2) * (2 * rows) + 64*b + 8*p + 4*(q // 2) + 2*(c % 2) + (q % 2)

  of ``mma_meta.reshape(-1)``. So each pair of metadata columns is one contiguous
  stripe of 2*rows words; inside it, every 32-row block is 64 words ordered
  [p][q // 2][c % 2][q % 2]: rows p and p+8 (q = 0, 1), or p+16 and p+24, of both
  columns of the pair are 4 adjacent words.

``decode_mma(values, meta, shape)`` undoes the layout.

int8 values are not supported (``base.SUPPORTED_VALUE_DTYPES`` holds float16/32/64).
"""
from __future__ import annotations

import re
import time

import numpy as np
import scipy.sparse as sp

from . import validate as V
from .axes import DenseFixed, SparseFixed
from .base import Format, FormatInstance, check_slot_mask, masked_coords
from .convert import as_csr, canonical_csr
from .stats import summarize

NAME = "nm"
DESCRIPTION = ("N:M structured sparsity along columns: N slots per window of M columns "
               "(element-wise or V-row vectors; 2:4 also in mma.sp layout)")

MASK = "valid"  # the slot mask's array name (V > 1)
VECTOR_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)  # 64 and 128: one Tensor Core block tile shares a pattern
MAX_M = 256

# ---------------------------------------------------------------- parameters


def _int(name, v):
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise ValueError(f"{name} should be an integer, got {v!r}")
    return int(v)


def _params(n, m, vec):
    if n is None or m is None:
        raise ValueError("nm needs N and M: spec 'nm:2:4' (or 'nm:2:4:v4'), or n=2, m=4 (and vec=4)")
    n, m = _int("N", n), _int("M", m)
    vec = 1 if vec is None else _int("vec", vec)
    if not 1 <= n < m:
        raise ValueError(f"N:M should have 1 <= N < M, got N={n}, M={m}")
    if m > MAX_M:
        raise ValueError(f"M should be at most {MAX_M}, got {m}")
    if vec not in VECTOR_SIZES:
        raise ValueError(f"vec should be one of {VECTOR_SIZES}, got {vec}")
    return n, m, vec


_VEC_RE = re.compile(r"^(?:v|vec)?=?(\d+)$")


def parse_spec(arg: str | None) -> dict:
    """``"2:4"`` -> {n: 2, m: 4, vec: 1}; ``"2:4:v4"``, ``"2:4,v=4"``, ``"2,4,4"`` -> vec 4."""
    if not arg:
        return {"n": None, "m": None, "vec": 1}  # make_format("nm", n=..., m=...) supplies them
    parts = [p.strip().lower() for p in re.split(r"[:,]", arg)]
    usage = "(e.g. 'nm:2:4', 'nm:1:8', 'nm:2:4:v4', 'nm:1:8,v=4')"
    if len(parts) not in (2, 3) or not all(p.isdigit() for p in parts[:2]):
        raise ValueError(f"nm spec should be N:M or N:M:vV, got {arg!r} {usage}")
    vec = 1
    if len(parts) == 3:
        mt = _VEC_RE.match(parts[2])
        if mt is None:
            raise ValueError(f"nm vector size should be written V, vV, v=V or vec=V, got {parts[2]!r} {usage}")
        vec = int(mt.group(1))
    n, m, vec = _params(int(parts[0]), int(parts[1]), vec)
    return {"n": n, "m": m, "vec": vec}


def declare(n=None, m=None, vec=1) -> Format:
    n, m, vec = _params(n, m, vec)
    if vec == 1:
        axes = (DenseFixed("i", dim=0),
                DenseFixed("w", dim=1, scale=m, extent=None),
                SparseFixed("s", dim=1, width=n, indices="indices"))
        return Format(NAME, axes, (("n", n), ("m", m)))
    axes = (DenseFixed("io", dim=0, scale=vec),
            DenseFixed("w", dim=1, scale=m, extent=None),
            SparseFixed("s", dim=1, width=n, indices="indices"),
            DenseFixed("ii", dim=0, extent=vec))
    return Format(NAME, axes, (("n", n), ("m", m), ("vec", vec)), slot_mask=MASK)


def tensor_core_layout(fmt: Format, dtype: str):
    """Element-wise 2:4 with float16 values runs on ``mma.sp`` (the kernel layer packs the
    operand from the instance once, ``formats.mma_sp``); other N:M on CUDA cores."""
    return "sp24" if _nmv(fmt) == (2, 4, 1) and dtype == "float16" else None


def _nmv(inst_or_fmt):
    fmt = inst_or_fmt.format if isinstance(inst_or_fmt, FormatInstance) else inst_or_fmt
    return int(fmt.param("n")), int(fmt.param("m")), int(fmt.param("vec", 1))


def _grid(shape, m, vec):
    """(row vectors, windows per row) of a logical shape."""
    rows, cols = shape
    return -(-rows // vec), -(-cols // m)


# ---------------------------------------------------------------- building


def _window_error(n, m, vec, shape, key, count):
    rows, cols = shape
    nw = _grid(shape, m, vec)[1]
    rv, w = divmod(int(key), nw)
    c0, c1 = w * m, min(w * m + m, cols) - 1
    if vec == 1:
        return ValueError(f"row {rv}, columns {c0}..{c1} hold {int(count)} non-zeros, "
                          f"more than N={n} of every M={m}")
    r0, r1 = rv * vec, min(rv * vec + vec, rows) - 1
    return ValueError(f"rows {r0}..{r1}, columns {c0}..{c1} hold non-zeros in {int(count)} distinct columns, "
                      f"more than N={n} of every M={m} (vector-wise, vec={vec}: the rows of a vector "
                      f"share one pattern)")


def _finish(n, m, vec, shape, indices, data, nnz, t0, valid=None) -> FormatInstance:
    """The instance; ``valid`` (V > 1): the slot mask, default every in-range used slot."""
    inst = FormatInstance(declare(n, m, vec), (int(shape[0]), int(shape[1])),
                          {"indices": np.ascontiguousarray(indices, dtype=np.int32)},
                          np.ascontiguousarray(data), int(nnz))
    if vec > 1:
        inst.arrays[MASK] = (stored_coords(inst)[0] >= 0).astype(np.uint8) if valid is None else valid
    hw = mma_arrays(inst)
    if hw is not None:
        inst.arrays["mma_values"], inst.arrays["mma_meta"] = hw
    inst.conversion_s = time.perf_counter() - t0
    check(inst)
    return inst


def from_matrix(matrix, *, n=None, m=None, vec=1, shape=None, dtype=None) -> FormatInstance:
    """``matrix`` (anything ``as_csr`` accepts), which must already be N:M: every window
    of M columns of a row (of a V-row vector: the union of its rows' columns) holds at
    most N stored entries. Explicit zeros count as entries."""
    t0 = time.perf_counter()
    n, m, vec = _params(n, m, vec)
    c = canonical_csr(matrix, shape=shape, dtype=dtype)
    shp = c.shape
    nv, nw = _grid(shp, m, vec)
    nwin = nv * nw
    rowid = V.major_ids(c.indptr)
    col = c.indices.astype(np.int64)
    win = (rowid // vec) * nw + col // m  # window id (row vector, window): non-decreasing
    off = col % m
    # the slots of a window are the union of its V rows' columns (V = 1: the row's own)
    ukeys, which = np.unique(win * m + off, return_inverse=True)
    uwin = ukeys // m
    counts = np.bincount(uwin, minlength=nwin) if uwin.size else np.zeros(nwin, np.int64)
    over = np.flatnonzero(counts > n)
    if over.size:
        raise _window_error(n, m, vec, shp, over[0], counts[over[0]])
    start = np.zeros(nwin + 1, np.int64)
    np.cumsum(counts, out=start[1:])
    uslot = uwin * n + (np.arange(ukeys.size, dtype=np.int64) - start[uwin])
    indices = np.full(nwin * n, -1, np.int32)
    indices[uslot] = ukeys % m
    data = np.zeros(nwin * n * vec, c.data.dtype)
    where = uslot[which.reshape(-1)] * vec + rowid % vec
    data[where] = c.data
    valid = None
    if vec > 1:
        valid = np.zeros(nwin * n * vec, np.uint8)
        valid[where] = 1
    return _finish(n, m, vec, shp, indices, data, c.nnz, t0, valid)


def _densify(x, dtype):
    if isinstance(x, np.ndarray):
        if x.ndim != 2:
            raise ValueError(f"a dense matrix should be 2-D, got shape {x.shape}")
        V.check_values(np.empty(0, x.dtype), dtype)
        return np.asarray(x if dtype is None else x.astype(dtype, copy=False))
    if type(x).__module__.startswith("torch") and str(getattr(x, "layout", "")) == "torch.strided" \
            and str(x.dtype) != "torch.bfloat16":  # bfloat16 (no numpy dtype) goes through canonical_csr
        return _densify(x.detach().cpu().numpy(), dtype)
    c = canonical_csr(x, dtype=dtype)
    out = np.zeros(c.shape, c.data.dtype)
    out[V.major_ids(c.indptr), c.indices] = c.data
    return out


def prune(dense_or_sparse, *, n, m, vec=1, dtype=None):
    """Magnitude pruning to N:M: in every window keep the N columns of largest |value|
    (vector-wise: largest L1 norm over the V rows of the vector); ties go to the lower
    column, NaN counts as largest. Returns ``(instance, keep)`` with ``keep`` a dense bool
    mask of the input's shape. Positions that are zero in the input are never kept: a window
    with fewer than N non-zeros keeps them all and pads the rest (index -1)."""
    t0 = time.perf_counter()
    n, m, vec = _params(n, m, vec)
    a = _densify(dense_or_sparse, dtype)
    rows, cols = a.shape
    nv, nw = _grid(a.shape, m, vec)
    pad = np.zeros((nv * vec, nw * m), a.dtype)
    pad[:rows, :cols] = a
    blocks = pad.reshape(nv, vec, nw, m)
    score = np.abs(blocks.astype(np.float64)).sum(axis=1)  # (nv, nw, m)
    score[np.isnan(score)] = np.inf
    score = np.where((np.arange(nw * m) >= cols).reshape(nw, m), -1.0, score)  # past the edge: never kept
    order = np.argsort(-score, axis=-1, kind="stable")[..., :n]
    keep = np.zeros(score.shape, bool)
    np.put_along_axis(keep, order, True, axis=-1)
    keep &= score > 0  # zeros (and the edge) are not entries: a window short of N gets padding slots
    # pack: kept offsets ascending, then -1
    rank = np.cumsum(keep, axis=-1) - 1
    wid, off = np.nonzero(keep.reshape(nv * nw, m))
    slot = wid * n + rank.reshape(nv * nw, m)[wid, off]
    indices = np.full(nv * nw * n, -1, np.int32)
    indices[slot] = off
    data = np.zeros((nv * nw * n, vec), a.dtype)
    # blocks (nv, vec, nw, m) -> (nv, nw, m, vec): the kept column's V values
    data[slot] = blocks.transpose(0, 2, 3, 1).reshape(nv * nw, m, vec)[wid, off]
    mask = np.broadcast_to(keep[:, None], (nv, vec, nw, m)).reshape(nv * vec, nw * m)[:rows, :cols].copy()
    return _finish(n, m, vec, (rows, cols), indices, data.reshape(-1), int(mask.sum()), t0), mask


# ---------------------------------------------------------------- layout


def root_extent(inst: FormatInstance) -> int:
    _, m, vec = _nmv(inst)
    return _grid(inst.shape, m, vec)[0]


def extents(inst: FormatInstance) -> dict:
    _, m, vec = _nmv(inst)
    nv, nw = _grid(inst.shape, m, vec)
    return {("i" if vec == 1 else "io"): nv, "w": nw}


def stored_coords(inst: FormatInstance):
    n, m, vec = _nmv(inst)
    rows, cols = inst.shape
    nv, nw = _grid(inst.shape, m, vec)
    idx = inst.arrays["indices"].astype(np.int64)
    pos = np.arange(idx.size, dtype=np.int64)
    c = (pos // n % nw) * m + idx
    r0 = pos // (nw * n) * vec
    if vec > 1:
        c = np.repeat(c, vec)
        idx = np.repeat(idx, vec)
        r0 = (np.repeat(r0, vec).reshape(-1, vec) + np.arange(vec)).reshape(-1)
    bad = (idx < 0) | (c >= cols) | (r0 >= rows)
    r0[bad] = -1
    c[bad] = -1
    return masked_coords(inst, r0, c)


# ---------------------------------------------------------------- checks


def check(inst: FormatInstance, full: bool = False) -> None:
    """O(1) array sizes; ``full`` also checks offsets, their order, padding values and
    the 2:4 hardware arrays against ``data``."""
    V.check_instance_arrays(inst, ("indices",))
    n, m, vec = _nmv(inst)
    rows, cols = inst.shape
    nv, nw = _grid(inst.shape, m, vec)
    idx = inst.arrays["indices"]
    want = nv * nw * n
    if idx.size != want:
        what = "rows" if vec == 1 else f"ceil(rows/{vec})"
        raise ValueError(f"indices has {idx.size} entries, should be {what} * windows * N = "
                         f"{nv} * {nw} * {n} = {want}")
    if inst.data.size != want * vec:
        raise ValueError(f"data should have {want * vec} values (one per slot{' per vector row' if vec > 1 else ''}), "
                         f"got {inst.data.size}")
    check_slot_mask(inst)
    hw = ("mma_values" in inst.arrays, "mma_meta" in inst.arrays)
    if any(hw) and not all(hw):
        raise ValueError("arrays should hold both mma_values and mma_meta or neither, got one")
    if not full:
        return
    grid = idx.reshape(nv * nw, n).astype(np.int64)
    bad = np.flatnonzero(((grid < -1) | (grid >= m)).any(axis=1))
    if bad.size:
        rv, w = divmod(int(bad[0]), nw)
        raise ValueError(f"in-window offsets should be in [0, {m}) or -1 (unused) (in indices), "
                         f"got {grid[bad[0]].tolist()} in {'row' if vec == 1 else 'row vector'} {rv}, window {w}")
    col = (np.arange(nv * nw) % nw)[:, None] * m + grid
    past = np.flatnonzero(((grid >= 0) & (col >= cols)).any(axis=1))
    if past.size:
        rv, w = divmod(int(past[0]), nw)
        raise ValueError(f"offsets should land inside the matrix ({cols} columns), got {grid[past[0]].tolist()} "
                         f"in window {w} of {'row' if vec == 1 else 'row vector'} {rv}")
    if n > 1:
        unused = grid < 0
        real_after = unused[:, :-1] & ~unused[:, 1:]
        unsorted = ~unused[:, 1:] & ~unused[:, :-1] & (grid[:, 1:] <= grid[:, :-1])
        for what, mask in (("unused slots (-1) should follow a window's entries", real_after),
                           ("offsets should be strictly increasing within each window", unsorted)):
            k = np.flatnonzero(mask.any(axis=1))
            if k.size:
                rv, w = divmod(int(k[0]), nw)
                raise ValueError(f"{what}, got {grid[k[0]].tolist()} in window {w} of "
                                 f"{'row' if vec == 1 else 'row vector'} {rv}")
    r, _ = inst.stored_coords()
    if np.any(inst.data[r < 0] != 0):
        raise ValueError("unused slots and slots past the matrix edge should hold 0, got a non-zero value")
    live = int((r >= 0).sum())
    if (vec == 1 and inst.nnz != live) or inst.nnz > live:
        raise ValueError(f"nnz should be {'' if vec == 1 else 'at most '}the number of used slots {live}, "
                         f"got {inst.nnz}")
    if all(hw):
        dense = decode_mma(inst.arrays["mma_values"], inst.arrays["mma_meta"], inst.shape)
        if not np.array_equal(dense.astype(np.float64), inst.to_dense().astype(np.float64), equal_nan=True):
            raise ValueError("mma_values/mma_meta should encode the same matrix as data, got a different one "
                             "(stale after with_data/astype? rebuild with mma_arrays(inst))")


def stats(inst: FormatInstance) -> dict:
    """Row lengths count in-bounds slots holding a non-zero value; ``slot_fill`` is the
    share of in-bounds slots that hold a real (index >= 0) entry."""
    n, m, vec = _nmv(inst)
    rows, _ = inst.stored_coords()
    ok = rows >= 0
    live = ok & (inst.data != 0)
    s = summarize(inst, np.bincount(rows[live], minlength=inst.shape[0])[: inst.shape[0]])
    nv, nw = _grid(inst.shape, m, vec)
    s.update({"n": n, "m": m, "vec": vec, "windows": int(nw), "sparsity": 1.0 - n / m,
              "slot_fill": float(ok.sum() / inst.stored) if inst.stored else 0.0,
              "mma_layout": "mma_meta" in inst.arrays})
    return s


# ---------------------------------------------------------------- 2:4 hardware layout

# metadata nibble for each pattern of non-zero slots (bit j = slot j is non-zero):
# low 2 bits = first kept index, high 2 bits = second; patterns with fewer than two
# non-zeros are padded the way CUTLASS / PyTorch do it (patterns with more are refused
# by encode_mma; their entries are PyTorch's, for completeness)
_NIBBLE = np.array([0xE, 0x8, 0x9, 0x4, 0xE, 0x8, 0x9, 0x4,
                    0xE, 0xC, 0xD, 0x4, 0xE, 0xC, 0xD, 0x4], dtype=np.uint16)


def _meta_offsets(rows: int, ncols: int) -> np.ndarray:
    """Flat position in the reordered metadata of logical word (r, c), shape (rows, ncols)."""
    r = np.arange(rows, dtype=np.int64)[:, None]
    c = np.arange(ncols, dtype=np.int64)[None, :]
    b, q, p = r // 32, (r % 32) // 8, r % 8
    return (c // 2) * (2 * rows) + 64 * b + 8 * p + 4 * (q // 2) + 2 * (c % 2) + (q % 2)


def _as_u16(a):
    a = np.asarray(a)
    if a.dtype.itemsize != 2:
        raise TypeError(f"2:4 hardware values should be 16-bit (float16, or bfloat16 bits as int16/uint16), "
                        f"got {a.dtype.name}")
    return a


def encode_mma(dense) -> tuple:
    """A 2:4 matrix (rows % 32 == 0, cols % 32 == 0, 16-bit values) -> ``(values, meta)``
    in the layout described in the module docstring."""
    a = _as_u16(dense)
    if a.ndim != 2:
        raise ValueError(f"dense should be 2-D, got shape {a.shape}")
    rows, cols = a.shape
    if rows % 32 or cols % 32:
        raise ValueError(f"the mma.sp layout needs rows % 32 == 0 and cols % 32 == 0, got shape {a.shape}")
    g = a.reshape(rows, cols // 4, 4)
    nz = (g.view(np.uint16) & 0x7FFF) != 0  # on the bits: -0.0 is zero, NaN is not (as in torch)
    counts = nz.sum(axis=-1)
    if np.any(counts > 2):
        r, gi = np.argwhere(counts > 2)[0]
        raise ValueError(f"row {r}, columns {4 * gi}..{4 * gi + 3} hold {counts[r, gi]} non-zeros, "
                         f"more than N=2 of every M=4")
    pattern = (nz * np.array([1, 2, 4, 8])).sum(axis=-1)
    nib = _NIBBLE[pattern]  # (rows, cols/4)
    first, second = (nib & 3).astype(np.int64), ((nib >> 2) & 3).astype(np.int64)
    vals = np.stack([np.take_along_axis(g, first[..., None], -1)[..., 0],
                     np.take_along_axis(g, second[..., None], -1)[..., 0]], axis=-1).reshape(rows, cols // 2)
    words = (nib.reshape(rows, cols // 16, 4).astype(np.uint32) << np.array([0, 4, 8, 12], np.uint32)).sum(-1)
    ncols = cols // 16
    meta = np.empty(rows * ncols, np.uint16)
    meta[_meta_offsets(rows, ncols).reshape(-1)] = words.astype(np.uint16).reshape(-1)
    return np.ascontiguousarray(vals), meta.view(np.int16).reshape(rows, ncols)


def decode_mma(values, meta, shape) -> np.ndarray:
    """``(values, meta)`` in the mma.sp layout -> the dense (rows, cols) matrix."""
    vals = _as_u16(values)
    rows, cols = (int(s) for s in shape)
    ncols = cols // 16
    if rows % 32 or cols % 32 or vals.shape != (rows, cols // 2) or np.shape(meta) != (rows, ncols):
        raise ValueError(f"values should be ({rows}, {cols // 2}) and meta ({rows}, {ncols}) for shape "
                         f"{(rows, cols)} (rows % 32 == 0, cols % 32 == 0), got {vals.shape} and {np.shape(meta)}")
    flat = np.asarray(meta).view(np.uint16).reshape(-1)
    words = flat[_meta_offsets(rows, ncols)].astype(np.uint32)  # (rows, ncols)
    nib = (words[..., None] >> np.array([0, 4, 8, 12], np.uint32)) & 0xF  # (rows, ncols, 4)
    nib = nib.reshape(rows, cols // 4)
    idx = np.stack([nib & 3, (nib >> 2) & 3], axis=-1).astype(np.int64)  # (rows, groups, 2)
    out = np.zeros((rows, cols // 4, 4), vals.dtype)
    np.put_along_axis(out, idx, vals.reshape(rows, cols // 4, 2), axis=-1)
    return out.reshape(rows, cols)


def mma_skip_reason(inst: FormatInstance) -> str | None:
    """Why ``inst`` gets no 2:4 hardware arrays (None: it gets them)."""
    n, m, vec = _nmv(inst)
    rows, cols = inst.shape
    if (n, m, vec) != (2, 4, 1):
        return f"the mma.sp layout is for element-wise 2:4, got {inst.format.spec}"
    if inst.data.dtype != np.float16:
        return f"the mma.sp layout is built for float16 values, got {inst.data.dtype.name}"
    if rows < 32 or rows % 32 or cols < 64 or cols % 64:
        return f"the mma.sp layout needs rows a multiple of 32 and cols a multiple of 64, got {rows}x{cols}"
    return None


def mma_arrays(inst: FormatInstance):
    """``(mma_values, mma_meta)`` for ``inst``, or None when ``mma_skip_reason`` says no."""
    if mma_skip_reason(inst) is not None:
        return None
    rows, cols = inst.shape
    idx = inst.arrays["indices"].astype(np.intp).reshape(rows, cols // 4, 2)
    dense = np.zeros((rows, cols // 4, 5), np.float16)  # unused slots (-1) write to column 4
    np.put_along_axis(dense, np.where(idx < 0, 4, idx), inst.data.reshape(rows, cols // 4, 2), axis=-1)
    return encode_mma(np.ascontiguousarray(dense[..., :4]).reshape(rows, cols))


def stored_keep_mask(matrix, n, m, vec=1):
    """``prune``'s choice restricted to the stored entries of a sparse matrix,
    without densifying it: in every window of M columns of every V-row vector keep the N
    columns of largest L1 norm over the vector (NaN largest, ties to the lower column).
    Returns a bool mask over the canonical CSR's entries and that CSR."""
    c = as_csr(matrix)
    c = c.tocsr(copy=True)
    c.sum_duplicates()
    c.sort_indices()
    rows = np.repeat(np.arange(c.shape[0], dtype=np.int64), np.diff(c.indptr))
    cols = c.indices.astype(np.int64)
    ncols = max(int(c.shape[1]), 1)
    a = np.abs(c.data.astype(np.float64))
    a[np.isnan(a)] = np.inf
    ukey, which = np.unique((rows // vec) * ncols + cols, return_inverse=True)
    which = which.reshape(-1)
    score = np.bincount(which, weights=a, minlength=ukey.size) if ukey.size else np.zeros(0)
    ucol = ukey % ncols
    group = (ukey // ncols) * (-(-ncols // m)) + ucol // m
    order = np.lexsort((ucol, -score, group))  # by window, then score descending, then column
    g = group[order]
    first = np.flatnonzero(np.r_[True, g[1:] != g[:-1]]) if g.size else np.zeros(0, np.int64)
    start = np.repeat(first, np.diff(np.r_[first, g.size]))
    keep_u = np.zeros(ukey.size, bool)
    keep_u[order[(np.arange(g.size) - start) < n]] = True
    return keep_u[which], c


def prune_stored(matrix, *, n, m, vec=1) -> "sp.csr_matrix":
    """The stored entries of ``matrix`` that ``prune`` keeps, as canonical scipy CSR, without
    densifying (``prune`` builds a dense mask: rows x cols values). For large sparse inputs."""
    keep, c = stored_keep_mask(matrix, n, m, vec)
    rows = np.repeat(np.arange(c.shape[0]), np.diff(c.indptr))
    indptr = np.zeros(c.shape[0] + 1, np.int64)
    np.cumsum(np.bincount(rows[keep], minlength=c.shape[0]), out=indptr[1:])
    return sp.csr_matrix((c.data[keep], c.indices[keep], indptr), shape=c.shape)
