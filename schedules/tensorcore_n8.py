"""Tensor intrinsics for 8-column output fragments: one ``mma.sync.m16n8k16`` per 16 x 8 tile.

TVM 0.27's MMA intrinsics cover 16 x 16 output tiles (two m16n8k16 each), so a warp's N
tile is at least 16 columns. With 8 feature columns (or an 8-wide tile of a narrow
operator) half of that work multiplies zeros; these intrinsics let the BSR Tensor Core
template (``warp_n = 8``) load B as a 16 x 8 fragment (``ldmatrix.x2.trans``), issue one
m16n8k16, and keep 16 x 8 fp32 accumulators (4 registers a lane).

Fragment layouts, as PTX defines them for m16n8k16 (lane t, register r):
  C (16 x 8, fp32):  row t // 4 + 8 * (r // 2), column 2 * (t % 4) + r % 2
  B (16 x 8, k x n): k 2 * (t % 4) + r % 2 + 8 * (r // 2), n t // 4
"""
from __future__ import annotations

from typing import Dict

from tvm.script import tirx as T

WARP = 32
_NAMES: Dict[str, Dict[str, str]] = {}


def c_layout(i, j):
    """(lane, register) of element (i, j) of a 16 x 8 accumulator tile."""
    return 4 * (i % 8) + j // 2, 2 * (i // 8) + j % 2


def b_layout(k, n):
    """(lane, register) of element (k, n) of a 16 x 8 B tile (k rows, n columns)."""
    return 4 * n + (k % 8) // 2, 2 * (k // 8) + k % 2


def intrinsics(dtype: str) -> Dict[str, str]:
    """Names of the registered 16 x 8 intrinsics for ``dtype`` (float16 or bfloat16):
    ``ld_b`` (shared.dyn -> fragment), ``mma`` (16 x 16 A fragment of TVM's layout, 16 x 8 B,
    fp32 16 x 8 C), ``fill`` (C = 0) and ``store`` (C -> shared fp32)."""
    if dtype in _NAMES:
        return _NAMES[dtype]
    from tvm.s_tir import TensorIntrin
    from tvm.s_tir.tensor_intrin.cuda import shared_16x16_to_ldmatrix_32x8_layout as a_layout

    abbrv = {"float16": "fp16", "bfloat16": "bf16"}[dtype]
    names = {"ld_b": f"sparsec_ldmatrix_{abbrv}_b16x8_dyn", "mma": f"sparsec_mma_16x8x16_{abbrv}_f32",
             "fill": "sparsec_mma_fill_16x8_f32", "store": "sparsec_mma_store_16x8_f32_shared"}
    makers = {"ld_b": lambda: _ldmatrix_b(dtype), "mma": lambda: _mma(dtype, abbrv, a_layout),
              "fill": _fill, "store": _store}
    for key, name in names.items():
        if TensorIntrin.get(name, allow_missing=True) is None:
            TensorIntrin.register(name, *makers[key]())
    _NAMES[dtype] = names
    return names


def _ldmatrix_b(dtype: str):
    """A 16 x 8 tile of B (k rows contiguous in shared memory) into the B fragment:
    ``ldmatrix.x2.trans``, lanes 0..15 giving the addresses of rows 0..15."""

    @T.prim_func(s_tir=True)
    def desc(warp_h: T.handle, shared_h: T.handle) -> None:
        shared = T.match_buffer(shared_h, (16, 8), dtype, align=64, offset_factor=8, scope="shared.dyn")
        warp = T.match_buffer(warp_h, (WARP, 4), dtype, align=64, offset_factor=4, scope="warp")
        with T.sblock("root"):
            T.reads(shared[0:16, 0:8])
            T.writes(warp[0:WARP, 0:4])
            for ax0, ax1 in T.grid(16, 8):
                with T.sblock("shared_warp"):
                    v0, v1 = T.axis.remap("SS", [ax0, ax1])
                    T.reads(shared[v0, v1])
                    lane, reg = T.meta_var(b_layout(v0, v1))
                    T.writes(warp[lane, reg])
                    warp[lane, reg] = shared[v0, v1]

    @T.prim_func(s_tir=True)
    def impl(warp_h: T.handle, shared_h: T.handle) -> None:
        s0 = T.int32()
        s1 = T.int32()
        shared = T.match_buffer(shared_h, (16, 8), dtype, align=64, offset_factor=8, scope="shared.dyn",
                                strides=[s0, s1])
        warp = T.match_buffer(warp_h, (WARP, 4), dtype, align=64, offset_factor=4, scope="warp")
        with T.sblock("root"):
            T.reads(shared[0:16, 0:8])
            T.writes(warp[0:WARP, 0:4])
            for tx in T.thread_binding(0, WARP, "threadIdx.x"):
                T.evaluate(T.ptx_legacy.ldmatrix(True, 2, ".b16", warp.data, warp.elem_offset + 4 * tx,
                                                 shared.access_ptr("r"), s0 * (tx % 16), dtype=dtype))

    return desc, impl


def _mma(dtype: str, abbrv: str, a_layout):
    """C (16 x 8, fp32) += A (16 x 16, TVM's fragment layout) @ B (16 x 8): one m16n8k16."""

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (WARP, 8), dtype, align=64, offset_factor=16, scope="warp")
        B = T.match_buffer(b, (WARP, 4), dtype, align=64, offset_factor=4, scope="warp")
        C = T.match_buffer(c, (WARP, 4), "float32", align=64, offset_factor=4, scope="warp")
        with T.sblock("root"):
            T.reads(C[0:WARP, 0:4], A[0:WARP, 0:8], B[0:WARP, 0:4])
            T.writes(C[0:WARP, 0:4])
            for i, j, k in T.grid(16, 8, 16):
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
        B = T.match_buffer(b, (WARP, 4), dtype, align=64, offset_factor=4, scope="warp")
        C = T.match_buffer(c, (WARP, 4), "float32", align=64, offset_factor=4, scope="warp")
        with T.sblock("root"):
            T.reads(C[0:WARP, 0:4], A[0:WARP, 0:8], B[0:WARP, 0:4])
            T.writes(C[0:WARP, 0:4])
            for tx in T.thread_binding(0, WARP, "threadIdx.x"):
                T.evaluate(T.ptx_legacy.mma("m16n8k16", "row", "col", abbrv, abbrv, "fp32",
                                            A.data, A.elem_offset + tx * 8, B.data, B.elem_offset + tx * 4,
                                            C.data, C.elem_offset + tx * 4, False, dtype="float32"))

    return desc, impl


def _fill():
    """C (16 x 8 fp32 fragment) = 0."""

    @T.prim_func(s_tir=True)
    def desc(c: T.handle) -> None:
        C = T.match_buffer(c, (WARP, 4), "float32", align=64, offset_factor=4, scope="warp")
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:WARP, 0:4])
            for i, j in T.grid(16, 8):
                with T.sblock("C_warp"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    lane, reg = T.meta_var(c_layout(vi, vj))
                    T.reads()
                    T.writes(C[lane, reg])
                    C[lane, reg] = T.float32(0)

    @T.prim_func(s_tir=True)
    def impl(c: T.handle) -> None:
        C = T.match_buffer(c, (WARP, 4), "float32", align=64, offset_factor=4, scope="warp")
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:WARP, 0:4])
            for tx in T.thread_binding(0, WARP, "threadIdx.x"):
                T.evaluate(T.cuda.mma_fill_legacy(4, C.data, C.elem_offset, dtype="float32"))

    return desc, impl


def _store():
    """C (16 x 8 fp32 fragment) -> shared memory, each lane storing its 4 registers."""

    @T.prim_func(s_tir=True)
    def desc(c: T.handle, s: T.handle) -> None:
        C = T.match_buffer(c, (WARP, 4), "float32", align=64, offset_factor=4, scope="warp")
        S = T.match_buffer(s, (16, 8), "float32", align=64, offset_factor=4, scope="shared")
        with T.sblock("root"):
            T.reads(C[0:WARP, 0:4])
            T.writes(S[0:16, 0:8])
            for i, j in T.grid(16, 8):
                with T.sblock("C_warp"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    lane, reg = T.meta_var(c_layout(vi, vj))
                    T.reads(C[lane, reg])
                    T.writes(S[vi, vj])
                    S[vi, vj] = C[lane, reg]

    @T.prim_func(s_tir=True)
    def impl(c: T.handle, s: T.handle) -> None:
        s0 = T.int32()
        s1 = T.int32()
        C = T.match_buffer(c, (WARP, 4), "float32", align=64, offset_factor=4, scope="warp")
        S = T.match_buffer(s, (16, 8), "float32", align=64, offset_factor=4, scope="shared", strides=[s0, s1])
        with T.sblock("root"):
            T.reads(C[0:WARP, 0:4])
            T.writes(S[0:16, 0:8])
            for tx in T.thread_binding(0, WARP, "threadIdx.x"):
                for r in T.serial(4):
                    S[tx // 4 + 8 * (r // 2), 2 * (tx % 4) + r % 2] = C[tx, r]

    return desc, impl
