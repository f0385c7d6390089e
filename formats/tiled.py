"""The ``tiled`` format family: unstructured sparse weights as a dense grid of tiles, each
tile's non-zeros found by a bitmap (SpInfer's layout; Flash-LLM's Tiled-CSL keeps a position
per value instead).

Pruned weights at 50-90 % sparsity leave non-zeros in every tile, so a Tensor Core kernel
cannot skip tiles; what it saves is bytes: it reads each tile's values and a bit per
element, rebuilds the dense tile in shared memory and multiplies it densely. The layout is
built for that expansion. The matrix is cut in ``TR x TC`` tiles (a dense grid, edge tiles
included), each tile in 8 x 8 subtiles, row-major; a subtile is one 64-bit word of its
``bitmap`` (bit ``8 r + c`` for the element at row r, column c) and its values follow one
another in ``data`` in bit order, subtile after subtile of a tile. So the 32 lanes of a warp
expand a subtile at once -- lane l takes bits 2l and 2l + 1, and its values sit at
``popcount(word & ((1 << 2l) - 1))`` past the subtile's start -- with no search and no bank
conflicts (each lane writes two adjacent halves of one row). Per tile, ``tile_offsets``
holds where its values start (a tile's subtiles are found by a prefix of popcounts).

The same order is an axis chain (``formats.axes``), so every operator lowers over it on any
target, reading ``indptr``/``indices`` (one index per value, CPU-friendly) rather than the
bitmap:

    go  DenseFixed(dim=0, scale=TR)           tile rows (root)
    gc  DenseFixed(dim=1, scale=TC, run time) tile columns
    so  DenseFixed(dim=0, scale=8, TR/8)      subtile rows of a tile
    sc  DenseFixed(dim=1, scale=8, TC/8)      subtile columns of a tile
    ri  DenseFixed(dim=0, 8)                  rows of a subtile
    cj  SparseVariable(dim=1)                 a row's non-zeros: column within the subtile

What a Tensor Core kernel streams (:func:`stream_bytes`): the values, 1 bit per element and
an int32 per tile -- at 90 % sparsity and float16, 0.2 + 0.125 + ~0 = 0.33 bytes per element
against dense float16's 2 (16.3 %).

Specs: ``tiled`` (64 x 64 tiles), ``tiled:64x64``, ``tiled:32x128`` (multiples of 8, at most
256); ``convert(m, "tiled", tile=(64, 64))``. ``prune(w, sparsity=0.9)`` keeps the largest
magnitudes of a dense weight (as ``formats.nm.prune`` does for N:M).
"""
from __future__ import annotations

import time

import numpy as np

from . import validate as V
from .axes import DenseFixed, SparseVariable
from .base import Format, FormatInstance
from .convert import canonical_csr
from .stats import summarize

NAME = "tiled"
DESCRIPTION = ("unstructured weights as a dense grid of tiles, each tile's non-zeros marked by a bitmap of "
               "8x8 subtiles (1 bit per element) and packed in bit order; tiled:RxC (default 64x64)")
DEFAULT_TILE = (64, 64)
SUB = 8  # a subtile is SUB x SUB elements: one 64-bit bitmap word
MAX_TILE = 256
BITMAP, OFFSETS = "bitmap", "tile_offsets"


def _tile(tile) -> tuple:
    try:
        r, c = (int(t) for t in tile)
        ok = all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in tile)
    except (TypeError, ValueError):
        ok = False
    if not ok or not all(0 < t <= MAX_TILE and t % SUB == 0 for t in (r, c)):
        raise ValueError(f"tile should be (rows, cols), multiples of {SUB} up to {MAX_TILE} (e.g. (64, 64) or "
                         f"spec 'tiled:64x64'), got {tile!r}")
    return r, c


def parse_spec(arg: str | None) -> dict:
    """``None`` -> 64 x 64; ``"32x128"`` (or ``"32/128"``, ``"tile=32x128"``) -> (32, 128)."""
    if not arg:
        return {"tile": DEFAULT_TILE}
    text = arg.strip().lower()
    if text.startswith("tile="):
        text = text[len("tile="):]
    parts = text.replace("/", "x").split("x")
    try:
        return {"tile": _tile(tuple(int(p) for p in parts))}
    except ValueError:
        raise ValueError(f"tiled takes a tile shape RxC, multiples of {SUB} up to {MAX_TILE}: spec should be like "
                         f"'tiled:64x64', got 'tiled:{arg}'") from None


def spec_text(fmt: Format) -> str:
    r, c = fmt.param("tile")
    return f"{NAME}:{r}x{c}"


def declare(tile=DEFAULT_TILE) -> Format:
    r, c = _tile(tile)
    return Format(NAME, (
        DenseFixed("go", dim=0, scale=r),
        DenseFixed("gc", dim=1, scale=c, extent=None),
        DenseFixed("so", dim=0, scale=SUB, extent=r // SUB),
        DenseFixed("sc", dim=1, scale=SUB, extent=c // SUB),
        DenseFixed("ri", dim=0, extent=SUB),
        SparseVariable("cj", dim=1, indptr="indptr", indices="indices"),
    ), (("tile", (r, c)),))


def tensor_core_layout(fmt: Format, dtype: str):
    """float16 values run on the Tensor Core kernel that expands the bitmap tiles
    (``schedules.tiled_tensorcore``: the instance's bitmap, tile offsets and values as they
    are); other value types on the generic lowering over the axis chain."""
    return "tiled_bitmap" if dtype == "float16" else None


def _grid(shape, tile) -> tuple:
    (rows, cols), (r, c) = shape, tile
    return -(-rows // r), -(-cols // c)


def _slot_keys(rows: np.ndarray, cols: np.ndarray, shape, tile) -> tuple:
    """Per entry: its (tile, subtile, subtile row) row of the chain -- the index of the
    ``indptr`` segment it lies in -- and its bit in the subtile's word."""
    r, c = tile
    _, ngc = _grid(shape, tile)
    tile_id = (rows // r) * ngc + cols // c
    sub = (rows % r // SUB) * (c // SUB) + cols % c // SUB
    segment = (tile_id * (r * c // (SUB * SUB)) + sub) * SUB + rows % SUB
    return segment, (rows % SUB) * SUB + cols % SUB


def _build(shape, tile, rows, cols, data, nnz, t0) -> FormatInstance:
    r, c = tile
    ngo, ngc = _grid(shape, tile)
    subtiles = ngo * ngc * (r // SUB) * (c // SUB)
    segment, bit = _slot_keys(rows, cols, shape, tile)
    order = np.lexsort((bit, segment))  # chain order: segment, then column within the subtile row
    segment, bit = segment[order], bit[order]
    indptr = np.zeros(subtiles * SUB + 1, np.int64)
    np.cumsum(np.bincount(segment, minlength=subtiles * SUB), out=indptr[1:])
    words = np.zeros(subtiles, np.uint64)
    np.bitwise_or.at(words, segment // SUB, np.left_shift(np.uint64(1), bit.astype(np.uint64)))
    per_tile = r * c // (SUB * SUB) * SUB
    arrays = {"indptr": indptr.astype(np.int32), "indices": (bit % SUB).astype(np.int32),
              BITMAP: words, OFFSETS: indptr[::per_tile].astype(np.int32)}
    inst = FormatInstance(declare(tile), tuple(int(s) for s in shape), arrays,
                          np.ascontiguousarray(data[order]), int(nnz))
    inst.conversion_s = time.perf_counter() - t0
    check(inst)
    return inst


def from_matrix(matrix, *, tile=DEFAULT_TILE, shape=None, dtype=None) -> FormatInstance:
    """Every entry of ``matrix`` (explicit zeros included) in ``tile``-shaped tiles."""
    t0 = time.perf_counter()
    tile = _tile(tile)
    m = canonical_csr(matrix, shape=shape, dtype=dtype)
    rows = V.major_ids(m.indptr).astype(np.int64)
    return _build(m.shape, tile, rows, m.indices.astype(np.int64), m.data, m.nnz, t0)


def _dense(x, dtype):
    if type(x).__module__.startswith("torch") and str(getattr(x, "layout", "")) == "torch.strided":
        import torch

        t = x.detach().cpu()
        x = (t.float() if t.dtype == torch.bfloat16 else t).numpy()
    if isinstance(x, np.ndarray):
        if x.ndim != 2:
            raise ValueError(f"a dense weight should be 2-D, got shape {x.shape}")
        V.check_values(np.empty(0, x.dtype), dtype)
        return np.asarray(x if dtype is None else x.astype(dtype, copy=False))
    c = canonical_csr(x, dtype=dtype)
    out = np.zeros(c.shape, c.data.dtype)
    out[V.major_ids(c.indptr), c.indices] = c.data
    return out


def prune(dense_or_sparse, *, sparsity: float, tile=DEFAULT_TILE, dtype=None):
    """Magnitude pruning to ``sparsity`` (the fraction of elements that become zero):
    keep the ``round((1 - sparsity) * rows * cols)`` elements of largest |value| (NaN counts
    as largest, ties go to the earlier element in row-major order; zeros are never kept, so
    a weight already sparser keeps all its non-zeros). Returns ``(instance, keep)`` with
    ``keep`` a dense bool mask of the weight's shape."""
    t0 = time.perf_counter()
    if isinstance(sparsity, bool) or not isinstance(sparsity, (int, float, np.integer, np.floating)) \
            or not 0.0 <= float(sparsity) < 1.0:
        raise ValueError(f"sparsity should be a fraction in [0, 1) (0.9: 90 % of the elements zero), got {sparsity!r}")
    tile = _tile(tile)
    a = _dense(dense_or_sparse, dtype)
    rows, cols = a.shape
    k = int(round((1.0 - float(sparsity)) * rows * cols))
    score = np.abs(a.astype(np.float64)).reshape(-1)
    score[np.isnan(score)] = np.inf
    keep = np.zeros(score.size, bool)
    if 0 < k < score.size:  # linear time (an LLM weight has 45M elements): everything above the
        # k-th largest magnitude, then the earliest of those equal to it until k are kept
        kth = np.partition(score, score.size - k)[score.size - k]
        keep = score > kth
        ties = np.flatnonzero(score == kth)
        keep[ties[:k - int(keep.sum())]] = True
    elif k:
        keep[:] = True
    keep &= score > 0
    keep = keep.reshape(rows, cols)
    r_idx, c_idx = np.nonzero(keep)
    return _build((rows, cols), tile, r_idx.astype(np.int64), c_idx.astype(np.int64), a[keep],
                  int(keep.sum()), t0), keep


# ---------------------------------------------------------------- layout


def _tile_of(inst) -> tuple:
    return tuple(int(t) for t in inst.format.param("tile"))


def root_extent(inst: FormatInstance) -> int:
    return _grid(inst.shape, _tile_of(inst))[0]


def extents(inst: FormatInstance) -> dict:
    ngo, ngc = _grid(inst.shape, _tile_of(inst))
    return {"go": ngo, "gc": ngc}


def stored_coords(inst: FormatInstance):
    r, c = _tile_of(inst)
    _, ngc = _grid(inst.shape, (r, c))
    segment = V.major_ids(inst.arrays["indptr"]).astype(np.int64)
    sub, row_in = segment // SUB, segment % SUB
    tile_id, sub_in = sub // (r * c // (SUB * SUB)), sub % (r * c // (SUB * SUB))
    rows = (tile_id // ngc) * r + (sub_in // (c // SUB)) * SUB + row_in
    cols = (tile_id % ngc) * c + (sub_in % (c // SUB)) * SUB + inst.arrays["indices"].astype(np.int64)
    return rows, cols


def check(inst: FormatInstance, full: bool = False) -> None:
    """O(1) consistency of the arrays with the shape and tile; ``full`` also scans the
    indices and checks the bitmap and tile offsets against them."""
    V.check_instance_arrays(inst, ("indptr", "indices"))
    r, c = _tile_of(inst)
    ngo, ngc = _grid(inst.shape, (r, c))
    segments = ngo * ngc * (r // SUB) * (c // SUB) * SUB
    indptr, indices = inst.arrays["indptr"], inst.arrays["indices"]
    if indptr.size != segments + 1:
        raise ValueError(f"indptr should have one entry per subtile row plus one ({segments + 1} for shape "
                         f"{tuple(inst.shape)} in {r}x{c} tiles), got {indptr.size}")
    if indptr[-1] != indices.size or inst.data.size != indices.size or inst.nnz != indices.size:
        raise ValueError(f"indptr should end at nnz = len(indices) = len(data) = {indices.size}, got "
                         f"indptr[-1] = {int(indptr[-1])}, len(data) = {inst.data.size}, nnz = {inst.nnz}")
    words, offsets = inst.arrays.get(BITMAP), inst.arrays.get(OFFSETS)
    if not isinstance(words, np.ndarray) or words.dtype != np.uint64 or words.shape != (segments // SUB,):
        raise ValueError(f"arrays[{BITMAP!r}] should be uint64, one word per 8x8 subtile ({segments // SUB}), got "
                         f"{getattr(words, 'dtype', type(words).__name__)} {getattr(words, 'shape', '')}")
    if not isinstance(offsets, np.ndarray) or offsets.dtype != np.int32 or offsets.shape != (ngo * ngc + 1,):
        raise ValueError(f"arrays[{OFFSETS!r}] should be int32, one start per tile plus the end ({ngo * ngc + 1}), "
                         f"got {getattr(offsets, 'dtype', type(offsets).__name__)} {getattr(offsets, 'shape', '')}")
    if not full:
        return
    V.check_indptr(indptr, segments, indices.size, major="subtile row")
    V.check_range(indices, SUB, V.major_ids(indptr), minor="column in subtile", major="subtile row", name="indices")
    V.check_sorted_rows(indptr, indices)
    rows, cols = stored_coords(inst)
    outside = (rows >= inst.shape[0]) | (cols >= inst.shape[1])
    if outside.any():
        k = int(np.argmax(outside))
        raise ValueError(f"entry {k} lies at ({int(rows[k])}, {int(cols[k])}), outside the shape {tuple(inst.shape)}")
    segment = V.major_ids(indptr).astype(np.int64)
    want = np.zeros(segments // SUB, np.uint64)
    np.bitwise_or.at(want, segment // SUB, np.left_shift(np.uint64(1), (segment % SUB * SUB + indices).astype(np.uint64)))
    if not np.array_equal(words, want):
        k = int(np.argmax(words != want))
        raise ValueError(f"arrays[{BITMAP!r}] word {k} should mark the subtile's entries ({int(want[k]):#x}), "
                         f"got {int(words[k]):#x}")
    per_tile = r * c // (SUB * SUB) * SUB
    if not np.array_equal(offsets, indptr[::per_tile]):
        k = int(np.argmax(offsets != indptr[::per_tile]))
        raise ValueError(f"arrays[{OFFSETS!r}][{k}] should be where tile {k}'s values start "
                         f"({int(indptr[k * per_tile])}), got {int(offsets[k])}")


def stream_bytes(inst: FormatInstance, value_bytes: int = 2) -> dict:
    """What a Tensor Core kernel reads of the weight: ``value_bytes`` per value (float16: 2),
    the bitmap (1 bit per element of the tile grid) and an int32 per tile; per element of the
    logical shape, and as a fraction of the dense weight at ``value_bytes`` per element."""
    rows, cols = inst.shape
    parts = {"values": int(inst.nnz) * value_bytes, "bitmap": int(inst.arrays[BITMAP].nbytes),
             "tile_offsets": int(inst.arrays[OFFSETS].nbytes)}
    total = sum(parts.values())
    elements = rows * cols
    return {**parts, "total": total, "bytes_per_element": total / elements if elements else 0.0,
            "of_dense": total / (elements * value_bytes) if elements else 0.0}


def stats(inst: FormatInstance) -> dict:
    rows, _ = stored_coords(inst)
    return {**summarize(inst, np.bincount(rows, minlength=inst.shape[0])[: inst.shape[0]]),
            "stream_bytes_per_element": stream_bytes(inst)["bytes_per_element"]}
