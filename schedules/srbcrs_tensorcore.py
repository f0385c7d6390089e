"""int8 SR-BCRS SpMM on Tensor Cores (Magicube's format): ``C = A @ B`` with A (M, K) in
``srbcrs:vV,int8`` (V = 2, 4, 8), B (K, N) int8 row-major, C (M, N) int32 (exact), or
float32 / float16 after scaling by ``row_scale[M]`` and ``b_scale`` (dequantisation).

The product is computed transposed, ``C^T = B^T A^T``, with ``mma.m16n8k32.s8.s8.s32``:
the instruction's A operand is 16 columns of B gathered at a vector row's 32 slot
columns (16 x 32), its B operand the vector row's values (32 slots x 8 rows, of which
the first V are real), so one vector row of A fills the n = 8 side and its slots run
along k. Each lane's B-operand registers are four consecutive slots of one row of a
value chunk (Magicube's row-major V x 16 chunks), i.e. one aligned 32-bit load; its
A-operand registers gather four rows of B (padding slots, index -1, read zero).

Per lane (g = lane / 4, t = lane % 4), as ``operands`` spells out and ``emulate``
replays: a0 = B^T[n0 + g, slots t*4..t*4+3], a1 = rows n0 + g + 8, a2/a3 the slots 16 on;
b0 = values of row g at slots t*4..t*4+3, b1 = slots 16 + t*4..; c0, c1 = (n0 + g, rows
2t, 2t+1), c2, c3 = n0 + g + 8. A warp covers one vector row and ``warp_n_tiles`` x 16
columns; ``warps`` warps of a block share the vector row. The straight version: B is
gathered from global memory (staging it in shared memory one step ahead comes next).
"""
from __future__ import annotations

import numpy as np

from .warp_mma import check_choice, check_knobs, check_sizes, compile_for

VECS = (2, 4, 8)
OUT_DTYPES = ("int32", "float32", "float16")
KNOBS = {"warp_n_tiles": (2, 1, 4), "warps": (4, 1, 2, 8)}


def check(M: int, K: int, N: int, vec: int, out_dtype: str, warp_n_tiles: int, warps: int):
    check_sizes(M=M, K=K, N=N)
    check_choice("vec (V)", vec, VECS)
    check_choice("out_dtype", out_dtype, OUT_DTYPES)
    check_knobs({"warp_n_tiles": warp_n_tiles, "warps": warps}, KNOBS)


def spmm_srbcrs_int8(M: int, K: int, N: int, vec: int, *, out_dtype: str = "int32", warp_n_tiles: int = 2,
                     warps: int = 4):
    """PrimFunc ``srbcrs_spmm(indptr, indices, values, B, C[, row_scale, b_scale])`` over an
    ``srbcrs:v{vec},int8`` instance's arrays (``indptr``, ``indices``, ``data``)."""
    from tvm.script import tirx as T

    check(M, K, N, vec, out_dtype, warp_n_tiles, warps)
    V, nt = vec, warp_n_tiles
    m_vec = -(-M // V)
    per_warp = 16 * nt
    grid_n = -(-N // (per_warp * warps))
    mma = T.ptx["mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32"]
    scaled = out_dtype != "int32"

    @T.macro
    def body(IP, IX, D, B, C, RS, bs):
        bx = T.env_thread("blockIdx.x")
        by = T.env_thread("blockIdx.y")
        ty = T.env_thread("threadIdx.y")
        tx = T.env_thread("threadIdx.x")
        T.launch_thread(bx, grid_n)
        T.launch_thread(by, m_vec)
        T.launch_thread(ty, warps)
        T.launch_thread(tx, 32)
        a_byte = T.decl_buffer([16 * nt], "int8", scope="local")
        b_byte = T.decl_buffer([8], "int8", scope="local")
        acc = T.decl_buffer([4 * nt], "uint32", scope="local")  # the instruction's s32, as .u32 registers
        acc_s32 = T.decl_buffer([4 * nt], "int32", data=acc.data, scope="local")
        a_word = T.decl_buffer([4 * nt], "uint32", data=a_byte.data, scope="local")
        b_word = T.decl_buffer([2], "uint32", data=b_byte.data, scope="local")
        n_base = (bx * warps + ty) * per_warp
        start = IP[by]
        end = IP[by + 1]
        for i in T.unroll(4 * nt):
            acc[i] = T.uint32(0)
        for kt in range((end - start + 31) // 32):
            for h in T.unroll(2):  # b0: slots t*4.., b1: slots 16 + t*4..
                for s in T.unroll(4):
                    b_byte[h * 4 + s] = T.if_then_else(
                        T.And(tx // 4 < V, start + kt * 32 + h * 16 + tx % 4 * 4 < end),
                        D[T.min((start + kt * 32 + h * 16) * V + tx // 4 * 16 + tx % 4 * 4 + s,
                                (end - 1) * V + V - 1)],  # chunk (p // 16) * 16V + row * 16 + p % 16
                        T.int8(0))
            for j in T.unroll(nt):
                for r in T.unroll(4):  # a0: (g, slots t*4..), a1: (g + 8, ..), a2/a3: slots 16 on
                    for s in T.unroll(4):
                        a_byte[j * 16 + r * 4 + s] = T.if_then_else(
                            T.And(T.And(start + kt * 32 + r // 2 * 16 + tx % 4 * 4 + s < end,
                                        n_base + j * 16 + tx // 4 + r % 2 * 8 < N),
                                  IX[T.min(start + kt * 32 + r // 2 * 16 + tx % 4 * 4 + s, end - 1)] >= 0),
                            B[T.max(IX[T.min(start + kt * 32 + r // 2 * 16 + tx % 4 * 4 + s, end - 1)], 0),
                              T.min(n_base + j * 16 + tx // 4 + r % 2 * 8, N - 1)],
                            T.int8(0))
                mma(acc[j * 4], acc[j * 4 + 1], acc[j * 4 + 2], acc[j * 4 + 3],
                    a_word[j * 4], a_word[j * 4 + 1], a_word[j * 4 + 2], a_word[j * 4 + 3],
                    b_word[0], b_word[1], acc[j * 4], acc[j * 4 + 1], acc[j * 4 + 2], acc[j * 4 + 3])
        for j in T.unroll(nt):
            for i in T.unroll(4):  # c(i): column n0 + g (+8 for i >= 2), row of the vector 2t + i % 2
                if T.And(T.And(tx % 4 * 2 + i % 2 < V, by * V + tx % 4 * 2 + i % 2 < M),
                         n_base + j * 16 + tx // 4 + i // 2 * 8 < N):
                    if scaled:
                        C[by * V + tx % 4 * 2 + i % 2, n_base + j * 16 + tx // 4 + i // 2 * 8] = T.Cast(
                            out_dtype, T.Cast("float32", acc_s32[j * 4 + i]) * RS[by * V + tx % 4 * 2 + i % 2] * bs)
                    else:
                        C[by * V + tx % 4 * 2 + i % 2, n_base + j * 16 + tx // 4 + i // 2 * 8] = acc_s32[j * 4 + i]

    @T.macro
    def operands_of(indptr_h, indices_h, values_h, b_h, c_h, scale_h, b_scale):
        slots = T.int32()
        IP = T.match_buffer(indptr_h, (m_vec + 1,), "int32")
        IX = T.match_buffer(indices_h, (slots,), "int32")
        D = T.match_buffer(values_h, (slots * V,), "int8")
        B = T.match_buffer(b_h, (K, N), "int8")
        C = T.match_buffer(c_h, (M, N), out_dtype)
        if scaled:
            RS = T.match_buffer(scale_h, (M,), "float32")
            body(IP, IX, D, B, C, RS, b_scale)
        else:
            body(IP, IX, D, B, C, None, None)

    if scaled:
        @T.prim_func(s_tir=True)
        def srbcrs_spmm(indptr_h: T.handle, indices_h: T.handle, values_h: T.handle, b_h: T.handle,
                        c_h: T.handle, scale_h: T.handle, b_scale: T.float32):
            T.func_attr({"global_symbol": "srbcrs_spmm", "tirx.noalias": True})
            operands_of(indptr_h, indices_h, values_h, b_h, c_h, scale_h, b_scale)
        return srbcrs_spmm

    @T.prim_func(s_tir=True)
    def srbcrs_spmm(indptr_h: T.handle, indices_h: T.handle, values_h: T.handle, b_h: T.handle, c_h: T.handle):
        T.func_attr({"global_symbol": "srbcrs_spmm", "tirx.noalias": True})
        operands_of(indptr_h, indices_h, values_h, b_h, c_h, None, None)
    return srbcrs_spmm


def build(M: int, K: int, N: int, vec: int, *, arch: str = "sm_90a", **knobs):
    """The compiled module (TVM executable) of :func:`spmm_srbcrs_int8` for ``arch``."""
    return compile_for(spmm_srbcrs_int8(M, K, N, vec, **knobs), arch)


# ---- the layout, spelled out and replayed on the CPU --------------------------------------

def operands(indptr, indices, values, B, vr: int, kt: int, n0: int, lane: int, V: int):
    """The registers lane ``lane`` builds for vector row ``vr``, k step ``kt`` and column
    tile ``n0``, with the kernel's index arithmetic: ``a`` 16 int8 (a0..a3, 4 each) and
    ``b`` 8 int8 (b0, b1)."""
    g, t = lane // 4, lane % 4
    start, end = int(indptr[vr]), int(indptr[vr + 1])
    K, N = B.shape
    a = np.zeros(16, np.int8)
    for r in range(4):
        for s in range(4):
            p = start + kt * 32 + r // 2 * 16 + t * 4 + s
            n = n0 + g + r % 2 * 8
            if p < end and n < N and indices[p] >= 0:
                a[r * 4 + s] = B[indices[p], n]
    b = np.zeros(8, np.int8)
    for h in range(2):
        base = start + kt * 32 + h * 16  # a chunk start: (base // 16) * 16V = base * V
        for s in range(4):
            if g < V and base + t * 4 < end:
                b[h * 4 + s] = values[base * V + g * 16 + t * 4 + s]
    return a, b


def emulate(indptr, indices, values, B, M: int, V: int) -> np.ndarray:
    """``A @ B`` (int64) as the warps compute it: per vector row and k step, the 32 lanes'
    registers are put back into the 16 x 32 and 32 x 8 operands of mma.m16n8k32 (PTX ISA
    fragment layout) and multiplied; the lanes' accumulators land where the kernel stores them."""
    K, N = B.shape
    C = np.zeros((-(-M // V) * V, N), np.int64)
    for vr in range(len(indptr) - 1):
        steps = (int(indptr[vr + 1]) - int(indptr[vr]) + 31) // 32
        for n0 in range(0, N, 16):
            acc = np.zeros((16, 8), np.int64)  # (n, vector row)
            for kt in range(steps):
                opa, opb = np.zeros((16, 32), np.int64), np.zeros((32, 8), np.int64)
                for lane in range(32):
                    g, t = lane // 4, lane % 4
                    a, b = operands(indptr, indices, values, B, vr, kt, n0, lane, V)
                    for r in range(4):
                        opa[g + r % 2 * 8, r // 2 * 16 + t * 4: r // 2 * 16 + t * 4 + 4] = a[r * 4: r * 4 + 4]
                    for h in range(2):
                        opb[h * 16 + t * 4: h * 16 + t * 4 + 4, g] = b[h * 4: h * 4 + 4]
                acc += opa @ opb
            for lane in range(32):
                g, t = lane // 4, lane % 4
                for i in range(4):
                    n, row = n0 + g + i // 2 * 8, t * 2 + i % 2
                    if row < V and n < N:
                        C[vr * V + row, n] = acc[g + i // 2 * 8, row]
    return C[:M]
