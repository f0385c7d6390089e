"""SR-BCRS: Magicube's strided row-major BCRS for quantized (int8 / int4) and fp16 tensor-core SpMM.

Vector sparsity: V (2, 4 or 8) consecutive rows share one column pattern and form a
*vector row* (rows are padded to a multiple of V; rows past the logical edge hold 0).
A vector row stores the union of its V rows' columns, sorted, each as a V x 1 column
vector, padded up to a multiple of the **stride** = the MMA k (16 for int8 and
float16, 32 for int4). Padding slots have column index -1 and value 0.

Axis chain (what lowering reads)::

    DenseFixed("io", dim=0, scale=V)                        vector rows (m_vec, run-time)
    SparseVariable("j", dim=1, indptr="indptr", indices="indices", padded=True)   column slots (-1 = padding)
    DenseFixed("ii", dim=0, extent=V)                       row within the vector

Arrays (all C-contiguous 1-D int32):

    indptr       m_vec + 1   padded start of each vector row's slots (multiples of stride)
    indices      indptr[-1]  column of each slot, -1 for padding
    row_offsets  2 * m_vec   Magicube's pairs: [padded start, padded start + true count]

Values (``data``) are **not** in the chain's flat order (slot, ii) -> slot * V + ii but in
Magicube's layout, declared as ``Format.value_chunk = stride``: slots come in chunks of
``stride`` (chunks never straddle vector rows, since indptr is padded), and within a
chunk the values are row-major V x stride, so the value of (slot p, row ii) is at

    (p // stride) * (stride * V) + ii * stride + p % stride

int4 (``Format.value_bits = 4``): values are packed two per int8 byte, value slot s in
byte s // 2, even s in the low nibble, odd s in the high nibble (two's complement
nibbles). int4 also applies Magicube's index shuffle (``aligned_col_indices_shuffle`` in
``spmm_benchmark.cpp``): within every group of 8 slots, the j-th smallest column of the
group is stored at position ``SHUFFLE_DEST[j] = (j % 2) * 4 + j // 2``, i.e. positions
0..7 hold sorted entries 0, 2, 4, 6, 1, 3, 5, 7 (padding -1s included in the
permutation). Unlike Magicube, the values are permuted with their columns, so every slot's
value belongs to its column and no consumer depends on the order.

Padding (``formats.base``): a slot with index -1, a row past the logical edge, and the value
of a row of a vector row that lacks a column another of its rows has (the slots store the
union of the V rows' columns). The last kind is marked by ``arrays["valid"]``, the format's
``slot_mask``: uint8, one byte per value slot in value order (int4: unpacked order), 1 at the
entries the input stored (explicit zeros included).

``unpack_values(inst)`` gives one value per slot in value order (int8 for int8/int4,
float16), aligned with ``inst.stored_coords()``. Integer precisions need integer
values in range; ``quantize(matrix, bits)`` makes them (symmetric, per tensor).
"""
from __future__ import annotations

import re
import time

import numpy as np
import scipy.sparse as sp

from . import validate as Vd
from .axes import DenseFixed, SparseVariable
from .base import Format, FormatInstance, check_slot_mask, masked_coords
from .convert import as_csr, canonical_csr
from .stats import summarize

NAME = "srbcrs"
DESCRIPTION = ("Magicube's strided row-major BCRS: V-row column vectors (V=2/4/8) padded to the MMA k "
               "(16 int8/fp16, 32 int4), values V x stride row-major per chunk; int8, int4 (packed) or float16")

VECS = (2, 4, 8)
MASK = "valid"  # the slot mask's array name (formats.base)
DTYPES = ("int8", "int4", "float16")
STRIDES = {"int8": 16, "float16": 16, "int4": 32}
INT_RANGE = {"int8": (-128, 127), "int4": (-8, 7)}
DATA_DTYPES = {"int8": np.dtype(np.int8), "int4": np.dtype(np.int8), "float16": np.dtype(np.float16)}
# int4 index shuffle: the j-th sorted entry of a group of 8 is stored at SHUFFLE_DEST[j]
SHUFFLE_DEST = np.array([(j % 2) * 4 + j // 2 for j in range(8)], dtype=np.int64)  # 0,4,1,5,2,6,3,7
SHUFFLE_SRC = np.argsort(SHUFFLE_DEST)  # stored position q holds sorted entry SHUFFLE_SRC[q]: 0,2,4,6,1,3,5,7

_DTYPE_ALIASES = {"int8": "int8", "i8": "int8", "s8": "int8",
                  "int4": "int4", "i4": "int4", "s4": "int4",
                  "float16": "float16", "fp16": "float16", "f16": "float16", "half": "float16"}
_SPEC_HELP = "e.g. 'srbcrs:v8,int8', 'srbcrs:v4,int4' or 'srbcrs:v2,float16'"


# ---------------------------------------------------------------- parameters


def _vec(vec) -> int:
    if vec is None:
        raise ValueError(f"vec (V) should be one of 2, 4, 8, got none ({_SPEC_HELP}, or vec=8)")
    if isinstance(vec, (bool, np.bool_)) or not isinstance(vec, (int, np.integer)) or int(vec) not in VECS:
        raise ValueError(f"vec (V) should be one of 2, 4, 8, got {vec!r}")
    return int(vec)


def _dtype(dtype) -> str:
    if dtype is None:
        raise ValueError(f"dtype should be one of int8, int4, float16 (the SR-BCRS precisions), got none "
                         f"({_SPEC_HELP}, or dtype='int8')")
    if isinstance(dtype, str):
        name = _DTYPE_ALIASES.get(dtype.strip().lower())
    else:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = None
        name = name if name in DTYPES else None
    if name is None:
        raise ValueError(f"dtype should be one of int8, int4, float16 (the SR-BCRS precisions), got {dtype!r}")
    return name


def stride_of(dtype) -> int:
    """The MMA k that vector rows are padded to: 16 for int8 and float16, 32 for int4."""
    return STRIDES[_dtype(dtype)]


def parse_spec(arg: str | None) -> dict:
    """Spec grammar: ``srbcrs[:TOKEN[,TOKEN]]`` where each TOKEN is either

    * the vector length ``vN`` or ``N`` with N in 2, 4, 8 (``Format.spec`` writes ``N``), or
    * the precision: ``int8`` (``i8``, ``s8``), ``int4`` (``i4``, ``s4``) or ``float16``
      (``fp16``, ``f16``, ``half``),

    in either order, each at most once: ``srbcrs:v8,int8``, ``srbcrs:int4,v4``, ``srbcrs:8,int8``.
    A missing part is None and must come as a keyword (``make_format("srbcrs", vec=8,
    dtype="int8")``; ``convert(m, "srbcrs:v8", dtype="int4")``).
    """
    out = {"vec": None, "dtype": None}
    if not arg:
        return out
    for tok in arg.split(","):
        t = tok.strip().lower()
        mt = re.fullmatch(r"v?(\d+)", t)
        if mt:
            if out["vec"] is not None:
                raise ValueError(f"srbcrs spec should give V once, got {arg!r} ({_SPEC_HELP})")
            out["vec"] = _vec(int(mt.group(1)))
        elif t in _DTYPE_ALIASES:
            if out["dtype"] is not None:
                raise ValueError(f"srbcrs spec should give the dtype once, got {arg!r} ({_SPEC_HELP})")
            out["dtype"] = _DTYPE_ALIASES[t]
        else:
            raise ValueError(f"srbcrs spec should be 'v<V>,<dtype>' with V in 2, 4, 8 and dtype int8, int4 "
                             f"or float16, got {arg!r} ({_SPEC_HELP})")
    return out


def declare(vec=None, dtype=None) -> Format:
    v, d = _vec(vec), _dtype(dtype)
    stride = STRIDES[d]
    return Format(NAME, (
        DenseFixed("io", dim=0, scale=v),
        SparseVariable("j", dim=1, indptr="indptr", indices="indices", padded=True),
        DenseFixed("ii", dim=0, extent=v),
    ), (("vec", v), ("dtype", d)), value_chunk=stride, value_bits=4 if d == "int4" else 0,
                  slot_mask=MASK)


def tensor_core_layout(fmt: Format, dtype: str):
    """int8 runs on the integer ``mma`` (``schedules.srbcrs_tensorcore`` reads indptr, indices
    and the int8 values as they are); int4 and float16 on CUDA cores."""
    return "srbcrs_int8" if dtype == "int8" and fmt.param("dtype") == "int8" else None


def _params(inst_or_fmt):
    fmt = inst_or_fmt.format if isinstance(inst_or_fmt, FormatInstance) else inst_or_fmt
    v, d = _vec(fmt.param("vec")), _dtype(fmt.param("dtype"))
    return v, d, STRIDES[d]


# ---------------------------------------------------------------- values


def quantize(matrix, bits: int = 8):
    """Symmetric per-tensor quantization: ``(q, scale)`` with ``q`` a canonical scipy CSR
    float32 matrix of integers in [-(2**(bits-1) - 1), 2**(bits-1) - 1] and ``q * scale``
    approximating ``matrix``. ``scale = max|a| / (2**(bits-1) - 1)`` (1.0 for an all-zero
    matrix); values are rounded to nearest (ties to even). The sparsity pattern is kept,
    entries that round to 0 included (explicit zeros)."""
    if isinstance(bits, (bool, np.bool_)) or not isinstance(bits, (int, np.integer)) or not 2 <= bits <= 16:
        raise ValueError(f"bits should be an integer in [2, 16] (8 for int8, 4 for int4), got {bits!r}")
    m = as_csr(matrix, dtype=np.float64)
    data = m.data
    if not np.all(np.isfinite(data)):
        k = int(np.flatnonzero(~np.isfinite(data))[0])
        raise ValueError(f"quantize needs finite values, got {data[k]} at position {k}")
    qmax = 2 ** (int(bits) - 1) - 1
    amax = float(np.abs(data).max()) if data.size else 0.0
    scale = amax / qmax if amax > 0 else 1.0
    q = np.clip(np.rint(data / scale), -qmax, qmax).astype(np.float32)
    out = sp.csr_matrix((q, m.indices.copy(), m.indptr.copy()), shape=m.shape)
    out.has_sorted_indices = True
    return out, float(scale)


def _pack_int4(vals: np.ndarray) -> np.ndarray:
    """int values in [-8, 7], even length -> int8 bytes, even slot in the low nibble."""
    u = vals.astype(np.uint8) & np.uint8(0x0F)
    return np.ascontiguousarray((u[0::2] | (u[1::2] << np.uint8(4))).view(np.int8))


def _unpack_int4(data: np.ndarray) -> np.ndarray:
    b = np.asarray(data).view(np.uint8)
    out = np.empty(2 * b.size, dtype=np.int8)
    for half, nib in ((0, b & 0x0F), (1, b >> 4)):
        out[half::2] = (nib.astype(np.int8) ^ 8) - 8  # sign-extend a two's-complement nibble
    return out


def unpack_values(inst: FormatInstance) -> np.ndarray:
    """One value per slot in value order (length ``inst.stored``, aligned with
    ``stored_coords``): int8 for int8 and int4, float16 for float16. For int4 a new array;
    otherwise ``inst.data`` itself."""
    if inst.format.value_bits == 4:
        return _unpack_int4(inst.data)
    return inst.data


def _values(m, d: str, rows: np.ndarray) -> np.ndarray:
    """Canonical float64 values -> the stored dtype, refusing what it cannot hold exactly."""
    x = m.data
    if d == "float16":
        with np.errstate(over="ignore"):
            y = x.astype(np.float16)
        bad = np.flatnonzero(np.isfinite(x) & ~np.isfinite(y))
        if bad.size:
            k = int(bad[0])
            raise ValueError(f"float16 values should be within +-65504, got {float(x[k])!r} at "
                             f"(row {int(rows[k])}, col {int(m.indices[k])})")
        return y
    lo, hi = INT_RANGE[d]
    with np.errstate(invalid="ignore"):
        ok = (x == np.round(x)) & (x >= lo) & (x <= hi)
    if not ok.all():
        k = int(np.flatnonzero(~ok)[0])
        raise ValueError(f"{d} values should be integers in [{lo}, {hi}], got {float(x[k])!r} at "
                         f"(row {int(rows[k])}, col {int(m.indices[k])}); quantize first: "
                         f"q, scale = sparsec.formats.srbcrs.quantize(matrix, bits={8 if d == 'int8' else 4})")
    return x.astype(np.int8)


# ---------------------------------------------------------------- conversion


def from_matrix(matrix, *, vec=None, dtype=None, shape=None) -> FormatInstance:
    """``matrix`` (anything ``canonical_csr`` accepts, integer inputs included) in SR-BCRS.
    ``dtype`` (int8, int4, float16) is required; int8/int4 values must already be integers
    in range (see ``quantize``)."""
    t0 = time.perf_counter()
    v, d = _vec(vec), _dtype(dtype)
    S = STRIDES[d]
    m = canonical_csr(matrix, shape=shape, dtype=np.float64)  # float64 holds int8/int4/fp16 exactly
    M, N = m.shape
    mv = -(-M // v)
    rows = Vd.major_ids(m.indptr)
    vals = _values(m, d, rows)
    cols = m.indices.astype(np.int64)
    vrow = rows // v
    # one key per (vector row, column): sorted unique keys are the vectors in slot order
    ukeys, which = np.unique(vrow * max(N, 1) + cols, return_inverse=True)
    which = which.reshape(-1)
    uv, ucol = ukeys // max(N, 1), ukeys % max(N, 1)
    nv = np.bincount(uv, minlength=mv).astype(np.int64) if ukeys.size else np.zeros(mv, np.int64)
    ustart = np.zeros(mv + 1, np.int64)
    np.cumsum(nv, out=ustart[1:])
    indptr = np.zeros(mv + 1, np.int64)
    np.cumsum(-(-nv // S) * S, out=indptr[1:])
    slot = indptr[uv] + (np.arange(ukeys.size, dtype=np.int64) - ustart[uv])  # sorted slot of each vector
    if d == "int4":
        slot = (slot // 8) * 8 + SHUFFLE_DEST[slot % 8]
    n_slots = int(indptr[-1])
    indices = np.full(n_slots, -1, dtype=np.int32)
    indices[slot] = ucol
    p = slot[which]
    values = np.zeros(n_slots * v, dtype=np.int8 if d != "float16" else np.float16)
    where = (p // S) * (S * v) + (rows % v) * S + p % S
    values[where] = vals
    valid = np.zeros(n_slots * v, dtype=np.uint8)
    valid[where] = 1
    row_offsets = np.empty(2 * mv, np.int64)
    row_offsets[0::2] = indptr[:-1]
    row_offsets[1::2] = indptr[:-1] + nv
    arrays = {"indptr": Vd.check_index(indptr, "indptr", nnz=m.nnz, shape=(M, N)),
              "indices": indices,
              "row_offsets": Vd.check_index(row_offsets, "row_offsets", nnz=m.nnz, shape=(M, N)),
              MASK: valid}
    data = _pack_int4(values) if d == "int4" else values
    inst = FormatInstance(declare(v, d), (int(M), int(N)), arrays, np.ascontiguousarray(data), int(m.nnz))
    inst.conversion_s = time.perf_counter() - t0
    check(inst)
    return inst


# ---------------------------------------------------------------- layout


def root_extent(inst: FormatInstance) -> int:
    return int(inst.arrays["indptr"].size - 1)


def extents(inst: FormatInstance) -> dict:
    return {"io": root_extent(inst)}


def stored_coords(inst: FormatInstance):
    """(row, col) of every value slot in value order (length ``inst.stored``); -1 for
    padding slots and rows past the logical edge."""
    v, _, S = _params(inst)
    M, _ = inst.shape
    indptr = inst.arrays["indptr"]
    s = np.arange(inst.stored, dtype=np.int64)
    w = s % (S * v)
    p = (s // (S * v)) * S + w % S  # the slot
    owner = Vd.major_ids(indptr)
    cols = inst.arrays["indices"].astype(np.int64)[p]
    rows = owner[p] * v + w // S
    outside = (cols < 0) | (rows >= M)
    rows[outside] = -1
    cols[outside] = -1
    return masked_coords(inst, rows, cols)


def _sorted_indices(indices: np.ndarray, d: str) -> np.ndarray:
    """``indices`` with the int4 shuffle undone (slot order = sorted order)."""
    if d != "int4" or indices.size == 0:
        return indices
    return np.ascontiguousarray(indices.reshape(-1, 8)[:, SHUFFLE_DEST].reshape(-1))


def check(inst: FormatInstance, full: bool = False) -> None:
    """O(1) consistency of the arrays with the shape and parameters; ``full`` also scans
    the indices (padding, sortedness, range), the row offsets and the padding values."""
    fmt = inst.format
    v, d, S = _params(inst)
    if fmt.value_chunk != S or fmt.value_bits != (4 if d == "int4" else 0):
        raise ValueError(f"srbcrs format should declare value_chunk={S}, value_bits={4 if d == 'int4' else 0} "
                         f"for {d}, got value_chunk={fmt.value_chunk}, value_bits={fmt.value_bits}")
    Vd.check_instance_arrays(inst, ("indptr", "indices", "row_offsets"), value_dtypes=(DATA_DTYPES[d].name,))
    data = inst.data
    M, N = inst.shape
    mv = -(-M // v)
    indptr, indices, ro = inst.arrays["indptr"], inst.arrays["indices"], inst.arrays["row_offsets"]
    if indptr.size != mv + 1:
        raise ValueError(f"indptr has {indptr.size} entries, should be vector rows + 1 = "
                         f"ceil({M} / {v}) + 1 = {mv + 1}")
    if indptr[-1] != indices.size:
        raise ValueError(f"indptr should end at the number of slots = len(indices) = {indices.size}, "
                         f"got {int(indptr[-1])}")
    if indices.size % S:
        raise ValueError(f"the number of slots should be a multiple of the stride {S}, got {indices.size}")
    want = indices.size * v // (2 if d == "int4" else 1)
    if data.size != want:
        raise ValueError(f"data should have slots * V{' / 2' if d == 'int4' else ''} = {want} "
                         f"{'bytes' if d == 'int4' else 'values'}, got {data.size}")
    if ro.size != 2 * mv:
        raise ValueError(f"row_offsets has {ro.size} entries, should be 2 * vector rows = {2 * mv}")
    check_slot_mask(inst)
    if not full:
        return
    Vd.check_indptr(indptr, mv, indices.size, major="vector row")
    off = np.flatnonzero(indptr % S)
    if off.size:
        k = int(off[0])
        raise ValueError(f"indptr should hold multiples of the stride {S}, got indptr[{k}] = {int(indptr[k])}")
    starts, ends = ro[0::2].astype(np.int64), ro[1::2].astype(np.int64)
    bad = np.flatnonzero(starts != indptr[:-1])
    if bad.size:
        k = int(bad[0])
        raise ValueError(f"row_offsets[{2 * k}] should be the padded start indptr[{k}] = {int(indptr[k])}, "
                         f"got {int(starts[k])}")
    true = ends - starts
    padded = np.diff(indptr.astype(np.int64))
    bad = np.flatnonzero((true < 0) | (-(-true // S) * S != padded))
    if bad.size:
        k = int(bad[0])
        raise ValueError(f"vector row {k} should hold its {int(padded[k])} slots as the true count padded to "
                         f"a multiple of {S}, got a true count of {int(true[k])} (row_offsets[{2 * k + 1}])")
    owner = Vd.major_ids(indptr)
    srt = _sorted_indices(indices, d).astype(np.int64)
    rank = np.arange(srt.size, dtype=np.int64) - indptr[:-1].astype(np.int64)[owner]
    real = rank < true[owner]
    bad = np.flatnonzero(real & ((srt < 0) | (srt >= N)))
    if bad.size:
        k = int(bad[0])
        raise ValueError(f"column index {int(srt[k])} in vector row {int(owner[k])} is out of range: should be "
                         f"in [0, {N}) (in indices)")
    bad = np.flatnonzero(~real & (srt != -1))
    if bad.size:
        k = int(bad[0])
        raise ValueError(f"padding slots should hold column index -1, got {int(srt[k])} in vector row "
                         f"{int(owner[k])} (past its {int(true[owner[k]])} real slots)")
    _check_sorted(srt, owner, real)
    n_real = int(real.sum())
    if not n_real <= inst.nnz <= n_real * v:
        raise ValueError(f"nnz should be between the number of column vectors {n_real} and V times it "
                         f"{n_real * v}, got {inst.nnz}")
    rows, _ = stored_coords(inst)
    if np.any(unpack_values(inst)[rows < 0] != 0):
        raise ValueError("padding slots and rows past the logical edge should hold 0, got a non-zero value")


def _check_sorted(srt, owner, real):
    k = np.flatnonzero(real)
    if k.size < 2:
        return
    same = owner[k[1:]] == owner[k[:-1]]
    bad = np.flatnonzero(same & (srt[k[1:]] <= srt[k[:-1]]))
    if bad.size:
        b = int(bad[0])
        raise ValueError(f"column indices should be strictly increasing within each vector row (int4: after "
                         f"undoing the shuffle), got {int(srt[k[b]])} then {int(srt[k[b + 1]])} in vector row "
                         f"{int(owner[k[b]])}")


def stats(inst: FormatInstance) -> dict:
    """Row lengths count in-bounds slots holding a non-zero value; ``padding_ratio`` is
    stored slots (V per column vector, stride padding included) / nnz."""
    v, d, S = _params(inst)
    rows, _ = stored_coords(inst)
    live = (rows >= 0) & (unpack_values(inst) != 0)
    M = inst.shape[0]
    s = summarize(inst, np.bincount(rows[live], minlength=M)[:M])
    ro = inst.arrays["row_offsets"]
    s.update({
        "V": v,
        "stride": S,
        "value_dtype": d,
        "vector_rows": root_extent(inst),
        "slots": int(inst.arrays["indices"].size),
        "column_vectors": int((ro[1::2].astype(np.int64) - ro[0::2]).sum()),
    })
    return s
