"""The learned default: ``sparsec.compile(op, converted_matrix)`` without knobs takes what the
tuning logs know for the target (the best record for this matrix, else the shipped cost
model's pick, read from the model file beside the log), and says so in
``Kernel.extra["knobs_source"]``; ``knobs="default"`` keeps the templates' rule."""
from __future__ import annotations

import os

import numpy as np
import pytest
import scipy.sparse as sp

import sparsec
from sparsec import build
from sparsec.formats import convert
from sparsec.tune import apply
from sparsec.tune import records as R
from sparsec.tune.signature import matrix_signature

TARGET = "cuda:sm_90a"
SHIPPED = os.path.join(os.path.dirname(__file__), "..", "tuning_logs", "spmm_cuda_sm_90a.jsonl")


@pytest.fixture(scope="module")
def graph():
    """A power-law-ish matrix no log names: a few long rows among short ones (up to 400
    entries: not skewed enough for csr_split, whose knobs the log never searched)."""
    rng = np.random.default_rng(7)
    lengths = np.minimum(rng.zipf(1.8, 3000), 400)
    rows = np.repeat(np.arange(3000), lengths)
    cols = rng.integers(0, 3000, rows.size)
    m = sp.csr_matrix((rng.standard_normal(rows.size).astype(np.float32), (rows, cols)), shape=(3000, 3000))
    m.sum_duplicates()
    return m


def _shipped(monkeypatch, tmp_path):
    """Only the repository's shipped log (and its model file) is looked at."""
    monkeypatch.setenv("SPARSEC_TUNING_LOGS", os.path.dirname(os.path.abspath(SHIPPED)))
    monkeypatch.chdir(tmp_path)


def test_without_knobs_a_logged_format_gets_the_models_pick_and_the_rule_stays_one_word_away(
        graph, monkeypatch, tmp_path):
    """CSR SpMM at 32 columns on sm_90a: the shipped model ranks the CSR configurations that
    won on the logged graphs for this matrix -- the same answer knobs="tuned" gives from the
    whole log -- and knobs="default" is the rule build.compile applies."""
    _shipped(monkeypatch, tmp_path)
    inst = convert(graph, "csr")
    k = sparsec.compile("spmm", inst, target=TARGET, feat=32)
    assert k.extra["knobs_source"] == "model"
    assert k.knobs == sparsec.compile("spmm", inst, target=TARGET, feat=32, knobs="tuned").knobs
    rule = build.compile("spmm", inst, target=TARGET, feat=32).knobs
    d = sparsec.compile("spmm", inst, target=TARGET, feat=32, knobs="default")
    assert d.knobs == rule and d.extra["knobs_source"] == "default: asked for"
    assert "rows_per_block" in k.knobs and k.source().count("__global__") >= 1


def test_a_hyb_instance_meets_the_logs_hyb_records_by_its_column_ranges(graph, monkeypatch, tmp_path):
    """hyb's buckets follow each matrix, so a converted hyb instance (its own buckets) is
    matched with the logged hyb records of its col_parts (any buckets): the model ranks their
    winning schedule knobs on this instance's own bucket layout; a col_parts the log never
    measured keeps the rule and says so."""
    from sparsec.tune.space import Space

    _shipped(monkeypatch, tmp_path)
    inst = convert(graph, "hyb:1:1/2/4/8/16/32/64/128")
    k = sparsec.compile("spmm", inst, target=TARGET, feat=32)
    assert k.extra["knobs_source"] == "model"
    space = Space("spmm", graph, 32, "float32", families=("hyb",), target=TARGET)
    fk = {"col_parts": 1, "buckets": "1/2/4/8/16/32/64/128"}
    searched = [c["schedule_knobs"] for c in space.format_candidates("hyb", fk)]
    assert all(c["format_knobs"] == fk for c in space.format_candidates("hyb", fk))
    assert {kk: v for kk, v in k.knobs.items() if kk != "feat_tiles"} in [
        {kk: v for kk, v in c.items() if kk != "feat_tiles"} for c in searched]
    other = sparsec.compile("spmm", convert(graph, "hyb:2:1/2/4"), target=TARGET, feat=32)
    assert other.extra["knobs_source"] == ("default: the tuning log has no winning configuration of "
                                           "hyb:col_parts=2 for spmm, float32 at feat=32")


@pytest.mark.parametrize("fmt, target, why", [
    ("bsr:4x4", TARGET, "the tuning log has no winning configuration of bsr:4x4 for spmm, float32 at feat=32"),
    ("csr", "llvm", "no tuning log for spmm on llvm"),
])
def test_where_the_logs_know_nothing_the_rule_answers_and_says_why(graph, monkeypatch, tmp_path, fmt, target, why):
    _shipped(monkeypatch, tmp_path)
    inst = convert(graph, fmt)
    k = sparsec.compile("spmm", inst, target=target, feat=32)
    assert k.extra["knobs_source"] == f"default: {why}"
    assert k.knobs == build.compile("spmm", inst, target=target, feat=32).knobs


def test_a_record_for_this_very_matrix_wins_over_the_model(graph, monkeypatch, tmp_path):
    """A log (no model file beside it, too few rows to fit one) holding two measurements of
    this matrix in CSR at 32 columns: the faster record's knobs are the default."""
    log = tmp_path / "logs" / os.path.basename(R.default_log_path("spmm", TARGET))
    log.parent.mkdir()
    sig = matrix_signature(graph)
    for ms, rpb in ((0.5, 8), (0.2, 2)):
        R.append(str(log), R.Record(op="spmm", format="csr", schedule_knobs={"rows_per_block": rpb, "vec": 2},
                                    feat=32, signature=sig, target=TARGET, status="ok", time_ms=ms))
    monkeypatch.setenv("SPARSEC_TUNING_LOGS", str(log.parent))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(apply, "log_candidates", lambda op, target: [str(log)] if target == TARGET else [])
    k = sparsec.compile("spmm", convert(graph, "csr"), target=TARGET, feat=32)
    assert k.extra["knobs_source"] == "record"
    assert k.knobs["rows_per_block"] == 2 and k.knobs["vec"] == 2
    # the same matrix at another width has no record and the log no model: the rule
    k = sparsec.compile("spmm", convert(graph, "csr"), target=TARGET, feat=64)
    assert k.extra["knobs_source"].startswith("default:")


def test_a_pick_that_fails_warns_and_compiles_with_the_rule(graph, monkeypatch, tmp_path):
    _shipped(monkeypatch, tmp_path)

    def broken(*a, **kw):
        raise ValueError("damaged model file")
    monkeypatch.setattr(apply, "learned_schedule_knobs", broken)
    inst = convert(graph, "csr")
    with pytest.warns(UserWarning, match="learned default knobs failed .*damaged model file"):
        k = sparsec.compile("spmm", inst, target=TARGET, feat=32)
    assert k.extra["knobs_source"] == "default: the pick failed (ValueError)"
    assert k.knobs == build.compile("spmm", inst, target=TARGET, feat=32).knobs


def test_sparse_tensor_auto_takes_the_logs_format_on_a_cuda_device(graph, monkeypatch, tmp_path):
    """SparseTensor(fmt="auto") on an sm_90 device converts to the format (and format knobs)
    the shipped log's model picks for SpMM at its width; on the CPU, or without a width, the
    rule-based default format."""
    torch = pytest.importorskip("torch")
    import sparsec.torch as st
    from sparsec.formats.choose import default_format, row_stats

    _shipped(monkeypatch, tmp_path)
    cand, source = apply.tuned_config("spmm", graph, 32, TARGET)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    for dtype in (None, torch.float32, np.float32, "float32"):
        inst, got = st._auto_instance(graph, 32, torch.device("cuda"), dtype)
        assert got == source == "model" and inst.value_dtype == "float32"
        assert inst.format.spec == convert(graph, cand["format"], **cand["format_knobs"]).format.spec
        np.testing.assert_array_equal(inst.to_scipy().toarray(), graph.toarray())
    with pytest.raises(TypeError, match="dtype should be one of float32, float64, float16, got int8"):
        st._auto_instance(graph, 32, torch.device("cuda"), "int8")  # no pick for integers: the rule's format refuses
    assert st.SparseTensor(graph, "csr", dtype=torch.float16).instance.value_dtype == "float16"
    monkeypatch.undo()
    for feat in (32, None):
        A = st.SparseTensor(graph, "auto", feat=feat)
        assert A.format_source == "default"
        assert A.format.split(":")[0] == default_format("spmm", row_stats(graph), feat)


def test_integer_formats_get_a_quiet_answer(monkeypatch, tmp_path):
    """An int8 SR-BCRS instance (integer values: the pick reads its pattern as floats): no
    warning; the shipped log holds too few int8 cases for the model, so the rule, said so."""
    import warnings

    from sparsec import workload

    _shipped(monkeypatch, tmp_path)
    m = sp.random(512, 512, density=0.05, format="csr", random_state=0, dtype=np.float32)
    inst, _ = workload.convert(m, "srbcrs:v8", {}, "int8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        k = sparsec.compile("spmm", inst, target=TARGET, feat=64)
    assert k.extra["knobs_source"].startswith("default: the tuning log has 2 case(s) of srbcrs")
    assert k.knobs == build.compile("spmm", inst, target=TARGET, feat=64).knobs


def test_convert_auto_takes_the_logs_pick_and_says_whose(graph, monkeypatch, tmp_path):
    """formats.convert(m, "auto", op=, feat=, target=) converts to the tuning logs' pick
    (format and format knobs, through the entry point the tuner registers: the formats layer
    never imports it); without a width or target, or for a target with no log, the rule's
    format; format_source says which."""
    from importlib.metadata import entry_points

    from sparsec.formats.choose import PICKERS, default_format, row_stats

    assert [ep.value for ep in entry_points(group=PICKERS)] == ["sparsec.tune.apply:auto_format_pick"]
    _shipped(monkeypatch, tmp_path)
    cand, source = apply.tuned_config("spmm", graph, 32, TARGET)
    inst = convert(graph, "auto", op="spmm", feat=32, target=TARGET)
    assert inst.format_source == source == "model"
    assert inst.format.spec == convert(graph, cand["format"], **cand["format_knobs"]).format.spec
    np.testing.assert_array_equal(inst.to_scipy().toarray(), graph.toarray())
    for kw in ({}, {"feat": 32}, {"feat": 32, "target": "llvm"}, {"op": "rgcn", "feat": 32, "target": TARGET}):
        inst = convert(graph, "auto", **kw)
        assert inst.format_source == "default" and inst.format.name == default_format(
            kw.get("op", "spmm"), row_stats(graph), kw.get("feat")), kw
    assert convert(graph, "auto", feat=32, target=TARGET, dtype="float16").value_dtype == "float16"


def test_an_uninstalled_checkout_still_reaches_the_learned_picker(monkeypatch):
    """A tree on PYTHONPATH has no package metadata, so no entry points: the pickers come from
    its pyproject.toml (before, "auto" silently took the rule there); an installed sparsec
    that registers none keeps none."""
    from importlib.metadata import PackageNotFoundError

    from sparsec.formats import choose

    def not_installed(name):
        raise PackageNotFoundError(name)

    monkeypatch.setattr(choose, "entry_points", lambda group: [])
    monkeypatch.setattr(choose, "version", not_installed)
    assert [(ep.name, ep.value) for ep in choose.pickers()] == [("learned", "sparsec.tune.apply:auto_format_pick")]
    assert choose.pickers()[0].load() is apply.auto_format_pick
    monkeypatch.setattr(choose, "version", lambda name: "0.1.0")
    assert choose.pickers() == []


def test_convert_auto_warns_and_takes_the_rule_when_the_picker_fails(graph, monkeypatch, tmp_path):
    _shipped(monkeypatch, tmp_path)

    def broken(*a, **k):
        raise RuntimeError("model file damaged")

    monkeypatch.setattr(apply, "tuned_config", broken)
    with pytest.warns(UserWarning, match="format picker 'learned' failed .*model file damaged.*rule-based"):
        inst = convert(graph, "auto", feat=32, target=TARGET)
    assert inst.format_source == "default"


def _child_signature(m):
    from sparsec.tune.features import MatrixContext

    return MatrixContext(m).signature


def test_a_forked_child_hashes_signatures_on_its_own_thread(graph):
    """MatrixContext hashes the signature on a worker thread; a forked child (a tuner's build
    worker) inherits the pool but not the thread, and must not wait on it forever."""
    import multiprocessing

    from sparsec.tune.features import MatrixContext

    want = MatrixContext(graph).signature  # the parent's pool and thread exist now
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply_async(_child_signature, (graph,)).get(timeout=60) == want


def test_a_matrix_far_beyond_the_logged_ones_gets_the_rule_and_says_why(monkeypatch, tmp_path):
    """Trees predict flat past their last split: a row over RANGE_MARGIN times longer than
    any logged row (or a matrix that much larger) is outside the model's range, so the
    schedule knobs, the zero-shot pick and convert(m, "auto") fall back to the rule, and
    knobs_source says why. The shipped model carries the logged span."""
    from sparsec.tune import apply

    _shipped(monkeypatch, tmp_path)
    span = apply._log_knowledge(SHIPPED)[1].meta["matrix_range"]
    longest = int(span["row_len_max"][1] * apply.RANGE_MARGIN) + 1000
    rng = np.random.default_rng(2)
    rows = np.concatenate([np.zeros(longest, np.int64), rng.integers(1, 2000, 20000)])
    cols = np.concatenate([np.arange(longest), rng.integers(0, longest, 20000)])
    m = sp.csr_matrix((rng.standard_normal(rows.size).astype(np.float32), (rows, cols)), shape=(2000, longest))
    m.sum_duplicates()
    knobs, source = apply.learned_schedule_knobs("spmm", convert(m, "csr"), 32, TARGET, "float32")
    assert knobs == {} and source.startswith("default: the matrix is outside the cost model's range (row_len_max")
    assert apply.tuned_config("spmm", m, 32, TARGET)[1] == "default"
    assert convert(m, "auto", op="spmm", feat=32, target=TARGET).format_source == "default"
    # within the span (the module's graph is far smaller than the largest logged) the model answers
    assert apply.outside_range(apply._log_knowledge(SHIPPED)[1], {"rows": 10, "nnz": 10, "row_len_max": 1}) is None


def test_rows_far_more_even_than_any_logged_get_the_rule(monkeypatch, tmp_path):
    """The shipped SDDMM log holds skewed graphs only (row-length CV >= 1): a mesh, whose rows
    are far more even, is outside its model's range and convert(m, "auto") takes the rule
    (CSR for long even rows); the SpMM log, which holds meshes, keeps answering."""
    from sparsec.tune import apply

    _shipped(monkeypatch, tmp_path)
    sddmm_log = SHIPPED.replace("spmm_", "sddmm_")
    lo = apply._log_knowledge(sddmm_log)[1].meta["matrix_range"]["row_len_cv"][0]
    assert lo > 0.5
    n, width = 4000, 12  # a banded mesh-like matrix: every row 12 entries, CV 0
    rows = np.repeat(np.arange(n), width)
    cols = (rows + np.tile(np.arange(width) - width // 2, n)) % n
    m = sp.csr_matrix((np.ones(rows.size, np.float32), (rows, cols)), shape=(n, n))
    why = apply.outside_range(apply._log_knowledge(sddmm_log)[1], {"row_len_cv": 0.0, "rows": n})
    assert why.startswith("the matrix is outside the cost model's range (row_len_cv 0")
    inst = convert(m, "auto", op="sddmm", feat=32, target=TARGET)
    assert inst.format_source == "default" and inst.format.name == "csr"
    assert apply.outside_range(apply._log_knowledge(SHIPPED)[1], {"row_len_cv": 0.0}) is None


def test_bench_format_auto_runs_what_convert_auto_picks(graph, monkeypatch, tmp_path):
    """``sparsec bench --format auto`` / ``run_suite.py --auto``: each case names the format
    convert(m, "auto") takes for its matrix, width and target (the log's pick, its knobs
    written out), the rule's where no log answers; the blocks suite refuses it."""
    from sparsec.bench.cases import build_cases
    from sparsec.formats.choose import default_format, row_stats

    _shipped(monkeypatch, tmp_path)
    path = tmp_path / "g.npz"
    sp.save_npz(path, graph)
    case = build_cases("spmm", matrix=str(path), feats=[32], spec="auto", target=TARGET)[0].cases[0]
    assert convert(graph, case.spec).format.spec == \
        convert(graph, "auto", op="spmm", feat=32, target=TARGET).format.spec
    llvm = build_cases("spmm", matrix=str(path), feats=[32], spec="auto", target="llvm")[0].cases[0]
    assert llvm.spec == default_format("spmm", row_stats(graph), 32)
    with pytest.raises(ValueError, match="auto"):
        build_cases("spmm", suite="blocks", spec="auto", target=TARGET)


def test_the_pick_is_the_same_in_every_process():
    """The model scores knobs it has no column for alike (SDDMM's unroll), and the first of
    equal scores wins: the candidates' order may not follow a set's order, which changes with
    each process's string hashing (PYTHONHASHSEED). Two processes, two seeds, one answer, on
    the shipped logs and models."""
    import json
    import os
    import subprocess
    import sys

    code = ("import json; from sparsec.bench.rmat import rmat; from sparsec.tune.apply import tuned_config; "
            "m = rmat(14, 200_000, seed=3).tocsr(); "
            "print(json.dumps([tuned_config(op, m, f, 'cuda:sm_90a') for op in ('sddmm', 'spmm') for f in (32, 128)],"
            " sort_keys=True))")
    outs = set()
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        picks = json.loads(done.stdout.strip().splitlines()[-1])
        assert all(src == "model" for _, src in picks)
        outs.add(json.dumps(picks, sort_keys=True))
    assert len(outs) == 1
