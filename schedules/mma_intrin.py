"""The two generators behind every ldmatrix / mma tensor intrinsic sparsec registers itself.

TVM 0.27 ships float16 intrinsics for 16 x 16 tiles only. The Tensor Core schedules need
more: bfloat16 (``tensorcore``, ``tensorcore_sddmm``), a B operand stored n-major for
C += A B^T (``tensorcore_sddmm``), and 16 x 8 output tiles of one m16n8k16 (``tensorcore_n8``).
Each of those is an instance of the same two shapes of intrinsic, which differ only in the
tile, the fragment layouts and how a lane addresses shared memory; the callers pass those in.

A fragment is a (32 lanes x registers) warp buffer; a layout maps an element (row, column)
of a tile to its (lane, register).
"""
from __future__ import annotations
from .tvm_modules import T

WARP = 32
# element alignment of a warp fragment: TVM's 16 x 16 fragments (8 registers a lane) are
# aligned to 16 elements, sparsec's 16 x 8 ones (4 registers) to their 4
FRAGMENT_ALIGN = {8: 16, 4: 4}


def ldmatrix(dtype: str, rows: int, cols: int, layout, *, trans: bool, num: int, lane_address):
    """A rows x cols tile of 16-bit values in dynamic shared memory into a fragment placed by
    ``layout``: one ``ldmatrix.x<num>[.trans]``, lane tx giving the row address
    ``lane_address(s0, tx)`` (s0 the tile's row stride)."""
    regs = rows * cols // WARP
    align = FRAGMENT_ALIGN[regs]

    @T.prim_func(s_tir=True)
    def desc(warp_h: T.handle, shared_h: T.handle) -> None:
        shared = T.match_buffer(shared_h, (rows, cols), dtype, align=64, offset_factor=cols, scope="shared.dyn")
        warp = T.match_buffer(warp_h, (WARP, regs), dtype, align=64, offset_factor=align, scope="warp")
        with T.sblock("root"):
            T.reads(shared[0:rows, 0:cols])
            T.writes(warp[0:WARP, 0:regs])
            for ax0, ax1 in T.grid(rows, cols):
                with T.sblock("shared_warp"):
                    v0, v1 = T.axis.remap("SS", [ax0, ax1])
                    T.reads(shared[v0, v1])
                    lane, reg = T.meta_var(layout(v0, v1))
                    T.writes(warp[lane, reg])
                    warp[lane, reg] = shared[v0, v1]

    @T.prim_func(s_tir=True)
    def impl(warp_h: T.handle, shared_h: T.handle) -> None:
        s0 = T.int32()
        s1 = T.int32()
        shared = T.match_buffer(shared_h, (rows, cols), dtype, align=64, offset_factor=cols, scope="shared.dyn",
                                strides=[s0, s1])
        warp = T.match_buffer(warp_h, (WARP, regs), dtype, align=64, offset_factor=align, scope="warp")
        with T.sblock("root"):
            T.reads(shared[0:rows, 0:cols])
            T.writes(warp[0:WARP, 0:regs])
            for tx in T.thread_binding(0, WARP, "threadIdx.x"):
                T.evaluate(T.ptx_legacy.ldmatrix(trans, num, ".b16", warp.data, warp.elem_offset + regs * tx,
                                                 shared.access_ptr("r"), lane_address(s0, tx), dtype=dtype))

    return desc, impl


def mma(dtype: str, abbrv: str, n: int, a_layout, b_layout, c_layout):
    """C (16 x n, fp32) += A (16 x 16) @ B: ``b_layout(k, j)`` places B's element (k, j), so a B
    stored n-major (C += A B^T) is a layout that swaps its arguments. n // 8 m16n8k16 (row.col),
    each on 4 of a lane's B and C registers."""
    regs = n // 2
    align = FRAGMENT_ALIGN[regs]

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (WARP, 8), dtype, align=64, offset_factor=16, scope="warp")
        B = T.match_buffer(b, (WARP, regs), dtype, align=64, offset_factor=align, scope="warp")
        C = T.match_buffer(c, (WARP, regs), "float32", align=64, offset_factor=align, scope="warp")
        with T.sblock("root"):
            T.reads(C[0:WARP, 0:regs], A[0:WARP, 0:8], B[0:WARP, 0:regs])
            T.writes(C[0:WARP, 0:regs])
            for i, j, k in T.grid(16, n, 16):
                with T.sblock("C"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    tc, lc = T.meta_var(c_layout(vi, vj))
                    ta, la = T.meta_var(a_layout(vi, vk))
                    tb, lb = T.meta_var(b_layout(vk, vj))
                    T.reads(C[tc, lc], A[ta, la], B[tb, lb])
                    T.writes(C[tc, lc])
                    C[tc, lc] += T.Cast("float32", A[ta, la]) * T.Cast("float32", B[tb, lb])

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (WARP, 8), dtype, align=64, offset_factor=16, scope="warp")
        B = T.match_buffer(b, (WARP, regs), dtype, align=64, offset_factor=align, scope="warp")
        C = T.match_buffer(c, (WARP, regs), "float32", align=64, offset_factor=align, scope="warp")
        with T.sblock("root"):
            T.reads(C[0:WARP, 0:regs], A[0:WARP, 0:8], B[0:WARP, 0:regs])
            T.writes(C[0:WARP, 0:regs])
            for tx in T.thread_binding(0, WARP, "threadIdx.x"):
                for h in T.unroll(n // 8):
                    T.evaluate(T.ptx_legacy.mma("m16n8k16", "row", "col", abbrv, abbrv, "fp32",
                                                A.data, A.elem_offset + tx * 8,
                                                B.data, B.elem_offset + tx * regs + 4 * h,
                                                C.data, C.elem_offset + tx * regs + 4 * h, False, dtype="float32"))

    return desc, impl
