"""The tuner's search space (sparsec.tune.space): every candidate is a valid, fully written-out
kernel, the pruning rules hold, and the default is what sparsec runs untuned."""
import numpy as np
import pytest
import scipy.sparse as sp

from sparsec.schedules import csr_split
from sparsec.schedules.cuda import features_over_threads
from sparsec.tune.space import MIN_TILE_FEATURES, Space, candidate_id


def powerlaw(n=3000, seed=0):
    rng = np.random.default_rng(seed)
    lens = np.minimum(rng.zipf(1.8, n), n // 2)
    lens[5] = 0
    rows = np.repeat(np.arange(n), lens)
    cols = rng.integers(0, n, rows.size)
    m = sp.csr_matrix((np.ones(rows.size, np.float32), (rows, cols)), shape=(n, n))
    m.sum_duplicates()
    return m


@pytest.fixture(scope="module")
def matrix():
    return powerlaw()


@pytest.mark.parametrize("feat", [32, 128, 512, 96])
def test_every_candidate_is_valid_and_unique(matrix, feat):
    space = Space("spmm", matrix, feat)
    ids = [candidate_id(c) for c in space.candidates]
    assert len(ids) == len(set(ids)) and candidate_id(space.default) in ids
    for c in space.candidates:
        k = c["schedule_knobs"]
        if c["format"] == "csr":  # these rows are skewed: CSR runs csr_split, its own knob grid
            assert set(k) == set(csr_split.KNOBS) and all(v in csr_split.KNOBS[n] for n, v in k.items()), k
            continue
        for name, value in k.items():
            assert name in features_over_threads.knobs, name
            assert value in features_over_threads.knobs[name].choices, (name, value)
        tiles = k.get("feat_tiles", 1)
        assert "feat_tiles" not in k or tiles > 1, "untiled kernels keep their pre-tiling identity"
        assert feat % tiles == 0 and (tiles == 1 or feat // tiles >= MIN_TILE_FEATURES)
        assert (feat // tiles) % k["vec"] == 0
        assert "unroll" not in k and k["slots_per_block"] <= 128


def test_feature_tiles_appear_only_on_wide_features(matrix):
    tiles = lambda feat: {c["schedule_knobs"].get("feat_tiles", 1) for c in Space("spmm", matrix, feat).candidates}  # noqa: E731
    assert tiles(64) == {1}
    assert tiles(128) == {1, 2}
    assert tiles(512) == {1, 2, 4, 8}
    assert tiles(96) == {1}  # 96 / 2 = 48 features a slice: too narrow


def test_small_space_is_enumerable_and_untiled(matrix):
    for feat in (32, 512):
        space = Space("spmm", matrix, feat, size="small")
        assert 0 < len(space) <= 100
        assert all("feat_tiles" not in c["schedule_knobs"] for c in space.candidates)


def test_default_is_the_untuned_template(matrix):
    d = Space("spmm", matrix, 512).default
    assert d["schedule_knobs"]["vec"] == 4 and "feat_tiles" not in d["schedule_knobs"]
    assert d["schedule_knobs"]["rows_per_block"] == 1  # auto: 128 threads a block, 128 a row at F = 512


def test_bad_arguments_name_the_problem(matrix):
    with pytest.raises(ValueError, match="feat"):
        Space("spmm", matrix, 0)
    with pytest.raises(ValueError, match="unknown format family"):
        Space("spmm", matrix, 32, families=["coo"])
    with pytest.raises(ValueError, match="size"):
        Space("spmm", matrix, 32, size="huge")


def test_default_is_buildable_where_auto_resolves_off_the_choices(matrix):
    """F = 96: "auto" means 5 rows a block, not a declared choice: the candidate keeps "auto"."""
    d = Space("spmm", matrix, 96).default
    assert d["schedule_knobs"]["rows_per_block"] == "auto"


def test_llvm_space_searches_the_cpu_template(matrix):
    """On llvm the CPU template's knobs are searched, and no CUDA knob that would do nothing."""
    space = Space("spmm", matrix, 32, target="llvm")
    assert {tuple(sorted(c["schedule_knobs"])) for c in space.candidates} == {("parallel",)}
    assert {c["schedule_knobs"]["parallel"] for c in space.candidates} == {True, False}
    assert space.default["schedule_knobs"] == {"parallel": True}


def test_sddmm_spellings_of_one_kernel_are_one_candidate(matrix):
    """lanes = 0 ("chosen from feat") is written as the lanes it chooses."""
    space = Space("sddmm", matrix, 64)
    assert all(c["schedule_knobs"]["lanes"] and c["schedule_knobs"]["vec"] and c["schedule_knobs"]["groups"]
               for c in space.candidates)
    assert space.default["schedule_knobs"] == {"lanes": 16, "vec": 4, "groups": 2, "rows_per_block": 4, "unroll": 1}


def test_bsr_takes_only_the_knobs_that_act_on_blocks():
    """BSR rows run a data-dependent number of fully unrolled blocks: neither slots/interleave
    (fixed-width rows) nor unroll (data-dependent rows) act on them; fp16 BSR with blocks of 16
    runs the Tensor Core template, whose knobs it searches (warp tiles that do not fit pruned)."""
    m = sp.csr_matrix(np.kron(sp.random(64, 64, 0.05, random_state=1).toarray() != 0, np.ones((16, 16))),
                      dtype=np.float32)
    space = Space("spmm", m, 128, families=["bsr"])
    generic = [c for c in space.candidates if c["format"] in ("bsr:2x2", "bsr:4x4", "bsr:8x8")]
    assert generic and all(set(c["schedule_knobs"]) <= {"rows_per_block", "vec", "feat_tiles"} for c in generic)
    half = Space("spmm", m, 128, "float16", families=["bsr"])
    tc = [c for c in half.candidates if c["format"] == "bsr:16x16"]
    assert tc and all(set(c["schedule_knobs"]) == {"n_tile", "warp_m", "warp_n", "stages", "k_split"} for c in tc)
    assert all(c["schedule_knobs"]["warp_m"] <= 16 for c in tc)
    assert any("bsr_tensorcore" in why for why in half.pruned)


@pytest.mark.parametrize("shape", [(97, 61), (64, 64), (1, 130)])
def test_block_fill_counts_the_stored_blocks_of_every_bsr_size(shape):
    """Stored b x b blocks (edge blocks whole, explicit zeros stored) by coarsening, against
    the definition: one np.unique over every entry's block key."""
    m = sp.random(*shape, density=0.07, format="csr", random_state=11)
    m.data[::3] = 0.0  # explicit zeros still store their blocks
    space = Space("spmm", m, 16)
    for b in (2, 4, 8, 16, 32):
        rows = np.repeat(np.arange(m.shape[0]) // b, np.diff(m.indptr))
        blocks = np.unique(rows * (m.shape[1] // b + 1) + m.indices // b).size
        assert space._block_fill(b) == pytest.approx(m.nnz / (blocks * b * b))


@pytest.mark.parametrize("feat", [32, 96, 512])
def test_a_space_of_the_winning_configurations_holds_the_same_pool(feat):
    """``Space(only=keys)`` enumerates just the configurations a zero-shot pick ranks: the
    transfer pool it gives equals the one filtered from the whole space (winners logged on
    the shipped H200 log, including knobs such as rows_per_block that "auto" resolved)."""
    from pathlib import Path

    from sparsec.tune import records as R
    from sparsec.tune.transfer import transfer_pool, winning_keys

    log = Path(__file__).resolve().parents[1] / "tuning_logs" / "spmm_cuda_sm_90a.jsonl"
    keys = winning_keys(R.load(log), "spmm")
    for m in (powerlaw(2000, 3), sp.random(500, 9000, density=0.01, format="csr", random_state=4)):
        full = Space("spmm", m, feat, target="cuda:sm_90a")
        narrow = Space("spmm", m, feat, target="cuda:sm_90a", only=keys)
        assert len(narrow) < len(full)
        assert sorted(map(candidate_id, transfer_pool(narrow, keys))) == \
            sorted(map(candidate_id, transfer_pool(full, keys)))


def test_statistics_and_space_leave_the_matrix_and_its_canonical_form_unchanged():
    """MatrixContext validates once and hands its Canonical to the statistics (block counting
    coarsens copies of indptr) and to Space: neither may write into the shared arrays."""
    from sparsec.tune.features import MatrixContext

    m = powerlaw(1500, 7)
    before = (m.indptr.copy(), m.indices.copy(), m.data.copy())
    ctx = MatrixContext(m)
    canon = tuple(a.copy() for a in (ctx.canonical.indptr, ctx.canonical.indices, ctx.canonical.data))
    Space("spmm", ctx.canonical, 64, stats=ctx.stats, target="cuda:sm_90a")
    for got, want in zip((m.indptr, m.indices, m.data), before):
        assert np.array_equal(got, want)
    for got, want in zip((ctx.canonical.indptr, ctx.canonical.indices, ctx.canonical.data), canon):
        assert np.array_equal(got, want)
    assert np.array_equal(ctx.csr.indptr, m.indptr) and ctx.signature == MatrixContext(m.copy()).signature
