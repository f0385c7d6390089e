"""Tensor Core template for BSR SpMM (fp16 / bf16 values, fp32 accumulation) on CUDA.

It takes any operator whose first statement is a block SpMM ``C[i, k] += A[i, j] * B[j, k]``
(recognised by structure, :func:`is_block_spmm`), followed or not by element-wise dense
iterations on C (bias, scale, activation, cast: ``tensorcore_epilogue``), which the store
applies to the fp32 accumulator; and any feature count (the last N tile is guarded; 8-column
tiles use 16 x 8 fragments, ``tensorcore_n8``).

The generic lowering reads each stored block and its B rows through data-dependent
indices, which TVM cannot blockize or tensorize (tvm-0.27 notes §4.3). This template
starts from a *staged* form of the same operator instead, where every tile the Tensor
Cores read is first gathered into a constant-shape buffer:

    for bi (block rows), bj (N tiles of n_tile columns):            one thread block each
      acc[bs, n_tile] = 0                                            (fp32)
      for p in row_len(bi):                                          stored blocks of the row
        A_s[bs, bs]     = A[block p]                                 gather (16-byte copies)
        B_s[bs, n_tile] = B[col(p) * bs : +bs, bj * n_tile : +n_tile] (rows past `cols` read 0)
        acc += A_s @ B_s                                             (fp32 accumulation)
      C[bi * bs : +bs, bj * n_tile : +n_tile] = epilogue(acc)        (rows past `rows`, columns past feat skipped)

``staged_spmm`` builds that PrimFunc (same arguments as the generic kernel, so Kernel
calls it the same way); run unscheduled on llvm it is the reference semantics. With
``stages`` > 1 it is software-pipelined by hand: A_s and B_s hold ``stages`` slots and
iteration p gathers block p while the product reads block p - stages + 1 (TVM's own
pipelining pass does not version buffers allocated outside the loop, and leaves a
non-constant cp.async wait count on a loop of data-dependent length).
``bsr_tensorcore`` schedules it:

* A_s, B_s in dynamic shared memory (rows padded by 16 bytes), filled with 16-byte
  ``cp.async`` copies, one commit group per iteration, ``cp.async.wait_group stages-1``
  before the product (B rows past ``cols`` are zero-filled by a predicated copy);
* each warp owns a ``warp_m x warp_n`` tile of the output: per 16-deep k step it loads
  warp_m/16 A and warp_n/16 B fragments with ``ldmatrix`` (B with ``.trans``) and issues
  (warp_m/16)*(warp_n/16)*2 ``mma.sync.m16n8k16`` into fp32 register accumulators;
* the accumulators go to static shared memory (``mma_store``) and from there to C with
  16-byte stores, guarded at the matrix's last row;
* with ``k_split`` > 1, that many warp groups share a block row's stored blocks (each its
  own slots and accumulators), and the store sums their tiles (``staged_spmm``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from . import mma_intrin
from .knobs import ANY, Knob, check_applicable, transformation
from .tensorcore_epilogue import Epilogue, epilogue_of
from .tensorcore_heads import Operands, head_axis
from .tvm_modules import cuda_intrinsics, s_tir, T

DTYPES = ("float16", "bfloat16")
WARP = 32
MAX_WARPS = 16
_INTRINS: Dict[str, Dict[str, str]] = {}


# --------------------------------------------------------------------------- when it applies


PASS_CONFIG = {"tirx.use_async_copy": True}  # lowers the gathers marked async_scope to cp.async


def applies(program, target_kind: str, knobs: dict | None = None) -> bool:
    """True when the Tensor Core template fits: CUDA, fp16/bf16 values, the program is a
    block SpMM (:func:`is_block_spmm`, with or without an element-wise epilogue) over square
    blocks of a multiple of 16. Any feature count: a last N tile past it is guarded. ``knobs``
    do not decide it (a knob the template cannot take is refused by :func:`schedule`)."""
    if target_kind != "cuda" or program.dtype.sparse not in DTYPES:
        return False
    if not (is_block_spmm(program) and block_size(program) is not None and feat_of(program) >= 1):
        return False
    try:  # blocks so large that no default fits a thread block (e.g. 224 x 224) take the generic template
        check_knobs(block_size(program), feat_of(program), **default_knobs(block_size(program), feat_of(program)))
    except ValueError:
        return False
    return True


def schedule(program, *, shape: Optional[Tuple[int, int]] = None, **knobs):
    """The staged PrimFunc of ``program``'s shape scheduled by ``bsr_tensorcore``; returns
    (schedule, knobs used). Knobs not given take ``default_knobs`` (for ``shape``, that of
    the matrix a kernel is compiled for, where known); a knob the template does not take (a
    generic CUDA knob, an unknown one) is a ValueError."""
    check_applicable(knobs, [(bsr_tensorcore, (ANY,))], f"{program.name} on cuda (Tensor Cores)")
    chosen = _resolve(program, knobs, shape)
    check_knobs(block_size(program), feat_of(program), **chosen)
    func = staged_for(program, chosen["n_tile"], chosen["stages"], async_copy=True, k_split=chosen["k_split"])
    sch = s_tir.Schedule(func, enable_check=False)
    bsr_tensorcore(sch, program, **chosen)
    return sch, chosen


def staged_for(program, n_tile: int, stages: int = 1, async_copy: bool = False, k_split: int = 1):
    """``staged_spmm`` for ``program`` (a block SpMM): its block size, features, dtypes, its
    epilogue and its arguments in the order the generic kernel takes them."""
    parts = _spmm_parts(program)
    if parts is None or block_size(program) is None:
        raise ValueError(f"{program.name} is not a block SpMM over square blocks of a multiple of 16")
    epi = epilogue_of(program, parts[2])
    by_name = {b.name: b for b in program.buffers}
    return staged_spmm(block_size(program), feat_of(program), n_tile, program.dtype.sparse, stages, async_copy,
                       name=program.name, out_dtype=by_name[parts[2]].dtype, epilogue=epi,
                       signature=Signature.of(program, parts), heads=heads_of(program), k_split=k_split)


def is_block_spmm(program) -> bool:
    """Capability check, on the program's structure alone: the first statement is a sum over
    the sparse axis of (sparse value x dense operand) into a dense output,
    ``C[i, k] += A[i, j] * B[j, k]``, or per head ``C[i, h, k] += P[i, j, h] * B[j, h, k]``
    (``tensorcore_heads``), over one format part, the sparse and dense operands in the
    precision's dtype; what follows it, if anything, is an element-wise epilogue on C
    (``tensorcore_epilogue.epilogue_of``: bias, scale, activation, cast) whose other operands
    are dense inputs, which become further arguments of the staged function. The values may
    be edge data on the matrix's pattern (the matrix's own values then unread): their
    padding slots hold 0 as the matrix's do, so the format's slot mask goes unread too."""
    parts = _spmm_parts(program)
    return parts is not None and epilogue_of(program, parts[2]) is not None


def _spmm_parts(program):
    """(sparse operand, dense operand, output) names of a program whose first nest is a block
    SpMM statement (see :func:`is_block_spmm`), else None."""
    from sparsec.dsl import Access
    from sparsec.expr import BinOp

    op = program.bound.op
    statements = [it.statement for it in op.iterations if it.statement is not None]
    if program.bound.composite or not statements or not program.nests:
        return None
    st, nest = statements[0], program.nests[0]
    if st.reduce != "sum" or nest.reduce != "sum" or not nest.init or nest.atomic or nest.fill or nest.dense:
        return None
    v = st.value
    if not (isinstance(v, BinOp) and v.op == "*" and isinstance(v.a, Access) and isinstance(v.b, Access)):
        return None
    sparse, dense = (v.a, v.b) if v.a.buffer.sparse else (v.b, v.a)
    out = st.target
    row, col = op.structure()
    k = out.axes[-1]
    if dense.buffer.sparse or out.buffer.sparse or k.structural:
        return None
    single = out.axes == (row, k) and sparse.axes == (row, col) and dense.axes == (col, k)
    if not single and head_axis(op, sparse, dense, out) is None:
        return None
    by_name = {b.name: b for b in program.buffers}
    names = (sparse.buffer.name, dense.buffer.name, out.buffer.name)
    if any(n not in by_name for n in names) or not by_name[names[2]].dtype.startswith(("float", "bfloat")):
        return None
    if by_name[names[0]].role != "input":
        return None
    if by_name[names[0]].dtype != program.dtype.sparse or by_name[names[1]].dtype != program.dtype.sparse:
        return None  # the staged kernel's tiles take the precision's own dtype
    if sorted(program.scalars) != sorted(SCALARS):
        return None
    index = [b.name for b in program.buffers if b.role == "index"]
    if len(index) != 2 and index[2:] != [program.bound.parts[0].slot_mask]:
        return None
    read = _read_buffers(program)
    if [b for b in program.buffers if b.sparse and b.name != names[0] and b.name in read]:
        return None  # per-entry data beside the values
    return names


def _read_buffers(program) -> set:
    """Names of the buffers the program's nests read (values, targets' indices, guards)."""
    from sparsec.expr import Load, walk

    out = set()
    for nest in program.nests:
        for e in (nest.value, nest.target, getattr(nest, "write_guard", None)):
            if e is not None:
                out.update(n.buffer for n in walk(e) if isinstance(n, Load))
    return out


SCALARS = ("n_io", "rows", "cols")


@dataclass(frozen=True)
class Signature:
    """The staged function's arguments in the generic kernel's order: buffers as (name, role
    in the template or "extra", dtype, shape) and the scalars by name."""

    buffers: Tuple[Tuple[str, str, str, tuple], ...]
    scalars: Tuple[str, ...] = SCALARS

    @staticmethod
    def of(program, parts) -> "Signature":
        index = [b.name for b in program.buffers if b.role == "index"]  # the row pointer, then the block columns
        roles = {index[0]: "indptr", index[1]: "indices", parts[0]: "A", parts[1]: "B", parts[2]: "C"}
        # the slot mask, and the matrix when edge data holds the values: arguments the template does not read
        roles.update({b.name: "unused" for b in program.buffers
                      if b.name not in roles and (b.role == "index" or b.sparse)})
        return Signature(tuple((b.name, roles.get(b.name, "extra"), b.dtype, tuple(b.shape)) for b in program.buffers),
                         tuple(program.scalars))


def block_size(program):
    """The block size of a program over square blocks of a multiple of 16 (a dense row
    axis, a variable sparse axis of blocks, and two dense in-block axes of constant equal
    extent), else None."""
    axes = program.bound.parts[0].axes
    if len(axes) != 4:
        return None
    root, blocks, r, c = axes
    if root.sparse or root.variable or not (blocks.sparse and blocks.variable) or blocks.padded:
        return None
    if any(a.sparse or a.variable or getattr(a, "extent", None) is None for a in (r, c)):
        return None
    if (r.dim, c.dim) != (0, 1) or r.extent != c.extent or r.extent % 16:
        return None
    return int(r.extent)


def feat_of(program) -> int:
    """The extent of the SpMM's feature loop, over its output's last axis (0 when it has none)."""
    return _dense_extent(program, _output_axes(program)[-1].name)


def heads_of(program) -> Optional[int]:
    """The extent of a multi-head SpMM's head loop, over the output's middle axis
    (``tensorcore_heads``); None without one."""
    axes = _output_axes(program)
    return _dense_extent(program, axes[1].name) if len(axes) == 3 else None


def _output_axes(program):
    """The DSL axes of the first statement's target (``C[i, k]``: (i, k))."""
    return next(it.statement for it in program.bound.op.iterations if it.statement is not None).target.axes


def _dense_extent(program, axis: str) -> int:
    """The extent of the first nest's dense loop over ``axis`` (0 when there is none)."""
    return int(next((b.loop.extent for b in program.nests[0].blocks[-1]
                     if b.loop.role == "dense" and b.loop.name == axis), 0))


N_TILES = (128, 64, 256, 32, 16, 8)  # the declared choices of n_tile, the default first
# When a few-column grid widens its N tile (A then read once at 64 columns, not 4 times): the
# thread blocks it must keep and the columns its walks must span. The H100 sweep at 64 columns
# (``benchmarks/time_bsr_small_feat.py --sweep``): a wider tile won on 4096 x 4096 (blocks of
# 16, 32, 64) and 1024 x 4096 (16) and lost on every weight of 384 columns and at fewer blocks
WIDE_TILE_BLOCKS = 128
WIDE_TILE_COLS = 2048
LAUNCH_DEFAULT_SMEM = 48 * 1024  # what a launch may use without the opt-in attribute
MAX_SMEM = 227 * 1024  # per thread block, sm_90 (sm_80: 163 KiB: the tuner's pruning is for Hopper)


def padded_row(n: int, factor: int, offset: int) -> int:
    """The row stride ``storage_align(factor, offset)`` gives a row of n values."""
    return n + (offset - n) % factor


def launch_smem_problem(dynamic: int, static: int) -> bool:
    """True when ``dynamic`` + ``static`` bytes of shared memory cannot be launched. TVM opts a
    kernel into more than the 48 KiB launch default only when its dynamic shared memory
    alone reaches 48 KiB, so below that the two together must stay under it."""
    total = dynamic + static
    return not (total <= LAUNCH_DEFAULT_SMEM or (dynamic >= LAUNCH_DEFAULT_SMEM and total <= MAX_SMEM))


def smem_problem(bs: int, n_tile: int, stages: int, k_split: int = 1) -> Optional[str]:
    """Why the stages of A_s, B_s (dynamic) and the fp32 output tiles (static), per group of
    ``k_split``, do not fit a launch, or None."""
    dynamic = k_split * max(stages, 1) * bs * (padded_row(bs, 32, 8) + padded_row(n_tile, 32, 8)) * 2
    static = k_split * bs * n_tile * 4  # as ncu reports it for the template (the alignment adds no padding here)
    if not launch_smem_problem(dynamic, static):
        return None
    return (f"bsr_tensorcore: {k_split} group(s) of {stages} stage(s) of {bs} x {bs} blocks and {bs} x {n_tile} "
            f"tiles of B need {dynamic + static} bytes of shared memory, over what a launch gets; use fewer stages, "
            "fewer k_split groups or a narrower n_tile")


def default_knobs(bs: int, feat: int, shape: Optional[Tuple[int, int]] = None) -> dict:
    """Up to 64 feature columns, narrow N tiles (16 columns; 8 for blocks of 64 with at most
    16) and ``k_split`` groups up to 8 warps a thread block: a block row's walk is then
    short and its gathers in flight at once, which is what decides a product this small
    (the best geomean of each block size's knob sweep against dense cuBLAS on the H100:
    ``benchmarks/time_bsr_small_feat.py --sweep``). Wider: the N tile that fits (128 where
    it divides the features, 64 otherwise), 4 warps for blocks of 16 and 32 and 8 for 64
    (4 warps of 32 x 64 and 3 stages where 128 divides the features), one group. Groups, then stages, step down until the shared memory and the warps fit a
    thread block (large blocks first take wider warp tiles).

    ``shape`` (the matrix's rows and columns, when a kernel is compiled for one): from 17 to
    64 features, a matrix of at least :data:`WIDE_TILE_COLS` columns takes the widest N tile
    (64, 32) whose grid keeps :data:`WIDE_TILE_BLOCKS` thread blocks, with 64 / bs groups
    (128 / bs for 32 columns, 4 stages deep): its long walks then read A fewer times."""
    if feat <= 64:
        n_tile = 8 if feat <= 8 or (bs >= 64 and feat <= 16) else 16
        wide = _wide_n_tile(bs, feat, shape)
        if wide:
            chosen = {"n_tile": wide, "warp_m": 32 if bs % 32 == 0 else 16, "warp_n": 16,
                      "stages": 4 if wide == 32 else 2, "k_split": max(1, (128 if wide == 32 else 64) // bs)}
        else:
            warp_m = 32 if feat <= 16 and bs % 32 == 0 else 16
            chosen = {"n_tile": n_tile, "warp_m": warp_m, "warp_n": min(n_tile, 16),
                      "stages": 4 if bs == 16 and feat <= 16 else 2, "k_split": max(1, 8 // (bs // warp_m))}
    elif bs == 16:
        n_tile = 128 if feat % 128 == 0 else 64
        chosen = {"n_tile": n_tile, "warp_m": 16, "warp_n": 32 if n_tile == 128 else 16, "stages": 3, "k_split": 1}
    elif bs == 32:
        n_tile = 128 if feat % 128 == 0 else 64
        chosen = {"n_tile": n_tile, "warp_m": 32, "warp_n": 32 if n_tile == 128 else 16, "stages": 2, "k_split": 1}
    elif bs == 64 and feat % 128 == 0:
        # 4 warps of 32 x 64, 3 stages: 1.07-1.11x the 8 warps of 32 x 32, 2 stages, on the
        # 4096 x 4096 and 11008 x 4096 weights at 70 and 90 % and 4096 columns (H200,
        # results/weights_bsr_sweep_H200.json; the other sets swept there were slower), and
        # 1.04-1.15x on those and 3072 x 768 at 128 and 1024 (weights_bsr64_default_H200.json)
        chosen = {"n_tile": 128, "warp_m": 32, "warp_n": 64, "stages": 3, "k_split": 1}
    else:
        n_tile = 128 if feat % 128 == 0 else 64
        chosen = {"n_tile": n_tile, "warp_m": 32 if bs % 32 == 0 else 16, "warp_n": 32, "stages": 2, "k_split": 1}
    while smem_problem(bs, chosen["n_tile"], chosen["stages"], chosen["k_split"]) or \
            chosen["k_split"] * (bs // chosen["warp_m"]) * (chosen["n_tile"] // chosen["warp_n"]) > MAX_WARPS:
        if (bs // chosen["warp_m"]) * (chosen["n_tile"] // chosen["warp_n"]) > MAX_WARPS:  # large blocks
            if chosen["warp_n"] * 2 <= min(chosen["n_tile"], 64):
                chosen["warp_n"] *= 2
            elif chosen["warp_m"] * 2 <= 64 and bs % (chosen["warp_m"] * 2) == 0:
                chosen["warp_m"] *= 2
            else:
                break
        elif chosen["k_split"] > 1:
            chosen["k_split"] //= 2
        elif chosen["stages"] > 1:
            chosen["stages"] -= 1  # e.g. 64 x 64 blocks with 64 columns: 2 stages do not fit a launch
        else:
            break
    return chosen


def _wide_n_tile(bs: int, feat: int, shape: Optional[Tuple[int, int]]) -> Optional[int]:
    """The wider N tile (64 or 32) :func:`default_knobs` gives a matrix of ``shape`` at
    ``feat`` features, or None (the narrow tile stays)."""
    if shape is None or feat <= 16 or int(shape[1]) < WIDE_TILE_COLS:
        return None
    block_rows = -(-int(shape[0]) // bs)
    return next((w for w in (64, 32) if w // 2 < feat and block_rows * -(-feat // w) >= WIDE_TILE_BLOCKS), None)


def vector_width(feat: int, widest: int) -> int:
    """The widest vector (in elements, at most ``widest``) that divides a row of ``feat``:
    a row then starts on its alignment, and a vector never crosses the last column."""
    w = widest
    while feat % w:
        w //= 2
    return w


# --------------------------------------------------------------------------- the staged operator


def staged_spmm(bs: int, feat: int, n_tile: int, dtype: str, stages: int = 1, async_copy: bool = False,
                name: str = "spmm", out_dtype: str = "float32", epilogue: Optional[Epilogue] = None,
                signature: Optional["Signature"] = None, heads: Optional[int] = None, k_split: int = 1):
    """The staged BSR SpMM PrimFunc (arguments as the generic kernel's: indptr, indices, A, B,
    C, n_io, rows, cols, or ``signature``'s order with its extra operands). Staging buffers
    are global; the schedule moves them on chip.

    ``feat`` need not be a multiple of ``n_tile``: the last N tile reads zeros past the last
    column (a predicated copy) and stores only the columns that exist. Each output element
    is stored as ``epilogue.apply(cast(out_dtype, acc))`` (``tensorcore_epilogue``).

    ``stages`` > 1 software-pipelines the block loop by hand: A_s and B_s hold ``stages``
    slots, and iteration p gathers block p into slot p % stages while the product reads
    block p - stages + 1 (the loop runs stages - 1 extra iterations to drain). With
    ``async_copy`` (CUDA) the gathers are marked for ``cp.async``: each iteration commits
    one copy group (empty past the row's end) and the product waits until at most
    stages - 1 groups are in flight. B rows of fewer than 4 bytes' alignment (odd ``feat``)
    are copied synchronously (cp.async moves 4, 8 or 16 bytes).

    ``heads`` (an int): a multi-head SpMM (``tensorcore_heads``): A is (stored slots, heads),
    B (cols, heads, feat), C (rows, heads, feat), one thread block per (block row, head, N
    tile); with more than one head a head's A values are ``heads`` apart, so their gather is
    synchronous.

    ``k_split`` > 1 splits a block row's stored blocks over that many groups inside the
    thread block: group g takes blocks g, g + k_split, ... with its own staging slots and
    accumulator, and the store sums the groups' accumulators. Every group walks the same
    number of steps (a group past the row's end gathers zeros), so the barriers stay
    uniform. With few feature columns a row's walk is a chain of dependent gathers; the
    groups put k_split of them in flight at once."""
    BS, F, NT, DT, S, OUT, KS = bs, feat, n_tile, dtype, stages, out_dtype, k_split
    NJ = -(-F // NT)
    TAIL = F % NT != 0
    zero = T.Cast(DT, 0)
    b_async = async_copy and vector_width(F, 8) >= 2
    O = Operands(heads, NJ)
    a_async = async_copy and O.contiguous_values
    NY = O.grid_y

    @T.prim_func(s_tir=True)
    def spmm(indptr_h: T.handle, indices_h: T.handle, A_h: T.handle, B_h: T.handle, C_h: T.handle,
             n_io: T.int32, rows: T.int32, cols: T.int32):
        T.func_attr({"global_symbol": name, "tirx.noalias": True})
        nnz = T.int32()
        indptr = T.match_buffer(indptr_h, (n_io + 1,), "int32")
        indices = T.match_buffer(indices_h, (nnz,), "int32")
        A = T.match_buffer(A_h, O.a_shape(nnz * BS * BS), DT)
        B = T.match_buffer(B_h, O.dense_shape(cols, F), DT)
        C = T.match_buffer(C_h, O.dense_shape(rows, F), OUT)
        for bi, by in T.grid(T.max(n_io, 1), NY):
            with T.sblock("tile"):
                vbi, vby = T.axis.remap("SS", [bi, by])
                vbj = T.meta_var(O.tile(vby))  # the N tile (the grid index itself with one head)
                T.reads(indptr[0:n_io + 1], indices[0:nnz], O.whole(A), O.whole(B))
                T.writes(O.c_tile(C, rows, vby, vbj * NT, T.min(vbj * NT + NT, F)))
                A_s = T.sblock_alloc_buffer((KS, S, BS, BS), DT)
                B_s = T.sblock_alloc_buffer((KS, S, BS, NT), DT)
                acc = T.sblock_alloc_buffer((KS, BS, NT), "float32")
                C_s = T.sblock_alloc_buffer((KS, BS, NT), "float32")
                for g, i, j in T.grid(KS, BS, NT):
                    with T.sblock("acc_init"):
                        vg, vi, vj = T.axis.remap("SSS", [g, i, j])
                        T.reads()
                        T.writes(acc[vg, vi, vj])
                        acc[vg, vi, vj] = T.float32(0)
                # a grid padded to one block row (n_io = 0) reads indptr[0] - indptr[0] = 0 blocks
                start = T.int32(indptr[T.min(vbi, n_io)])
                row_len = T.int32(indptr[T.min(vbi + 1, n_io)] - start)
                steps = T.meta_var(_steps(row_len, KS))  # every group's steps
                for p in range(steps + S - 1):
                    with T.attr(0, "async_commit_queue_scope" if async_copy else "sparsec_copy", 0):
                        if p < steps:
                            with T.attr(0, "async_scope" if a_async else "sparsec_copy", 1):
                                for g, i, k in T.grid(KS, BS, BS):
                                    with T.sblock("A_load"):
                                        vp = T.axis.opaque(steps + S - 1, p)
                                        vg, vi, vk = T.axis.remap("SSS", [g, i, k])
                                        a_at = T.meta_var(O.a_at(((start + _block(vp, vg, KS, row_len)) * BS + vi) * BS
                                                                 + vk, vby))
                                        T.reads(A[a_at])
                                        T.writes(A_s[vg, 0:S, vi, vk])  # any slot: covers the product's reads
                                        if KS == 1:
                                            A_s[vg, vp % S, vi, vk] = A[a_at]
                                        else:  # a group past the row's end gathers zeros
                                            A_s[vg, vp % S, vi, vk] = T.if_then_else(vp * KS + vg < row_len, A[a_at],
                                                                                     zero)
                            with T.attr(0, "async_scope" if b_async else "sparsec_copy", 1):
                                for g, k, j in T.grid(KS, BS, NT):
                                    with T.sblock("B_load"):
                                        vp = T.axis.opaque(steps + S - 1, p)
                                        vg, vk, vj = T.axis.remap("SSS", [g, k, j])
                                        col = T.meta_var(indices[start + _block(vp, vg, KS, row_len)])
                                        b_at = T.meta_var(O.dense_at(col * BS + vk, vby, vbj * NT + vj))
                                        T.reads(indices[start + _block(vp, vg, KS, row_len)], B[b_at])
                                        T.writes(B_s[vg, 0:S, vk, vj])
                                        B_s[vg, vp % S, vk, vj] = T.if_then_else(
                                            _b_in_range(col * BS + vk < cols, vp * KS + vg < row_len,
                                                        vbj * NT + vj < F, KS, TAIL),
                                            B[b_at], zero)  # rows past cols, columns past F read 0
                    if p >= S - 1:
                        use = T.int32((p + 1) % S)  # the slot of step p - S + 1 (a let: affine for blockize)
                        with T.attr(0, "async_wait_queue_scope" if async_copy else "sparsec_wait", 0):
                            with T.attr(0, "async_wait_inflight_count" if async_copy else "sparsec_wait", S - 1):
                                with T.sblock("step"):  # fragments of slot `use` are allocated in here
                                    T.reads(acc[0:KS, 0:BS, 0:NT], A_s[0:KS, use, 0:BS, 0:BS],
                                            B_s[0:KS, use, 0:BS, 0:NT])
                                    T.writes(acc[0:KS, 0:BS, 0:NT])
                                    for g, i, j, k in T.grid(KS, BS, NT, BS):
                                        with T.sblock("mma"):
                                            vg, vi, vj, vk = T.axis.remap("SSSR", [g, i, j, k])
                                            T.reads(acc[vg, vi, vj], A_s[vg, use, vi, vk], B_s[vg, use, vk, vj])
                                            T.writes(acc[vg, vi, vj])
                                            acc[vg, vi, vj] = acc[vg, vi, vj] + T.Cast(
                                                "float32", A_s[vg, use, vi, vk]) * T.Cast("float32", B_s[vg, use, vk, vj])
                for g, i, j in T.grid(KS, BS, NT):
                    with T.sblock("acc_out"):
                        vg, vi, vj = T.axis.remap("SSS", [g, i, j])
                        T.reads(acc[vg, vi, vj])
                        T.writes(C_s[vg, vi, vj])
                        C_s[vg, vi, vj] = acc[vg, vi, vj]
                for i, j in T.grid(BS, NT):
                    with T.sblock("C_store"):
                        vi, vj = T.axis.remap("SS", [i, j])
                        if TAIL:
                            T.where(vbi * BS + i < rows and vbj * NT + j < F)
                        else:
                            T.where(vbi * BS + i < rows)
                        T.reads(C_s[0:KS, vi, vj])
                        T.writes(C[O.dense_at(vbi * BS + vi, vby, vbj * NT + vj)])
                        C[O.dense_at(vbi * BS + vi, vby, vbj * NT + vj)] = T.Cast(OUT, _group_sum(C_s, vi, vj, KS))

    if epilogue is None and signature is None:
        return spmm
    return with_operands(spmm, signature, epilogue)


def _steps(row_len, k_split: int):
    """Steps of the walk over a row of ``row_len`` stored blocks with ``k_split`` groups."""
    return row_len if k_split == 1 else (row_len + k_split - 1) // k_split


def _block(step, group, k_split: int, row_len):
    """The stored block (from the row's first) that ``group`` gathers at ``step``: its
    (step * k_split + group)-th, held inside the row (a group past the end reads the row's
    last block, whose values its predicate turns to zeros)."""
    if k_split == 1:
        return step
    from tvm import tirx

    return tirx.min(step * k_split + group, row_len - 1)


def _b_in_range(row_ok, block_ok, col_ok, k_split: int, tail: bool):
    """The predicate of a gathered element of B: its row inside the matrix, its block inside
    the row (with k_split groups) and its column inside the features (a tail tile)."""
    from tvm import tirx

    cond = row_ok
    if k_split > 1:
        cond = tirx.And(block_ok, cond)
    if tail:
        cond = tirx.And(cond, col_ok)
    return cond


def _group_sum(C_s, vi, vj, k_split: int):
    """The groups' accumulators of output element (vi, vj), summed (one group: its own)."""
    total = C_s[0, vi, vj]
    for g in range(1, k_split):
        total = total + C_s[g, vi, vj]
    return total


def with_operands(func, signature: Optional[Signature], epilogue: Optional[Epilogue]):
    """``func`` (``staged_spmm``'s own arguments) taking ``signature``'s arguments in its
    order, the extra operands as buffers of their declared shapes (unused ones of any
    shape), and storing each output element through ``epilogue``."""
    import tvm
    from tvm import tirx

    from .tir_rewrite import map_blocks, with_fields

    base = list(func.params)
    by_role = {"indptr": base[0], "indices": base[1], "A": base[2], "B": base[3], "C": base[4]}
    scalars = dict(zip(SCALARS, base[5:]))
    sig = signature or Signature(tuple((r, r, "", ()) for r in ("indptr", "indices", "A", "B", "C")))
    params, extras = [], {}
    for name, role, dtype, shape in sig.buffers:
        if role == "unused":  # taken, never read: any extent (the call binds its own size vars)
            params.append(tirx.decl_buffer([tirx.Var(f"{name}_n{d}", "int32") for d in range(len(shape))], dtype, name))
            continue
        if role != "extra":
            params.append(by_role[role])
            continue
        extras[name] = tirx.decl_buffer([_shape_dim(d, scalars, name) for d in shape], dtype, name)
        params.append(extras[name])
    params += [scalars[s] for s in sig.scalars]
    regions = [tirx.BufferRegion(b, [tvm.ir.Range.from_min_extent(0, d) for d in b.shape]) for b in extras.values()]

    def rewrite(block):
        if block.name_hint == "tile":
            return with_fields(block, body=map_blocks(block.body, rewrite), reads=list(block.reads) + regions)
        if block.name_hint != "C_store":
            return None
        store = block.body
        value = store.value
        if epilogue is not None:
            value = epilogue.apply(value, store.indices, extras)
            if str(value.ty) != str(store.buffer.dtype):
                value = tirx.Cast(str(store.buffer.dtype), value)
        return with_fields(block, body=tirx.BufferStore(store.buffer, value, store.indices),
                           reads=list(block.reads) + regions)

    body = map_blocks(func.body, rewrite)
    return tirx.PrimFunc(params, body, func.ret_type, func.attrs)


def _shape_dim(d, scalars, name):
    """One dimension of an extra operand's declared shape (a flat expression of the sizes)."""
    from sparsec.expr import BinOp, Const, Var

    if isinstance(d, Const):
        return int(d.value)
    if isinstance(d, Var) and d.name in scalars:
        return scalars[d.name]
    if isinstance(d, BinOp) and d.op in ("+", "*", "-"):
        a, b = _shape_dim(d.a, scalars, name), _shape_dim(d.b, scalars, name)
        return a + b if d.op == "+" else a * b if d.op == "*" else a - b
    raise ValueError(f"the Tensor Core template cannot size the operand {name}: its shape holds {d!r}")


# --------------------------------------------------------------------------- tensor intrinsics


def intrinsics(dtype: str) -> Dict[str, str]:
    """Names of the ldmatrix / mma / fill / store intrinsics for ``dtype`` (TVM's for float16;
    bf16 variants of ldmatrix and mma are registered here, as TVM 0.27 ships none)."""
    if dtype in _INTRINS:
        return _INTRINS[dtype]
    cu = cuda_intrinsics()  # parses every TVM intrinsic (9 s on 2 cores)

    from tvm.s_tir import TensorIntrin

    # fragments -> static shared memory (the f32 staging of C is kept out of the merged
    # dynamic allocation: TVM 0.27 mistypes mma_store's pointer when it shares bytes with f16)
    store = "sparsec_mma_store_16x16_f32_shared"
    if TensorIntrin.get(store, allow_missing=True) is None:
        TensorIntrin.register(store, *cu.get_mma_store_intrin("float32", 8, "shared", True))
    names = {"fill": cu.MMA_fill_16x16_f32_INTRIN, "store": store}
    if dtype == "float16":
        names.update(ld_a=cu.LDMATRIX_f16_A_DYN_INTRIN, ld_b=cu.LDMATRIX_f16_B_DYN_INTRIN,
                     mma=cu.MMA_f16f16f32_INTRIN)
    else:
        names.update(_register_bf16(cu))
    _INTRINS[dtype] = names
    return names


def _register_bf16(cu) -> Dict[str, str]:
    """ldmatrix (A, B from dynamic shared memory) and mma.m16n8k16 bf16 x bf16 -> fp32,
    following TVM's float16 generators (ldmatrix moves 16-bit words, whatever their type)."""
    from tvm.s_tir import TensorIntrin

    layout = cu.shared_16x16_to_ldmatrix_32x8_layout
    names = {"ld_a": "sparsec_ldmatrix_bf16_a_dyn", "ld_b": "sparsec_ldmatrix_bf16_b_dyn",
             "mma": "sparsec_mma_bf16bf16f32"}
    for key, trans in (("ld_a", False), ("ld_b", True)):  # A as is; B's k rows are contiguous: .trans
        if TensorIntrin.get(names[key], allow_missing=True) is None:
            TensorIntrin.register(names[key], *mma_intrin.ldmatrix(
                "bfloat16", 16, 16, layout, trans=trans, num=4, lane_address=lambda s0, tx: s0 * (tx % 16) + 8 * (tx // 16)))
    if TensorIntrin.get(names["mma"], allow_missing=True) is None:
        TensorIntrin.register(names["mma"], *mma_intrin.mma("bfloat16", "bf16", 16, layout, layout, layout))
    return names


# --------------------------------------------------------------------------- the schedule


def check_knobs(bs: int, feat: int, n_tile: int, warp_m: int, warp_n: int, stages: int, k_split: int = 1) -> int:
    """Validate a knob combination for blocks of ``bs``; returns the warps per thread block."""
    if warp_m > bs or bs % warp_m:
        raise ValueError(f"bsr_tensorcore: warp_m should divide the block size {bs}, got {warp_m}")
    if warp_n > n_tile or n_tile % warp_n:
        raise ValueError(f"bsr_tensorcore: warp_n should divide n_tile {n_tile}, got {warp_n}")
    if isinstance(k_split, bool) or not isinstance(k_split, int) or k_split < 1:
        raise ValueError(f"bsr_tensorcore: k_split should be a positive int, got {k_split!r}")
    warps = k_split * (bs // warp_m) * (n_tile // warp_n)
    if warps > MAX_WARPS:
        raise ValueError(f"bsr_tensorcore: k_split*(bs/warp_m)*(n_tile/warp_n) should be at most {MAX_WARPS} warps, "
                         f"got {warps}")
    problem = smem_problem(bs, n_tile, stages, k_split)
    if problem:
        raise ValueError(problem)
    return warps


def _resolve(program, knobs, shape: Optional[Tuple[int, int]] = None) -> dict:
    """The knobs the template runs with: ``default_knobs`` for the block size, width and
    (where known) the matrix's shape, overridden by those given."""
    return {**default_knobs(block_size(program), feat_of(program), shape), **knobs}


def _prune(program, knobs):
    chosen = _resolve(program, knobs)
    try:
        check_knobs(block_size(program), feat_of(program), **chosen)
    except ValueError as e:
        return str(e)
    feat = feat_of(program)
    if any(feat <= n < chosen["n_tile"] for n in N_TILES):  # the same columns in a wider, emptier tile
        return f"bsr_tensorcore: n_tile {chosen['n_tile']} is wider than the {feat} features need"
    return None


def warp_tiles(sch: s_tir.Schedule, blk, wm: int, fm: int, wn: int, fn: int, fw: int = 16, grouped: bool = False):
    """(i, j) of ``blk`` -> warps (threadIdx.y) x fragments x 16 x ``fw``; returns the
    fragment loops' innermost. ``grouped``: the loop before i is a group axis (``k_split``),
    whose groups take further warps."""
    loops = sch.get_loops(blk)
    i, j = loops[-2:]
    i0, i1, i2 = sch.split(i, [wm, fm, 16])
    j0, j1, j2 = sch.split(j, [wn, fn, fw])
    sch.reorder(i0, j0, i1, j1, i2, j2)
    sch.bind(sch.fuse(*([loops[-3]] if grouped else []), i0, j0), "threadIdx.y")
    return i2


def warp_mma(sch: s_tir.Schedule, mma, wm: int, fm: int, wn: int, fn: int, fw: int = 16, grouped: bool = False):
    """The product block ``mma`` (i, j, k) -> warps (threadIdx.y), 16-deep k steps, fragments,
    16 x ``fw`` x 16 tiles blockized; returns the warp-scope copies of its two operands,
    placed at the k step (to be laid out and tensorized by the caller). ``grouped`` as for
    :func:`warp_tiles`."""
    loops = sch.get_loops(mma)
    i, j, k = loops[-3:]
    i0, i1, i2 = sch.split(i, [wm, fm, 16])
    j0, j1, j2 = sch.split(j, [wn, fn, fw])
    k0, k1 = sch.split(k, [None, 16])
    sch.reorder(i0, j0, k0, i1, j1, i2, j2, k1)
    sch.bind(sch.fuse(*([loops[-4]] if grouped else []), i0, j0), "threadIdx.y")
    tile_mma = sch.blockize(i2)
    a_w = sch.cache_read(tile_mma, 1, "warp")  # reads: acc, then the two operands
    b_w = sch.cache_read(tile_mma, 2, "warp")
    sch.compute_at(a_w, k0)
    sch.compute_at(b_w, k0)
    return a_w, b_w


# the tuner's small space: every N tile that fits the features (``_prune`` drops wider ones;
# the first choice alone would be pruned at few features), two warp tiles, three pipeline depths,
# three group counts (8 groups won most few-column cases of the H100 sweep)
@transformation(knobs={"n_tile": Knob(N_TILES, small=N_TILES), "warp_m": Knob((32, 16, 64), small=(32, 16)),
                       "warp_n": Knob((32, 16, 64, 8), small=(32, 16, 8)),
                       "stages": Knob((2, 1, 3, 4, 6, 8), small=(2, 4, 8)),
                       "k_split": Knob((1, 2, 4, 8), small=(1, 4, 8))},
                resolve=_resolve, prune=_prune)
def bsr_tensorcore(sch: s_tir.Schedule, program, *, n_tile: int, warp_m: int, warp_n: int, stages: int,
                   k_split: int = 1):
    """Schedule ``staged_spmm`` onto Tensor Cores (see the module docstring).

    Requires: ``sch`` holds ``staged_spmm(bs, feat, n_tile, dtype)``.
    Before: tile(bi, bj): acc = 0; for p: A_s = ..; B_s = ..; acc += A_s @ B_s;  C = acc
            (bj: heads x N tiles for a multi-head SpMM, ``tensorcore_heads``)
    After:  bx = bi, by = bj, ty = k_split groups x warps, tx = lanes;  acc in mma fragments;
            for p (pipelined, cp.async): ldmatrix -> mma.sync per 16-deep step;  C via shared
            (the groups' tiles summed)
    """
    bs, feat = block_size(program), feat_of(program)
    warps = check_knobs(bs, feat, n_tile, warp_m, warp_n, stages, k_split)
    names = intrinsics(program.dtype.sparse)
    layout = cuda_intrinsics().shared_16x16_to_ldmatrix_32x8_layout

    # output fragments 16 x fw: 16 x 16 (two m16n8k16 each), or 16 x 8 for warp_n = 8 (one)
    fw = 8 if warp_n == 8 else 16
    if fw == 8:
        from . import tensorcore_n8 as n8

        names = {**names, **n8.intrinsics(program.dtype.sparse)}
        c_layout, b_layout = n8.c_layout, n8.b_layout
    else:
        c_layout = b_layout = layout

    def frag(g, i, j):
        return (g, i // 16, j // fw, *c_layout(i % 16, j % fw))

    def slot_frag(g, s, i, j):
        return (g, s, i // 16, j // 16, *layout(i % 16, j % 16))

    def slot_frag_b(g, s, k, j):
        return (g, s, k // 16, j // fw, *b_layout(k % 16, j % fw))

    tile = sch.get_sblock("tile")
    bi, bj = sch.get_loops(tile)
    sch.bind(bi, "blockIdx.x")
    sch.bind(bj, "blockIdx.y")
    fm, fn = warp_m // 16, warp_n // fw
    wm, wn = bs // warp_m, n_tile // warp_n

    # on-chip buffers: A_s, B_s (dynamic shared), acc (mma fragments, per warp)
    mma = sch.get_sblock("mma")
    sch.set_scope(sch.get_sblock("A_load"), 0, "shared.dyn")
    sch.set_scope(sch.get_sblock("B_load"), 0, "shared.dyn")
    sch.set_scope(sch.get_sblock("acc_init"), 0, "warp")

    # mma: (i, j, k) -> ty (warps), k steps, fragments, 16 x fw x 16 tiles
    a_w, b_w = warp_mma(sch, mma, wm, fm, wn, fn, fw, grouped=True)  # reads: acc, A_s, B_s

    # acc_init and the accumulators' way out (fragments -> shared -> C, the groups summed)
    init = sch.get_sblock("acc_init")
    warp_tiles(sch, init, wm, fm, wn, fn, fw, grouped=True)
    store = sch.get_sblock("C_store")
    acc_s = sch.get_sblock("acc_out")
    sch.set_scope(acc_s, 0, "shared")
    warp_tiles(sch, acc_s, wm, fm, wn, fn, fw, grouped=True)
    # C (and the epilogue's operands) in vectors that divide a row: a tail tile never crosses it
    i, j = sch.get_loops(store)[-2:]
    _, ty, tx, vec = sch.split(sch.fuse(i, j), [None, warps, WARP, vector_width(feat, 4)])
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    sch.vectorize(vec)

    # gathers: 16-byte vectors over all threads (B: the widest that divides its rows; A with
    # heads: single values, a head's being ``heads`` apart)
    a_width = 8 if Operands(heads_of(program)).contiguous_values else 1
    for name, width in (("A_load", a_width), ("B_load", vector_width(feat, 8))):
        blk = sch.get_sblock(name)
        g, i, k = sch.get_loops(blk)[-3:]
        per_group = bs * (bs if name == "A_load" else n_tile)
        # whole rounds of every thread per group: the group loop stays outside (a vector then
        # never needs the group from its own index, which TVM cannot always prove constant)
        spread = sch.fuse(i, k) if k_split > 1 and per_group % (warps * WARP * width) == 0 else sch.fuse(g, i, k)
        _, ty, tx, vec = sch.split(spread, [None, warps, WARP, width])
        sch.bind(ty, "threadIdx.y")
        sch.bind(tx, "threadIdx.x")
        sch.vectorize(vec)
        sch.storage_align(blk, 0, axis=-2, factor=32, offset=8)  # rows 16 bytes apart: no bank conflicts
    sch.storage_align(acc_s, 0, axis=-2, factor=32, offset=4)

    # fragments: layouts, then tensorize
    for blk, (h, w) in ((a_w, (16, 16)), (b_w, (16, fw))):
        a, b = sch.get_loops(blk)[-2:]
        a0, a1 = sch.split(a, [None, h])
        b0, b1 = sch.split(b, [None, w])
        sch.reorder(a0, b0, a1, b1)
    sch.transform_layout(a_w, ("write", 0), slot_frag)
    sch.transform_layout(b_w, ("write", 0), slot_frag_b)
    sch.transform_layout(init, ("write", 0), frag)
    sch.tensorize(sch.get_loops(a_w)[-2], names["ld_a"])
    sch.tensorize(sch.get_loops(b_w)[-2], names["ld_b"])
    sch.tensorize(sch.get_loops(sch.get_sblock("mma"))[-3], names["mma"])
    sch.tensorize(sch.get_loops(init)[-2], names["fill"])
    sch.tensorize(sch.get_loops(acc_s)[-2], names["store"])
