"""Tuning records and matrix signatures (issue 5): a log must survive concurrent writers and a
killed writer, resume keys must not depend on knob order, and a signature must name the
matrix's content, not how it was stored."""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

from sparsec.formats.choose import row_stats
from sparsec.tune import records as rec
from sparsec.tune.signature import matrix_signature, matrix_stats


def _record(**kw):
    base = dict(op="spmm", format="hyb", format_knobs={"buckets": [4, 32]},
                schedule_knobs={"unroll": 2, "threads": 128}, feat=64, dtype="float32",
                matrix="test", signature="m-0123456789abcdef", stats={"nnz": 10},
                target="cuda:sm_90a", device="H200", time_ms=1.0, status="ok",
                versions={"sparsec": "test"}, trial=0)
    base.update(kw)
    return rec.Record(**base)


def _random(rows, cols, density, seed):
    return sp.random(rows, cols, density=density, format="csr", random_state=seed)


# ------------------------------------------------------------------------ signature and stats

def test_signature_is_stable_across_equivalent_inputs():
    m = _random(57, 43, 0.2, 1)
    sig = matrix_signature(m)
    assert sig.startswith("m-") and len(sig) == 18
    coo = m.tocoo()
    assert matrix_signature(coo) == sig
    assert matrix_signature(sp.csr_array(m)) == sig
    assert matrix_signature(m.astype(np.float32).astype(np.float64)) == matrix_signature(m.astype(np.float32))
    # each row's entries reversed: a CSR matrix with unsorted indices
    order = np.concatenate([np.arange(m.indptr[i], m.indptr[i + 1])[::-1] for i in range(m.shape[0])])
    unsorted = sp.csr_matrix((m.data[order], m.indices[order], m.indptr), shape=m.shape)
    assert not unsorted.has_sorted_indices
    assert matrix_signature(unsorted) == sig
    assert not unsorted.has_sorted_indices  # the caller's matrix is left as it was
    # each value split in two halves: duplicates that sum to the original
    dup = sp.coo_matrix((np.concatenate([coo.data / 2, coo.data / 2]),
                         (np.concatenate([coo.row, coo.row]), np.concatenate([coo.col, coo.col]))),
                        shape=m.shape)
    assert matrix_signature(dup) == sig
    by_row = np.argsort(dup.row, kind="stable")
    indptr = np.searchsorted(dup.row[by_row], np.arange(m.shape[0] + 1))
    dup_csr = sp.csr_matrix((dup.data[by_row], dup.col[by_row], indptr), shape=m.shape)
    assert matrix_signature(dup_csr) == sig
    assert dup_csr.nnz == 2 * coo.nnz  # duplicates summed in a copy, not in the caller's matrix
    # int64 index arrays
    wide = sp.csr_matrix((m.data, m.indices.astype(np.int64), m.indptr.astype(np.int64)), shape=m.shape)
    assert matrix_signature(wide) == sig


def test_signature_changes_with_content():
    m = _random(57, 43, 0.2, 1)
    sig = matrix_signature(m)
    changed = m.copy()
    changed.data[5] += 1.0
    assert matrix_signature(changed) != sig
    moved = m.tolil()
    r, c = m.nonzero()
    moved[r[0], c[0]] = 0
    moved = moved.tocsr()
    moved.eliminate_zeros()
    assert matrix_signature(moved) != sig
    assert matrix_signature(sp.csr_matrix((m.data, m.indices, m.indptr), shape=(57, 44))) != sig
    assert matrix_signature(sp.csr_matrix((3, 4))) != matrix_signature(sp.csr_matrix((4, 3)))


def _blocks(m, b):
    r, c = m.nonzero()
    return len(set(zip((r // b).tolist(), (c // b).tolist())))


def test_stats_match_direct_computation():
    m = _random(129, 250, 0.05, 3)
    s = matrix_stats(m)
    lengths = np.diff(m.indptr)
    assert (s["rows"], s["cols"], s["nnz"]) == (129, 250, m.nnz)
    assert s["density"] == pytest.approx(m.nnz / (129 * 250))
    assert s["row_len_p90"] == pytest.approx(np.percentile(lengths, 90))
    for key, value in row_stats(m).items():
        assert s[key] == pytest.approx(value)
    for b in (4, 16, 32):
        assert s[f"block_fill_{b}"] == pytest.approx(m.nnz / (_blocks(m, b) * b * b))
    spans = [(row.indices.max() - row.indices.min() + 1) / 250 for row in m if row.nnz]
    assert s["col_span_mean"] == pytest.approx(np.mean(spans))
    assert json.loads(json.dumps(s)) == s


def test_stats_empty_matrices():
    for shape in ((0, 0), (0, 5), (7, 0), (7, 5)):
        s = matrix_stats(sp.csr_matrix(shape))
        assert s["nnz"] == 0 and s["density"] == 0.0 and s["block_fill_32"] == 0.0
        assert s["empty_row_frac"] == (1.0 if shape[0] else 0.0)
        assert matrix_signature(sp.csr_matrix(shape)).startswith("m-")


def test_stats_empty_rows_and_one_huge_row():
    dense = np.zeros((10, 8))
    dense[2, [1, 2, 3]] = 1.0
    dense[7, [0, 7]] = 2.0
    s = matrix_stats(sp.csr_matrix(dense))
    assert s["empty_row_frac"] == pytest.approx(0.8)
    assert s["row_len_max"] == 3 and s["row_len_p50"] == 0
    assert s["col_span_mean"] == pytest.approx((3 / 8 + 8 / 8) / 2)
    assert s["block_fill_4"] == pytest.approx(5 / (3 * 16))   # blocks (0,0), (1,0), (1,1)
    assert s["block_fill_32"] == pytest.approx(5 / 1024)

    cols = 2_000_000
    idx = np.arange(0, cols, 7)
    huge = sp.csr_matrix((np.ones(idx.size), idx, [0, idx.size]), shape=(1, cols))
    s = matrix_stats(huge)
    assert s["rows"] == 1 and s["nnz"] == idx.size and s["row_len_cv"] == 0.0
    assert s["col_span_mean"] == pytest.approx((idx[-1] + 1) / cols)
    assert s["block_fill_4"] == pytest.approx(idx.size / (_blocks(huge, 4) * 16))


# ------------------------------------------------------------------------ append and load

def test_round_trip(tmp_path):
    path = tmp_path / "deep" / "logs" / "spmm.jsonl"
    first = _record(time_ms=np.float32(0.5), feat=np.int64(64), stats={"cv": float("nan"), "p": np.float64(2.0)})
    failed = _record(status="compile_error", time_ms=float("inf"), error="boom\nline two", trial=1)
    rec.append(path, first)
    rec.append(path, failed.to_dict())
    text = path.read_text()
    assert text.count("\n") == 2 and "NaN" not in text and "Infinity" not in text
    loaded = rec.load(path)
    assert [r.trial for r in loaded] == [0, 1]
    assert loaded[0].time_ms == 0.5 and loaded[0].feat == 64 and loaded[0].stats == {"cv": None, "p": 2.0}
    assert loaded[1].time_ms is None and loaded[1].error == "boom\nline two"
    assert loaded[1] == failed and loaded[0] == rec.Record.from_dict(first.to_dict())
    assert rec.load(tmp_path / "missing.jsonl") == []


def test_unknown_keys_survive(tmp_path):
    path = tmp_path / "log.jsonl"
    line = json.loads(rec.to_json_line(_record()))
    line["future_field"] = {"x": 1}
    path.write_text(json.dumps(line) + "\n")
    (loaded,) = rec.load(path)
    assert loaded.extra == {"future_field": {"x": 1}}
    assert json.loads(rec.to_json_line(loaded)) == line


def _append_many(path, worker, count):
    for i in range(count):
        rec.append(path, _record(trial=i, matrix=f"w{worker}", error="x" * (worker * 3000)))


def test_concurrent_appends(tmp_path):
    path = str(tmp_path / "log.jsonl")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(path, w, 50)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    with open(path) as f:
        lines = f.read().splitlines()
    assert len(lines) == 200
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = rec.load(path)
    assert len(loaded) == 200
    for w in range(4):
        assert sorted(r.trial for r in loaded if r.matrix == f"w{w}") == list(range(50))


def test_truncated_last_line(tmp_path):
    path = tmp_path / "log.jsonl"
    for i in range(3):
        rec.append(path, _record(trial=i))
    with open(path, "a") as f:
        f.write(rec.to_json_line(_record(trial=3))[:40])  # a writer killed mid-line
    with pytest.warns(rec.TuningLogWarning, match=r"log\.jsonl:4: skipping truncated last line"):
        loaded = rec.load(path)
    assert [r.trial for r in loaded] == [0, 1, 2]
    # the next run appends on a fresh line: the damage stays on line 4
    rec.append(path, _record(trial=4))
    with pytest.warns(rec.TuningLogWarning, match=r"log\.jsonl:4: skipping corrupt line"):
        loaded = rec.load(path)
    assert [r.trial for r in loaded] == [0, 1, 2, 4]


def test_corrupt_middle_lines(tmp_path):
    path = tmp_path / "log.jsonl"
    good = rec.to_json_line(_record())
    path.write_bytes(good.encode() + b"\xff\xfe garbage\n" + b"[1, 2]\n" + b'{"op": "spmm"}\n\n' + good.encode())
    with pytest.warns(rec.TuningLogWarning) as caught:
        loaded = rec.load(path)
    assert len(loaded) == 2
    messages = [str(w.message) for w in caught]
    assert len(messages) == 3 and any(":4:" in m and "'format'" in m for m in messages)


WRITER = """
import sys
from sparsec.tune import records as rec
i = 0
while True:
    rec.append(sys.argv[1], rec.Record(op="spmm", format="bsr:32x32", signature="m-0", target="llvm",
               status="ok", time_ms=1.0 + i, trial=i, error="e" * 20000, versions={}), fsync=False)
    i += 1
"""


def test_killed_writer_leaves_a_readable_log(tmp_path):
    path = tmp_path / "log.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)])
    try:
        deadline = time.time() + 30
        while time.time() < deadline and (not path.exists() or path.stat().st_size < 200_000):
            time.sleep(0.01)
        assert proc.poll() is None, "the writer died on its own"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rec.TuningLogWarning)  # a cut last line is allowed
        loaded = rec.load(path)
    assert len(loaded) >= 5
    assert [r.trial for r in loaded] == list(range(len(loaded)))
    for r in loaded:
        assert r.time_ms == 1.0 + r.trial and r.error == "e" * 20000 and r.format == "bsr:32x32"


# ------------------------------------------------------------------------ best and resume

def test_best_picks_fastest_ok_matching_record():
    rs = [_record(time_ms=3.0, trial=0),
          _record(time_ms=2.0, trial=1, format="csr"),
          _record(time_ms=0.1, trial=2, status="wrong", error="mismatch"),
          _record(time_ms=None, trial=3, status="timeout"),
          _record(time_ms=0.5, trial=4, target="llvm"),
          _record(time_ms=0.5, trial=5, signature="m-ffffffffffffffff"),
          _record(time_ms=0.7, trial=6, feat=32),
          _record(time_ms=1.5, trial=7, dtype="float16")]
    assert rec.best(rs, "spmm", "m-0123456789abcdef", "cuda:sm_90a").trial == 6
    assert rec.best(rs, "spmm", "m-0123456789abcdef", "cuda:sm_90a", feat=64).trial == 7
    assert rec.best(rs, "spmm", "m-0123456789abcdef", "cuda:sm_90a", feat=64, dtype="float32").trial == 1
    assert rec.best(rs, "spmm", "m-0123456789abcdef", "llvm").trial == 4
    assert rec.best(rs, "sddmm", "m-0123456789abcdef", "cuda:sm_90a") is None
    assert rec.best([r.to_dict() for r in rs], "spmm", "m-0123456789abcdef", "llvm").trial == 4


def test_candidate_keys_ignore_knob_order():
    a = _record(format_knobs={"a": 1, "b": [1, 2]}, schedule_knobs={"x": {"p": 1, "q": 2}, "y": 3})
    b = _record(format_knobs={"b": (1, 2), "a": 1}, schedule_knobs={"y": 3, "x": {"q": 2, "p": 1}},
                status="crash", time_ms=None)
    assert rec.candidate_key(a) == rec.candidate_key(b)
    assert rec.candidate_key(a) == rec.candidate_key(json.loads(rec.to_json_line(a)))
    candidate = {"op": "spmm", "format": "hyb", "format_knobs": {"b": [1, 2], "a": 1},
                 "schedule_knobs": {"y": 3, "x": {"p": 1, "q": 2}}, "feat": 64,
                 "signature": "m-0123456789abcdef", "target": "cuda:sm_90a"}
    keys = rec.done_keys([a, b])
    assert len(keys) == 1 and rec.candidate_key(candidate) in keys
    assert rec.candidate_key(dict(candidate, schedule_knobs={"y": 4})) not in keys
    assert rec.done_keys([a, b], statuses=["crash"]) == keys
    assert rec.done_keys([a, b], statuses=["timeout"]) == set()
    hash(rec.candidate_key(a))
    json.dumps(rec.candidate_key(a))


def test_default_log_path(tmp_path):
    assert rec.default_log_path("spmm", "cuda:sm_90a") == os.path.join("tuning_logs", "spmm_cuda_sm_90a.jsonl")
    assert rec.default_log_path("sddmm", "llvm", root=tmp_path) == str(tmp_path / "tuning_logs" / "sddmm_llvm.jsonl")


# ------------------------------------------------------------------------ bad input

@pytest.mark.parametrize("field", rec.REQUIRED)
def test_missing_required_field(field):
    d = _record().to_dict()
    del d[field]
    with pytest.raises(ValueError, match=f"'{field}'"):
        rec.Record.from_dict(d)
    with pytest.raises(ValueError, match=f"'{field}'"):
        _record(**{field: None})


def test_bad_values():
    with pytest.raises(ValueError, match="'status'.*ok, compile_error"):
        _record(status="fast")
    with pytest.raises(ValueError, match="'time_ms'"):
        _record(status="ok", time_ms=float("nan"))
    with pytest.raises(ValueError, match="'time_ms'"):
        _record(time_ms=-1.0)
    with pytest.raises(ValueError, match="'feat'"):
        _record(feat=0)
    with pytest.raises(ValueError, match="'schedule_knobs'"):
        _record(schedule_knobs=[("unroll", 2)])
    with pytest.raises(ValueError, match="keys must be strings"):
        _record(format_knobs={1: 2})
    with pytest.raises(ValueError, match="not JSON data"):
        _record(stats={"obj": object()})
    with pytest.raises(ValueError, match="JSON object"):
        rec.Record.from_dict([1, 2])
    with pytest.raises(ValueError, match="'target'"):
        rec.candidate_key({"op": "spmm", "format": "csr", "signature": "m-0"})


def test_stats_leave_the_matrix_untouched():
    """Block counting coarsens the pattern; with rows a multiple of the block size it once
    rewrote the caller's indptr through a view."""
    rng = np.random.default_rng(11)
    m = sp.random(64, 48, 0.2, format="csr", random_state=rng)
    indptr, indices, data = m.indptr.copy(), m.indices.copy(), m.data.copy()
    matrix_stats(m)
    assert np.array_equal(m.indptr, indptr) and np.array_equal(m.indices, indices) and np.array_equal(m.data, data)


def test_trusted_records_read_as_checked_ones_and_refuse_what_a_pick_needs():
    """``Record.trusted`` (a saved model's top records, read on every process's first pick)
    builds the same record as ``from_dict`` from the fields a pick reads, with its own
    dicts; a required field missing or empty, or an ok record without a time, is refused."""
    fields = ("op", "format", "format_knobs", "schedule_knobs", "feat", "dtype", "signature", "target",
              "time_ms", "status", "timestamp", "trial")
    d = {k: v for k, v in _record().to_dict().items() if k in fields}
    fast, checked = rec.Record.trusted(d), rec.Record.from_dict(d)
    assert fast == checked and fast.versions == {} and fast.extra == {}
    fast.schedule_knobs["unroll"] = 99
    assert d["schedule_knobs"].get("unroll") != 99  # not the saved dict itself
    for field in rec.REQUIRED:
        with pytest.raises(ValueError, match=field):
            rec.Record.trusted({k: v for k, v in d.items() if k != field})
    with pytest.raises(ValueError, match="time_ms"):
        rec.Record.trusted({**d, "status": "ok", "time_ms": None})
    for bad in (float("inf"), float("nan"), True):
        with pytest.raises(ValueError, match="time_ms"):
            rec.Record.trusted({**d, "status": "ok", "time_ms": bad})
    with pytest.raises(ValueError, match="'status'"):
        rec.Record.trusted({**d, "status": "fast"})
    with pytest.raises(ValueError, match="JSON object"):
        rec.Record.trusted([1, 2])
