"""The streaming Tensor Core SpMM for BSR weights at few columns of B (schedules/bsr_stream.py),
on the CPU: what nvcc makes of it for sm_90a, its walk over a row's blocks step for step in
numpy, its refusals, its defaults and how sparsec.compile reaches it.
benchmarks/check_bsr_stream.py checks it against float64 on the GPU host."""
import numpy as np
import pytest

from nvcc_tools import nvcc_ptx
from sparsec.schedules import bsr_stream as bs
from sparsec.schedules.warp_mma import cuda_source


@pytest.mark.parametrize("block, feat, knobs", [((16, 16), 16, {}), ((32, 32), 64, {"cluster": 1, "warps": 4}),
                                                ((64, 64), 5, {"nb": 8, "cluster": 4, "bk": 8})])
def test_builds_to_copies_mma_and_a_cluster_reduction(block, feat, knobs):
    """16-byte cp.async for the blocks and B's rows, ldmatrix and mma.m16n8k16 in float32, a
    ballot over the sorted block columns and a shuffle for each block's column; split K
    reduced through the cluster's shared memory (mapa between cluster barriers) or, with one
    CTA a block row slice, stored directly; no CTA barrier in a warp's walk; one launch."""
    kn = {**bs.default_knobs(block, feat, 300, 1111, 0.3), **knobs}
    src = cuda_source(bs.build(block, feat, **kn))
    ptx = nvcc_ptx(src, "sm_90a")
    assert "cp.async.cg.shared.global" in ptx and "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in ptx and "vote.sync.ballot.b32" in ptx
    assert "shfl.sync.idx.b32" in ptx
    clustered = kn["cluster"] > 1
    assert ("mapa" in ptx) == clustered and ("barrier.cluster.arrive" in ptx) == clustered
    loop = src[src.index("for (int j = 0"):]
    loop = loop[:loop.index("tvm_builtin_ptx_cp_async_wait_group_async_wait_group_0")]
    assert "__syncthreads" not in loop and "__syncwarp" in loop
    assert src.count("__global__") // 2 == 1  # one launch: nothing zeroes C first


def _walk(indptr, indices, n_cols, cluster, bk, row):
    """(block, column, phase's first column) of every block block row ``row`` multiplies, in
    the kernel's order, over the cluster's CTAs: each takes ``per`` block columns from
    ``rank * per``, counts the row's blocks below its first column (ballots of 32), then per
    phase of ``bk`` columns counts those below the phase's end and walks them, reading each
    one's column from a window of 32 held across the lanes."""
    lo, hi = int(indptr[row]), int(indptr[row + 1])
    per = -(-n_cols // cluster)

    def count_below(cur, limit):
        n = 0
        while True:
            window = [indices[q] if q < hi else 2**31 - 1 for q in range(cur + n, cur + n + 32)]
            got = sum(v < limit for v in window)
            n += got
            if got < 32:
                return n

    out = []
    for rank in range(cluster):
        g0 = rank * per
        cols = max(min(g0 + per, n_cols) - g0, 0)
        cur = lo + (count_below(lo, g0) if cluster > 1 else 0)
        for ph in range(-(-cols // bk)):
            c0 = g0 + ph * bk
            n = count_below(cur, min(c0 + bk, g0 + per))
            windows = [[indices[q] if q < hi else 0 for q in range(cur + w, cur + w + 32)] for w in (0, 32)]
            for j in range(n):
                if j % 32 == 0 and j > 0:
                    windows = [windows[1], [indices[q] if q < hi else 0 for q in range(cur + j + 32, cur + j + 64)]]
                out.append((cur + j, windows[0][j % 32], c0))
            cur += n
    return out


@pytest.mark.parametrize("cluster, bk", [(1, 256), (8, 64), (4, 4), (2, 1), (8, 8)])
def test_walk_multiplies_every_stored_block_once_with_its_rows_of_b(cluster, bk):
    """Every stored block of every row, once, with its own column, inside the phase whose B
    rows are resident: rows of 0, 1, 31-33, 70 and all 300 block columns (windows of 32
    crossed, many phases), over the cluster's ranks."""
    rng = np.random.default_rng(5)
    n_cols = 300
    lengths = [0, 1, 31, 32, 33, 70, 300, 5]
    rows = [np.sort(rng.choice(n_cols, size=n, replace=False)) for n in lengths]
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    indices = np.concatenate(rows).astype(np.int64)
    for r in range(len(lengths)):
        seen = _walk(indptr, indices, n_cols, cluster, bk, r)
        assert [q for q, _, _ in seen] == list(range(indptr[r], indptr[r + 1]))
        for q, col, c0 in seen:
            assert col == indices[q] and c0 <= col < c0 + bk


@pytest.mark.parametrize("kw, match", [
    ({"block": (80, 16)}, "block rows should be 16, 32, 48 or 64"),
    ({"block": (16, 8)}, "block columns should be a multiple of 16"),
    ({"block": (16, 256)}, "block columns should be a multiple of 16 up to 128"),
    ({"nb": 24}, r"nb should be one of \[8, 16, 32, 64\]"),
    ({"warps": 3}, "warps should be one of"),
    ({"cluster": 16}, "cluster should be one of"),
    ({"bk": 5}, "bk should be one of"),
    ({"feat": 0}, "feat should be a positive int"),
    ({"feat": 65}, "feat should be at most 64"),
    ({"feat": 20, "nb": 64, "bk": 256, "block": (16, 64)}, "static shared memory"),
    ({"block": (64, 128), "warps": 8, "stages": 6}, "bytes of shared memory a CTA"),
])
def test_refuses_what_it_cannot_take_by_name(kw, match):
    args = {"block": (16, 16), "feat": 16, "nb": 16, "warps": 8, "stages": 4, "cluster": 8, "bk": 64, **kw}
    with pytest.raises(ValueError, match=match):
        bs.plan(args.pop("block"), args.pop("feat"), **args)


def test_defaults_fit_and_follow_the_matrix():
    """Every default plan fits; B's columns round up to the MMA's; a 4096 x 4096 weight's
    CTAs fit one wave at 132 SMs; a phase covers a CTA's share of K where it fits."""
    for feat in (1, 5, 8, 9, 16, 17, 32, 40, 64):
        for block in ((16, 16), (32, 32), (64, 64), (48, 48), (32, 16), (16, 64)):
            for shape in ((384, 384), (4096, 4096), (768, 3072), (4096, 11008)):
                k = bs.default_knobs(block, feat, *shape, 0.3)
                p = bs.plan(block, feat, **k)
                assert k["nb"] >= min(feat, 64) and p.smem <= bs.SMEM_LIMIT
    k = bs.default_knobs((16, 16), 16, 4096, 4096, 0.1)
    p = bs.plan((16, 16), 16, **k)
    ctas = 4096 // 16 // k["warps"] * k["cluster"]
    assert ctas <= 0.9 * bs.SMS * p.ctas_per_sm
    assert k["bk"] * 16 * k["cluster"] >= 4096


def test_compile_reaches_it_by_capability_and_knobs_pick_the_template():
    """sparsec.compile builds the streaming kernel for float16 SpMM on BSR up to 64 columns
    of B that are not a multiple of 8 (a multiple of 8 takes bsr_ring, tests/test_bsr_ring.py,
    unless a knob only this kernel has is given), for the library operator and a user's own
    DSL product alike, with the instance's arrays as its operands; the block-row template's
    knobs, a wider B, bfloat16 or an epilogue take the block-row template; a knob neither
    takes is refused by name."""
    import sparsec
    from sparsec import dsl, formats
    from sparsec.schedules.tensorcore_packed import bsr_stream_spmm

    assert set(bsr_stream_spmm.knobs) == set(bs.KNOBS)
    w = np.random.default_rng(0).standard_normal((200, 1100)).astype(np.float16)
    w[:, 64:200] = 0
    inst = formats.convert(w, "bsr:32x32")
    k = sparsec.compile("spmm", inst, target="cuda", feat=20)
    assert set(k.knobs) == set(bs.KNOBS) and "__ballot_sync" in k.source()
    assert set(sparsec.compile("spmm", inst, target="cuda", feat=16, knobs={"bk": 16}).knobs) == set(bs.KNOBS)
    assert [(p.name, p.dtype) for p in k.params] == [
        ("indptr", "int32"), ("indices", "int32"), ("A", "float16"), ("B", "float16"), ("C", "float32")]
    assert "n_tile" in sparsec.compile("spmm", inst, target="cuda", feat=16, knobs={"n_tile": 16}).knobs
    assert "n_tile" in sparsec.compile("spmm", inst, target="cuda", feat=128).knobs
    assert "n_tile" in sparsec.compile("spmm", "bsr:32x32", target="cuda", feat=16, dtype="bfloat16").knobs
    with pytest.raises(ValueError, match="warps should be one of"):
        sparsec.compile("spmm", inst, target="cuda", feat=16, knobs={"warps": 3})
    # where the block-row template wins: few blocks a row (sparse) or no matrix to judge by;
    # short rows go to bsr_gather up to 64 columns; a stream knob given still takes the stream kernel
    w[:, 256:] = 0
    sparse = formats.convert(w, "bsr:32x32")
    assert "n_tile" in sparsec.compile("spmm", sparse, target="cuda", feat=16).knobs
    short = formats.convert(w[:, :512], "bsr:32x32")
    assert "per_warp" in sparsec.compile("spmm", short, target="cuda", feat=24).knobs  # short rows: bsr_gather
    assert "per_warp" in sparsec.compile("spmm", short, target="cuda", feat=16).knobs
    assert "n_tile" in sparsec.compile("spmm", "bsr:32x32", target="cuda", feat=16, dtype="float16").knobs
    assert sparsec.compile("spmm", sparse, target="cuda", feat=16, knobs={"warps": 4}).knobs["warps"] == 4

    from dense_ops import _spmm

    mine, I, K, C = _spmm("my_product", "C = A @ B, written by a user")
    assert set(sparsec.compile(mine, inst, target="cuda", feat=5).knobs) == set(bs.KNOBS)
    with mine.iterate([I, K], "SS") as (ii, kk):  # an epilogue: the block-row template carries it
        C[ii, kk] = dsl.relu(C[ii, kk])
    assert "n_tile" in sparsec.compile(mine, inst, target="cuda", feat=8).knobs


def test_templates_name_the_kernel_compile_would_build():
    """``schedules.templates`` (what the tuner derives its space from) names the block-row
    template for a BSR float16 SpMM of a format spec alone, the few-column kernels'
    transformation once one of their knobs is given (bsr_ring at a multiple of 8 columns,
    this kernel with a knob only it has); bfloat16 never reaches them."""
    from sparsec import ops
    from sparsec.formats import make_format
    from sparsec.lower import lower_program
    from sparsec.schedules import templates
    from sparsec.schedules.tensorcore import bsr_tensorcore
    from sparsec.schedules.tensorcore_packed import bsr_ring_spmm, bsr_stream_spmm

    def named(dtype, knobs=None):
        _, program = lower_program(ops.get("spmm"), make_format("bsr:32x32"), {"feat": 16}, dtype, atomics=True)
        return [u.transformation for u in templates(program, "cuda", knobs)]

    assert named("float16") == [bsr_tensorcore]
    assert named("float16", {"cluster": 4}) == [bsr_ring_spmm]
    assert named("float16", {"bk": 16}) == [bsr_stream_spmm]
    assert named("bfloat16", {"cluster": 4}) == [bsr_tensorcore]


def test_the_tuner_searches_it_where_compile_builds_it_and_featurizes_its_knobs():
    """For a matrix the streaming kernel takes, the tuner's BSR float16 candidates are its
    knobs (the untuned one what sparsec.compile builds), and the cost model's features
    accept them (its own knobs have no columns: the shipped model keeps its FEATURE_NAMES)."""
    import scipy.sparse as sp

    from sparsec.bench.suites import random_block_mask
    from sparsec.tune import features
    from sparsec.tune.space import Space

    w = np.where(random_block_mask((1024, 4096), 16, 0.7, [1]), np.random.default_rng(1).standard_normal((1024, 4096)),
                 0).astype(np.float32)
    m = sp.csr_matrix(w)
    s = Space("spmm", m, 36, "float16", families=("bsr",), size="small", target="cuda:sm_90a")  # not 8k: not ring
    mine = [c for c in s.candidates if c["format"] == "bsr:16x16"]
    assert mine and all(set(c["schedule_knobs"]) == set(bs.KNOBS) for c in mine)
    assert features.feature_matrix(mine, features.MatrixContext(m)).shape == (len(mine), len(features.FEATURE_NAMES))
