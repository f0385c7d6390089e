"""Tensor Core SpMM for formats that store an MMA operand packed (2:4 ``mma.sp``, vector-wise
N:M gathered ``mma``, int8 SR-BCRS ``mma`` s8), chosen by capability.

A program qualifies by its structure alone (:func:`match`): one sparse x dense product into
a dense output, ``C[i, k] += A[i, j] * B[j, k]`` or transposed, ``C[k, i] += ...`` (the
kernel's ``transpose_c``: with B a linear layer's activations feature-major, C comes back
token-major), optionally followed by a dense iteration that rewrites the same output as an
activation (``sparsec.dsl.ACTIVATIONS``: relu, gelu, gelu_tanh) of ``C`` or of ``C + bias[i]``
/ ``C + bias[k]`` (an epilogue the pipelined kernel carries in registers); no other operand;
a single format part. The output may be declared float16 / bfloat16 (the kernel stores
that precision; the sum stays float32) and the bias float32. The format
says which packed operands it can hand over (its family's ``tensor_core_layout``, read
through ``formats.registry``), for the program's value dtype on CUDA:

* ``sp24``  -> ``tc_pipeline`` mode sp24 (``formats.mma_sp``'s packing: values, metadata);
* ``gather`` -> ``tc_pipeline`` mode gather (``formats.nm_tc``'s packing: values, columns);
* ``srbcrs_int8`` -> ``srbcrs_tensorcore`` (the instance's own indptr, indices, int8 values);
* ``tiled_bitmap`` -> ``tiled_stream`` up to 64 columns of B (tiles of 16-64 rows: a warp
  streams a tile row's compressed bytes and scatters its non-zeros into a dense buffer; the
  CTAs of a cluster split K) and ``tiled_tensorcore`` beyond, or where its knobs are given
  (the instance's own bitmap, tile offsets and float16 values: unstructured weights loaded
  as sparse, multiplied as dense).

Both kernels are built for any matrix size (M and K are read from the operands), so a kernel
compiled for a format spec runs on every matrix converted with it; compiled for a converted
matrix, it also carries a body sized for that matrix, run when the operands have its size.
The packed operands are named here (:data:`OPERANDS`); the kernel layer
(``sparsec.tc_operands``) produces them from an instance. The knobs of both kernels are
declared once, below, as transformations.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from . import bsr_dispatch, bsr_gather, bsr_ring, bsr_stream, bsr_tokens
from . import srbcrs_tensorcore as srbcrs_tc
from . import tc_pipeline_plan as tpp
from . import tiled_stream
from . import tiled_tensorcore as tiled_tc
from . import tiled_tensorcore_staged as tiled_staged
from .knobs import ANY, Knob, check_applicable, transformation
from .spmm_structure import spmm_structure

# the packed operands each layout passes, in the kernel's argument order: (name, dtype)
OPERANDS = {
    "sp24": (("sp24_values", "float16"), ("sp24_meta", "uint32")),
    "gather": (("gather_values", "float16"), ("gather_cols", "int32")),
    "srbcrs_int8": (("indptr", "int32"), ("indices", "int32")),
    "tiled_bitmap": (("bitmap", "uint64"), ("tile_offsets", "int32")),
    "bsr_blocks": (("indptr", "int32"), ("indices", "int32")),
    "bsr_tokens": (("indptr", "int32"), ("indices", "int32")),
}
# layouts whose kernel reads the instance's own arrays and values, with no epilogue: a bias,
# an activation, a transposed or a declared output dtype leave the program to the generic path
OWN_ARRAYS = ("srbcrs_int8", "tiled_bitmap", "bsr_blocks", "bsr_tokens")
# bsr_tokens (a BSR weight times token-major activations) copies X's rows and writes Y's by
# 16-byte units: the matrix's rows and columns a multiple of this (Kernel.extra checks it per call)
TOKEN_MAJOR_MULTIPLE = 8


# gather mode takes a multiple of 16 columns of B: ldmatrix.x4.trans loads two 8-column tiles at once
GATHER_FEAT_ALIGN = 16


@dataclass(frozen=True)
class PackedSpmm:
    """What :func:`match` found: the layout, the feature count, the epilogue and the names
    of the operator's operands."""

    layout: str
    feat: int
    vec: int
    dtype: str  # the value dtype
    out_dtype: str
    bias: Optional[str]  # the bias operand's name, or None
    activation: str  # "none" or a name of sparsec.dsl.ACTIVATIONS
    b_name: str
    c_name: str
    transpose_c: bool = False  # the statement writes C[k, i]
    bias_axis: str = "row"  # bias[i] ("row") or bias[k] ("col")
    bias_dtype: str = ""  # the bias operand's dtype
    kc: Optional[int] = None  # gather: the matrix's gathered row length, when compiled for one
    # (rows, cols, kc; kc is 0 but in gather mode) of the matrix compiled for: the kernel carries a
    # body sized for it
    sized_for: Optional[Tuple[int, int, int]] = None
    tile: Optional[Tuple[int, int]] = None  # tiled_bitmap: the format's tile shape
    density: Optional[float] = None  # the matrix's stored entries per element, when compiled for one
    clusters: bool = True  # the target has thread-block clusters and mbarrier waits (sm_90 on)
    skew: Optional[float] = None  # BSR: the longest block row's stored blocks over the mean, when compiled for one
    token_major: bool = False  # bsr_tokens: B and C token-major (C[k, i] = sum_j A[i, j] * B[k, j])


def match(program, target_kind: str, kc: Optional[int] = None,
          shape: Optional[Tuple[int, int]] = None, density: Optional[float] = None,
          clusters: bool = True, skew: Optional[float] = None) -> Optional[PackedSpmm]:
    """The packed Tensor Core SpMM that computes ``program`` on ``target_kind``, or None.
    ``kc``: the gathered row length of the matrix a kernel is compiled for (it picks the
    pipeline's depth, :func:`default_pipeline_knobs`); ``shape``: that matrix's (rows, cols),
    for which the kernel carries a sized body (``tc_pipeline.spmm``'s and
    ``srbcrs_tensorcore.spmm_srbcrs_int8``'s ``fast_for``); ``density``: its stored entries
    per element (the tiled kernel sizes its slots by it). The kernel still runs on any
    matrix of the format. ``clusters``: the target has thread-block clusters (sm_90 on;
    without them the few-column BSR kernels defer and tiled SpMM takes ``tiled_tensorcore``).
    ``skew``: a BSR matrix's longest block row over its mean (``bsr_ring``'s cluster size)."""
    from sparsec.formats.registry import tensor_core_layout

    if target_kind != "cuda" or program.bound.composite or len(program.bound.parts) != 1:
        return None
    fmt = program.bound.parts[0]
    layout = tensor_core_layout(fmt, program.dtype.sparse)
    if layout is None:
        return None
    if layout == "bsr_blocks":
        tokens = _token_major(program, fmt, shape, clusters)
        if tokens is not None:
            return tokens
    found = spmm_structure(program)
    if found is None:
        return None
    b_name, c_name, bias, activation, feat, transpose_c, bias_axis, dtypes = found
    out_dtype = dtypes.get(c_name) or program.dtype.out
    bias_dtype = (dtypes.get(bias) or program.dtype.dense) if bias else ""
    if layout in OWN_ARRAYS and (bias is not None or activation != "none" or transpose_c or dtypes):
        return None  # these kernels have no epilogue: the generic template runs
    tile = None
    if layout == "tiled_bitmap":
        if program.dtype.dense != "float16" or out_dtype != "float32":
            return None  # float16 B, float32 C is what its MMA takes and stores
        tile = tuple(int(t) for t in fmt.param("tile"))
        try:
            tiled_tc.check(tile, 16, 1)
        except ValueError:
            return None  # a tile the kernel's warps cannot cover (rows not a multiple of 16)
    if layout == "bsr_blocks":
        tile = tuple(int(b) for b in fmt.param("block"))
        if program.dtype.dense != "float16" or out_dtype != "float32" or feat > bsr_stream.MAX_FEAT:
            return None  # the block-row template (schedules.tensorcore) takes it
        try:
            bsr_stream.check_block(tile)
        except ValueError:
            return None
    if layout not in OWN_ARRAYS and (out_dtype not in tpp.OUT_DTYPES
                                    or bias_dtype not in ("", "float32", program.dtype.sparse)):
        return None
    if layout == "gather" and feat % GATHER_FEAT_ALIGN:
        return None
    vec = int(fmt.param("vec", 1))
    if layout == "gather" and kc is None and shape is not None:
        # a matrix that does not carry the packing (a bfloat16 layer's float32 instance)
        kc = _packed_row_length(fmt, shape)
    sized = None
    if shape is not None and (layout != "gather" or kc):
        sized = (int(shape[0]), int(shape[1]), int(kc) if layout == "gather" else 0)
    return PackedSpmm(layout, feat, vec, program.dtype.sparse, out_dtype, bias, activation, b_name, c_name,
                      transpose_c, bias_axis, bias_dtype, kc if layout == "gather" else None, sized, tile,
                      density if layout in ("tiled_bitmap", "bsr_blocks") else None, bool(clusters),
                      skew if layout == "bsr_blocks" else None)


def _token_major(program, fmt, shape, clusters) -> Optional[PackedSpmm]:
    """``bsr_tokens``'s match: a float16 BSR linear layer on token-major activations
    (``C[k, i] = act(sum_j A[i, j] * B[k, j] [+ bias[i]])``, C float16 / bfloat16 / float32,
    the bias float32 or float16), blocks it takes, sm_90 on (TMA copies, mbarrier waits), and
    a matrix compiled for (if any) of rows and columns a multiple of TOKEN_MAJOR_MULTIPLE."""
    found = spmm_structure(program, token_major=True)
    if found is None or not clusters:
        return None
    b_name, c_name, bias, activation, feat, _, bias_axis, dtypes = found
    out_dtype = dtypes.get(c_name) or program.dtype.out
    bias_dtype = (dtypes.get(bias) or program.dtype.dense) if bias else ""
    tile = tuple(int(b) for b in fmt.param("block"))
    if (program.dtype.dense != "float16" or out_dtype not in bsr_tokens.OUT_DTYPES or bias_axis != "row"
            or bias_dtype not in ("", "float32", "float16") or not bsr_tokens.takes(tile)
            or (shape is not None and any(int(s) % TOKEN_MAJOR_MULTIPLE for s in shape))):
        return None
    return PackedSpmm("bsr_tokens", feat, 1, program.dtype.sparse, out_dtype, bias, activation, b_name, c_name,
                      transpose_c=True, bias_axis=bias_axis, bias_dtype=bias_dtype,
                      sized_for=None if shape is None else (int(shape[0]), int(shape[1]), 0), tile=tile,
                      clusters=True, token_major=True)


# --------------------------------------------------------------------------- the knobs


def _pipeline_resolve(program, knobs, kc: Optional[int] = None, shape: Optional[Tuple[int, int]] = None) -> dict:
    """The knobs the pipelined kernel runs with: ``default_pipeline_knobs`` for the layout,
    row vector, feature count (and gathered row length and matrix shape, where known),
    overridden by those given."""
    m = match(program, "cuda")
    if kc is None and shape is not None and m.layout == "gather":  # e.g. the tuner's, with the shape alone
        kc = _packed_row_length(program.bound.parts[0], shape)
    return {**default_pipeline_knobs(m.layout, m.vec, m.feat, kc, shape), **knobs}


def _packed_row_length(fmt, shape: Tuple[int, int]) -> int:
    """The gathered row length ``formats.nm_tc`` packs a matrix of ``shape`` to."""
    from sparsec.formats.nm_tc import gathered_row_length

    return gathered_row_length(shape[1], int(fmt.param("n")), int(fmt.param("m")))


KC_STAGE = 32  # the gathered row length counted in whole stages of two 16-deep k-steps


# 2:4 products this large in M, K and N took 128 x 128 blocks, two k-steps a stage, 4 stages and
# one fragment set, walked 16 row tiles a group: 0.254 ms against 0.267 ms for the 128 x 64 blocks
# at 4096 x 4096 x 4096 (H200, nm_tc_H200.json; from 1024 columns on)
WIDE_SP24 = dict(warps_m=2, warps_n=2, warp_m_tiles=4, warp_n_tiles=8, k_steps=2, stages=4, group_m=16,
                 frag_sets=1)
WIDE_SP24_FROM = (4096, 4096, 1024)  # rows, cols, columns of B

# below 512 columns: 64 x 16 blocks (4 warps of one 16 x 16 tile), 4 k-steps a stage, 4 stages --
# the best or within 1 % of it in 19 of the committed H200 run's 20 cases under 512 columns
# (nm_tc_H200.json; gather mode's short rows included: 2.48 against 2.47 us at 16 columns)
NARROW = dict(warps_m=4, warps_n=1, warp_m_tiles=1, warp_n_tiles=2, k_steps=4, stages=4, group_m=8, frag_sets=2)
# ... save where 128 x 64 blocks still make enough blocks and each walks a long K: at 128 columns
# 2:4 3072 x 768 took 5.94 us against 6.47 (narrow), 2:4 4096 x 4096 20.4 against 31.0, and 1:8
# 4096 x 4096 (512-long gathered rows) 6.77 against 6.95; with 768 rows (12 such blocks) or
# 96-long gathered rows the narrow blocks won (7.84 against 16.05 us, 3.34 against 3.52)
MID = dict(warps_m=2, warps_n=2, warp_m_tiles=4, warp_n_tiles=4, k_steps=2, stages=3, group_m=8, frag_sets=2)
MID_FROM = (64, 32, 256)  # columns of B, 128 x 64 blocks, rows of the K walk (K, or the gathered row)


def default_pipeline_knobs(layout: str, vec: int, feat: Optional[int] = None, kc: Optional[int] = None,
                           shape: Optional[Tuple[int, int]] = None) -> dict:
    """The tiles for ``feat`` columns of B (a linear layer's token count), from the committed
    H200 runs (``benchmarks/results/nm_tc_H200.json``, ``ffn_tc_H200.json``); ``kc`` is the
    gathered row length and ``shape`` the matrix's (rows, cols), where a kernel is compiled
    for a matrix (without them the rules that need them do not apply):

    * below 512 columns :data:`NARROW` 64 x 16 blocks with deep stages, or :data:`MID`
      128 x 64 blocks from ``MID_FROM``: at least 64 columns, 32 such blocks and a K walk
      (2:4: K; gather: ``kc``) of 256;
    * from 512 on 128 x 64 blocks walked in groups of 8 row tiles, 3 stages; 4 k-steps a
      stage where the K walk is long (always for 2:4, 32 deep per k-step; in gather mode a
      gathered row, counted in 32-deep stages, that is a multiple of 64 above 128), else 2
      (4 stages won 7 of the 10 short-row cases, but 3 stages lost at most 3 % where 4 lost
      5 %: the rule keeps the better worst case);
    * a 2:4 matrix of at least ``WIDE_SP24_FROM`` takes :data:`WIDE_SP24`.

    In gather mode the block's rows must divide the row vector, so narrower vectors take
    fewer warp tiles down."""
    if layout == "sp24" and shape is not None and feat is not None and all(
            have >= least for have, least in zip((shape[0], shape[1], feat), WIDE_SP24_FROM)):
        return dict(WIDE_SP24)
    padded = None if kc is None else -(-int(kc) // KC_STAGE) * KC_STAGE
    long_k = layout == "sp24" or (padded is not None and padded % 64 == 0 and padded > 128)
    if feat is not None and feat < 512:
        walk = (shape[1] if layout == "sp24" else kc) if shape is not None else None
        blocks = None if shape is None else -(-int(shape[0]) // 128) * -(-feat // 64)
        mid = walk is not None and feat >= MID_FROM[0] and blocks >= MID_FROM[1] and walk >= MID_FROM[2]
        base = dict(MID if mid else NARROW)
    else:
        base = dict(warps_m=2, warps_n=2, warp_m_tiles=4, warp_n_tiles=4, k_steps=4 if long_k else 2, stages=3,
                    group_m=8, frag_sets=2)
    if layout == "gather":
        while 16 * base["warp_m_tiles"] * base["warps_m"] > vec:
            if base["warp_m_tiles"] > 1:
                base["warp_m_tiles"] //= 2
            else:
                base["warps_m"] //= 2
    return base


def _pipeline_prune(program, knobs) -> Optional[str]:
    m = match(program, "cuda")
    chosen = _pipeline_resolve(program, knobs)
    try:
        tpp.check(m.layout, None, None, m.feat, m.dtype, "float32", m.vec, chosen)
    except ValueError as e:
        return str(e)
    return None


# what the tuner searches of tc_pipeline's knobs: the full space every choice except the
# grouped order's extremes (1 and 64 were never best on the H200, nm_tc_sweep_H200.json); the
# small one the warp tiles, stages and k-steps (block shape and pipeline depth decide most of the time)
_SEARCH = {"group_m": (8, 16)}
_SMALL = {"warp_m_tiles": (4, 1), "warp_n_tiles": (4, 2), "warps_m": (2, 4), "warps_n": (2, 1), "stages": (3, 4),
          "k_steps": (4, 2)}


@transformation(knobs={k: Knob(tuple(v), search=_SEARCH.get(k), small=_SMALL.get(k))
                       for k, v in tpp.KNOBS.items()}, resolve=_pipeline_resolve,
                prune=_pipeline_prune)
def tc_pipeline_spmm(built, program, **knobs):
    """Build ``schedules.tc_pipeline``'s kernel (sp24 or gather) for ``program`` into
    ``built.mod``: the program's feature count and epilogue, any matrix size (and a body
    sized for the matrix compiled for, ``built.sized_for``, when there is one)."""
    from tvm import IRModule

    from . import tc_pipeline

    m = match(program, "cuda")
    func = tc_pipeline.spmm(m.layout, None, None, m.feat, dtype=m.dtype, out_dtype=m.out_dtype,
                            vec=m.vec if m.layout == "gather" else 0, bias=m.bias is not None,
                            bias_dtype=m.bias_dtype or "float32", bias_axis=m.bias_axis, activation=m.activation,
                            transpose_c=m.transpose_c, name=program.name, fast_for=built.sized_for, **knobs)
    built.mod = IRModule({program.name: func})


# the int8 kernel's 8 bytes of B a lane and 2 warps a block where that grid -- a block per vector row
# and 128 columns -- still has this many blocks; 8 bytes / 8 warps below (few vector rows)
SRBCRS_FEW_WARPS_FROM = 384


def srbcrs_default_knobs(feat: int, vec: int, rows: Optional[int] = None) -> dict:
    """The int8 kernel's knobs when none are given, from the H200 sweep of 9 settings (4, 8,
    16 bytes x 2, 4, 8 warps) over the 288 cases of ``results/lowprec_int8_H200.json``
    (``results/int8_knobs_H200.json``): 8 bytes / 2 warps (each warp 64 columns, two a
    block) won most cases at every V and width, once the grid had blocks enough to fill the
    GPU -- ``ceil(rows / V) * ceil(feat / 128)`` at least :data:`SRBCRS_FEW_WARPS_FROM` --
    and 8 / 8 below. Against the best of the two settings the hand-written kernel was run
    with (16 / 4, 8 / 8): geomean 1.086, worst 0.944; always 8 / 2 gave 1.083 and 0.829,
    which is the rule without ``rows`` (a kernel compiled for a format spec)."""
    if rows is not None and -(-int(rows) // vec) * -(-int(feat) // 128) < SRBCRS_FEW_WARPS_FROM:
        return {"n_bytes": 8, "warps": 8}
    return {"n_bytes": 8, "warps": 2}


def _srbcrs_resolve(program, knobs, shape: Optional[Tuple[int, int]] = None) -> dict:
    m = match(program, "cuda")
    return {**srbcrs_default_knobs(m.feat, m.vec, None if shape is None else shape[0]), **knobs}


def _srbcrs_prune(program, knobs) -> Optional[str]:
    m = match(program, "cuda")
    chosen = _srbcrs_resolve(program, knobs)
    try:
        srbcrs_tc.check(None, None, m.feat, m.vec, "int32", chosen["n_bytes"], chosen["warps"])
    except ValueError as e:
        return str(e)
    return None


# the tuner's small space: B's load width, warps a block -- what won the H200 sweep's cases
# (int8_knobs_H200.json: 8 / 2 most, 4 / 2 at 16 columns with V = 2, 8 / 8 with few vector rows,
# 16 bytes at 8192 columns with V = 2; one warp never ran)
_SRBCRS_SMALL = {"n_bytes": (8, 4, 16), "warps": (2, 4, 8)}


@transformation(knobs={k: Knob(tuple(v), small=_SRBCRS_SMALL.get(k)) for k, v in srbcrs_tc.KNOBS.items()},
                resolve=_srbcrs_resolve,
                prune=_srbcrs_prune)
def srbcrs_int8_spmm(built, program, *, n_bytes: int, warps: int):
    """Build ``schedules.srbcrs_tensorcore``'s int8 kernel for ``program`` into ``built.mod``:
    any matrix size (and a body sized for the matrix compiled for, ``built.sized_for``, when
    there is one)."""
    from tvm import IRModule

    m = match(program, "cuda")
    sized = built.sized_for[:2] if built.sized_for else None
    func = srbcrs_tc.spmm_srbcrs_int8(None, None, m.feat, m.vec, out_dtype="int32", n_bytes=n_bytes, warps=warps,
                                      name=program.name, fast_for=sized)
    built.mod = IRModule({program.name: func})


def _tiled_resolve(program, knobs, shape: Optional[Tuple[int, int]] = None) -> dict:
    return {**tiled_tc.default_knobs(match(program, "cuda").feat), **knobs}


def _tiled_prune(program, knobs) -> Optional[str]:
    m = match(program, "cuda")
    chosen = _tiled_resolve(program, knobs)
    if chosen["pipeline"] and chosen["loads"] != 1:
        return "loads applies to pipeline 0 only (the staged kernel moves a tile's bytes in one batch)"
    try:
        tiled_tc.check(m.tile, **chosen)
    except ValueError as e:
        return str(e)
    return None


# the tuner's small space: a block's columns of B, splits of K from few to a tile or two a
# block, and the three memory paths (loads into place one by one or 16 at a time, staged a tile ahead)
_TILED_SMALL = {"nb": (16, 32, 64), "splits": (8, 16, 64), "loads": (1, 16), "pipeline": (0, 2)}


@transformation(knobs={k: Knob(tuple(v), small=_TILED_SMALL.get(k)) for k, v in tiled_tc.KNOBS.items()},
                resolve=_tiled_resolve,
                prune=_tiled_prune)
def tiled_tc_spmm(built, program, *, nb: int, splits: int, loads: int, pipeline: int):
    """Build ``schedules.tiled_tensorcore``'s kernel (``pipeline`` 0) or
    ``tiled_tensorcore_staged``'s (1, 2) for ``program`` into ``built.mod``, for the format's
    tile shape and any matrix size (a first launch zeroes C where splits add)."""
    from tvm import IRModule

    m = match(program, "cuda")
    if pipeline and loads != 1:
        raise ValueError(f"knobs: loads={loads} applies to pipeline 0 only (pipeline {pipeline}, the staged "
                         f"kernel, moves a tile's bytes in one batch); leave loads at 1 or set pipeline 0")
    if pipeline:
        func = tiled_staged.spmm(m.tile, nb=nb, splits=splits, pipeline=pipeline, name=program.name)
    else:
        func = tiled_tc.spmm(m.tile, nb=nb, splits=splits, name=program.name, loads=loads)
    built.mod = IRModule({program.name: func})


def _stream_resolve(program, knobs, shape: Optional[Tuple[int, int]] = None,
                    density: Optional[float] = None) -> dict:
    """The knobs given, the rest by ``tiled_stream.default_knobs`` for the matrix's shape and
    density where known (else slots for whole tiles)."""
    m = match(program, "cuda")
    rows, cols = shape if shape else (0, 0)
    return {**tiled_stream.default_knobs(m.feat, rows, cols, m.tile, 1.0 if density is None else density), **knobs}


def _plan_problem(plan, resolve, program, knobs) -> Optional[str]:
    """What ``plan`` (a streaming kernel's size check) refuses in ``program``'s knobs as
    ``resolve`` completes them, or None."""
    m = match(program, "cuda")
    try:
        plan(m.tile, m.feat, **resolve(program, knobs))
    except ValueError as e:
        return str(e)
    return None


def _stream_prune(program, knobs) -> Optional[str]:
    return _plan_problem(tiled_stream.plan, _stream_resolve, program, knobs)


# the tuner's small space: warps and stages around the default, cluster sizes, slot sizes
_STREAM_SMALL = {"warps": (8, 4), "stages": (4, 6), "cluster": (8, 4), "cap": (1, 4)}


@transformation(knobs={k: Knob(tuple(v), small=_STREAM_SMALL.get(k)) for k, v in tiled_stream.KNOBS.items()},
                resolve=_stream_resolve,
                prune=_stream_prune)
def tiled_stream_spmm(built, program, *, nb: int, warps: int, stages: int, cluster: int, cap: int, bk: int):
    """Build ``schedules.tiled_stream``'s kernel for ``program`` into ``built.mod``: the
    format's tile shape, the program's columns of B, any matrix size (C written whole, in one
    launch)."""
    from tvm import IRModule

    m = match(program, "cuda")
    func = tiled_stream.spmm(m.tile, m.feat, nb=nb, warps=warps, stages=stages, cluster=cluster, cap=cap, bk=bk,
                             name=program.name)
    built.mod = IRModule({program.name: func})


def _block_resolve(kernel, program, knobs, shape, density, **known) -> dict:
    """The knobs given, the rest by a few-column BSR kernel's ``default_knobs`` for the
    matrix's shape and density where known (30 % of blocks stored where not); ``known``:
    what else the kernel's rule reads, where known (``skew``)."""
    m = match(program, "cuda")
    rows, cols = shape if shape else (0, 0)
    return kernel.default_knobs(m.tile, m.feat, rows, cols, 0.3 if density is None else density, fixed=knobs,
                                **{k: v for k, v in known.items() if v is not None})


def _bsr_resolve(program, knobs, shape: Optional[Tuple[int, int]] = None,
                 density: Optional[float] = None) -> dict:
    return _block_resolve(bsr_stream, program, knobs, shape, density)


def _bsr_prune(program, knobs) -> Optional[str]:
    return _plan_problem(bsr_stream.plan, _bsr_resolve, program, knobs)


_BSR_SMALL = {"warps": (8, 4), "stages": (4, 3), "cluster": (8, 4, 2), "bk": (64, 16)}


@transformation(knobs={k: Knob(tuple(v), small=_BSR_SMALL.get(k)) for k, v in bsr_stream.KNOBS.items()},
                resolve=_bsr_resolve,
                prune=_bsr_prune)
def bsr_stream_spmm(built, program, *, nb: int, warps: int, stages: int, cluster: int, bk: int):
    """Build ``schedules.bsr_stream``'s kernel for ``program`` into ``built.mod``: the
    format's block shape, the program's columns of B, any matrix size (C written whole, in
    one launch)."""
    from tvm import IRModule

    m = match(program, "cuda")
    func = bsr_stream.spmm(m.tile, m.feat, nb=nb, warps=warps, stages=stages, cluster=cluster, bk=bk,
                           name=program.name)
    built.mod = IRModule({program.name: func})


def _ring_resolve(program, knobs, shape: Optional[Tuple[int, int]] = None,
                  density: Optional[float] = None, skew: Optional[float] = None) -> dict:
    return _block_resolve(bsr_ring, program, knobs, shape, density, skew=skew)


def _ring_prune(program, knobs) -> Optional[str]:
    return _plan_problem(bsr_ring.plan, _ring_resolve, program, knobs)


# the tuner's small space: around the probe's winners (results/probe_bsr_bulk_r3_H200.json);
# teams stay at 1 there: 2 and 4 teams never beat 1 by more than noise on 27 cases (H200, MiniLM
# FFN-in / attention-Q and the random 70 % weights, results/bsr_small_feat_teams_H200.json)
_RING_SMALL = {"warps": (2, 4), "stages": (4, 8), "cluster": (1, 2, 4), "per_stage": (1, 2, 4), "col_split": (1, 2),
               "teams": (1,), "tma": (1, 0)}


@transformation(knobs={k: Knob(tuple(v), small=_RING_SMALL.get(k)) for k, v in bsr_ring.KNOBS.items()},
                resolve=_ring_resolve,
                prune=_ring_prune)
def bsr_ring_spmm(built, program, *, warps: int, stages: int, cluster: int, per_stage: int, col_split: int,
                  teams: int, tma: int):
    """Build ``schedules.bsr_ring``'s kernel for ``program`` into ``built.mod``: the format's
    block shape, the program's columns of B (a multiple of 8), any matrix size (C written
    whole, in one launch)."""
    from tvm import IRModule

    m = match(program, "cuda")
    func = bsr_ring.spmm(m.tile, m.feat, warps=warps, stages=stages, cluster=cluster, per_stage=per_stage,
                         col_split=col_split, teams=teams, tma=tma, name=program.name)
    built.mod = IRModule({program.name: func})


def _gather_resolve(program, knobs, shape: Optional[Tuple[int, int]] = None,
                    density: Optional[float] = None) -> dict:
    return _block_resolve(bsr_gather, program, knobs, shape, density)


def _gather_prune(program, knobs) -> Optional[str]:
    return _plan_problem(bsr_gather.plan, _gather_resolve, program, knobs)


_GATHER_SMALL = {"warps": (8, 4), "per_warp": (4, 2), "split": (1, 2, 4), "heavy": (2, 8, 16)}


@transformation(knobs={k: Knob(tuple(v), small=_GATHER_SMALL.get(k)) for k, v in bsr_gather.KNOBS.items()},
                resolve=_gather_resolve,
                prune=_gather_prune)
def bsr_gather_spmm(built, program, *, warps: int, per_warp: int, split: int, heavy: int):
    """Build ``schedules.bsr_gather``'s kernel for ``program`` into ``built.mod``: the
    format's block shape, the program's columns of B, any matrix size (C written whole, in
    one launch; no clusters, so sm_80 takes it too)."""
    from tvm import IRModule

    m = match(program, "cuda")
    func = bsr_gather.spmm(m.tile, m.feat, warps=warps, per_warp=per_warp, split=split, heavy=heavy,
                           name=program.name)
    built.mod = IRModule({program.name: func})


def _out_bytes(m: PackedSpmm) -> int:
    return 4 if m.out_dtype == "float32" else 2


def _tokens_resolve(program, knobs, shape: Optional[Tuple[int, int]] = None) -> dict:
    m = match(program, "cuda")
    return {**bsr_tokens.default_knobs(m.tile, m.feat, None if shape is None else shape[0], _out_bytes(m)), **knobs}


def _tokens_prune(program, knobs) -> Optional[str]:
    m = match(program, "cuda")
    try:
        bsr_tokens.plan(m.tile, m.feat, **_tokens_resolve(program, knobs), out_bytes=_out_bytes(m))
    except ValueError as e:
        return str(e)
    return None


@transformation(knobs={k: Knob(tuple(v)) for k, v in bsr_tokens.KNOBS.items()}, resolve=_tokens_resolve,
                prune=_tokens_prune)
def bsr_tokens_spmm(built, program, **knobs):
    """Build ``schedules.bsr_tokens``'s kernel for ``program`` into ``built.mod``: the
    format's block shape, the program's token count, epilogue and output dtype, any matrix
    size with rows and columns a multiple of 8."""
    from tvm import IRModule

    m = match(program, "cuda")
    func = bsr_tokens.spmm(m.tile, m.feat, dtype=m.dtype, out_dtype=m.out_dtype, bias=m.bias is not None,
                           bias_dtype=m.bias_dtype or "float32", activation=m.activation, name=program.name, **knobs)
    built.mod = IRModule({program.name: func})


STREAM_MAX_FEAT = 64  # above, the tiled kernel that shares its decoded tiles across more columns


def _streams(m: PackedSpmm, knobs=None) -> bool:
    """``tiled_stream`` takes this tiled SpMM: up to STREAM_MAX_FEAT columns of B, tiles of
    16-64 rows, and no knob of the other tiled kernel given."""
    if knobs and set(knobs) & set(tiled_tc.KNOBS) - set(tiled_stream.KNOBS):
        return False
    r, c = m.tile
    return m.feat <= STREAM_MAX_FEAT and r % 16 == 0 and r <= 64 and c % 16 == 0 and c <= 256


_TRANSFORMATIONS = {"srbcrs_int8": srbcrs_int8_spmm, "tiled_bitmap": tiled_tc_spmm}
CLUSTER_KERNELS = (bsr_ring_spmm, bsr_stream_spmm, tiled_stream_spmm, bsr_tokens_spmm)  # sm_90 on


def transformation_for(m: PackedSpmm, knobs=None):
    """The transformation that builds ``m``'s kernel (``knobs``: those given, which may
    name one tiled kernel over the other)."""
    stream_only = set(knobs or {}) & (set(tiled_stream.KNOBS) - set(tiled_tc.KNOBS))
    if m.layout == "tiled_bitmap" and _streams(m, knobs) and (m.clusters or stream_only):
        return tiled_stream_spmm  # without clusters only where its own knobs ask for it (then refused)
    if m.layout == "bsr_tokens":
        return bsr_tokens_spmm
    if m.layout == "bsr_blocks":
        if bsr_dispatch.gathers(m, knobs):
            return bsr_gather_spmm
        return bsr_ring_spmm if bsr_dispatch.rings(m, knobs) else bsr_stream_spmm
    return _TRANSFORMATIONS.get(m.layout, tc_pipeline_spmm)


class Built:
    """What a packed-kernel transformation fills in: the IRModule to compile (``mod``, as a
    ``tvm.s_tir.Schedule`` has); ``sized_for`` is what it may specialise for."""

    mod = None
    sized_for = None


def schedule(program, m: PackedSpmm, **knobs):
    """(built, knobs used) for a matched program; a knob the kernel does not take is a
    ValueError naming it."""
    t = transformation_for(m, knobs)
    check_applicable(knobs, [(t, (ANY,))], f"{program.name} on cuda (packed Tensor Core SpMM, {m.layout})")
    if t in CLUSTER_KERNELS and not m.clusters:
        raise ValueError(f"{t.name} launches thread-block clusters, waits on mbarriers or issues TMA copies, which "
                         f"need sm_90 or later; this target has none of them (compile for cuda:sm_90a, or leave its "
                         f"knobs out)")
    # the matrix's shape (and gathered row length), when known, pick the defaults
    shape = m.sized_for[:2] if m.sized_for else None
    if t is tc_pipeline_spmm:
        knobs = _pipeline_resolve(program, knobs, m.kc, shape)
    elif t is tiled_tc_spmm:
        knobs = _tiled_resolve(program, knobs, shape)
    elif t is tiled_stream_spmm:
        knobs = _stream_resolve(program, knobs, shape, m.density)
    elif t is bsr_stream_spmm:
        knobs = _bsr_resolve(program, knobs, shape, m.density)
    elif t is bsr_ring_spmm:
        knobs = _ring_resolve(program, knobs, shape, m.density, m.skew)
    elif t is bsr_gather_spmm:
        knobs = _gather_resolve(program, knobs, shape, m.density)
    elif t is bsr_tokens_spmm:
        knobs = _tokens_resolve(program, knobs, shape)
    else:
        knobs = _srbcrs_resolve(program, knobs, shape)
    built = Built()
    built.sized_for = m.sized_for
    used = t(built, program, **knobs)
    return built, used


def kernel_params(program, m: PackedSpmm):
    """The kernel's arguments in order, as (name, role, dtype, shape, sparse, matrix): the
    packed operands (or the instance's arrays), B, the bias, C. Shapes use "rows"/"cols"
    as the Kernel's calling convention does."""
    out = [(name, "index", m.dtype if name == "gather_values" else dtype, (None,), False, False)
           for name, dtype in OPERANDS[m.layout]]
    if m.layout in OWN_ARRAYS:
        matrix = next(b for b in program.bound.op.buffers if b.sparse and b.matrix)
        out.append((matrix.name, "input", m.dtype, (None,), True, True))
    out.append((m.b_name, "input", program.dtype.dense, (m.feat, "cols") if m.token_major else ("cols", m.feat),
                False, False))
    if m.bias is not None:
        out.append((m.bias, "input", m.bias_dtype, ("rows",) if m.bias_axis == "row" else (m.feat,), False, False))
    out.append((m.c_name, "output", m.out_dtype, (m.feat, "rows") if m.transpose_c else ("rows", m.feat), False,
                False))
    return out
