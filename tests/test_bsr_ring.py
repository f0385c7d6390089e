"""The producer/consumer Tensor Core SpMM for BSR weights at 8-64 columns of B
(schedules/bsr_ring.py), on the CPU: what nvcc makes of it for sm_90a, its refusals by name,
its defaults, and how sparsec.compile and the tuner reach it. benchmarks/check_bsr_stream.py
--kernel ring checks it against float64 on the GPU host (results/check_bsr_ring_H200.json)."""
import numpy as np
import pytest

from nvcc_tools import nvcc_ptx
from sparsec.schedules import bsr_ring as br
from sparsec.schedules.warp_mma import cuda_source


@pytest.mark.parametrize("block, feat, knobs", [
    ((16, 16), 16, {}), ((32, 32), 64, {"cluster": 4, "per_stage": 2, "col_split": 2}),
    ((64, 32), 24, {"cluster": 1, "warps": 4, "stages": 8}), ((16, 64), 40, {"warps": 1, "cluster": 2}),
    ((16, 16), 64, {"cluster": 1, "teams": 4, "stages": 8, "per_stage": 4}),
    ((32, 32), 32, {"cluster": 1, "teams": 2, "col_split": 2}),
    ((16, 16), 16, {"tma": 0}), ((32, 32), 64, {"cluster": 4, "per_stage": 2, "col_split": 2, "tma": 0}),
    ((64, 64), 64, {"cluster": 2, "per_stage": 4, "tma": 1}), ((32, 16), 8, {"cluster": 1, "tma": 1})])
def test_builds_to_a_producer_warp_on_mbarriers_and_mma(block, feat, knobs):
    """tma=1: one tensor copy a stage for its blocks and one a block for B's rows, on the
    stage's mbarrier armed with their byte count (arrive.expect_tx), from tensor maps encoded
    on the host and passed as grid constants; tma=0: 16-byte cp.async for a block and B's rows
    (zero-filled past K), their landing signalled on the stage's mbarrier
    (cp.async.mbarrier.arrive.noinc). Consumers wait on it (try_wait.parity), ldmatrix +
    mma.m16n8k16 in float32, release the stage with mbarrier.arrive; a cluster's partial tiles
    summed through distributed shared memory (mapa between cluster barriers) or stored
    directly; no CTA barrier inside either role's walk; teams of consumers that take every
    teams-th stage add their partial tiles in shared memory after one CTA barrier; one launch."""
    kn = {**br.default_knobs(block, feat, 300, 1111, 0.3), **knobs}
    src = cuda_source(br.build(block, feat, **kn))
    ptx = nvcc_ptx(src, "sm_90a")
    copies = (("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes",
               "mbarrier.arrive.expect_tx.shared::cta.b64") if kn["tma"] else
              ("cp.async.cg.shared.global", "cp.async.mbarrier.arrive.noinc.shared::cta.b64"))
    for needle in copies + ("mbarrier.try_wait.parity", "mbarrier.arrive.shared::cta.b64",
                            "mbarrier.init.shared::cta.b64", "ldmatrix.sync.aligned.m8n8", ".trans.shared.b16",
                            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", "shfl.sync.idx.b32"):
        assert needle in ptx, needle
    assert ("cp.async.cg.shared.global" in ptx) != bool(kn["tma"])
    assert ("__grid_constant__ CUtensorMap" in src) == bool(kn["tma"])
    assert ("fence.proxy.async.shared::cta" in ptx) == bool(kn["tma"])  # reads ordered before a refill
    clustered = kn["cluster"] > 1
    assert ("mapa" in ptx) == clustered and ("barrier.cluster.arrive" in ptx) == clustered
    producer = src[src.index("for (int j = 0"):]
    producer = producer[:producer.index("} else {")]
    assert "__syncthreads" not in producer
    consumer = src[src.index("for (int jj = 0"):]
    consumer = consumer[:consumer.index("__syncwarp") + 200]
    assert "__syncthreads" not in consumer
    if not clustered:  # (a cluster's sum has barriers of its own)
        after = src[src.index("for (int jj = 0"):]
        assert after.count("__syncthreads") == (1 if kn["teams"] > 1 else 0)  # the teams' sum
    assert src.count("__global__") // 2 == 1  # one launch: nothing zeroes C first


@pytest.mark.parametrize("kw, match", [
    ({"block": (48, 16)}, "block rows should be 16, 32, 48 or 64"),  # 48 passes the shape check ...
    ({"block": (80, 16)}, "block rows should be 16, 32, 48 or 64"),
    ({"block": (16, 8)}, "block columns should be a multiple of 16"),
    ({"feat": 20}, "feat should be a multiple of 8 up to 64"),
    ({"feat": 72}, "feat should be a multiple of 8 up to 64"),
    ({"feat": 24, "col_split": 2}, "col_split=2 leaves a CTA 12 of feat=24 columns"),
    ({"block": (32, 32), "warps": 1}, "warps=1 should be a multiple of the block's 2 16-row tiles"),
    ({"feat": 16, "warps": 4}, "warps=4 on a 16-row block make 4 column groups"),
    ({"warps": 3}, "warps should be one of"),
    ({"per_stage": 3}, "per_stage should be one of"),
    ({"block": (64, 128), "feat": 64, "warps": 8, "stages": 8, "per_stage": 4}, "bytes of shared memory"),
    ({"teams": 2, "cluster": 2}, "split either by teams of consumer warps in one CTA or by the CTAs of a cluster"),
    ({"teams": 4, "stages": 2}, "stages=2 should be a multiple of teams=4"),
    ({"block": (64, 16), "warps": 8, "teams": 4, "stages": 4}, "pass a CTA's 32 warps"),
    ({"teams": 3}, "teams should be one of"),
    ({"feat": 24, "warps": 1, "tma": 1}, "tma=1 copies rows of a block \\(16 columns\\) and of B \\(24 columns a CTA\\)"),
    ({"block": (16, 128), "tma": 1}, "tma=1 copies rows of a block \\(128 columns\\)"),
    ({"block": (64, 64), "warps": 4, "per_stage": 8, "tma": 1}, "per_stage should be one of"),
    ({"tma": 2}, "tma should be one of"),
])
def test_refuses_what_it_cannot_take_by_name(kw, match):
    args = {"block": (16, 16), "feat": 16, "warps": 2, "stages": 4, "cluster": 1, "per_stage": 1, "col_split": 1,
            **kw}
    if args["block"] == (48, 16):  # ... and its 3 tiles a block take no warp count the kernel has
        args.pop("block")
        with pytest.raises(ValueError, match="warps=2 should be a multiple of the block's 3 16-row tiles"):
            br.plan((48, 16), args.pop("feat"), **args)
        assert not br.takes((48, 16), 16)
        return
    with pytest.raises(ValueError, match=match):
        br.plan(args.pop("block"), args.pop("feat"), **args)


def test_defaults_fit_and_follow_the_matrix():
    """Every default plan fits; a cluster splits the long rows of a short matrix and not a
    tall one's; B's columns split where block rows are few; four blocks a stage on long walks."""
    for feat in (8, 16, 24, 32, 40, 64):
        for block in ((16, 16), (32, 32), (64, 64), (32, 16), (16, 64), (64, 128)):
            for shape in ((384, 384), (4096, 4096), (768, 3072), (4096, 11008), (100, 100000)):
                for density in (0.01, 0.1, 0.3, 1.0):
                    br.plan(block, feat, **br.default_knobs(block, feat, *shape, density))
    assert br.default_knobs((32, 32), 64, 1024, 4096, 0.3)["cluster"] == 4  # 32 rows of 38 blocks
    assert br.default_knobs((32, 32), 64, 4096, 4096, 0.3)["cluster"] == 2  # 128 block rows: 4 a row passes 400
    assert br.default_knobs((32, 32), 64, 1024, 4096, 0.3)["col_split"] == 2
    assert br.default_knobs((16, 16), 64, 4096, 4096, 0.3)["col_split"] == 1
    b64 = br.default_knobs((64, 64), 64, 4096, 4096, 0.3)  # 64-row blocks: columns split before clusters
    assert (b64["col_split"], b64["cluster"]) == (2, 2)
    assert br.default_knobs((64, 64), 16, 4096, 4096, 0.3)["col_split"] == 1  # 16 columns stay whole
    assert br.default_knobs((16, 16), 16, 4096, 4096, 0.3)["per_stage"] == 4
    assert br.default_knobs((16, 16), 16, 384, 384, 0.05)["per_stage"] == 1  # 1.2 blocks a row
    assert br.default_knobs((32, 32), 64, 0, 0, 0.3, fixed={"cluster": 8})["cluster"] == 8
    # tensor copies wherever the copy engine's swizzles take a block's rows and B's
    assert br.default_knobs((32, 32), 64, 4096, 4096, 0.3)["tma"] == 1
    assert br.default_knobs((16, 16), 8, 384, 384, 0.3)["tma"] == 1
    assert br.default_knobs((32, 32), 24, 4096, 4096, 0.3)["tma"] == 0  # 48-byte rows of B
    assert br.default_knobs((64, 128), 64, 4096, 4096, 0.3)["tma"] == 0  # 256-byte rows of a block
    assert br.default_knobs((32, 32), 64, 4096, 4096, 0.3, fixed={"tma": 0})["tma"] == 0


def test_uneven_rows_split_eight_ways():
    """A weight whose longest block row holds SKEWED times the mean or more gets a cluster
    of 8 where even rows get 4 (the longest walk sets the time); the rule keeps 4 where 8
    would pass the grid's 400 CTAs, and a cluster given stays."""
    even = br.default_knobs((32, 32), 64, 384, 1536, 0.3)
    assert even["cluster"] == 4
    assert br.default_knobs((32, 32), 64, 384, 1536, 0.3, skew=br.SKEWED)["cluster"] == 8
    assert br.default_knobs((32, 32), 64, 384, 1536, 0.3, skew=1.5)["cluster"] == 4
    assert br.default_knobs((32, 32), 64, 1024, 4096, 0.3, skew=3.0)["cluster"] == 4  # 32 x 2 x 8 > 400 CTAs
    assert br.default_knobs((32, 32), 64, 384, 1536, 0.3, skew=3.0, fixed={"cluster": 2})["cluster"] == 2
    assert br.default_knobs((32, 32), 64, 4096, 4096, 0.3, skew=3.0)["cluster"] == 2
    assert br.default_knobs((16, 16), 16, 4096, 4096, 0.05)["cluster"] == 1  # short walks stay whole

    import sparsec
    from sparsec import formats

    rng = np.random.default_rng(3)
    keep = rng.random((12, 48)) < 0.3  # 12 block rows of 32 x 32 blocks, ~14 stored each
    keep[5] = True  # one row holds all 48: 3x the mean
    w = (np.kron(keep, np.ones((32, 32))) * rng.standard_normal((384, 1536))).astype(np.float16)
    assert sparsec.compile("spmm", formats.convert(w, "bsr:32x32"), target="cuda", feat=64).knobs["cluster"] == 8
    keep[5] = rng.random(48) < 0.3
    w = (np.kron(keep, np.ones((32, 32))) * rng.standard_normal((384, 1536))).astype(np.float16)
    assert keep.sum(1).max() / keep.sum(1).mean() < 1.2  # even rows again
    assert sparsec.compile("spmm", formats.convert(w, "bsr:32x32"), target="cuda", feat=64).knobs["cluster"] == 4


def test_compile_reaches_it_by_capability():
    """sparsec.compile builds it for float16 SpMM on BSR at a multiple of 8 columns up to 64,
    where the matrix is dense enough and wide enough for the few-column kernels, for the
    library operator and a user's own DSL product alike; its knobs given pick it anywhere;
    bsr_stream keeps widths that are not a multiple of 8, its own knobs, and many block rows
    of 16 x 16 blocks at 16 columns; the block-row template keeps sparse or narrow matrices."""
    import sparsec
    from sparsec import formats

    rng = np.random.default_rng(0)
    w = rng.standard_normal((200, 1100)).astype(np.float16)
    w[:, 64:200] = 0
    inst = formats.convert(w, "bsr:32x32")
    k = sparsec.compile("spmm", inst, target="cuda", feat=64)
    assert set(k.knobs) == set(br.KNOBS) and "mbarrier" in k.source()
    assert [(p.name, p.dtype) for p in k.params] == [
        ("indptr", "int32"), ("indices", "int32"), ("A", "float16"), ("B", "float16"), ("C", "float32")]
    assert "bk" in sparsec.compile("spmm", inst, target="cuda", feat=20).knobs
    assert "bk" in sparsec.compile("spmm", inst, target="cuda", feat=64, knobs={"nb": 32}).knobs
    with pytest.raises(ValueError, match="col_split should be one of"):
        sparsec.compile("spmm", inst, target="cuda", feat=64, knobs={"col_split": 3})
    sparse = w.copy()
    sparse[:, 256:] = 0
    assert "n_tile" in sparsec.compile("spmm", formats.convert(sparse, "bsr:32x32"), target="cuda", feat=64).knobs
    assert "per_stage" in sparsec.compile("spmm", formats.convert(sparse, "bsr:32x32"), target="cuda", feat=64,
                                          knobs={"per_stage": 2}).knobs
    tall = np.where(np.kron(rng.random((160, 80)) < 0.3, np.ones((16, 16))), 1.0, 0.0).astype(np.float16)
    tall_inst = formats.convert(tall, "bsr:16x16")  # 160 block rows of 16 x 16 blocks
    assert "bk" in sparsec.compile("spmm", tall_inst, target="cuda", feat=16).knobs
    assert "per_stage" in sparsec.compile("spmm", tall_inst, target="cuda", feat=32).knobs

    from dense_ops import _spmm

    mine, *_ = _spmm("my_product", "C = A @ B, written by a user")
    assert set(sparsec.compile(mine, inst, target="cuda", feat=8).knobs) == set(br.KNOBS)


def test_the_tuner_searches_it_where_compile_builds_it_and_featurizes_its_knobs():
    """For a matrix it takes, the tuner's BSR float16 candidates are its knobs (the untuned
    one what sparsec.compile builds), and the cost model's features accept them; tuning for
    sm_80 searches the block-row template instead, as sparsec.compile builds it there."""
    import scipy.sparse as sp

    from sparsec.bench.suites import random_block_mask
    from sparsec.tune import features
    from sparsec.tune.space import Space

    w = np.where(random_block_mask((1024, 4096), 16, 0.7, [1]), np.random.default_rng(1).standard_normal((1024, 4096)),
                 0).astype(np.float32)
    m = sp.csr_matrix(w)
    s = Space("spmm", m, 64, "float16", families=("bsr",), size="small", target="cuda:sm_90a")
    mine = [c for c in s.candidates if c["format"] == "bsr:16x16"]
    assert mine and all(set(c["schedule_knobs"]) == set(br.KNOBS) for c in mine)
    assert len({tuple(sorted(c["schedule_knobs"].items())) for c in mine}) > 1
    assert features.feature_matrix(mine, features.MatrixContext(m)).shape == (len(mine), len(features.FEATURE_NAMES))
    old = Space("spmm", m, 64, "float16", families=("bsr",), size="small", target="cuda:sm_80")  # no clusters
    theirs = [c for c in old.candidates if c["format"] == "bsr:16x16"]
    assert theirs and not any(set(c["schedule_knobs"]) & {"per_stage", "cluster"} for c in theirs)


def test_an_arch_without_clusters_gets_kernels_that_run_there():
    """The few-column BSR kernels and the streaming tiled kernel launch thread-block clusters
    and wait on mbarriers (sm_90 on): for sm_80, BSR defers to the block-row template and tiled
    SpMM takes the tiled Tensor Core kernel (sparsec.compile passes the target's
    ``has_clusters`` to the match); their own knobs given there are refused by name."""
    import sparsec
    from sparsec import formats, ops
    from sparsec.formats import make_format
    from sparsec.lower import lower_program
    from sparsec.schedules import bsr_dispatch
    from sparsec.schedules import tensorcore_packed as tp
    from sparsec.targets import parse_target

    assert parse_target("cuda:sm_90a").has_clusters and not parse_target("cuda:sm_80").has_clusters
    assert not parse_target("llvm").has_clusters
    from sparsec.targets import TargetSpec

    assert TargetSpec("cuda", "sm_100a").has_clusters and not TargetSpec("cuda", "sm_86").has_clusters

    def packed(spec, feat, clusters):
        _, program = lower_program(ops.get("spmm"), make_format(spec), {"feat": feat}, "float16", atomics=True)
        return tp.match(program, "cuda", shape=(1024, 2048), density=0.3, clusters=clusters)

    for feat in (20, 64):
        assert not bsr_dispatch.defers(packed("bsr:32x32", feat, True)) and bsr_dispatch.defers(packed("bsr:32x32", feat, False))
    assert tp.transformation_for(packed("tiled:16x64", 16, True)) is tp.tiled_stream_spmm
    assert tp.transformation_for(packed("tiled:16x64", 16, False)) is tp.tiled_tc_spmm
    rng = np.random.default_rng(3)
    w = np.where(np.kron(rng.random((32, 64)) < 0.3, np.ones((32, 32))), rng.standard_normal((1024, 2048)),
                 0).astype(np.float16)
    with pytest.raises(ValueError, match="bsr_ring_spmm launches thread-block clusters.* need sm_90"):
        sparsec.compile("spmm", formats.convert(w, "bsr:32x32"), target="cuda:sm_80", feat=64,
                        knobs={"per_stage": 2})
