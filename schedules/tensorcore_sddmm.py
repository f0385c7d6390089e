"""Tensor Core template for SDDMM on BSR blocks (fp16 / bf16 operands, fp32 scores) on CUDA.

Block-sparse attention scores: ``S[i, j] = sum_k Q[i, k] * K[j, k]`` for every slot of every
stored bs x bs block. A stored block at block row bi and block column bj is the dense product
``Q[bi*bs : +bs, :] @ K[bj*bs : +bs, :].T``: both operands are row-major over the features,
which is exactly mma's ``row.col`` layout (K's rows are the columns of B). As for BSR SpMM
(``schedules/tensorcore.py``) the generic lowering reads its operands through data-dependent
indices, which TVM cannot tensorize, so this template starts from a *staged* form:

    for bi (block rows), g (row_split CTAs per block row):            one thread block each
      Q_s[bs, FP] = Q[bi*bs : +bs, :]                                  (rows past `rows`, k >= feat: 0)
      for t over the stored blocks g, g + row_split, ... of row bi:
        K_s[bs, FP] = K[col(p)*bs : +bs, :]                            (rows past `cols`, k >= feat: 0)
        acc[bs, bs] = Q_s @ K_s.T                                      (fp32 accumulation)
        S[block p] = epilogue(acc)                                     (the statement's scale / A factor)

FP is feat rounded up to 16: the tail columns of Q_s and K_s are zeroed once and never
copied over, so the mma's last 16-deep step adds 0. The epilogue writes every slot of the
block as the generic kernel does: the statement's value where the slot is in range (and
valid, when the lowering guards the statement with the slot mask), else 0.

Accepted (by structure, ``match``): one sparse iteration ``S[i, j] += c * Q[i, k] * K[j, k]``
(c: constant factors, optional) into a sparse output on the structure, optionally followed
by one in-place rewrite ``S[i, j] = c' * [A[i, j] *] S[i, j]`` (A: the matrix), on one BSR
part of square blocks of 16, 32 or 64, fp16/bf16 with the precision's own dtypes, feat a
multiple of 8 (16-byte copies). Anything else takes the CUDA-core template (correct, slower).

``staged_sddmm`` builds the PrimFunc with the generic kernel's arguments (Kernel calls it
the same way); unscheduled on llvm it is the reference semantics. ``bsr_tensorcore_sddmm``
schedules it: Q_s / K_s in dynamic shared memory filled by 16-byte ``cp.async`` (K_s in
``stages`` slots, software-pipelined by hand as in tensorcore.py), per warp a warp_m x
warp_n tile of the block's scores: ``ldmatrix`` fragments (K's with TVM's "B transposed"
addressing) and ``mma.sync.m16n8k16`` per 16-deep step, fragments -> shared -> S with the
epilogue on 16-byte stores.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from . import mma_intrin, tensorcore
from .knobs import ANY, Knob, check_applicable, transformation
from .tvm_modules import cuda_intrinsics, s_tir, T, tirx

DTYPES = tensorcore.DTYPES
BLOCKS = (16, 32, 64)
WARP = tensorcore.WARP
MAX_WARPS = tensorcore.MAX_WARPS
VEC = 8  # 16-bit values per 16-byte copy
PASS_CONFIG = tensorcore.PASS_CONFIG
LAUNCH_DEFAULT_SMEM = tensorcore.LAUNCH_DEFAULT_SMEM
MAX_SMEM = tensorcore.MAX_SMEM
_INTRINS: Dict[str, Dict[str, str]] = {}


# --------------------------------------------------------------------------- when it applies


@dataclass(frozen=True)
class SddmmShape:
    """What the staged function needs to know of a matched program."""

    bs: int
    feat: int
    dtype: str
    params: Tuple[str, ...]  # the kernel's buffer roles in argument order: indptr, indices, valid, A, Q, K, S
    scale: float  # product of the constant factors of both statements
    sampled: bool  # the rewrite multiplies by the matrix A
    masked: bool  # the statement is guarded by the slot mask (``valid`` is an argument)


def applies(program, target_kind: str, knobs: Optional[dict] = None) -> bool:
    """True when the template fits (``match``) on CUDA and every knob given is one of its own
    (a CUDA-core knob such as ``lanes`` asks for the CUDA-core template), and the shared memory
    of the default (or given) stages fits."""
    if target_kind != "cuda" or (knobs and set(knobs) - set(bsr_tensorcore_sddmm.knobs)):
        return False
    shape = match(program)
    if shape is None:
        return False
    chosen = resolve_knobs(shape, knobs or {})
    return smem_problem(shape.bs, shape.feat, chosen["stages"]) is None


def match(program) -> Optional[SddmmShape]:
    """The program's SDDMM shape when it is a block SDDMM this template computes, else None.

    On structure alone: no outer axes, one BSR-like part (dense row axis, variable sparse
    axis of blocks, two dense in-block axes of equal extent 16/32/64), one or two sparse
    iterations as in the module docstring, default dtypes, feat a multiple of 8."""
    op = program.bound.op
    if program.dtype.sparse not in DTYPES or program.bound.composite or op.outer_axes():
        return None
    bs = tensorcore.block_size(program)
    if bs not in BLOCKS or any(b.dtype is not None for b in op.buffers):
        return None
    its = [it for it in op.iterations if it.statement is not None]
    if len(its) not in (1, 2) or len(program.nests) != len(its) or len(its) != len(op.iterations):
        return None
    row, col = op.structure()
    dot = its[0].statement
    out = dot.target.buffer
    if (dot.reduce != "sum" or not out.sparse or out.role != "output" or dot.target.axes != (row, col)
            or out.axes != (row, col) or not op.is_sparse_iteration(its[0])):
        return None
    nest = program.nests[0]
    if nest.reduce != "sum" or not nest.init or nest.atomic or nest.fill:
        return None
    scale, reads = _factors(dot.value)
    if scale is None or len(reads) != 2 or any(r.buffer.sparse for r in reads):
        return None
    q = next((r for r in reads if r.axes[0] is row), None)
    k_op = next((r for r in reads if r.axes[0] is col), None)
    if q is None or k_op is None or len(q.axes) != 2 or len(k_op.axes) != 2 or q.axes[1] is not k_op.axes[1]:
        return None
    k = q.axes[1]
    kinds = [("R" if a is k else "S") for a in its[0].axes]
    if k.structural or len(its[0].axes) != 3 or not any(a is k for a in its[0].axes) or list(its[0].kinds) != kinds:
        return None
    sampled = False
    if len(its) == 2:
        st = its[1].statement
        if (st.reduce is not None or st.target.buffer is not out or st.target.axes != (row, col)
                or not op.is_sparse_iteration(its[1]) or list(its[1].kinds) != ["S"] * len(its[1].axes)):
            return None
        more, reads2 = _factors(st.value)
        if more is None:
            return None
        scale *= more
        selfs = [r for r in reads2 if r.buffer is out]
        others = [r for r in reads2 if r.buffer is not out]
        if (len(selfs) != 1 or selfs[0].axes != (row, col) or len(others) > 1
                or any(not (r.buffer.matrix and r.axes == (row, col)) for r in others)):
            return None
        sampled = bool(others)
    feat = int(program.bound.extent(k))
    if feat % VEC:
        return None
    part = program.bound.parts[0]
    names = {b.name: b for b in program.buffers}
    role_of = {part.axes[1].indptr: "indptr", part.axes[1].indices: "indices", q.buffer.name: "Q",
               k_op.buffer.name: "K", out.name: "S"}
    if part.slot_mask:
        role_of[part.slot_mask] = "valid"
    matrix = op.matrix()
    if matrix is not None:
        role_of[matrix.name] = "A"
    if set(names) - set(role_of) or not {"indptr", "indices", "Q", "K", "S"} <= {role_of[n] for n in names}:
        return None
    params = tuple(role_of[b.name] for b in program.buffers)
    if list(program.scalars) != ["n_io", "rows", "cols"]:
        return None
    dtypes = {role_of[b.name]: b.dtype for b in program.buffers}
    if dtypes["Q"] != program.dtype.sparse or dtypes["K"] != program.dtype.sparse or dtypes["S"] != "float32":
        return None
    return SddmmShape(bs, feat, program.dtype.sparse, params, float(scale), sampled, "valid" in params)


def _factors(value):
    """(product of the constant factors, the accesses) of a product tree, or (None, ()) when
    ``value`` has another kind of factor (a call, a sum, a division, a lookup)."""
    from sparsec.dsl import Access
    from sparsec.expr import BinOp, Const

    def walk(e):
        if isinstance(e, BinOp) and e.op == "*":
            return walk(e.a) + walk(e.b)
        return [e]

    scale, reads = 1.0, []
    for f in walk(value):
        if isinstance(f, Const) and isinstance(f.value, (int, float)):
            scale *= float(f.value)
        elif isinstance(f, Access) and all(hasattr(a, "structural") for a in f.axes):
            reads.append(f)
        else:
            return None, ()
    return scale, tuple(reads)


# --------------------------------------------------------------------------- knobs


def default_knobs(bs: int, feat: int) -> dict:
    """1 warp for blocks of 16, 4 for 32 and 64 (16x16 / 32x32 tiles a warp); two K stages
    where the shared memory allows it; 4 thread blocks a block row (block-sparse attention
    has few block rows: 64 at 4096 tokens in blocks of 64)."""
    warp = 16 if bs <= 32 else 32
    stages = 2 if smem_problem(bs, feat, 2) is None else 1
    return {"warp_m": warp, "warp_n": warp, "stages": stages, "row_split": 4}


def resolve_knobs(shape: SddmmShape, knobs) -> dict:
    return {**default_knobs(shape.bs, shape.feat), **knobs}


def smem_problem(bs: int, feat: int, stages: int) -> Optional[str]:
    """Why Q_s, K_s (dynamic) and the fp32 score tile (static) do not fit a thread block, or
    None. TVM opts a kernel into more than the 48 KiB launch default only when its dynamic
    shared memory alone reaches 48 KiB, so below that the two together must stay under it."""
    fp = -(-feat // 16) * 16
    dyn = (1 + stages) * bs * tensorcore.padded_row(fp, 32, 8) * 2
    static = bs * tensorcore.padded_row(bs, 32, 4) * 4
    if not tensorcore.launch_smem_problem(dyn, static):
        return None
    return (f"bsr_tensorcore_sddmm: {stages} stage(s) of {bs} x {fp} operands need {dyn + static} bytes of shared "
            f"memory, over what a launch gets; use fewer stages")


def check_knobs(bs: int, feat: int, warp_m: int, warp_n: int, stages: int, row_split: int) -> int:
    """Validate a knob combination for blocks of ``bs``; returns the warps per thread block."""
    for name, w in (("warp_m", warp_m), ("warp_n", warp_n)):
        if w > bs or bs % w:
            raise ValueError(f"bsr_tensorcore_sddmm: {name} should divide the block size {bs}, got {w}")
    problem = smem_problem(bs, feat, stages)
    if problem:
        raise ValueError(problem)
    warps = (bs // warp_m) * (bs // warp_n)
    if warps > MAX_WARPS:
        raise ValueError(f"bsr_tensorcore_sddmm: (bs/warp_m)*(bs/warp_n) should be at most {MAX_WARPS} warps, "
                         f"got {warps}")
    return warps


def _resolve(program, knobs) -> dict:
    return resolve_knobs(match(program), knobs)


def _prune(program, knobs):
    shape = match(program)
    try:
        check_knobs(shape.bs, shape.feat, **resolve_knobs(shape, knobs))
    except ValueError as e:
        return str(e)
    return None


# --------------------------------------------------------------------------- the staged operator


def staged_sddmm(shape: SddmmShape, stages: int = 1, row_split: int = 1, async_copy: bool = False,
                 name: str = "sddmm"):
    """The staged block SDDMM PrimFunc, its arguments those of the generic kernel
    (``shape.params`` in order, then n_io, rows, cols). Staging buffers are global; the
    schedule moves them on chip. ``stages`` > 1 pipelines the K tiles by hand (a prologue
    gathers the CTA's first stages - 1 blocks; iteration q gathers block q + stages - 1 into
    slot (q - 1) % stages while the product reads block q); with ``async_copy`` (CUDA) the
    gathers are marked for ``cp.async``, one commit group per gather."""
    BS, F, DT, S, G = shape.bs, shape.feat, shape.dtype, stages, row_split
    FP = -(-F // 16) * 16
    zero = T.Cast(DT, 0)
    copy, commit = ("async_scope", "async_commit_queue_scope") if async_copy else ("sparsec_copy", "sparsec_copy")
    wait, inflight = ("async_wait_queue_scope", "async_wait_inflight_count") if async_copy else ("sparsec_wait",) * 2

    def epilogue(acc, A, valid, slot, in_range):
        """The statement's value at a slot in range (and valid), else 0: what the generic kernel stores."""
        v = T.Cast("float32", A[slot]) * acc if shape.sampled else acc
        if shape.scale != 1.0:
            v = v * T.float32(shape.scale)
        cond = tirx.all(in_range, T.Cast("int32", valid[slot]) > 0) if shape.masked else in_range
        return T.if_then_else(cond, v, T.float32(0))

    def epilogue_reads(A, valid, at, n):
        """What the epilogue reads of A and the slot mask: only the buffers the kernel takes."""
        return [b[at:at + n] for b, used in ((A, shape.sampled), (valid, shape.masked)) if used]

    @T.prim_func(s_tir=True)
    def sddmm(indptr_h: T.handle, indices_h: T.handle, valid_h: T.handle, A_h: T.handle, Q_h: T.handle,
              K_h: T.handle, S_h: T.handle, n_io: T.int32, rows: T.int32, cols: T.int32):
        T.func_attr({"global_symbol": name, "tirx.noalias": True})
        nnz = T.int32()
        indptr = T.match_buffer(indptr_h, (n_io + 1,), "int32")
        indices = T.match_buffer(indices_h, (nnz,), "int32")
        valid = T.match_buffer(valid_h, (nnz * BS * BS,), "uint8")
        A = T.match_buffer(A_h, (nnz * BS * BS,), DT)
        Q = T.match_buffer(Q_h, (rows, F), DT)
        K = T.match_buffer(K_h, (cols, F), DT)
        C = T.match_buffer(S_h, (nnz * BS * BS,), "float32")
        for bi, g in T.grid(T.max(n_io, 1), G):
            with T.sblock("tile"):
                vbi, vg = T.axis.remap("SS", [bi, g])
                T.reads(indptr[0:n_io + 1], indices[0:nnz], Q[0:rows, 0:F], K[0:cols, 0:F],
                        *epilogue_reads(A, valid, 0, nnz * BS * BS))
                T.writes(C[0:nnz * BS * BS])
                Q_s = T.sblock_alloc_buffer((BS, FP), DT)
                K_s = T.sblock_alloc_buffer((S, BS, FP), DT)
                acc = T.sblock_alloc_buffer((BS, BS), "float32")
                C_s = T.sblock_alloc_buffer((BS, BS), "float32")
                if FP > F:  # the zero tail of the last 16-deep step: written once, never copied over
                    for i, k in T.grid(BS, FP - F):
                        with T.sblock("Q_tail"):
                            vi, vk = T.axis.remap("SS", [i, k])
                            T.reads()
                            T.writes(Q_s[vi, F + vk])
                            Q_s[vi, F + vk] = zero
                    for s, i, k in T.grid(S, BS, FP - F):
                        with T.sblock("K_tail"):
                            vs, vi, vk = T.axis.remap("SSS", [s, i, k])
                            T.reads()
                            T.writes(K_s[vs, vi, F + vk])
                            K_s[vs, vi, F + vk] = zero
                with T.attr(0, commit, 0):  # Q's copy group: complete by the first product's wait
                    with T.attr(0, copy, 1):
                        for i, k in T.grid(BS, F):
                            with T.sblock("Q_load"):
                                vi, vk = T.axis.remap("SS", [i, k])
                                T.reads(Q[vbi * BS + vi, vk])
                                T.writes(Q_s[vi, vk])
                                Q_s[vi, vk] = T.if_then_else(vbi * BS + vi < rows, Q[vbi * BS + vi, vk], zero)
                # a grid padded to one block row (n_io = 0) reads indptr[0] - indptr[0] = 0 blocks
                start = T.int32(indptr[T.min(vbi, n_io)])
                row_len = T.int32(indptr[T.min(vbi + 1, n_io)] - start)
                mine = T.int32((row_len - vg + G - 1) // G)  # this CTA's blocks: vg, vg + G, ...
                if S > 1:  # prologue: the first S - 1 blocks in flight, one commit group each
                    for t in range(S - 1):
                        with T.attr(0, commit, 0):
                            if t < mine:
                                with T.attr(0, copy, 1):
                                    for i, k in T.grid(BS, F):
                                        with T.sblock("K_first"):
                                            vt = T.axis.opaque(S - 1, t)
                                            vi, vk = T.axis.remap("SS", [i, k])
                                            T.reads(indices[start + vg + vt * G],
                                                    K[indices[start + vg + vt * G] * BS + vi, vk])
                                            T.writes(K_s[0:S, vi, vk])
                                            K_s[vt, vi, vk] = T.if_then_else(
                                                indices[start + vg + vt * G] * BS + vi < cols,
                                                K[indices[start + vg + vt * G] * BS + vi, vk], zero)
                # Iteration q gathers block q + S - 1 and multiplies block q. Nothing that needs a
                # barrier sits under a condition (TVM inserts none there): only the gather does.
                for q in range(mine):
                    with T.attr(0, commit, 0):
                        if q + S - 1 < mine:
                            with T.attr(0, copy, 1):
                                for i, k in T.grid(BS, F):
                                    with T.sblock("K_load"):
                                        vq = T.axis.opaque(mine, q)
                                        vi, vk = T.axis.remap("SS", [i, k])
                                        T.reads(indices[start + vg + (vq + S - 1) * G],
                                                K[indices[start + vg + (vq + S - 1) * G] * BS + vi, vk])
                                        T.writes(K_s[0:S, vi, vk])  # any slot: covers the product's reads
                                        K_s[(vq + S - 1) % S, vi, vk] = T.if_then_else(
                                            indices[start + vg + (vq + S - 1) * G] * BS + vi < cols,
                                            K[indices[start + vg + (vq + S - 1) * G] * BS + vi, vk], zero)
                    use = T.int32(q % S)  # the slot of block q (a let: affine for blockize)
                    p = T.int32(start + vg + q * G)  # its position among the stored blocks
                    for i, j in T.grid(BS, BS):
                        with T.sblock("acc_init"):
                            vi, vj = T.axis.remap("SS", [i, j])
                            T.reads()
                            T.writes(acc[vi, vj])
                            acc[vi, vj] = T.float32(0)
                    with T.attr(0, wait, 0):
                        with T.attr(0, inflight, S - 1):
                            with T.sblock("step"):  # fragments of slot `use` are allocated in here
                                T.reads(acc[0:BS, 0:BS], Q_s[0:BS, 0:FP], K_s[use, 0:BS, 0:FP])
                                T.writes(acc[0:BS, 0:BS])
                                for i, j, k in T.grid(BS, BS, FP):
                                    with T.sblock("mma"):
                                        vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                                        T.reads(acc[vi, vj], Q_s[vi, vk], K_s[use, vj, vk])
                                        T.writes(acc[vi, vj])
                                        acc[vi, vj] = acc[vi, vj] + T.Cast("float32", Q_s[vi, vk]) * T.Cast(
                                            "float32", K_s[use, vj, vk])
                    for i, j in T.grid(BS, BS):
                        with T.sblock("acc_out"):
                            vi, vj = T.axis.remap("SS", [i, j])
                            T.reads(acc[vi, vj])
                            T.writes(C_s[vi, vj])
                            C_s[vi, vj] = acc[vi, vj]
                    for i, j in T.grid(BS, BS):
                        with T.sblock("S_store"):
                            vi, vj = T.axis.remap("SS", [i, j])
                            T.reads(C_s[vi, vj], indices[p],
                                    *epilogue_reads(A, valid, (p * BS + vi) * BS + vj, 1))
                            T.writes(C[(p * BS + vi) * BS + vj])
                            C[(p * BS + vi) * BS + vj] = epilogue(
                                C_s[vi, vj], A, valid, (p * BS + vi) * BS + vj,
                                tirx.all(vbi * BS + vi < rows, indices[p] * BS + vj < cols))

    return _keep_params(sddmm, shape.params)


def _keep_params(func, roles):
    """``func`` with only the buffer parameters named by ``roles`` (in that order), then the
    three scalars: the generic kernel's signature for this operator."""
    order = ("indptr", "indices", "valid", "A", "Q", "K", "S")
    handles = dict(zip(order, func.params[:len(order)]))
    params = [handles[r] for r in roles] + list(func.params[len(order):])
    return tirx.PrimFunc(params, func.body, func.ret_type, func.attrs)


# --------------------------------------------------------------------------- tensor intrinsics


def intrinsics(dtype: str) -> Dict[str, str]:
    """Names of the intrinsics for ``dtype``: tensorcore's Q-fragment ldmatrix, fill and store,
    and for K (stored n x k, k contiguous) the "B transposed" ldmatrix and the mma that reads
    it, C += A B^T: TVM's for float16, registered here for bfloat16 (TVM 0.27 has none)."""
    if dtype in _INTRINS:
        return _INTRINS[dtype]
    cu = cuda_intrinsics()

    names = dict(tensorcore.intrinsics(dtype))
    if dtype == "float16":
        names.update(ld_b=cu.LDMATRIX_f16_B_TRANS_DYN_INTRIN, mma=cu.MMA_f16f16f32_TRANS_B_INTRIN)
    else:
        from tvm.s_tir import TensorIntrin

        layout = cu.shared_16x16_to_ldmatrix_32x8_layout
        names.update(ld_b="sparsec_ldmatrix_bf16_b_trans_dyn", mma="sparsec_mma_bf16bf16f32_trans_b")
        # as TVM's float16 "B transposed" ldmatrix: no .trans, the four 8 x 8 matrices addressed
        # n 0-7 (k 0-7, then 8-15), then n 8-15, so that each m16n8k16 gets its n half in two registers
        if TensorIntrin.get(names["ld_b"], allow_missing=True) is None:
            TensorIntrin.register(names["ld_b"], *mma_intrin.ldmatrix(
                dtype, 16, 16, layout, trans=False, num=4,
                lane_address=lambda s0, tx: s0 * 8 * (tx // 16) + s0 * (tx % 8) + 8 * ((tx % 16) // 8)))
        if TensorIntrin.get(names["mma"], allow_missing=True) is None:  # C += A B^T: B placed at (j, k)
            TensorIntrin.register(names["mma"], *mma_intrin.mma(dtype, "bf16", 16, layout,
                                                                lambda k, j: layout(j, k), layout))
    _INTRINS[dtype] = names
    return names


# --------------------------------------------------------------------------- the schedule


def schedule(program, **knobs):
    """The staged PrimFunc of ``program``'s shape scheduled by ``bsr_tensorcore_sddmm``;
    returns (schedule, knobs used). Knobs not given take ``default_knobs``."""
    check_applicable(knobs, [(bsr_tensorcore_sddmm, (ANY,))], f"{program.name} on cuda (Tensor Cores)")
    shape = match(program)
    chosen = resolve_knobs(shape, knobs)
    func = staged_sddmm(shape, chosen["stages"], chosen["row_split"], async_copy=True, name=program.name)
    sch = s_tir.Schedule(func, enable_check=False)
    bsr_tensorcore_sddmm(sch, program, **chosen)
    return sch, chosen


def _spread(sch, blk, warps: int, vec: int):
    """The block's last two loops over all threads: rows x (vectors of ``vec``), vectorized."""
    a, b = sch.get_loops(blk)[-2:]
    b0, b1 = sch.split(b, [None, vec])
    _, ty, tx = sch.split(sch.fuse(a, b0), [None, warps, WARP])
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    sch.vectorize(b1)


@transformation(knobs={"warp_m": Knob((16, 32, 64), small=(16, 32)), "warp_n": Knob((16, 32, 64), small=(16, 32)),
                       "stages": Knob((2, 1, 3, 4), small=(2, 3)),
                       "row_split": Knob((4, 1, 2, 8, 16), search=(4, 1, 2, 8), small=(4, 1))},
                resolve=_resolve, prune=_prune)
def bsr_tensorcore_sddmm(sch: s_tir.Schedule, program, *, warp_m: int, warp_n: int, stages: int, row_split: int):
    """Schedule ``staged_sddmm`` onto Tensor Cores (see the module docstring). The knobs'
    first choices are placeholders: ``default_knobs`` picks by block size and feat.

    Requires: ``sch`` holds ``staged_sddmm(match(program), stages, row_split)``.
    Before: tile(bi, g): Q_s = ..; for t: K_s = ..; acc = 0; acc += Q_s @ K_s.T; S[p] = epilogue(acc)
    After:  bx = bi, by = g, ty = warps, tx = lanes;  acc in mma fragments;
            for t (pipelined, cp.async): ldmatrix -> mma.sync per 16-deep step;  S via shared
    """
    shape = match(program)
    bs = shape.bs
    warps = check_knobs(bs, shape.feat, warp_m, warp_n, stages, row_split)
    names = intrinsics(shape.dtype)
    layout = cuda_intrinsics().shared_16x16_to_ldmatrix_32x8_layout

    def frag(i, j):
        return (i // 16, j // 16, *layout(i % 16, j % 16))

    def slot_frag(s, i, j):
        return (s, i // 16, j // 16, *layout(i % 16, j % 16))

    tile = sch.get_sblock("tile")
    bi, g = sch.get_loops(tile)
    sch.bind(bi, "blockIdx.x")
    sch.bind(g, "blockIdx.y")
    fm, fn = warp_m // 16, warp_n // 16
    wm, wn = bs // warp_m, bs // warp_n

    sch.set_scope(sch.get_sblock("Q_load"), 0, "shared.dyn")
    sch.set_scope(sch.get_sblock("K_load"), 0, "shared.dyn")
    sch.set_scope(sch.get_sblock("acc_init"), 0, "warp")

    # mma: (i, j, k) -> ty (warps), k steps, fragments, 16x16x16 tiles
    mma = sch.get_sblock("mma")
    q_w, k_w = tensorcore.warp_mma(sch, mma, wm, fm, wn, fn)  # reads: acc, Q_s, K_s

    # the accumulators: zeroed per block, out through static shared memory with the epilogue
    init = sch.get_sblock("acc_init")
    tensorcore.warp_tiles(sch, init, wm, fm, wn, fn)
    acc_s = sch.get_sblock("acc_out")
    sch.set_scope(acc_s, 0, "shared")
    tensorcore.warp_tiles(sch, acc_s, wm, fm, wn, fn)
    # the epilogue's conditional loads keep TVM from vectorizing the store: consecutive threads
    # take consecutive slots instead (coalesced 4-byte stores)
    store = sch.get_sblock("S_store")
    _, ty, tx = sch.split(sch.fuse(*sch.get_loops(store)[-2:]), [None, warps, WARP])
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")

    # copies: 16-byte vectors over all threads, rows 16 bytes apart (no bank conflicts)
    for name in ("Q_load", "K_first", "K_load") if stages > 1 else ("Q_load", "K_load"):
        blk = sch.get_sblock(name)
        _spread(sch, blk, warps, VEC)
        sch.storage_align(blk, 0, axis=-2, factor=32, offset=8)
    sch.storage_align(acc_s, 0, axis=-2, factor=32, offset=4)
    if shape.feat % 16:
        for name in ("Q_tail", "K_tail"):
            blk = sch.get_sblock(name)
            _, ty, tx = sch.split(sch.fuse(*sch.get_loops(blk)), [None, warps, WARP])
            sch.bind(ty, "threadIdx.y")
            sch.bind(tx, "threadIdx.x")

    # fragments: 16 x 16 tiles, their layouts, then tensorize
    for blk in (q_w, k_w):
        a, b = sch.get_loops(blk)[-2:]
        a0, a1 = sch.split(a, [None, 16])
        b0, b1 = sch.split(b, [None, 16])
        sch.reorder(a0, b0, a1, b1)
    sch.transform_layout(q_w, ("write", 0), frag)
    sch.transform_layout(k_w, ("write", 0), slot_frag)
    sch.transform_layout(init, ("write", 0), frag)
    sch.tensorize(sch.get_loops(q_w)[-2], names["ld_a"])
    sch.tensorize(sch.get_loops(k_w)[-2], names["ld_b"])
    sch.tensorize(sch.get_loops(sch.get_sblock("mma"))[-3], names["mma"])
    sch.tensorize(sch.get_loops(init)[-2], names["fill"])
    sch.tensorize(sch.get_loops(acc_s)[-2], names["store"])
