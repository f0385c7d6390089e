"""The packed Tensor Core kernels ``sparsec.compile`` builds are the hand-written ones: the
default knob rules (``schedules.tensorcore_packed``) pick the committed H200 bests by shape,
and for a matrix compiled for, the body that runs is the hand-written kernel's CUDA, launched
once with its grid (``benchmarks/compare_tc_kernels.py`` does this for every committed case;
the GPU timing is ``benchmarks/check_tc_formats.py``)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sparsec import build, formats
from sparsec.schedules import srbcrs_tensorcore as stc
from sparsec.schedules import tc_pipeline as tp
from sparsec.schedules import tensorcore_packed as packed
from sparsec.schedules.tensorcore_packed import MID, NARROW, default_pipeline_knobs, srbcrs_default_knobs
from script_modules import load_script

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _load(name):
    return load_script(BENCHMARKS / f"{name}.py", f"sparsec_benchmark_{name}")


# ---------------------------------------------------------------- the default rules


@pytest.mark.parametrize("layout, vec, feat, kc, shape, want", [
    ("sp24", 1, 128, None, (3072, 768), MID),  # 48 blocks of 128 x 64, a 768-deep K walk
    ("sp24", 1, 128, None, (4096, 4096), MID),
    ("gather", 128, 128, 512, (4096, 4096), MID),  # gathered rows 512 long
    ("sp24", 1, 128, None, (768, 3072), NARROW),  # 12 blocks of 128 x 64: too few
    ("gather", 128, 128, 96, (3072, 768), NARROW),  # 96-long gathered rows: too short a walk
    ("sp24", 1, 16, None, (4096, 4096), NARROW),  # 16 columns: a 64-column tile would be a quarter full
    ("sp24", 1, 128, None, None, NARROW),  # no matrix (a format spec): what needs its shape does not apply
])
def test_pipeline_default_below_512_columns_picks_the_block_by_shape(layout, vec, feat, kc, shape, want):
    assert default_pipeline_knobs(layout, vec, feat, kc, shape) == want


def test_pipeline_default_from_512_columns_and_narrow_row_vectors():
    short, long = default_pipeline_knobs("gather", 128, 4096, 96), default_pipeline_knobs("gather", 128, 4096, 512)
    assert (short["k_steps"], short["stages"], long["k_steps"], long["stages"]) == (2, 3, 4, 3)
    assert default_pipeline_knobs("sp24", 1, 4096, None, (4096, 4096)) == packed.WIDE_SP24
    narrow = default_pipeline_knobs("gather", 16, 4096, 96)  # a block's rows within one 16-row vector
    assert tp.block_shape(narrow)[0] == 16


@pytest.mark.parametrize("feat, vec, rows, want", [
    (16, 2, 768, (8, 2)),  # 384 vector rows x 1 column group: blocks enough
    (16, 2, 766, (8, 8)),  # 383
    (16, 8, 768, (8, 8)),  # 96 vector rows
    (2048, 8, 768, (8, 2)),  # 96 x 16 = 1536
    (256, 4, 384, (8, 8)),  # 96 x 2 = 192
    (8192, 4, None, (8, 2)), (16, 8, None, (8, 2)),  # no matrix: 8 / 2, the best single setting
])
def test_srbcrs_default_by_the_blocks_the_matrix_makes(feat, vec, rows, want):
    knobs = srbcrs_default_knobs(feat, vec, rows)
    assert (knobs["n_bytes"], knobs["warps"]) == want


def test_compiled_int8_kernel_takes_the_rule_of_its_matrix_rows():
    q = np.where(np.random.default_rng(1).random((512, 64)) < 0.3, 3, 0).astype(np.float32)
    A = formats.convert(q, "srbcrs:v2,int8")  # 256 vector rows
    assert build.compile("spmm", A, target="cuda:sm_90a", feat=128).knobs == {"n_bytes": 8, "warps": 8}
    assert build.compile("spmm", A, target="cuda:sm_90a", feat=256).knobs == {"n_bytes": 8, "warps": 2}
    assert build.compile("spmm", "srbcrs:v2,int8", target="cuda:sm_90a", dtype="int8", feat=128).knobs == \
        {"n_bytes": 8, "warps": 2}


# ---------------------------------------------------------------- the same CUDA as the hand-written kernel


@pytest.fixture(scope="module")
def compare():
    return _load("compare_tc_kernels")


def _case(kind):
    """(op, converted matrix, feature count, the hand-written PrimFunc for given knobs)."""
    rng = np.random.default_rng(7)
    if kind == "int8":
        q = np.where(rng.random((96, 160)) < 0.3, np.round(rng.standard_normal((96, 160)) * 20), 0)
        A = formats.convert(q.astype(np.float32), "srbcrs:v4,int8")
        return "spmm", A, 16, lambda knobs: stc.spmm_srbcrs_int8(96, 160, 16, 4, **knobs)
    half = _load("check_tc_formats").spmm_half_out()
    w = rng.standard_normal((256, 512)).astype(np.float32)
    if kind == "sp24":
        w = formats.nm.prune(w, n=2, m=4)[0].to_dense()
        A = formats.convert(w.astype(np.float16), "mma_sp", dtype=np.float16)
        return half, A, 128, lambda knobs: tp.spmm("sp24", 256, 512, 128, out_dtype="float16", **knobs)
    A = formats.convert(formats.nm_tc.prune(w, n=1, m=8, vec=128).astype(np.float16), "nm_tc:1:8:v128",
                        dtype=np.float16)
    kc = A.arrays["gather_values"].shape[1]
    return half, A, 32, lambda knobs: tp.spmm("gather", 256, 512, 32, out_dtype="float16", vec=128, kc=kc, **knobs)


@pytest.mark.parametrize("kind", ["sp24", "gather", "int8"])
def test_compiled_kernel_runs_the_hand_written_cuda(compare, kind):
    """For the matrix compiled for, the compiled kernel launches one kernel: the hand-written
    kernel built with the same knobs, character for character after the names are made
    alike, with the same grid, block and shared memory."""
    op, A, feat, hand_func = _case(kind)
    comp = compare.describe_build(compare.compiled_build(op, A, feat))
    table = tp.KNOBS if kind != "int8" else stc.KNOBS
    knobs = {k: comp["knobs"][k] for k in table}
    hand = compare.describe_build(compare.hand_build(lambda: hand_func(knobs)))
    assert len(comp["kernels"]) == 2 and comp["launch_sites"] == 2  # the sized body and the any-size one
    assert len(comp["launches"]) == len(hand["launches"]) == 1
    assert comp["launches"][0]["dims"] == hand["launches"][0]["dims"]
    assert comp["signature"] == hand["signature"]
    assert comp["body"] == hand["body"]
    assert comp["helpers"] == hand["helpers"]


def test_normalising_keeps_what_changes_the_code(compare):
    """Names, a pointer read through one cast, an unused size and TVM's numbering are made
    alike; a different read is not."""
    a = ('extern "C" __global__ void __launch_bounds__(64) k_1(signed char* __restrict__ Dv_ptr, int cse_v7, '
         'int n) {\n  int cse_v9 = n * 2;\n  x[0] = ((uint*)Dv_ptr)[cse_v9];\n}\n')
    b = ('extern "C" __global__ void __launch_bounds__(64) hand(uint* __restrict__ Dv_ptr, int n) {\n'
         '  int cse_v2 = n * 2;\n  x[0] = Dv_ptr[cse_v2];\n}\n')
    assert compare.normalise(a, "k_1") == compare.normalise(b, "hand")
    c = b.replace("uint* __restrict__", "signed char* __restrict__")  # bytes read where words were
    assert compare.normalise(a, "k_1") != compare.normalise(c, "hand")
    host = ('            for _ in range(cse_v1):\n'
            '                T.call_ffi_kernel("k", A.data, 48, 4, 32, T.int64(512), launch_params=["blockIdx.x", '
            '"threadIdx.y", "threadIdx.x", "tirx.use_dyn_shared_memory"], ret_ty="int32")\n'
            '            for _ in range(1 - cse_v1):\n'
            '                T.call_ffi_kernel("k_1", A.data, M, M // 64, 4, 32, T.int64(512), launch_params=['
            '"blockIdx.x", "threadIdx.y", "threadIdx.x", "tirx.use_dyn_shared_memory"], ret_ty="int32")\n')
    calls = compare.launches(host)
    assert [c["branch"] for c in calls] == ["sized", "any"]
    assert compare.on_path(calls, "sized") == [calls[0]]
    assert calls[0]["dims"] == {"blockIdx.x": "48", "threadIdx.y": "4", "threadIdx.x": "32", "smem": "512"}
    assert calls[1]["dims"]["blockIdx.x"] == "M // 64"
