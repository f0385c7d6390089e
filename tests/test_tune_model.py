"""Cost-model features and the XGBoost model (issue 5): the format-derived features must match
what the formats really store, the schedule features what the templates really launch, and
the model must learn a ranking from measurements, reproducibly, and survive a save/load."""
from __future__ import annotations

import itertools
import json
import subprocess
import sys
import types

import numpy as np
import pytest
import scipy.sparse as sp

from sparsec.formats import convert, rell
from sparsec.schedules.cuda import features_over_threads
from sparsec.tune import records as rec
from sparsec.tune.features import FEATURE_NAMES, MatrixContext, candidate_features, feature_matrix
from sparsec.tune.model import FEATURES_KEY, CostModel, log_throughput, spearman, training_rows


def _cand(fmt="csr", format_knobs=None, feat=64, op="spmm", dtype="float32", **schedule_knobs):
    return {"op": op, "format": fmt, "format_knobs": format_knobs or {}, "schedule_knobs": schedule_knobs,
            "feat": feat, "dtype": dtype}


def _rows_of_lengths(lengths, cols=16):
    """A matrix whose row i has lengths[i] entries in columns 0..lengths[i]-1."""
    r = np.repeat(np.arange(len(lengths)), lengths)
    c = np.concatenate([np.arange(k) for k in lengths]) if sum(lengths) else np.zeros(0, int)
    return sp.csr_matrix((np.ones(r.size), (r, c)), shape=(len(lengths), cols))


def _powerlaw(rows, cols, seed, alpha=1.3, scale=4.0):
    rng = np.random.default_rng(seed)
    lengths = np.minimum((rng.pareto(alpha, rows) * scale).astype(int), cols)
    r = np.repeat(np.arange(rows), lengths)
    c = rng.integers(0, cols, r.size)
    m = sp.csr_matrix((rng.standard_normal(r.size), (r, c)), shape=(rows, cols))
    m.sum_duplicates()
    return m


# ------------------------------------------------------------------------ format-derived features

def test_hyb_padding_by_hand():
    # rows of 0, 1, 3, 5, 9 entries, buckets 1/2/4 (widest W = 4), one column range:
    #   1 -> bucket 1 (1 slot); 3 -> bucket 4 (4 slots); 5 and 9 are longer than W and are
    #   split into ceil(k / 4) ELL rows of the widest bucket: 2 x 4 and 3 x 4 slots.
    m = _rows_of_lengths([0, 1, 3, 5, 9])
    ctx = MatrixContext(m)
    f = candidate_features(_cand("hyb", {"col_parts": 1, "buckets": "1/2/4"}), ctx)
    assert f["padding_ratio"] == pytest.approx((1 + 4 + 8 + 12) / 18)
    assert f["split_frac"] == pytest.approx((5 + 9) / 18)
    assert f["log_ell_rows"] == pytest.approx(np.log1p(1 + 1 + 2 + 3))
    assert f["n_parts"] == 2  # bucket 1 and bucket 4; bucket 2 is empty
    assert f["hyb_log2_max_bucket"] == 2 and f["hyb_n_buckets"] == 3 and f["hyb_log2_col_parts"] == 0
    inst = convert(m, "hyb", col_parts=1, buckets=(1, 2, 4))  # the format agrees (bucket 2: a part with no rows)
    assert inst.stored == 25 and [p.root_extent() for p in inst.parts] == [1, 0, 6]


@pytest.mark.parametrize("knobs", [{}, {"col_parts": 2}, {"col_parts": 4, "buckets": "1/2/4/8"},
                                   {"buckets": [2, 8, 32]}, {"col_parts": 3, "buckets": "1/2/4/8/16/32/64"}])
def test_hyb_features_match_conversion(knobs):
    m = _powerlaw(300, 2000, seed=len(str(knobs)))
    before = m.indptr.copy()
    ctx = MatrixContext(m)
    inst = convert(m, "hyb", **knobs)
    f = candidate_features(_cand("hyb", knobs), ctx)
    assert f["padding_ratio"] == pytest.approx(inst.stored / inst.nnz)
    assert f["n_parts"] == sum(1 for p in inst.parts if p.root_extent())  # parts with work (empty ones idle)
    assert np.expm1(f["log_ell_rows"]) == pytest.approx(sum(rell.root_extent(p) for p in inst.parts))
    assert f["hyb_log2_col_parts"] == np.log2(inst.format.param("col_parts"))
    assert f["hyb_log2_max_bucket"] == np.log2(inst.format.param("buckets")[-1])
    assert np.array_equal(m.indptr, before)  # the caller's matrix is left alone


def test_csr_ell_bsr_padding():
    m = _powerlaw(200, 300, seed=1)
    ctx = MatrixContext(m)
    csr = candidate_features(_cand("csr"), ctx)
    assert (csr["padding_ratio"], csr["split_frac"], csr["n_parts"]) == (1.0, 0.0, 1.0)
    assert csr["log_ell_rows"] == pytest.approx(np.log1p(200))
    assert csr["fmt_csr"] == 1 and csr["fmt_hyb"] == 0 and np.isnan(csr["hyb_log2_max_bucket"])
    bsr4 = candidate_features(_cand("bsr:4x4"), ctx)
    assert bsr4["padding_ratio"] == pytest.approx(1 / ctx.stats["block_fill_4"])
    for spec in ("bsr:3x5", "bsr:1x8", "ell"):
        f = candidate_features(_cand(spec), ctx)
        assert f["padding_ratio"] == pytest.approx(convert(m, spec).stored / m.nnz), spec
    ell = candidate_features(_cand("ell", {"width": 512}), ctx)
    assert ell["padding_ratio"] == pytest.approx(200 * 512 / m.nnz) and ell["ell_log2_width"] == 9
    other = candidate_features(_cand("nm:2:4"), ctx)
    assert other["fmt_other"] == 1 and np.isnan(other["padding_ratio"]) and np.isnan(other["n_parts"])


def test_empty_matrix_features_are_finite_where_defined():
    ctx = MatrixContext(sp.csr_matrix((5, 7)))
    for spec in ("csr", "hyb", "ell", "bsr:2x2"):
        f = candidate_features(_cand(spec), ctx)
        assert f["padding_ratio"] == 1.0 and f["split_frac"] == 0.0, spec


def test_serial_chain_is_the_longest_piece_a_thread_walks():
    """CSR walks the longest row; hyb stops at its widest bucket; ELL walks its width; each
    times the feature steps one thread takes (features / (threads a row x vector))."""
    lengths = [1, 2, 3, 40] + [3] * 60
    ctx = MatrixContext(_rows_of_lengths(lengths, cols=64))
    csr = candidate_features(_cand("csr", feat=64, vec=4), ctx)  # 16 threads x 4: one step
    assert csr["log_serial_chain"] == pytest.approx(np.log1p(40))
    hyb = candidate_features(_cand("hyb", {"col_parts": 1, "buckets": "1/2/4/8"}, feat=64, vec=4), ctx)
    assert hyb["log_serial_chain"] == pytest.approx(np.log1p(8))
    ell = candidate_features(_cand("ell", feat=64, vec=4), ctx)
    assert ell["log_serial_chain"] == pytest.approx(np.log1p(40))
    sliced = candidate_features(_cand("csr", feat=512, vec=1, feat_tiles=2), ctx)  # 256 features, 256 threads
    assert sliced["log_serial_chain"] == pytest.approx(np.log1p(40))
    mean = ctx.nnz / ctx.rows
    assert csr["log_chain_over_mean"] == pytest.approx(np.log(40 / mean), rel=1e-6)
    assert csr["log_chain_bound"] == pytest.approx(np.log(2 * ctx.nnz * 64) - np.log1p(40), rel=1e-6)
    assert hyb["log_chain_bound"] > csr["log_chain_bound"]  # the bucket cut shortens the chain


# ------------------------------------------------------------------------ schedule features

class _Recorder:
    """Just enough of a tvm Schedule for features_over_threads: records splits and bindings."""

    def __init__(self):
        self.bound = {}
        self.feature_split = None

    def get_sblock(self, name):
        return name

    def get_loops(self, blk):
        return [("loop", "root"), ("loop", "k")]

    def split(self, loop, factors):
        if loop == ("loop", "k"):
            self.feature_split = factors
        return tuple(("split", i, f) for i, f in enumerate(factors))

    def bind(self, loop, tag):
        self.bound[tag] = loop[2]

    def __getattr__(self, name):  # reorder, vectorize, unroll, ...: nothing to record
        return lambda *a, **k: None


def _spmm_nest(F):
    loop = lambda role, kind, extent: types.SimpleNamespace(  # noqa: E731
        loop=types.SimpleNamespace(role=role, kind=kind, extent=extent), extent=extent)
    blocks = [[loop("root", "S", 100), loop("dense", "S", F)]]
    return types.SimpleNamespace(name="spmm", blocks=blocks, reduce=None, init=False, atomic=False,
                                 target=types.SimpleNamespace(buffer="C", index=()))


@pytest.mark.parametrize("F", [32, 64, 512, 6])
@pytest.mark.parametrize("vec", [4, 1])
@pytest.mark.parametrize("rows_per_block", ["auto", 16])
@pytest.mark.parametrize("feat_tiles", [1, 4])
def test_schedule_resolution_matches_features_over_threads(F, vec, rows_per_block, feat_tiles):
    sch = _Recorder()
    features_over_threads.fn(sch, _spmm_nest(F), rows_per_block=rows_per_block, vec=vec, slots_per_block=64,
                             unroll=2, interleave=1, feat_tiles=feat_tiles)
    ctx = MatrixContext(_powerlaw(50, 60, seed=2))
    f = candidate_features(_cand(feat=F, rows_per_block=rows_per_block, vec=vec, feat_tiles=feat_tiles), ctx)
    assert f["rows_per_block"] == sch.bound["threadIdx.y"]
    assert f["threads_per_row"] == sch.bound["threadIdx.x"]
    assert f["vec"] == sch.feature_split[3]
    tiles = sch.feature_split[0]  # a width the tiles do not divide (F = 6 in 4) stays whole
    assert tiles == (feat_tiles if F % feat_tiles == 0 else 1) and 2 ** f["log2_feat_tiles"] == tiles
    assert sch.bound.get("blockIdx.y", 1) == tiles
    assert f["threads_per_block"] == sch.bound["threadIdx.x"] * sch.bound["threadIdx.y"]
    assert f["rows_per_block_auto"] == float(rows_per_block == "auto")


def test_defaults_and_sddmm_knobs():
    ctx = MatrixContext(_powerlaw(50, 60, seed=3))
    spmm = candidate_features(_cand(), ctx)  # defaults: auto, vec 4, 64 slots, unroll 2, interleave 1
    assert (spmm["vec"], spmm["log2_slots_per_block"], spmm["unroll"], spmm["interleave"]) == (4, 6, 2, 1)
    assert np.isnan(spmm["sddmm_lanes"]) and spmm["is_sddmm"] == 0
    sddmm = candidate_features(_cand(op="sddmm", feat=64), ctx)  # vec 4 -> 16 lanes, 2 groups a warp
    assert (sddmm["vec"], sddmm["sddmm_lanes"], sddmm["sddmm_groups"], sddmm["rows_per_block"]) == (4, 16, 2, 4)
    assert sddmm["threads_per_block"] == 128 and np.isnan(sddmm["unroll"]) and sddmm["is_sddmm"] == 1


def test_feature_matrix_shape_order_and_bad_knobs():
    ctx = MatrixContext(_powerlaw(100, 100, seed=4))
    cands = [_cand(), _cand("hyb", {"col_parts": 2}, feat=32, vec=2, dtype="float16"), _cand("bsr:2x2")]
    X = feature_matrix(cands, ctx)
    assert X.shape == (3, len(FEATURE_NAMES)) and X.dtype == np.float32
    assert len(set(FEATURE_NAMES)) == len(FEATURE_NAMES)
    f = candidate_features(cands[1], ctx)
    np.testing.assert_array_equal(X[1], np.array([f[n] for n in FEATURE_NAMES], dtype=np.float32))
    assert X[1, FEATURE_NAMES.index("dtype_bytes")] == 2 and X[1, FEATURE_NAMES.index("log2_feat")] == 5
    with pytest.raises(ValueError, match="'threads'"):
        candidate_features(_cand(threads=128), ctx)
    with pytest.raises(ValueError, match="'lanes'"):
        candidate_features(_cand(lanes=4), ctx)  # an SDDMM knob on SpMM
    with pytest.raises(ValueError, match="'width'"):
        candidate_features(_cand("hyb", {"width": 8}), ctx)
    with pytest.raises(ValueError, match="rows_per_block"):
        candidate_features(_cand(rows_per_block="fast"), ctx)
    with pytest.raises(ValueError, match="'vec'"):
        candidate_features(_cand(vec=0), ctx)
    assert candidate_features(_cand(rows_per_block=3), ctx)["rows_per_block"] == 3  # off the grid: still a number
    with pytest.raises(ValueError, match="op"):
        candidate_features(_cand(op="spmv"), ctx)


# ------------------------------------------------------------------------ the model

_RPB_COST = {1: 2.0, 2: 1.5, 4: 1.0, 8: 1.2, 16: 1.6}
_VEC_COST = {1: 1.8, 2: 1.3, 4: 1.0}
_FORMATS = [("csr", {}), ("hyb", {}), ("ell", {}), ("bsr:2x2", {}), ("bsr:4x4", {})] + [
    ("hyb", {"col_parts": p, "buckets": "/".join(str(1 << i) for i in range(w + 1))})
    for p in (1, 2) for w in (2, 3, 4, 5)]
_SCHEDULES = [dict(rows_per_block=r, vec=v, unroll=u) for r in ("auto", 1, 2, 4, 8, 16) for v in (1, 2, 4)
              for u in (1, 4)]


def _synthetic(ctx, cands, rng):
    """"Measured" times from a known cost: work x padding x f(rows per block) x g(vec) x noise."""
    times = []
    for c in cands:
        f = candidate_features(c, ctx)
        t = ctx.nnz * c["feat"] * 1e-6 * f["padding_ratio"] * _RPB_COST[int(f["rows_per_block"])] \
            * _VEC_COST[int(f["vec"])]
        times.append(t * float(np.exp(rng.normal(0, 0.03))))
    return np.array(times)


@pytest.fixture(scope="module")
def synthetic_data():
    rng = np.random.default_rng(0)
    mats = [_powerlaw(1500, 1500, seed=10), _powerlaw(800, 4000, seed=11, alpha=2.0, scale=10),
            sp.random(1000, 1000, density=0.01, format="csr", random_state=12),
            sp.random(2000, 500, density=0.004, format="csr", random_state=13) + sp.eye(2000, 500, format="csr")]
    train, test = [], []
    space = list(itertools.product(_FORMATS, _SCHEDULES))
    for m in mats:
        ctx = MatrixContext(m)
        picks = rng.choice(len(space), size=150, replace=False)
        cands = [_cand(fmt, dict(fk), **sk) for fmt, fk, sk in ((*space[i][0], space[i][1]) for i in picks)]
        times = _synthetic(ctx, cands, rng)
        n_train = int(0.8 * len(cands))
        train += [(c, ctx, t) for c, t in zip(cands[:n_train], times[:n_train])]
        test.append((ctx, cands[n_train:], times[n_train:]))
    return train, test


def test_model_learns_a_ranking(synthetic_data):
    train, test = synthetic_data
    model = CostModel().fit(train)
    assert model.trained and model.n_samples == len(train)
    for ctx, cands, times in test:
        rho = spearman(model.predict(cands, ctx), times)
        assert rho >= 0.8, rho


def test_model_is_deterministic_and_round_trips(synthetic_data, tmp_path):
    train, test = synthetic_data
    ctx, cands, _ = test[0]
    a = CostModel().fit(train).predict(cands, ctx)
    model = CostModel().fit(train)
    b = model.predict(cands, ctx)
    assert a.dtype == np.float64 and np.array_equal(a, b)
    # the array interface (rows kept from earlier runs) is the same model
    X = np.concatenate([feature_matrix([c], cx) for c, cx, _ in train])
    y = np.array([np.log(2 * cx.nnz * c["feat"] / t) for c, cx, t in train])
    assert np.array_equal(CostModel().fit_arrays(X, y).predict_arrays(feature_matrix(cands, ctx)), b)
    with pytest.raises(ValueError, match="columns"):
        model.predict_arrays(X[:, :-1])
    path = tmp_path / "model.json"
    model.save(path)
    loaded = CostModel.load(path)
    assert loaded.trained and loaded.n_samples == model.n_samples
    assert np.array_equal(loaded.predict(cands, ctx), b)
    doc = json.loads(path.read_text())
    doc["feature_names"][3] = "something_else"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="feature names differ"):
        CostModel.load(path)


def test_untrained_model_predicts_zeros(tmp_path):
    ctx = MatrixContext(_powerlaw(100, 100, seed=5))
    cands = [_cand(), _cand("hyb"), _cand(vec=1)]
    model = CostModel()
    assert not model.trained and model.n_samples == 0
    np.testing.assert_array_equal(model.predict(cands, ctx), np.zeros(3))
    model.fit([(c, ctx, 1.0 + i) for i, c in enumerate(cands)])  # fewer than 4: stays untrained
    assert not model.trained and model.n_samples == 3
    np.testing.assert_array_equal(model.predict(cands, ctx), np.zeros(3))
    model.save(tmp_path / "m.json")
    assert not CostModel.load(tmp_path / "m.json").trained
    with pytest.raises(ValueError, match="time_ms"):
        model.fit([(cands[0], ctx, 0.0)])


def test_training_rows_from_logged_records():
    """A log trains the model without its matrices: each record carries its feature row."""
    m = _powerlaw(100, 100, seed=6)
    ctx = MatrixContext(m)
    cand = _cand(vec=2)
    row = [None if not np.isfinite(v) else float(v) for v in feature_matrix([cand], ctx)[0]]
    base = dict(op="spmm", format=cand["format"], format_knobs=cand["format_knobs"],
                schedule_knobs=cand["schedule_knobs"], feat=cand["feat"], signature=ctx.signature, target="cuda",
                versions={}, stats=dict(ctx.stats), extra={FEATURES_KEY: row})
    records = [rec.Record(**base, status="ok", time_ms=0.5),
               rec.Record(**base, status="timeout"),
               rec.Record(**{**base, "extra": {}}, status="ok", time_ms=0.2),  # no features: skipped
               rec.Record(**{**base, "signature": "m-ffffffffffffffff"}, status="ok", time_ms=0.1)]
    X, y = training_rows(records)
    assert X.shape == (2, len(FEATURE_NAMES))
    # newest first; the derived columns are recomputed from the stored float32 values
    np.testing.assert_allclose(X[1], feature_matrix([cand], ctx)[0], rtol=1e-6)
    assert y[1] == pytest.approx(log_throughput(cand, ctx, 0.5))
    X, y = training_rows(records, exclude_signature="m-ffffffffffffffff")
    assert len(y) == 1 and y[0] == pytest.approx(log_throughput(cand, ctx, 0.5))


def test_training_rows_extend_rows_logged_before_newer_features():
    """Rows logged before log2_feat_tiles existed ran untiled kernels: they train as tiles = 1,
    with the derived columns computed from the stored ones."""
    from sparsec.tune.features import BASE_LENGTH, LEGACY_LENGTH, LEGACY_VALUES

    ctx = MatrixContext(_powerlaw(100, 100, seed=7))
    cand = _cand(vec=2)
    full = [float(v) if np.isfinite(v) else None for v in feature_matrix([cand], ctx)[0]]
    assert full[LEGACY_LENGTH:BASE_LENGTH] == list(LEGACY_VALUES)
    base = dict(op="spmm", format="csr", format_knobs={}, schedule_knobs={"vec": 2}, feat=64, signature=ctx.signature,
                target="cuda", versions={}, stats=dict(ctx.stats), status="ok", time_ms=0.5)
    X, _ = training_rows([rec.Record(**base, extra={FEATURES_KEY: full[:LEGACY_LENGTH]}),
                          rec.Record(**base, extra={FEATURES_KEY: full[:BASE_LENGTH]}),
                          rec.Record(**base, extra={FEATURES_KEY: full[:LEGACY_LENGTH - 1]})])  # unknown length: skipped
    assert X.shape == (2, len(FEATURE_NAMES))
    np.testing.assert_allclose(X, np.repeat(feature_matrix([cand], ctx)[:1], 2, axis=0), rtol=1e-6)


def test_spearman_is_nan_safe():
    assert spearman([3, 2, 1], [1.0, 2.0, 3.0]) == pytest.approx(1.0)  # fast predicted fastest
    assert spearman([1, 2, np.nan, 3], [3.0, 2.0, 1.0, np.inf]) == pytest.approx(1.0)
    assert np.isnan(spearman([1.0], [1.0]))
    assert np.isnan(spearman([0, 0, 0], [1.0, 2.0, 3.0]))


def test_xgboost_is_imported_lazily_and_missing_one_is_explained(monkeypatch):
    code = "import sys, sparsec.tune.model; assert 'xgboost' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
    monkeypatch.setitem(sys.modules, "xgboost", None)  # what an environment without it looks like
    ctx = MatrixContext(_powerlaw(100, 100, seed=7))
    with pytest.raises(ImportError, match=r"pip install 'sparsec\[tune\]'"):
        CostModel().fit([(_cand(vec=v), ctx, 1.0) for v in (1, 2, 4, 4)])
