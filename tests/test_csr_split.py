"""schedules.csr_split: the CSR SpMM whose warps split the stored entries, not the rows. On
the CPU: its row search and its two launches replayed step by step against scipy (hub rows,
empty rows at both ends and inside, rows longer than many warps' ranges, an empty matrix),
the capability check (any CSR-like SpMM in float32 with no epilogue, reached by its knobs,
the default on skewed rows),
the refusals, and nvcc on the CUDA TVM emits. On the GPU: benchmarks/probe_csr_split.py
--compiled checks and times the compiled kernel."""
import numpy as np
import pytest
import scipy.sparse as sp

from sparsec.schedules import csr_split as cs


def _edge_matrices():
    rng = np.random.default_rng(0)
    m = sp.random(3000, 2000, density=0.003, format="lil", random_state=1, dtype=np.float32)
    m[:3, :] = 0  # leading empty rows
    m[1000:1010, :] = 0
    m[2990:, :] = 0  # trailing empty rows
    m[77, :1900] = rng.standard_normal(1900)  # a hub row over many warps' ranges
    m[78, 100:1500] = rng.standard_normal(1400)
    yield "hub", m.tocsr()
    yield "empty", sp.csr_matrix((50, 30), dtype=np.float32)
    yield "one-row", sp.csr_matrix(rng.standard_normal((1, 4000)).astype(np.float32))
    yield "tall", sp.random(20000, 40, density=0.002, format="csr", random_state=3, dtype=np.float32)
    power = sp.random(4000, 4000, density=0.0005, format="lil", random_state=5, dtype=np.float32)
    power[rng.choice(4000, 8, replace=False), :] = rng.standard_normal((8, 4000)) * (rng.random((8, 4000)) < 0.5)
    yield "power-law", power.tocsr()


@pytest.mark.parametrize("entries", cs.KNOBS["entries_per_warp"])
def test_the_two_launches_replayed_give_the_product(entries):
    """Every row written (NaN-poisoned start), equal to the float64 product."""
    rng = np.random.default_rng(entries)
    for name, m in _edge_matrices():
        B = rng.standard_normal((m.shape[1], 7)).astype(np.float32)
        got = cs.replay(m.indptr, m.indices, m.data, B, entries)
        ref = m.astype(np.float64) @ B.astype(np.float64)
        assert np.isfinite(got).all(), name
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(ref).max(initial=0))),
                                   err_msg=name)


@pytest.mark.parametrize("lanes, feat", [(8, 32), (16, 32), (16, 64), (8, 16), (8, 8)])
def test_the_grouped_walk_replayed_gives_the_product(lanes, feat):
    """csr_group's steps of 32 / lanes entries side by side, rows ending inside a step summed
    over the groups: every row written (NaN-poisoned start), equal to the float64 product."""
    from sparsec.schedules import csr_group

    rng = np.random.default_rng(lanes * feat)
    for entries in cs.KNOBS["entries_per_warp"]:
        for name, m in _edge_matrices():
            B = rng.standard_normal((m.shape[1], feat)).astype(np.float32)
            got = csr_group.replay(m.indptr, m.indices, m.data, B, entries, lanes)
            ref = m.astype(np.float64) @ B.astype(np.float64)
            assert np.isfinite(got).all(), (name, entries)
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(ref).max(initial=0))),
                                       err_msg=f"{name} E={entries}")


def test_row_search_finds_the_row_holding_each_entry():
    """The 32-ary search equals ``searchsorted(indptr, p, 'right') - 1``: the last row starting
    at or before the entry, past any empty rows."""
    for _, m in _edge_matrices():
        rows = m.shape[0]
        for p in np.unique(np.r_[0, m.indptr[1:-1], np.linspace(0, max(m.nnz - 1, 0), 37).astype(int)]):
            if p >= m.nnz:
                continue
            assert cs.row_of(m.indptr, rows, int(p)) == np.searchsorted(m.indptr, p, "right") - 1


def test_compile_takes_it_by_its_knobs_on_a_user_operator():
    """A CSR SpMM written in the DSL (not the library's) reaches the kernel by its knob, with
    the others at their defaults; without one the CUDA-core template runs."""
    import sparsec
    from sparsec import formats
    from dense_ops import _spmm

    m = sp.random(300, 200, density=0.05, format="csr", random_state=2, dtype=np.float32)
    inst = formats.convert(m, "csr")
    mine, *_ = _spmm("my_spmm", "C = A @ B, written by a user")
    k = sparsec.compile(mine, inst, target="cuda", feat=40, knobs={"entries_per_warp": 256})
    assert k.knobs == {"entries_per_warp": 256, "warps_per_block": 4, "loads_ahead": 4, "lanes_per_entry": 32}
    assert [(p.name, p.dtype) for p in k.params] == [("indptr", "int32"), ("indices", "int32"), ("A", "float32"),
                                                      ("B", "float32"), ("C", "float32")]
    src = k.source()
    assert "__ballot_sync" in src and "atomicAdd" in src and src.count("__global__ void") >= 2
    assert "__ballot_sync" not in sparsec.compile("spmm", inst, target="cuda", feat=40).source()


def test_the_default_on_skewed_rows_only():
    """Without knobs a matrix with a hub row (``skewed``: 512+ entries, 64x the mean) gets the
    split kernel and its default knobs; an even matrix, a template knob, a feature count over
    its limit or float16 keep the CUDA-core template."""
    import sparsec
    from sparsec import formats

    rng = np.random.default_rng(6)
    hub = sp.random(5000, 3000, density=0.001, format="lil", random_state=6, dtype=np.float32)
    hub[17, :2500] = rng.standard_normal(2500)
    hub = formats.convert(hub.tocsr(), "csr")
    even = formats.convert(sp.random(5000, 3000, density=0.01, format="csr", random_state=7, dtype=np.float32),
                           "csr")
    assert cs.skewed(2500, 3.5) and not cs.skewed(2500, 50.0) and not cs.skewed(300, 1.0)
    k = sparsec.compile("spmm", hub, target="cuda:sm_90a", feat=32)
    assert k.knobs == cs.default_knobs(32) and "__ballot_sync" in k.source()
    assert cs.default_knobs(128)["loads_ahead"] == 8 and cs.default_knobs(512)["loads_ahead"] == 4
    assert k.knobs["lanes_per_entry"] == 8 and "__shfl_xor_sync" in k.source()  # 32 columns: csr_group
    assert cs.default_knobs(64)["lanes_per_entry"] == cs.default_knobs(128)["lanes_per_entry"] == 32
    source = k.extra.get("knobs_source", "")  # the learned default defers to the rule: the log never ran it
    assert source.startswith("default") and ("csr_split" in source or "no tuning log" in source), source
    for inst, kw in ((even, {}), (hub, {"knobs": {"vec": 1}}), (hub, {"feat": 1024}),
                     (hub, {"dtype": "float16"})):
        kw = {"feat": 32, **kw}
        got = sparsec.compile("spmm", inst, target="cuda:sm_90a", **kw)
        assert "entries_per_warp" not in got.knobs and "__ballot_sync" not in got.source(), kw
    assert "entries_per_warp" not in sparsec.compile("spmm", hub, target="llvm", feat=32).knobs


def test_refusals_name_the_knob_and_the_problem():
    import sparsec
    from sparsec import formats

    inst = formats.convert(sp.random(100, 80, density=0.05, format="csr", random_state=4, dtype=np.float32), "csr")
    with pytest.raises(ValueError, match="entries_per_warp should be one of"):
        sparsec.compile("spmm", inst, target="cuda", feat=32, knobs={"entries_per_warp": 100})
    with pytest.raises(ValueError, match=r"knob \['vec'\] does not apply"):
        sparsec.compile("spmm", inst, target="cuda", feat=32, knobs={"entries_per_warp": 64, "vec": 2})
    with pytest.raises(ValueError, match="entries_per_warp"):  # float16: the CUDA-core template's knobs only
        sparsec.compile("spmm", inst, target="cuda", feat=32, dtype="float16", knobs={"entries_per_warp": 64})
    with pytest.raises(ValueError, match="loads_ahead=8 at feat=512 holds 128 floats"):
        sparsec.compile("spmm", inst, target="cuda", feat=512, knobs={"loads_ahead": 8})
    with pytest.raises(ValueError, match="lanes_per_entry=8 at feat=40: each lane takes feat / lanes_per_entry"):
        sparsec.compile("spmm", inst, target="cuda", feat=40, knobs={"lanes_per_entry": 8})
    with pytest.raises(ValueError, match="lanes_per_entry should be one of"):
        sparsec.compile("spmm", inst, target="cuda", feat=32, knobs={"lanes_per_entry": 4})
    with pytest.raises(ValueError, match="feat should be at most 512"):
        sparsec.compile("spmm", inst, target="cuda", feat=1024, knobs={"entries_per_warp": 64})


def test_nvcc_compiles_what_tvm_emits():
    """The two launches' CUDA for widths under, at and over one warp's 32 lanes, and grouped
    (csr_group: float4, float2 and scalar loads a lane)."""
    from nvcc_tools import nvcc_sources
    from sparsec.schedules.warp_mma import cuda_source

    sources = {(f, g, "sm_90a"): cuda_source(cs.build(f, entries_per_warp=128, loads_ahead=u, lanes_per_entry=g))
               for f, u, g in ((20, 2, 32), (64, 2, 32), (128, 8, 32), (32, 4, 8), (64, 8, 16), (16, 4, 8), (8, 2, 8))}
    for key, (ok, output) in nvcc_sources(sources).items():
        assert ok, (key, output[-2000:])


def test_the_tuner_searches_its_knobs_where_it_is_the_default():
    """``sparsec tune``'s space for CSR on skewed rows is this kernel's knob grid (declared by
    its transformation), each candidate featurized for the cost model; on even rows, the
    CUDA-core template's."""
    from sparsec.tune.features import MatrixContext, feature_matrix
    from sparsec.tune.space import Space

    rng = np.random.default_rng(8)
    hub = sp.random(5000, 3000, density=0.001, format="lil", random_state=8, dtype=np.float32)
    hub[5, :2000] = rng.standard_normal(2000)
    hub = hub.tocsr()
    cands = Space("spmm", hub, 32, "float32", families=("csr",), target="cuda:sm_90a").format_candidates("csr", {})
    grid = {tuple(c["schedule_knobs"][k] for k in cs.KNOBS) for c in cands}
    assert len(grid) == np.prod([len(v) for v in cs.KNOBS.values()])  # 32 columns: every setting fits
    assert np.isfinite(feature_matrix(cands, MatrixContext(hub))[:, 0]).all()
    even = sp.random(3000, 3000, density=0.01, format="csr", random_state=9, dtype=np.float32)
    other = Space("spmm", even, 32, "float32", families=("csr",), target="cuda:sm_90a").format_candidates("csr", {})
    assert not any("entries_per_warp" in c["schedule_knobs"] for c in other)
