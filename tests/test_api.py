"""``sparsec.compile`` (sparsec.api) resolves ``knobs="tuned"`` through the tuner and then
compiles with ``sparsec.build.compile``, which takes only a dict of knobs: the compiler
does not know the tuner (imports flow api -> tune -> build)."""
from __future__ import annotations

import inspect

import numpy as np
import pytest
import scipy.sparse as sp

import sparsec
from sparsec import api, build, ops
from sparsec.formats import convert
from sparsec.tune import apply


@pytest.fixture(scope="module")
def matrix():
    return convert(sp.random(30, 20, density=0.2, format="csr", dtype=np.float32, random_state=0), "csr")


def test_sparsec_compile_is_the_api_facade_with_the_compilers_signature():
    assert sparsec.compile is api.compile
    mine, theirs = inspect.signature(api.compile).parameters, inspect.signature(build.compile).parameters
    assert [(p.name, p.kind, p.default) for p in mine.values()] == \
        [(p.name, p.kind, p.default) for p in theirs.values()]


def test_the_compiler_refuses_tuned_and_points_to_sparsec_compile(matrix):
    with pytest.raises(ValueError, match=r"knobs='tuned' is resolved .* by sparsec.compile \(sparsec.api.compile\)"):
        build.compile("spmm", matrix, feat=4, knobs="tuned")


def test_tuned_knobs_come_from_the_tuner_and_reach_the_compiler(matrix, monkeypatch):
    asked, compiled = [], []
    monkeypatch.setattr(apply, "tuned_schedule_knobs", lambda *a: asked.append(a) or {"rows_per_block": 2})
    monkeypatch.setattr(build, "compile", lambda *a, **kw: compiled.append((a, kw)) or "kernel")
    assert api.compile(ops.get("spmm"), matrix, feat=4, target="llvm", knobs="tuned") == "kernel"
    assert asked == [("spmm", matrix, 4, "llvm", "float32")]  # an Operator is looked up by its name
    assert compiled[0][1]["knobs"] == {"rows_per_block": 2}
    monkeypatch.setattr(apply, "tuned_schedule_knobs", lambda *a: {})
    api.compile("spmm", matrix, feat=4, knobs="tuned", dtype="float64")
    assert compiled[1][1]["knobs"] is None and compiled[1][1]["dtype"] == "float64"  # no record: the defaults


def test_without_tuning_logs_tuned_means_the_template_defaults(matrix, tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSEC_TUNING_LOGS", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(apply, "log_candidates", lambda op, target: [])
    k = sparsec.compile("spmm", matrix, feat=4, target="llvm", knobs="tuned")
    assert k.knobs == build.compile("spmm", matrix, feat=4, target="llvm").knobs
    B = np.ones((20, 4), np.float32)
    np.testing.assert_allclose(k(matrix, B), matrix.to_scipy() @ B, rtol=1e-5)


@pytest.mark.parametrize("fmt, knobs, message", [
    ("csr", "tuned", "'tuned' with a converted matrix, got 'tuned' with fmt=str"),
    (None, "fast", "knobs should be a dict, 'default', or 'tuned' with a converted matrix, got 'fast'"),
])
def test_bad_knobs_are_named(matrix, fmt, knobs, message):
    with pytest.raises(ValueError, match=message):
        sparsec.compile("spmm", matrix if fmt is None else fmt, feat=4, knobs=knobs)


def test_a_bad_operator_is_refused_before_the_logs_are_read(matrix):
    with pytest.raises(TypeError, match="op should be an operator name or a sparsec.dsl.Operator, got int"):
        sparsec.compile(3, matrix, feat=4, knobs="tuned")
