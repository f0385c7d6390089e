"""2:4 SpMM on Sparse Tensor Cores: ``C = A @ B`` with A 2:4-sparse along K (fp16/bf16),
B dense (K, N) row-major, C (M, N) float32, through ``mma.sp.m16n8k32``.

TVM 0.27 has no mma.sp TensorIntrin, so the kernel is written in TVMScript around the
table-driven ``T.ptx["mma.sp::ordered_metadata..."]`` call. Each warp owns a 16-row tile
of A and ``warp_n_tiles`` tiles of 8 columns of C, and walks K in steps of 32: it loads
its A registers and metadata word straight from the lane-ordered arrays of
``formats.mma_sp`` (one 32-bit load each, coalesced across the warp), gathers its B
fragment (two 16-bit loads per register, K-adjacent elements of one column), and issues
one mma.sp per column tile. ``warps`` warps of a block share the A tile (L1 hits) and
cover consecutive column tiles. Loads past K or N read zero and stores past M or N are
skipped, so any shape works. This is the straight, checked version; staging B through
shared memory (ldmatrix.trans) comes next.
"""
from __future__ import annotations

from .warp_mma import check_choice, check_knobs, check_sizes, compile_for

DTYPES = {"float16": "f16", "bfloat16": "bf16"}
KNOBS = {"warp_n_tiles": (2, 1, 4, 8), "warps": (4, 1, 2, 8)}


def check(M: int, K: int, N: int, dtype: str, warp_n_tiles: int, warps: int):
    check_sizes(M=M, K=K, N=N)
    check_choice("dtype", dtype, sorted(DTYPES))
    check_knobs({"warp_n_tiles": warp_n_tiles, "warps": warps}, KNOBS)


def spmm_24(M: int, K: int, N: int, *, dtype: str = "float16", warp_n_tiles: int = 2, warps: int = 4):
    """The PrimFunc ``spmm24(values, meta, B, C)``: values (Mp, Kp/2) and meta
    (Mp/16, Kp/32, 16) uint32 from ``formats.mma_sp.pack`` (Mp, Kp: M, K padded to 16 and
    32), B (K, N) in ``dtype``, C (M, N) float32."""
    from tvm.script import tirx as T

    from formats.mma_sp import padded_shape

    check(M, K, N, dtype, warp_n_tiles, warps)
    mp, kp = padded_shape(M, K)
    tiles_m, tiles_k = mp // 16, kp // 32
    per_warp = 8 * warp_n_tiles
    per_block = per_warp * warps
    grid_n = -(-N // per_block)
    nt = warp_n_tiles
    mma = T.ptx[f"mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.{DTYPES[dtype]}.{DTYPES[dtype]}.f32"]
    zero = T.float16(0) if dtype == "float16" else T.bfloat16(0)

    @T.prim_func(s_tir=True)
    def spmm24(values_h: T.handle, meta_h: T.handle, b_h: T.handle, c_h: T.handle):
        T.func_attr({"global_symbol": "spmm24", "tirx.noalias": True})
        V = T.match_buffer(values_h, (mp, kp // 2), dtype)
        E = T.match_buffer(meta_h, (tiles_m, tiles_k, 16), "uint32")
        B = T.match_buffer(b_h, (K, N), dtype)
        C = T.match_buffer(c_h, (M, N), "float32")
        bx = T.env_thread("blockIdx.x")
        by = T.env_thread("blockIdx.y")
        ty = T.env_thread("threadIdx.y")
        tx = T.env_thread("threadIdx.x")
        T.launch_thread(bx, grid_n)
        T.launch_thread(by, tiles_m)
        T.launch_thread(ty, warps)
        T.launch_thread(tx, 32)
        a_half = T.decl_buffer([8], dtype, scope="local")
        b_half = T.decl_buffer([8 * nt], dtype, scope="local")
        acc = T.decl_buffer([4 * nt], "float32", scope="local")
        e = T.decl_buffer([1], "uint32", scope="local")
        a_word = T.decl_buffer([4], "uint32", data=a_half.data, scope="local")
        b_word = T.decl_buffer([4 * nt], "uint32", data=b_half.data, scope="local")
        for i in T.unroll(4 * nt):
            acc[i] = T.float32(0)
        for kt in range(tiles_k):
            # lane (g, t): a0 row g cols 2t..2t+1, a1 row g+8, a2/a3 the same 8 columns on
            # (formats.mma_sp.lane_registers)
            for r in T.unroll(4):
                for s in T.unroll(2):
                    a_half[r * 2 + s] = V[by * 16 + tx // 4 + r % 2 * 8, kt * 16 + tx % 4 * 2 + r // 2 * 8 + s]
            e[0] = T.if_then_else(tx % 4 < 2, E[by, kt, tx // 4 * 2 + tx % 4], T.uint32(0))
            for j in T.unroll(nt):
                for i in T.unroll(4):
                    for s in T.unroll(2):
                        b_half[j * 8 + i * 2 + s] = T.if_then_else(
                            T.And(kt * 32 + tx % 4 * 2 + i * 8 + s < K,
                                  bx * per_block + ty * per_warp + j * 8 + tx // 4 < N),
                            B[T.min(kt * 32 + tx % 4 * 2 + i * 8 + s, K - 1),
                              T.min(bx * per_block + ty * per_warp + j * 8 + tx // 4, N - 1)],
                            zero)
                mma(acc[j * 4], acc[j * 4 + 1], acc[j * 4 + 2], acc[j * 4 + 3],
                    a_word[0], a_word[1], a_word[2], a_word[3],
                    b_word[j * 4], b_word[j * 4 + 1], b_word[j * 4 + 2], b_word[j * 4 + 3],
                    acc[j * 4], acc[j * 4 + 1], acc[j * 4 + 2], acc[j * 4 + 3], e[0], 0)
        for j in T.unroll(nt):
            for i in T.unroll(4):
                if by * 16 + tx // 4 + i // 2 * 8 < M and bx * per_block + ty * per_warp + j * 8 + tx % 4 * 2 + i % 2 < N:
                    C[by * 16 + tx // 4 + i // 2 * 8, bx * per_block + ty * per_warp + j * 8 + tx % 4 * 2 + i % 2] = \
                        acc[j * 4 + i]

    return spmm24


def build(M: int, K: int, N: int, *, arch: str = "sm_90a", **knobs):
    """The compiled module (TVM executable) of :func:`spmm_24` for ``arch``."""
    return compile_for(spmm_24(M, K, N, **knobs), arch)
