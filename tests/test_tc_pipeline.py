"""The pipelined Tensor Core SpMM (schedules.tc_pipeline) and the vector-wise N:M layout it
gathers from (formats.nm_tc): packing gives the dense product through the gathered rows,
the shared-memory swizzle is a conflict-free permutation, bad arguments are named, and the
PTX nvcc emits holds cp.async, ldmatrix and the sparse / dense mma for sm_90a and sm_80.
(The kernels themselves run on the GPU host: benchmarks/time_tc_pipeline.py.)"""
import re

import numpy as np
import pytest

from sparsec.formats import mma_sp, nm_tc
from nvcc_tools import nvcc_ptx, nvcc_sources
from sparsec.schedules import tc_pipeline as tp
from sparsec.schedules.warp_mma import cuda_source


def _vector_nm(rows, cols, n, m, vec, seed, empty_rows=()):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    w[list(empty_rows)] = 0
    return nm_tc.prune(w, n=n, m=m, vec=vec).astype(np.float16)


@pytest.mark.parametrize("rows, cols, n, m, vec", [
    (128, 768, 1, 8, 128), (37, 70, 2, 8, 16), (300, 515, 1, 4, 64), (16, 32, 4, 16, 16), (5, 3, 1, 8, 128)])
def test_gathered_rows_give_the_dense_product(rows, cols, n, m, vec):
    a = _vector_nm(rows, cols, n, m, vec, seed=rows + cols, empty_rows=(0,))
    values, col_idx = nm_tc.pack(a, n=n, m=m, vec=vec)
    mp = -(-rows // vec) * vec
    assert values.shape[0] == mp and values.shape[1] % nm_tc.KC_ALIGN == 0
    assert col_idx.shape == (mp // vec, values.shape[1]) and col_idx.dtype == np.int32
    assert col_idx.min() >= 0 and col_idx.max() < cols
    assert np.array_equal(nm_tc.unpack(values, col_idx, a.shape, vec), a.astype(np.float64))
    b = np.random.default_rng(1).standard_normal((cols, 11))
    got = np.concatenate([values[rv * vec:(rv + 1) * vec].astype(np.float64) @ b[col_idx[rv]]
                          for rv in range(col_idx.shape[0])])[:rows]
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-12, atol=1e-12)


def test_only_n_of_every_m_rows_of_b_are_read():
    a = _vector_nm(256, 4096, 1, 8, 128, seed=3)
    values, col_idx = nm_tc.pack(a, n=1, m=8, vec=128)
    assert values.shape[1] == 4096 // 8  # K/8 gathered rows per row vector, not K
    assert all(len(set(c.tolist())) == 512 for c in col_idx)


def test_a_window_with_too_many_columns_is_refused_by_position():
    a = _vector_nm(32, 64, 1, 8, 16, seed=5)
    a[17, 8:10] = 1.0  # row vector 1 now uses two columns of window 1
    with pytest.raises(ValueError, match=r"row vector 1 \(rows 16..31\) uses 2 columns in window 1 \(columns 8..15\)"):
        nm_tc.pack(a, n=1, m=8, vec=16)


def test_check_names_what_would_mislead_the_kernel():
    a = _vector_nm(40, 64, 1, 8, 16, seed=7)
    values, cols = nm_tc.pack(a, n=1, m=8, vec=16)
    nm_tc.check(values, cols, a.shape, 16)
    bad = cols.copy()
    bad[2, 3] = 64
    with pytest.raises(ValueError, match=r"cols\[2, 3\] = 64 is outside the 64 columns of B"):
        nm_tc.check(values, bad, a.shape, 16)
    with pytest.raises(ValueError, match="cols should be"):
        nm_tc.check(values, cols[:2], a.shape, 16)
    with pytest.raises(ValueError, match="values should be"):
        nm_tc.check(values[:, :8], cols, a.shape, 16)


@pytest.mark.parametrize("chunks", [2, 4, 8, 16, 32])
def test_swizzle_permutes_chunks_and_spreads_eight_rows_over_the_banks(chunks):
    for row in range(64):
        assert sorted(tp.swizzle(row, c, chunks) for c in range(chunks)) == list(range(chunks))
    for r0 in range(0, 64, 8):
        for c in range(chunks):
            groups = {((r * chunks + tp.swizzle(r, c, chunks)) * 16) % 128 for r in range(r0, r0 + 8)}
            assert len(groups) == 8  # one ldmatrix phase: 8 rows, 8 distinct 16-byte bank groups


@pytest.mark.parametrize("kwargs, match", [
    ({"mode": "dense"}, "mode should be one of"),
    ({"mode": "gather", "vec": 64, "kc": 96}, r"row vector \(V=64\) should be a multiple of the block's rows"),
    ({"mode": "gather", "vec": 128, "kc": 96, "warp_n_tiles": 2, "warps_n": 1, "warp_m_tiles": 4,
      "warps_m": 2, "k_steps": 2, "stages": 3, "dtype": "float16", "out_dtype": "int8"}, "out_dtype should be one of"),
    ({"mode": "gather", "vec": 128, "kc": 90}, "kc .* should be a multiple of 16"),
    ({"k_steps": 1}, "k_steps should be one of"),
    ({"dtype": "float32"}, "dtype should be one of"),
    ({"M": 0}, "M should be a positive int"),
    ({"bogus": 1}, r"unknown knob\(s\) \['bogus'\]: this kernel's knobs are \['warps_m', "),
])
def test_bad_arguments_name_the_problem(kwargs, match):
    args = {"mode": "sp24", "M": 256, "K": 768, "N": 64, **kwargs}
    with pytest.raises(ValueError, match=match):
        tp.spmm(args.pop("mode"), args.pop("M"), args.pop("K"), args.pop("N"), **args)


def test_knobs_that_overflow_shared_memory_are_refused():
    knobs = dict(warps_m=4, warps_n=4, warp_m_tiles=4, warp_n_tiles=8, k_steps=4, stages=4)
    assert tp.smem_bytes("sp24", knobs) > tp.SMEM_LIMIT
    with pytest.raises(ValueError, match="bytes of shared memory"):
        tp.spmm("sp24", 1024, 1024, 1024, **knobs)


@pytest.mark.parametrize("mode, dtype", [("sp24", "float16"), ("sp24", "bfloat16"), ("gather", "float16")])
def test_ptx_holds_async_copies_ldmatrix_and_the_mma(mode, dtype):
    kw = {"dtype": dtype, **({} if mode == "sp24" else {"vec": 128, "kc": 96})}
    src = cuda_source(tp.build(mode, 300, 768, 200, out_dtype="float16", **kw))
    ptx = nvcc_ptx(src, "sm_90a")
    ty = tp.DTYPES[dtype]
    mma = (f"mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.{ty}.{ty}.f32" if mode == "sp24"
           else f"mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32")
    per_step = tp.KNOBS["warp_m_tiles"][0] * tp.KNOBS["warp_n_tiles"][0]
    assert ptx.count(mma) >= per_step * tp.KNOBS["k_steps"][0]  # every mma of a stage, unrolled
    assert "cp.async.cg.shared.global" in ptx and "cp.async.wait_group" in ptx
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in ptx
    odd = cuda_source(tp.build(mode, 37, 70, 13, arch="sm_80", **{**kw, **({} if mode == "sp24" else {"kc": 16})}))
    results = nvcc_sources({("hopper", "sm_90a"): src, ("ampere", "sm_80"): odd})
    assert all(ok for ok, _ in results.values()), results


def test_sp24_reads_the_mma_sp_packing():
    """The kernel's A and metadata shapes are formats.mma_sp's padded ones."""
    a = np.zeros((37, 70), np.float16)
    values, meta = mma_sp.pack(a)
    f = tp.spmm("sp24", 37, 70, 13)
    text = f.script()
    assert f"A: T.Buffer(({values.shape[0]}, {values.shape[1]}), \"float16\")" in text
    assert f"E: T.Buffer(({meta.shape[0]}, {meta.shape[1]}, {meta.shape[2]}), \"uint32\")" in text


@pytest.mark.parametrize("grid_m,grid_n,group_m", [(1, 1, 8), (11, 7, 8), (32, 128, 64), (8, 3, 1), (5, 2, 4)])
def test_grouped_order_visits_every_tile_once(grid_m, grid_n, group_m):
    tiles = [tp.grouped_tile(pid, grid_m, grid_n, group_m) for pid in range(grid_m * grid_n)]
    assert sorted(tiles) == [(m, n) for m in range(grid_m) for n in range(grid_n)]
    if group_m >= grid_m:  # one group: consecutive blocks walk down a column tile
        assert tiles[:grid_m] == [(m, 0) for m in range(grid_m)]


def test_outputs_leave_through_shared_memory_in_16_byte_stores():
    """The epilogue stages the block in shared memory and writes C with one 16-byte store per
    8 fp16 outputs (half2 stores straight from the fragments made the FFN's short-K layers
    L2-request bound), each store from its own staged offset."""
    knobs = dict(warps_m=2, warps_n=2, warp_m_tiles=4, warp_n_tiles=4, k_steps=2, stages=3, group_m=8)
    src = cuda_source(tp.build("gather", 768, 768, 512, out_dtype="float16", vec=128, kc=96, **knobs))
    stores = re.findall(r"\*\(uint4\*\)\(C_ptr \+ .*= \*\(uint4\*\)\(Sm_ptr \+ (.*)\);", src)
    block = (16 * 4 * 2) * (8 * 4 * 2)  # 128 x 64 outputs per block
    assert len(stores) == block // 8 // 128  # 8 outputs a store, 128 threads
    assert len(set(stores)) == len(stores)


@pytest.mark.parametrize("mode", ["gather", "sp24"])
def test_epilogue_adds_bias_applies_gelu_and_can_write_c_transposed(mode):
    kw = {} if mode == "sp24" else {"vec": 128, "kc": 96}
    f = tp.spmm(mode, 256, 768, 512, out_dtype="float16", bias=True, activation="gelu", transpose_c=True, **kw)
    text = f.script()
    assert 'Bias: T.Buffer((256,), "float32")' in text
    assert 'C: T.Buffer((512, 256), "float16")' in text  # tokens x features
    src = cuda_source(tp.build(mode, 256, 768, 512, out_dtype="float16", bias=True, activation="gelu",
                               transpose_c=True, **kw))
    assert "expf(" in src and "erff(" not in src and "Bias_ptr[" in src  # A&S erf, not CUDA's erff
    assert re.search(r"\*\(uint4\*\)\(C_ptr", src)
    # a feature count that is not a multiple of 8 cannot take 16-byte stores along C's rows:
    # guarded element stores, still correct
    odd = cuda_source(tp.build(mode, 37, 70, 13, out_dtype="float16", bias=True, activation="relu", transpose_c=True,
                               **({} if mode == "sp24" else {"vec": 128, "kc": 16})))
    assert not re.search(r"\*\(uint4\*\)\(C_ptr", odd) and "max(" in odd
    results = nvcc_sources({("hopper", "sm_90a"): src, ("odd", "sm_90a"): odd})
    assert all(ok for ok, _ in results.values()), results


def test_unknown_activation_is_named():
    with pytest.raises(ValueError, match="activation should be one of"):
        tp.spmm("gather", 128, 64, 64, vec=128, kc=16, activation="swish")


def test_plan_skips_the_bounds_checks_only_where_the_shape_fills_the_tiles():
    """The plan decides, once, which copies and stores the emitted kernel may leave unguarded."""
    full = tp.make_plan("sp24", 256, 768, 512, dtype="float16", out_dtype="float16", vec=0, kc=0, bias=False,
                        activation="none", transpose_c=False, knobs={})
    assert (full.BM, full.BN, full.NT) == (128, 64, 128) and full.nk == 768 // 64
    assert full.fast_a and full.fast_b and full.staged and full.k_full and full.m_full and full.n_full
    odd = tp.make_plan("gather", 37, 70, 13, dtype="float16", out_dtype="float16", vec=128, kc=16, bias=True,
                       activation="relu", transpose_c=False, knobs={"frag_sets": 1})
    assert not (odd.aligned or odd.fast_a or odd.fast_b or odd.staged or odd.m_full or odd.n_full)
    assert odd.e_shape == (1, 16) and odd.a_rows == 128 and odd.frag_sets == 1
    # transposed C is stored along M: 37 rows cannot take whole 16-byte chunks either
    assert not tp.make_plan("sp24", 37, 70, 16, dtype="float16", out_dtype="float16", vec=0, kc=0, bias=False,
                            activation="none", transpose_c=True, knobs={}).staged
    with pytest.raises(AttributeError):
        full.BM = 64  # frozen: the emitting modules only read it
