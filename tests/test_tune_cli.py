"""`sparsec tune` end to end on the CPU (llvm): faults injected into a tuning run are
recorded as failed and the run finishes; a run killed with SIGKILL leaves a log that
loads, and --resume continues it without measuring anything twice; the tuned choice is
then applied by sparsec.compile and compile_tuned."""
import json
import os
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

import sparsec
from sparsec import workload
from sparsec.cli import main
from sparsec.tune import records as R
from sparsec.tune.apply import compile_tuned, tuned_config
from sparsec.tune.apply import model_path, tuned_schedule_knobs
from sparsec.tune.signature import matrix_signature
from sparsec.tune.space import candidate_id

pytest.importorskip("xgboost")

FEAT = 8


def _matrix(seed=0, rows=240, cols=180):
    """Random rows, a few empty ones and one long row."""
    rng = np.random.default_rng(seed)
    m = sp.random(rows, cols, 0.03, format="lil", dtype=np.float32, random_state=rng)
    for r in (0, 9, rows - 1):
        m.rows[r], m.data[r] = [], []
    m[17, :] = rng.standard_normal(cols).astype(np.float32)
    return m.tocsr()


@pytest.fixture
def matrix_file(tmp_path):
    path = tmp_path / "graph.npz"
    sp.save_npz(path, _matrix())
    return str(path)


def _tune_args(matrix, log, *extra):
    return ["tune", "spmm", "--matrix", matrix, "--feat", str(FEAT), "--target", "llvm", "--log", log,
            "--workers", "2", "--timeout", "5", *extra]


def _case_records(log):
    return [r for r in R.load(log) if r.feat == FEAT]


def test_injected_faults_are_recorded_and_the_run_finishes(matrix_file, tmp_path, capsys):
    log = str(tmp_path / "log.jsonl")
    out = str(tmp_path / "res.json")
    rc = main(_tune_args(matrix_file, log, "--trials", "8", "--batch", "4", "--json", out,
                         "--inject-faults", "1:crash,2:hang,3:wrong,5:compile_error"))
    assert rc == 0
    recs = _case_records(log)
    # appended as they finish; numbered in the order they were picked
    assert sorted(r.trial for r in recs) == list(range(8))
    by_trial = {r.trial: r for r in recs}
    status = {t: r.status for t, r in by_trial.items()}
    assert (status[1], status[2], status[3], status[5]) == ("crash", "timeout", "wrong", "compile_error")
    assert all(status[i] == "ok" for i in (0, 4, 6, 7))
    assert by_trial[0].extra["default"] is True  # the untuned default is always picked first
    assert "SIGABRT" in by_trial[1].error and "killed" in by_trial[2].error
    res = json.load(open(out))["cases"][0]
    assert res["failed"] == {"crash": 1, "timeout": 1, "wrong": 1, "compile_error": 1}
    assert res["best_ms"] <= res["default_ms"]
    table = capsys.readouterr().out
    assert "| graph | 8 | 8 |" in table and "crash 1" in table


def test_sigkill_leaves_a_loadable_log_and_resume_continues(matrix_file, tmp_path):
    log = str(tmp_path / "log.jsonl")
    args = _tune_args(matrix_file, log, "--trials", "10", "--batch", "2")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "sparsec.cli", *args], start_new_session=True, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if os.path.exists(log) and sum(1 for _ in open(log, "rb")) >= 3:
                break
            time.sleep(0.05)
        assert proc.poll() is None, f"the run ended before it could be killed: {proc.stderr.read().decode()[-2000:]}"
        os.killpg(proc.pid, signal.SIGKILL)  # the run and its workers, mid-search
    finally:
        proc.wait()
        proc.stderr.close()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", R.TuningLogWarning)  # a line cut by the kill is skipped
        before = _case_records(log)
    assert 3 <= len(before) < 10
    assert main(_tune_args(matrix_file, log, "--trials", "10", "--batch", "2", "--resume")) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", R.TuningLogWarning)
        after = _case_records(log)
    ids = [candidate_id({"op": r.op, "format": r.format, "format_knobs": r.format_knobs,
                         "schedule_knobs": r.schedule_knobs, "feat": r.feat, "dtype": r.dtype}) for r in after]
    assert len(after) == 10 and len(set(ids)) == 10  # continued to the budget, nothing measured twice
    assert [r.to_dict() for r in after[:len(before)]] == [r.to_dict() for r in before]


def test_a_fresh_saved_model_answers_without_the_log_and_a_changed_log_refits_it(matrix_file, tmp_path,
                                                                                monkeypatch):
    """The model the tuner saves carries the log's digest and the top records of each case:
    while the log is unchanged, picks read neither the log nor fit anything, and give what
    the whole log gives; a log changed since (another tuning run, a pulled commit) refits and
    re-saves it."""
    from sparsec.tune import apply
    from sparsec.tune.model import CostModel

    log = str(tmp_path / "spmm_llvm.jsonl")
    assert main(_tune_args(matrix_file, log, "--trials", "8", "--batch", "4")) == 0
    m, other = sp.load_npz(matrix_file), _matrix(seed=5)
    want = [tuned_config("spmm", x, FEAT, "llvm", log=log) for x in (m, other)]
    saved = CostModel.load(model_path(log))
    meta, meta_rows = saved.meta, saved.n_samples
    assert meta["log_sha256"] == apply.log_digest(log) and 0 < len(meta["top_records"]) <= len(R.load(log))

    def no_log(path):
        raise AssertionError(f"read the log {path}")

    with monkeypatch.context() as mp:
        mp.setattr(R, "load", no_log)
        mp.setattr(apply, "fit_log_model", no_log)
        assert [tuned_config("spmm", x, FEAT, "llvm", log=log) for x in (m, other)] == want
    records = R.load(log)
    with open(log, "a") as f:  # a slower duplicate of a logged measurement: a new digest, one more row
        f.write(R.to_json_line({**records[0].to_dict(), "time_ms": 1e3, "trial": 999}))
    assert tuned_config("spmm", m, FEAT, "llvm", log=log) == want[0]  # its best record stands
    assert tuned_config("spmm", other, FEAT, "llvm", log=log)[1] == "model"
    refitted = CostModel.load(model_path(log))
    assert refitted.meta["log_sha256"] == apply.log_digest(log) and refitted.n_samples == meta_rows + 1
    answer = tuned_config("spmm", other, FEAT, "llvm", log=log)
    refitted.meta["top_records"] = [{"op": "spmm"}]  # damaged: the log is read instead, with a warning
    refitted.save(model_path(log))
    with pytest.warns(UserWarning, match="missing the required field.*reading"):
        assert tuned_config("spmm", other, FEAT, "llvm", log=log) == answer


def test_refit_saves_each_logs_model_and_names_a_missing_log(matrix_file, tmp_path, capsys):
    from sparsec.tune import apply, refit
    from sparsec.tune.model import CostModel

    log = str(tmp_path / "spmm_llvm.jsonl")
    assert main(_tune_args(matrix_file, log, "--trials", "8", "--batch", "4")) == 0
    os.remove(model_path(log))
    assert refit.main([log]) == 0 and model_path(log) in capsys.readouterr().out
    assert CostModel.load(model_path(log)).meta["log_sha256"] == apply.log_digest(log)
    with pytest.raises(SystemExit):
        refit.main([str(tmp_path / "none.jsonl")])
    assert "no such log" in capsys.readouterr().err


def test_tuned_choices_are_applied(matrix_file, tmp_path, monkeypatch):
    """The best record for the matrix wins; an unseen matrix gets the model's pick; with no
    log, the default. sparsec.compile(knobs="tuned") takes the record's schedule knobs."""
    logs = tmp_path / "logs"
    log = str(logs / os.path.basename(R.default_log_path("spmm", "llvm")))
    assert main(_tune_args(matrix_file, log, "--trials", "8", "--batch", "4")) == 0
    assert os.path.exists(model_path(log))
    m = sp.load_npz(matrix_file)
    best = R.best(R.load(log), "spmm", matrix_signature(m), "llvm", feat=FEAT)

    cand, source = tuned_config("spmm", m, FEAT, "llvm", log=log)
    assert source == "record" and (cand["format"], cand["schedule_knobs"]) == (best.format, best.schedule_knobs)
    other = _matrix(seed=5)
    assert tuned_config("spmm", other, FEAT, "llvm", log=log)[1] == "model"
    saved_pick = tuned_config("spmm", other, FEAT, "llvm", log=log)[0]
    os.remove(model_path(log))  # no saved model: one is fitted on the log, the same one
    assert tuned_config("spmm", other, FEAT, "llvm", log=log) == (saved_pick, "model")
    with open(model_path(log), "w") as f:  # a model of another sparsec: refitted, with a warning
        json.dump({"format": "sparsec-cost-model", "version": 1, "feature_names": ["old"]}, f)
    with pytest.warns(UserWarning, match="feature names differ.*refitting"):
        assert tuned_config("spmm", other, FEAT, "llvm", log=log) == (saved_pick, "model")
    assert tuned_config("spmm", other, FEAT, "llvm", log=str(tmp_path / "none.jsonl"))[1] == "default"

    monkeypatch.setenv("SPARSEC_TUNING_LOGS", str(logs))
    monkeypatch.chdir(tmp_path)
    tk = compile_tuned("spmm", m, feat=FEAT, target="llvm")
    assert tk.source == "record"
    B = np.random.default_rng(1).standard_normal((m.shape[1], FEAT)).astype(np.float32)
    np.testing.assert_allclose(tk(B), m.astype(np.float64) @ B, rtol=1e-4, atol=1e-4)
    inst, _ = workload.convert(m, best.format, best.format_knobs, "float32")
    assert tuned_schedule_knobs("spmm", inst, FEAT, "llvm", "float32") == best.schedule_knobs
    k = sparsec.compile("spmm", inst, feat=FEAT, target="llvm", knobs="tuned")  # (the CPU template ignores GPU knobs)
    np.testing.assert_allclose(k(inst, B), m.astype(np.float64) @ B, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="knobs should be a dict, 'default', or 'tuned'"):
        sparsec.compile("spmm", "csr", feat=FEAT, target="llvm", knobs="fast")


def test_bad_tune_arguments_are_reported(matrix_file, tmp_path, capsys):
    assert main(["tune", "spmm", "--matrix", str(tmp_path / "missing.npz"), "--target", "llvm"]) == 2
    assert "does not exist" in capsys.readouterr().err  # the message of every matrix file
    assert main(["tune", "spmm", "--matrix", matrix_file, "--formats", "csr,coo"]) == 2
    assert "--formats takes" in capsys.readouterr().err
