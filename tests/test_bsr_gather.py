"""The split-walk Tensor Core SpMM for BSR weights at 8-64 columns of B
(schedules/bsr_gather.py), on the CPU: what nvcc makes of it, its refusals by name, its
defaults, and how sparsec.compile reaches it (by its own knobs only, until the GPU host has
checked and timed it: benchmarks/check_bsr_stream.py --kernel gather)."""
import numpy as np
import pytest

from nvcc_tools import nvcc_ptx
from sparsec.schedules import bsr_gather as bg
from sparsec.schedules.warp_mma import cuda_source


@pytest.mark.parametrize("block, feat, knobs, arch", [
    ((16, 16), 64, {"warps": 8, "per_warp": 4, "split": 4, "heavy": 8}, "sm_90a"),
    ((32, 32), 16, {"warps": 4, "per_warp": 2, "split": 1, "heavy": 8}, "sm_90a"),
    ((48, 16), 40, {"warps": 2, "per_warp": 1, "split": 1, "heavy": 1}, "sm_80"),
    ((64, 64), 16, {"warps": 4, "per_warp": 2, "split": 2, "heavy": 2}, "sm_80"),
    ((64, 64), 64, {"warps": 4, "per_warp": 1, "split": 2, "heavy": 1}, "sm_90a")])
def test_builds_to_one_round_trip_per_walk_and_mma(block, feat, knobs, arch):
    """16-byte cp.async for each block and B's rows for it (zero-filled past K), one
    wait for a round of them; ldmatrix + mma.m16n8k16 into float32; no CTA barrier inside the
    walk (the warps meet only to add their partial tiles: two barriers a path, the whole row's
    and, with ``split``, the long row's share of columns); no mbarrier or cluster, so sm_80
    takes it; one launch."""
    src = cuda_source(bg.build(block, feat, arch=arch, **knobs))
    ptx = nvcc_ptx(src, arch)
    for needle in ("cp.async.cg.shared.global", "cp.async.wait_group 0", "ldmatrix.sync.aligned.m8n8",
                   ".trans.shared.b16", "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"):
        assert needle in ptx, needle
    assert "mbarrier" not in ptx and "barrier.cluster" not in ptx
    paths = 2 if knobs["split"] > 1 and knobs["heavy"] > 1 else 1  # heavy=1: every row split, one path
    assert src.count("__syncthreads") == 2 * paths
    walk = src[src.index("for (int rd = 0"):]
    walk = walk[:walk.index("__syncthreads")]
    assert "__syncwarp" in walk
    assert src.count("__global__") // 2 == 1  # one launch: nothing zeroes C first


def test_a_long_row_has_its_columns_split_and_a_short_row_is_one_cta():
    """With split > 1 the grid has ``split`` CTAs a block row: those of a row of at least
    ``heavy`` stored blocks each take feat / split columns, a shorter row's first takes all
    of them and the others exit at once."""
    src = cuda_source(bg.build((16, 16), 64, warps=4, per_warp=2, split=4, heavy=8))
    assert "blockIdx.y" in src
    heavy = src.index("if (8 <= rng_ptr[1])")
    short = src.index("if (((int)blockIdx.y) == 0)")
    assert heavy < short
    assert "((int)blockIdx.y) * 16" in src[heavy:short]  # a quarter of the 64 columns
    every = cuda_source(bg.build((64, 64), 64, warps=4, per_warp=1, split=2, heavy=1))
    assert "blockIdx.y) == 0" not in every and "((int)blockIdx.y) * 32" in every  # every row halved, an empty one too


@pytest.mark.parametrize("kw, match", [
    ({"block": (80, 16)}, "block rows should be 16, 32, 48 or 64"),
    ({"block": (16, 8)}, "block columns should be a multiple of 16"),
    ({"feat": 20}, "feat should be a multiple of 8 up to 64"),
    ({"feat": 72}, "feat should be a multiple of 8 up to 64"),
    ({"feat": 24, "split": 2}, "split=2 leaves a CTA 12 of feat=24 columns"),
    ({"block": (64, 64), "feat": 64}, "64-row blocks at 64 columns a CTA make 32 accumulator tiles"),
    ({"block": (64, 64), "feat": 64, "split": 2, "heavy": 2}, "64 columns a CTA make 32 accumulator tiles"),
    ({"warps": 3}, "warps should be one of"),
    ({"split": 3}, "split should be one of"),
    ({"heavy": 0}, "heavy should be a positive int"),
    ({"block": (64, 128), "feat": 16, "warps": 16, "per_warp": 4}, "bytes of shared memory"),
])
def test_refuses_what_it_cannot_take_by_name(kw, match):
    args = {"block": (16, 16), "feat": 16, "warps": 8, "per_warp": 4, "split": 1, "heavy": 8, **kw}
    with pytest.raises(ValueError, match=match):
        bg.plan(args.pop("block"), args.pop("feat"), **args)


def test_defaults_fit_and_follow_the_matrix():
    """Every default plan fits; long rows (from 1.5x the mean stored blocks) split 4 ways on
    16-row blocks from 32 columns, none at 16 columns (2 ways on larger blocks); fewer
    blocks a warp where shared memory runs out."""
    for block in ((16, 16), (32, 32), (64, 64), (16, 128)):
        for feat in (8, 16, 24, 32, 64):
            if not bg.takes(block, feat):
                continue
            kn = bg.default_knobs(block, feat, 1536, 384, 0.3)
            bg.plan(block, feat, **kn)
    assert bg.default_knobs((16, 16), 64, 384, 384, 0.3)["split"] == 4
    assert bg.default_knobs((16, 16), 16, 1536, 384, 0.3)["split"] == 1
    assert bg.default_knobs((32, 32), 16, 1536, 384, 0.3)["split"] == 2
    assert bg.default_knobs((32, 32), 8, 1536, 384, 0.3)["split"] == 1  # 4 columns a CTA: not a whole MMA
    assert bg.default_knobs((16, 16), 32, 1536, 384, 0.3)["heavy"] == 16  # mean 7.2 stored blocks
    assert bg.default_knobs((16, 16), 32, 1536, 384, 0.1)["heavy"] == 4  # mean 2.4
    assert bg.default_knobs((16, 16), 64, 1536, 384, 0.3)["heavy"] == 8  # from 64 columns: the mean
    assert bg.default_knobs((32, 32), 64, 1536, 384, 0.1)["heavy"] == 4  # mean 1.2, at least 4
    assert bg.default_knobs((32, 32), 64, 1536, 384, 0.3)["split"] == 2  # 48 block rows: CTAs enough
    assert bg.default_knobs((32, 32), 64, 384, 384, 0.3)["split"] == 4  # 12 block rows
    assert bg.default_knobs((64, 128), 16, 512, 4096, 0.3, fixed={"warps": 16})["per_warp"] < 4


def test_compile_reaches_it_by_its_own_knobs():
    """sparsec.compile builds it for a BSR float16 SpMM (the library operator and a user's
    own product alike) when a knob only it has is given; a format spec alone keeps the
    block-row template; a block shape it cannot take is refused by name."""
    import sparsec
    from dense_ops import _spmm
    from sparsec import formats

    w = np.random.default_rng(0).standard_normal((384, 384)).astype(np.float16)
    w[:, 64:200] = 0
    inst = formats.convert(w, "bsr:16x16")
    k = sparsec.compile("spmm", inst, target="cuda", feat=64, knobs={"split": 4})
    assert set(k.knobs) == set(bg.KNOBS) and k.knobs["split"] == 4
    assert [(p.name, p.dtype) for p in k.params] == [
        ("indptr", "int32"), ("indices", "int32"), ("A", "float16"), ("B", "float16"), ("C", "float32")]
    from sparsec import ops
    from sparsec.formats import make_format
    from sparsec.lower import lower_program
    from sparsec.schedules import templates
    from sparsec.schedules.tensorcore import bsr_tensorcore
    from sparsec.schedules.tensorcore_packed import bsr_gather_spmm

    _, program = lower_program(ops.get("spmm"), make_format("bsr:16x16"), {"feat": 64}, "float16", atomics=True)
    assert [u.transformation for u in templates(program, "cuda", None)] == [bsr_tensorcore]  # the default
    assert [u.transformation for u in templates(program, "cuda", {"heavy": 4})] == [bsr_gather_spmm]
    mine, *_ = _spmm("my_product", "C = A @ B, written by a user")
    assert sparsec.compile(mine, inst, target="cuda:sm_80", feat=16, knobs={"per_warp": 2}).knobs["per_warp"] == 2
    with pytest.raises(ValueError, match="split should be one of"):
        sparsec.compile("spmm", inst, target="cuda", feat=64, knobs={"split": 3})


@pytest.mark.parametrize("shape,density,feat,target,expect", [
    ((1536, 384), 0.3, 16, "cuda", "gather"),  # short rows, few columns: this kernel
    ((384, 384), 0.1, 8, "cuda", "gather"),
    ((1536, 384), 0.3, 64, "cuda", "gather"),  # 64 columns too, once its partial tiles were padded
    ((1536, 384), 0.3, 128, "cuda", "blockrow"),  # wider than it takes
    ((1536, 384), 0.3, 16, "cuda:sm_80", "blockrow"),  # timed on sm_90 only
    ((384, 1536), 0.3, 16, "cuda", "ring"),  # long rows, dense enough: bsr_ring's region
])
def test_default_dispatch_by_row_length_and_width(shape, density, feat, target, expect):
    """With no knobs given, ``sparsec.compile``'s plan picks it for few columns (up to
    GATHER_MAX_FEAT) of B on a matrix of short rows, on sm_90 on; the block-row template or
    bsr_ring elsewhere, as before."""
    from sparsec import ops
    from sparsec.formats import make_format
    from sparsec.lower import lower_program
    from sparsec.schedules import templates
    from sparsec.schedules.tensorcore import bsr_tensorcore
    from sparsec.schedules.tensorcore_packed import bsr_gather_spmm, bsr_ring_spmm

    _, program = lower_program(ops.get("spmm"), make_format("bsr:16x16"), {"feat": feat}, "float16", atomics=True)
    sm90 = target == "cuda"
    got = [u.transformation for u in templates(program, "cuda", None, shape=shape, density=density, clusters=sm90)]
    assert got == [{"gather": bsr_gather_spmm, "blockrow": bsr_tensorcore, "ring": bsr_ring_spmm}[expect]]


def test_compile_picks_it_for_a_short_row_matrix_at_16_columns():
    """The whole path: a 1536 x 384 block-pruned weight at 16 columns compiles to this kernel
    with its default knobs (no knob given), at 64 columns too (B's columns split 2 ways on a
    long row: 96 block rows), at 128 columns to the block-row template."""
    import sparsec
    from sparsec import formats

    w = np.random.default_rng(1).standard_normal((1536, 384)).astype(np.float16)
    w.reshape(96, 16, 24, 16).transpose(0, 2, 1, 3)[np.random.default_rng(2).random((96, 24)) < 0.7] = 0
    inst = formats.convert(w, "bsr:16x16")
    k16 = sparsec.compile("spmm", inst, target="cuda", feat=16)
    assert set(k16.knobs) == set(bg.KNOBS) and k16.knobs["split"] == 1
    assert "mma.sync" in k16.source() and "mbarrier" not in k16.source()
    k64 = sparsec.compile("spmm", inst, target="cuda", feat=64)
    assert set(k64.knobs) == set(bg.KNOBS) and k64.knobs["split"] == 2
    assert not set(sparsec.compile("spmm", inst, target="cuda", feat=128).knobs) & set(bg.KNOBS)
