"""Tensor Core BSR SpMM (schedules/tensorcore.py): the staged operator's semantics on the CPU
against float64, and the scheduled CUDA kernel's source (mma.sync m16n8k16, ldmatrix,
cp.async), launch bounds, knobs and fallbacks; nvcc compiles it for sm_80 and sm_90a."""
from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
import tvm

import sparsec
from sparsec.kernel import _compact
from sparsec.schedules import tensorcore as tc

from nvcc_tools import nvcc_many

ARCHS = ("sm_80", "sm_90a")


def block_matrix(bs, mb, kb, rows, cols, seed, density=0.5, dtype=np.float16):
    """A rows x cols matrix of bs x bs blocks (block row 1 empty), values rounded to dtype."""
    rng = np.random.default_rng(seed)
    mask = rng.random((mb, kb)) < density
    mask[1] = False
    mask[0, 0] = True
    dense = np.kron(mask, np.ones((bs, bs))) * rng.standard_normal((mb * bs, kb * bs))
    return dense[:rows, :cols].astype(dtype)


# ------------------------------------------------------------------- staged semantics (CPU)


@pytest.mark.parametrize("bs,feat,n_tile,stages,k_split", [(16, 64, 64, 1, 1), (32, 128, 64, 2, 1),
                                                           (16, 128, 128, 3, 1), (64, 64, 64, 2, 1),
                                                           (16, 16, 16, 2, 4), (32, 40, 16, 3, 3),
                                                           (16, 24, 16, 1, 8)])
def test_staged_operator_matches_float64(bs, feat, n_tile, stages, k_split):
    """Edge blocks (rows and cols not multiples of bs), an empty block row (its outputs are
    written as zeros over a NaN-poisoned C), every pipeline depth, and a block row's blocks
    split over ``k_split`` groups (rows of 0 to 5 blocks: groups past a row's end, a group
    count that does not divide it, a tail N tile)."""
    rows, cols = 4 * bs - 3, 5 * bs - 5
    dense = block_matrix(bs, 4, 5, rows, cols, seed=bs + stages + k_split, density=0.7)
    A = sparsec.formats.convert(dense, f"bsr:{bs}x{bs}")
    B = np.random.default_rng(1).standard_normal((cols, feat)).astype(np.float16)
    C = np.full((rows, feat), np.nan, np.float32)
    ex = tvm.compile(tc.staged_spmm(bs, feat, n_tile, "float16", stages, k_split=k_split), target="llvm")
    n_io = A.arrays["indptr"].size - 1
    arrays = A.kernel_arrays()  # writeable: DLPack refuses the read-only views in A.arrays
    ex["spmm"](arrays["indptr"], arrays["indices"], A.data, B, C, n_io, rows, cols)
    ref = dense.astype(np.float64) @ B.astype(np.float64)
    np.testing.assert_allclose(C, ref, rtol=1e-5, atol=1e-4)
    assert np.all(C[bs:2 * bs] == 0)


def test_staged_operator_with_no_block_rows():
    """A 0-row matrix: the grid is padded to one block, which reads no blocks and writes nothing."""
    ex = tvm.compile(tc.staged_spmm(16, 64, 64, "float16", 2), target="llvm")
    C = np.zeros((0, 64), np.float32)
    empty = [_compact(a) for a in (np.zeros(0, np.int32), np.zeros(0, np.float16), C)]
    ex["spmm"](np.zeros(1, np.int32), empty[0], empty[1], np.ones((16, 64), np.float16), empty[2], 0, 0, 16)


# ------------------------------------------------------------------- CUDA kernels

CASES = {  # name: (block, feat, dtype, knobs)
    "b16-fp16": (16, 256, "float16", {}),
    "b32-fp16": (32, 512, "float16", {}),
    "b64-fp16": (64, 256, "float16", {}),
    "b32-bf16": (32, 256, "bfloat16", {}),
    "b32-fp16-knobs": (32, 512, "float16", {"n_tile": 256, "warp_m": 16, "warp_n": 64, "stages": 4}),
    "b16-fp16-few": (16, 16, "float16", {}),  # the default at few columns: k_split groups
    "b64-fp16-groups": (64, 16, "float16", {"n_tile": 8, "warp_m": 32, "warp_n": 8, "stages": 2, "k_split": 4}),
}


@pytest.fixture(scope="module")
def kernels():
    return {(name, arch): sparsec.compile("spmm", f"bsr:{b}x{b}", feat=f, dtype=dt, knobs=kn, target=f"cuda:{arch}")
            for name, (b, f, dt, kn) in CASES.items() for arch in ARCHS}


@pytest.mark.parametrize("name", CASES)
def test_cuda_source_is_a_tensor_core_kernel(kernels, name):
    bs, feat, dtype, knobs = CASES[name]
    k = kernels[(name, "sm_90a")]
    src = k.source()
    abbr = "f16" if dtype == "float16" else "bf16"
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{abbr}.{abbr}.f32" in src
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in src
    assert re.search(r"ldmatrix\.sync\.aligned\.m8n8\.x[24]\.trans", src)  # x2: 8-column B fragments
    assert "cp.async.cg.shared.global" in src and "cp.async.commit_group" in src
    used = k.knobs
    assert used == {**tc.default_knobs(bs, feat), **knobs}
    warps = used["k_split"] * (bs // used["warp_m"]) * (used["n_tile"] // used["warp_n"])
    assert set(re.findall(r"__launch_bounds__\((\d+)\)", src)) == {str(32 * warps)}
    assert "condval" not in src  # every gather a vector cp.async (no scalar fallback)
    if used["stages"] > 1:
        assert f"cp.async.wait_group {used['stages'] - 1};" in src
    assert k.outputs[0].dtype == "float32"


def test_nvcc_compiles_tensor_core_kernels(kernels):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    results = nvcc_many({key: (k.source(), key[1]) for key, k in kernels.items()})
    for key, (ok, log) in results.items():
        assert ok, f"nvcc -arch={key[1]} failed for {key[0]}:\n{log[-3000:]}"


def test_feat_not_a_multiple_of_the_tile_takes_a_guarded_tail():
    """feat = 96: two 64-column tiles, the second half past the last column (B read as
    zeros by a predicated copy, C stored where the column exists), still on Tensor Cores."""
    k = sparsec.compile("spmm", "bsr:32x32", feat=96, dtype="float16", target="cuda:sm_90a")
    assert "mma.sync" in k.source() and k.knobs["n_tile"] == 64
    assert k.outputs[0].dtype == "float32"


@pytest.mark.parametrize("spec,dtype", [("bsr:8x8", "float16"), ("bsr:16x32", "float16"), ("bsr:32x32", "float32"),
                                        ("csr", "float16")])
def test_other_formats_and_dtypes_take_the_generic_template(spec, dtype):
    k = sparsec.compile("spmm", spec, feat=128, dtype=dtype, target="cuda:sm_90a")
    assert "mma.sync" not in k.source()


def test_cpu_target_takes_the_generic_template():
    k = sparsec.compile("spmm", "bsr:16x16", feat=128, dtype="float16", target="llvm")
    assert "n_tile" not in k.knobs


@pytest.mark.parametrize("knobs,match", [
    ({"warp_m": 64}, "warp_m should divide the block size 32"),
    ({"n_tile": 64, "warp_n": 64, "warp_m": 16}, None),
    ({"stages": 5}, "stages should be one of"),
    ({"n_tile": 256, "warp_m": 16, "warp_n": 16}, "at most 16 warps"),
])
def test_knobs_are_validated(knobs, match):
    if match is None:
        k = sparsec.compile("spmm", "bsr:32x32", feat=128, dtype="float16", knobs=knobs, target="cuda:sm_90a")
        assert k.knobs["warp_n"] == 64
        return
    with pytest.raises(ValueError, match=match):
        sparsec.compile("spmm", "bsr:32x32", feat=256, dtype="float16", knobs=knobs, target="cuda:sm_90a")


def test_few_columns_split_a_block_row_over_warp_groups(kernels):
    """Up to 64 columns the default splits a block row's blocks over k_split warp groups:
    each walks ceil(row / k_split) steps, and the store sums the groups' tiles."""
    assert tc.default_knobs(16, 16)["k_split"] > 1 and tc.default_knobs(32, 512)["k_split"] == 1
    src = kernels[("b64-fp16-groups", "sm_90a")].source()
    assert "+ 3) >> 2)" in src  # (row_len + 3) / 4 steps per group
    store = src[src.rindex("__syncthreads();"):]
    assert store.count("C_s_shared_ptr") == 4  # four groups' accumulators read per output vector


@pytest.mark.parametrize("shape,n_tile,k_split", [((4096, 4096), 64, 4), ((1024, 4096), 32, 8),
                                                   ((1536, 384), 16, 8), ((768, 3072), 16, 8), (None, 16, 8)])
def test_few_columns_widen_the_n_tile_for_long_walks_on_a_full_grid(shape, n_tile, k_split):
    """With 64 columns a matrix of at least WIDE_TILE_COLS columns takes the widest N tile
    whose grid keeps WIDE_TILE_BLOCKS thread blocks (A read once at 64); short walks, small
    grids and a format spec alone (no shape known) keep the narrow tile."""
    knobs = tc.default_knobs(16, 64, shape)
    assert (knobs["n_tile"], knobs["k_split"]) == (n_tile, k_split)
    assert tc.check_knobs(16, 64, **knobs) <= tc.MAX_WARPS


def test_a_kernel_compiled_for_a_matrix_takes_its_shapes_default():
    """The block-row template (one of its knobs given; the streaming kernel takes this
    matrix by default, tests/test_bsr_stream.py) fills in the rest for the matrix's shape."""
    m = sparsec.formats.convert(block_matrix(16, 64, 256, 1024, 4096, seed=3, density=0.3), "bsr:16x16")
    k = sparsec.compile("spmm", m, feat=64, dtype="float16", target="cuda:sm_90a", knobs={"warp_m": 16})
    assert k.knobs == tc.default_knobs(16, 64, (1024, 4096)) and k.knobs["n_tile"] == 32


@pytest.mark.parametrize("knobs,message", [({"k_split": 0}, "k_split should be a positive int"),
                                           ({"k_split": 32}, "at most 16 warps"),
                                           ({"k_split": 4, "stages": 8, "n_tile": 64, "warp_n": 64, "warp_m": 64},
                                            "fewer k_split groups")])
def test_bad_k_split_is_refused_by_name(knobs, message):
    with pytest.raises(ValueError, match=message):
        sparsec.compile("spmm", "bsr:64x64", feat=64, dtype="float16", knobs=knobs, target="cuda:sm_90a")
