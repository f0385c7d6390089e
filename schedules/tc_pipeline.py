"""Pipelined Tensor Core SpMM ``C = A @ B`` for weights whose rows share their K positions
tile by tile, in two modes:

* ``"sp24"``: A 2:4-sparse (``formats.mma_sp.pack``: compressed values (Mp, Kp/2), metadata
  (Mp/16, Kp/32, 16) uint32), ``mma.sp::ordered_metadata`` m16n8k32: B's rows are read in
  order and the hardware skips the pruned half of the math;
* ``"gather"``: A vector-wise N:M (``formats.nm_tc.pack``: values (Mp, Kc), cols (Mp/V, Kc)),
  dense ``mma`` m16n8k16 on the B rows at the row vector's kept columns, so only N/M of B
  is loaded and multiplied.

Schedule (CUTLASS's multistage GEMM, written out in TVMScript): a 1-D grid of blocks
walked ``group_m`` row tiles at a time (Triton's grouped order, for L2 reuse); a block owns
``16*warp_m_tiles*warps_m`` rows x ``8*warp_n_tiles*warps_n`` columns of C; each stage copies
``k_steps`` MMA k-steps of A (and metadata) and of B into shared memory with 16-byte
``cp.async`` (rows out of range zero-filled), ``stages - 1`` stages ahead of the math.
Shared rows are XOR-swizzled by 16-byte chunk, so both the copies and the ``ldmatrix``
reads (A plain, B ``.trans``) are free of bank conflicts. Accumulators are fp32; C is
float32 or float16. B's row pitch must be 16-byte aligned for ``cp.async``; when N is not a
multiple of 8 the B tiles are copied element by element instead (correct, slower).

The kernel is written in parts, each a module a reader can take alone: the plan of every
build-time number (``tc_pipeline_plan``), the cp.async producer (``tc_pipeline_copies``),
the ldmatrix / mma main loop (``tc_pipeline_mma``) and the bias / activation / store
epilogue (``tc_pipeline_epilogue``); :func:`spmm` below puts them together.
"""
from __future__ import annotations

from .tc_pipeline_copies import copy_macros
from .tc_pipeline_epilogue import epilogue_macros
from .tc_pipeline_mma import mma_macros
from .tc_pipeline_plan import (ACTIVATIONS, DTYPES, KNOBS, MODES, OUT_DTYPES, SMEM_LIMIT, Plan, block_shape,
                               check, grouped_tile, make_plan, smem_bytes, swizzle)
from .warp_mma import compile_for

__all__ = ["spmm", "build", "check", "make_plan", "Plan", "block_shape", "smem_bytes", "grouped_tile", "swizzle",
           "MODES", "DTYPES", "OUT_DTYPES", "ACTIVATIONS", "KNOBS", "SMEM_LIMIT"]


def spmm(mode: str, M, K, N: int, *, dtype: str = "float16", out_dtype: str = "float32",
         vec: int = 0, kc: int = 0, bias: bool = False, activation: str = "none", transpose_c: bool = False,
         bias_dtype: str = "float32", bias_axis: str = "row", name: str = "tc_spmm", fast_for=None, **knobs):
    """The PrimFunc ``tc_spmm(A, E, B, C)`` (``tc_spmm(A, E, B, bias, C)`` with ``bias``): A
    the packed values, E the metadata (sp24) or the gathered columns (gather: ``kc`` is their
    row length), B (K, N), C (M, N), or (N, M) with ``transpose_c``.

    The epilogue adds ``bias`` (float32, one per row of C, i.e. per output feature) and
    applies ``activation`` to the fp32 accumulator before the cast, so a linear layer's bias
    and activation cost no extra pass over its output. ``transpose_c`` writes C as (N, M):
    with B holding activations feature-major (in x tokens), the product comes back
    token-major, as the next layer or the caller wants it, without a transpose kernel.

    ``M = K = None`` gives a kernel for any size: M, K and the packed shapes (``kc``
    included) are read from the operands when it is called (what ``sparsec.compile`` builds
    for a format spec). ``bias_dtype`` may be the value dtype (a DSL operator's bias);
    ``bias_axis="col"`` takes one bias per column of C instead (``bias[k]``, N entries, along
    the dense axis); ``name`` is the kernel's symbol.

    ``fast_for = (M, K, kc)`` with ``M = K = None``: the any-size kernel also carries the
    kernel built for that one size (every bound a constant, the checks of full tiles gone),
    and runs it when the operands have that size, e.g. the matrix a kernel is compiled for
    (on an H100 the any-size kernel took 1.3-1.5x the time of the sized one at 4096 columns:
    ``benchmarks/time_tc_parity.py``)."""
    def plan(M, K, kc):
        return make_plan(mode, M, K, N, dtype=dtype, out_dtype=out_dtype, vec=vec, kc=kc, bias=bias,
                         activation=activation, transpose_c=transpose_c, knobs=knobs,
                         bias_dtype=bias_dtype, bias_axis=bias_axis)  # checks every argument

    p = plan(M, K, kc)
    fast = None
    if fast_for is not None and M is None:
        pf = plan(*fast_for)
        fast = (pf, _block_of(pf))
    return _prim_func(p, _block_of(p), fast).with_attr("global_symbol", name)


def _block_of(p: Plan):
    copies = copy_macros(p)  # global -> shared stages (cp.async)
    mma = mma_macros(p, copies)  # fill the pipeline, walk K: ldmatrix + mma(.sp)
    out = epilogue_macros(p)  # bias, activation, stores to C
    return _block(p, mma, out)


def _block(p: Plan, mma, out):
    """The macro of one block's work: its threads and buffers, where its tile of C lies, then
    the pipeline, the K walk and the epilogue."""
    from tvm.script import tirx as T

    fill_pipeline, walk_k, write_c = mma.fill_pipeline, mma.walk_k, out.write_c

    @T.macro
    def body(A, E, B, Bias, C):
        bx = T.env_thread("blockIdx.x")
        ty = T.env_thread("threadIdx.y")
        tx = T.env_thread("threadIdx.x")
        T.launch_thread(bx, p.grid_m * p.grid_n)
        T.launch_thread(ty, p.warps_m * p.warps_n)
        T.launch_thread(tx, 32)
        # one dynamic shared buffer: the pipeline's stages, then the epilogue's staging tile
        Sm = T.decl_buffer([p.total], p.dtype, scope="shared.dyn")
        Sw = T.decl_buffer([p.total // 2], "uint32", data=Sm.data, scope="shared.dyn")
        Cs = T.decl_buffer([p.total * 2 // p.out_bytes], p.out_dtype, data=Sm.data, scope="shared.dyn")
        ob = T.decl_buffer([p.VO], p.out_dtype, scope="local")
        acc = T.decl_buffer([p.mt * p.nt * 4], "float32", scope="local")
        af = T.decl_buffer([p.frag_sets * p.mt * 4], "uint32", scope="local")
        bf = T.decl_buffer([p.frag_sets * p.nt * 4], "uint32", scope="local")
        ef = T.decl_buffer([p.frag_sets * p.mt], "uint32", scope="local")
        nidx = T.decl_buffer([p.b_it], "int32", scope="local")
        cb = T.decl_buffer([2 * p.b_it], "int32", scope="local")
        ca = T.decl_buffer([2 * p.a_it], "int32", scope="local")
        bm0 = p.tile_m(bx) * p.BM
        bn0 = p.tile_n(bx) * p.BN
        tid = ty * 32 + tx
        wr = ty // p.warps_n * p.WM  # the warp's first row and column inside the block
        wc = ty % p.warps_n * p.WN
        fill_pipeline(Sm, Sw, A, B, E, af, bf, ef, acc, nidx, cb, ca, bm0, bn0, wr, wc, tx, tid)
        walk_k(Sm, Sw, A, B, E, af, bf, ef, acc, nidx, cb, ca, bm0, bn0, wr, wc, tx, tid)
        write_c(C, Cs, Bias, ob, acc, bm0, bn0, wr, wc, tx, tid)

    return body


def _sized(p: Plan, body, fast):
    """``body``, or with ``fast = (sized plan, its body)``: the sized body when the operands
    have its sizes (viewed through buffers of constant shape), ``body`` otherwise."""
    from tvm.script import tirx as T

    if fast is None:
        return body
    pf, fast_body = fast
    same = T.And(T.And(p.a_rows == pf.a_rows, p.a_cols == pf.a_cols),
                 T.And(p.K == pf.K, p.M == pf.M))
    for have, want in zip(p.e_shape, pf.e_shape):
        same = T.And(same, have == want)

    # the choice is a host loop run once or not at all: TVM plans the kernels' barriers
    # itself and refuses to plan them under a condition
    @T.macro
    def dispatch(A, E, B, Bias, C):
        for _ in range(T.Cast("int32", same)):
            Af = T.decl_buffer((pf.a_rows, pf.a_cols), p.dtype, data=A.data)
            Ef = T.decl_buffer(pf.e_shape, p.e_dtype, data=E.data)
            Bf = T.decl_buffer((pf.K, pf.N), p.dtype, data=B.data)
            Cf = T.decl_buffer(pf.c_shape, p.out_dtype, data=C.data)
            if p.bias:
                Biasf = T.decl_buffer((pf.M if p.bias_axis == "row" else pf.N,), p.bias_dtype, data=Bias.data)
                fast_body(Af, Ef, Bf, Biasf, Cf)
            else:
                fast_body(Af, Ef, Bf, None, Cf)
        for _ in range(1 - T.Cast("int32", same)):
            body(A, E, B, Bias, C)

    return dispatch


def _prim_func(p: Plan, body, fast=None):
    """The kernel's PrimFunc around ``body``: its operands, with a bias one only when asked
    (and the sized body of ``fast`` beside it, :func:`_sized`)."""
    from tvm.script import tirx as T

    body = _sized(p, body, fast)
    if p.bias:
        @T.prim_func(s_tir=True)
        def tc_spmm(a_h: T.handle, e_h: T.handle, b_h: T.handle, bias_h: T.handle, c_h: T.handle):
            T.func_attr({"global_symbol": "tc_spmm", "tirx.noalias": True})
            A = T.match_buffer(a_h, (p.a_rows, p.a_cols), p.dtype)
            E = T.match_buffer(e_h, p.e_shape, p.e_dtype)
            B = T.match_buffer(b_h, (p.K, p.N), p.dtype)
            Bias = T.match_buffer(bias_h, (p.M if p.bias_axis == "row" else p.N,), p.bias_dtype)
            C = T.match_buffer(c_h, p.c_shape, p.out_dtype)
            body(A, E, B, Bias, C)
    else:
        @T.prim_func(s_tir=True)
        def tc_spmm(a_h: T.handle, e_h: T.handle, b_h: T.handle, c_h: T.handle):
            T.func_attr({"global_symbol": "tc_spmm", "tirx.noalias": True})
            A = T.match_buffer(a_h, (p.a_rows, p.a_cols), p.dtype)
            E = T.match_buffer(e_h, p.e_shape, p.e_dtype)
            B = T.match_buffer(b_h, (p.K, p.N), p.dtype)
            C = T.match_buffer(c_h, p.c_shape, p.out_dtype)
            body(A, E, B, None, C)
    return tc_spmm


def build(mode: str, M: int, K: int, N: int, *, arch: str = "sm_90a", **kw):
    """The compiled module (TVM executable) of :func:`spmm` for ``arch``."""
    return compile_for(spmm(mode, M, K, N, **kw), arch)
