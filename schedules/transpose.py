"""A 2-D transpose kernel for the Tensor Core linear layers' token-major -> feature-major
step (``sparsec.tc_linear``): torch's strided copy (``x.t().contiguous()``) moves fp16 at a
fraction of the memory bandwidth, which at BERT's sizes cost as much as the sparse FFN's
second GEMM.

A block moves a 64 x 64 tile through shared memory. It reads the tile with 16-byte loads,
a warp covering 32 consecutive rows at one 8-column chunk, and scatters each chunk's 8
elements into the transposed shared tile (consecutive rows land in consecutive halves:
no bank conflicts); then each thread reads 16 bytes of a transposed row and stores them,
8 threads covering 128 contiguous bytes of the output. Both sizes must be multiples of 8
(whole 16-byte chunks); the edges of a matrix that does not fill its last tiles are guarded.
"""
from __future__ import annotations

TILE = 64
THREADS = 256
DTYPES = ("float16", "bfloat16")


def transpose(rows: int, cols: int, dtype: str = "float16"):
    """The PrimFunc ``transpose(X, Y)``: Y (cols, rows) = X (rows, cols) transposed."""
    from tvm.script import tirx as T

    from .warp_mma import check_choice, check_sizes

    check_sizes(rows=rows, cols=cols)
    check_choice("dtype", dtype, DTYPES)
    if rows % 8 or cols % 8:
        raise ValueError(f"rows and cols should be multiples of 8 (16-byte chunks), got {rows} x {cols}")
    grid_r, grid_c = -(-rows // TILE), -(-cols // TILE)
    ld = TILE + 8  # shared row pitch: 144 bytes keeps each row 16-byte aligned
    chunks = TILE * TILE // 8 // THREADS  # 16-byte chunks per thread and phase

    def r_of(it, tx):  # load phase: row in the tile, then its 8-column chunk
        return (it * THREADS + tx) % TILE

    def c_of(it, tx):
        return (it * THREADS + tx) // TILE * 8

    def line_of(it, tx):  # store phase: output row in the tile, then its 8-element chunk
        return (it * THREADS + tx) // 8

    def off_of(it, tx):
        return (it * THREADS + tx) % 8 * 8

    @T.prim_func(s_tir=True)
    def transpose_kernel(x_h: T.handle, y_h: T.handle):
        T.func_attr({"global_symbol": "transpose", "tirx.noalias": True})
        X = T.match_buffer(x_h, (rows, cols), dtype)
        Y = T.match_buffer(y_h, (cols, rows), dtype)
        bx = T.env_thread("blockIdx.x")
        tx = T.env_thread("threadIdx.x")
        T.launch_thread(bx, grid_r * grid_c)
        T.launch_thread(tx, THREADS)
        S = T.decl_buffer([TILE * ld], dtype, scope="shared")
        ld_buf = T.decl_buffer([8], dtype, scope="local")
        for it in T.unroll(chunks):
            if T.And(bx // grid_c * TILE + r_of(it, tx) < rows, bx % grid_c * TILE + c_of(it, tx) < cols):
                for e in T.vectorized(8):
                    ld_buf[e] = X[bx // grid_c * TILE + r_of(it, tx), bx % grid_c * TILE + c_of(it, tx) + e]
                for e in T.unroll(8):
                    S[(c_of(it, tx) + e) * ld + r_of(it, tx)] = ld_buf[e]
        T.tvm_storage_sync("shared")
        for it in T.unroll(chunks):
            if T.And(bx % grid_c * TILE + line_of(it, tx) < cols, bx // grid_c * TILE + off_of(it, tx) < rows):
                for e in T.vectorized(8):
                    Y[bx % grid_c * TILE + line_of(it, tx), bx // grid_c * TILE + off_of(it, tx) + e] = \
                        S[line_of(it, tx) * ld + off_of(it, tx) + e]

    return transpose_kernel


def build(rows: int, cols: int, dtype: str = "float16", arch: str = "sm_90a"):
    from .warp_mma import compile_for

    return compile_for(transpose(rows, cols, dtype), arch)
