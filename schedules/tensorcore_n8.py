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

from . import mma_intrin
from .mma_intrin import WARP
from .tvm_modules import cuda_intrinsics

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
    a_layout = cuda_intrinsics().shared_16x16_to_ldmatrix_32x8_layout

    abbrv = {"float16": "fp16", "bfloat16": "bf16"}[dtype]
    names = {"ld_b": f"sparsec_ldmatrix_{abbrv}_b16x8_dyn", "mma": f"sparsec_mma_16x8x16_{abbrv}_f32",
             "fill": "sparsec_mma_fill_16x8_f32", "store": "sparsec_mma_store_16x8_f32_shared"}
    # B's k rows are contiguous in shared memory: ldmatrix.x2.trans, lanes 0..15 giving rows 0..15
    makers = {"ld_b": lambda: mma_intrin.ldmatrix(dtype, 16, 8, b_layout, trans=True, num=2,
                                                  lane_address=lambda s0, tx: s0 * (tx % 16)),
              "mma": lambda: mma_intrin.mma(dtype, abbrv, 8, a_layout, b_layout, c_layout),
              "fill": _fill, "store": _store}
    for key, name in names.items():
        if TensorIntrin.get(name, allow_missing=True) is None:
            TensorIntrin.register(name, *makers[key]())
    _NAMES[dtype] = names
    return names


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
