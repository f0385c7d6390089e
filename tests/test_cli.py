"""The ``sparsec`` command line: run/build/ops/formats in-process through ``cli.main``, plus
one run of the installed console script."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from sparsec import cli, datasets

SMALL = "300,200,0.02"


def run_json(capsys, *argv):
    code = cli.main(["run", *argv, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    return json.loads(lines[0])


def fails(capsys, argv, text):
    code = cli.main(argv)
    out, err = capsys.readouterr()
    assert code == 2
    assert "Traceback" not in err
    assert text in err, err
    return err


@pytest.mark.parametrize("op", ["spmm", "sddmm"])
@pytest.mark.parametrize("fmt", [["--format", "csr"], ["--format", "bsr", "--block", "3x5"],
                                 ["--format", "bsr:3x5"], ["--format", "ell"], ["--format", "ell", "--width", "16"]])
def test_run_check_json(capsys, op, fmt):
    r = run_json(capsys, op, *fmt, "--random", SMALL, "--feat", "16", "--target", "llvm", "--check")
    for key in ("op", "format", "target", "rows", "cols", "nnz", "feat", "max_rel_err", "compile_s", "run_ms",
                "ran", "stored", "padding_ratio", "knobs", "conversion_s", "device"):
        assert key in r
    assert (r["op"], r["target"], r["rows"], r["cols"], r["feat"]) == (op, "llvm", 300, 200, 16)
    assert r["format"].startswith(fmt[1].split(":")[0])
    assert r["ran"] is True and r["run_ms"] > 0 and r["compile_s"] > 0
    assert r["max_rel_err"] < 1e-5
    assert r["nnz"] == sp.random(300, 200, 0.02, format="csr", random_state=0).nnz
    assert r["stored"] >= r["nnz"] and r["padding_ratio"] >= 1.0


def test_bsr_block_formats(capsys):
    r = run_json(capsys, "spmm", "--format", "bsr", "--block", "3x5", "--random", SMALL, "--feat", "8")
    assert r["format"] == "bsr:3x5" and r["max_rel_err"] is None  # no --check
    r = run_json(capsys, "spmm", "--format", "ell", "--width", "16", "--random", SMALL, "--feat", "8")
    assert r["format"] == "ell:16" and r["stored"] == 300 * 16


@pytest.mark.parametrize("op", ["spmm", "sddmm"])
def test_issue_command(capsys, op):
    r = run_json(capsys, op, "--format", "csr", "--random", "3000,2000,0.01", "--feat", "64", "--target", "llvm",
                 "--check")
    assert (r["rows"], r["cols"], r["feat"]) == (3000, 2000, 64)
    assert r["max_rel_err"] < 1e-5


def test_default_matrix_and_summary(capsys):
    m = datasets.default_matrix()
    assert cli.main(["run", "spmm", "--format", "csr", "--feat", "64", "--target", "llvm", "--check"]) == 0
    out = capsys.readouterr().out
    assert "power_grid" in out and f"nnz {m.nnz}" in out and "max_rel_err" in out and "ok" in out
    r = run_json(capsys, "sddmm", "--format", "csr", "--feat", "8")
    assert (r["rows"], r["cols"], r["nnz"]) == (*m.shape, m.nnz)


def test_matrix_file(capsys, tmp_path):
    m = sp.random(120, 90, 0.05, format="csr", dtype=np.float64, random_state=3)
    path = tmp_path / "m.npz"
    sp.save_npz(path, m)
    r = run_json(capsys, "spmm", "--format", "bsr:4x4", "--matrix", str(path), "--feat", "8", "--check",
                 "--dtype", "float64")
    assert (r["rows"], r["cols"], r["nnz"], r["dtype"]) == (120, 90, m.nnz, "float64")
    assert r["max_rel_err"] < 1e-5


def test_cuda_compiles_without_gpu(capsys):
    r = run_json(capsys, "spmm", "--format", "ell", "--random", SMALL, "--feat", "16", "--target", "cuda:sm_90a",
                 "--check")
    assert r["target"] == "cuda:sm_90a" and r["compile_s"] > 0 and r["knobs"]
    if not r["ran"]:  # no GPU here
        assert r["run_ms"] is None and r["max_rel_err"] is None
    else:
        assert r["max_rel_err"] < 1e-5


def test_build_emit_source_and_output(capsys, tmp_path):
    assert cli.main(["build", "sddmm", "--format", "ell", "--width", "8", "--feat", "16",
                     "--target", "cuda:sm_90a", "--emit-source"]) == 0
    assert "__global__" in capsys.readouterr().out
    path = tmp_path / "spmm.so"
    assert cli.main(["build", "spmm", "--format", "bsr:2x2", "--feat", "16", "-o", str(path)]) == 0
    out = capsys.readouterr().out
    assert path.stat().st_size > 0 and "default" in out and "bsr:2x2" in out and str(path.stat().st_size) in out
    # ell without a width takes it from a matrix
    assert cli.main(["build", "spmm", "--format", "ell", "--random", SMALL, "--feat", "16", "--emit-source"]) == 0
    assert "define" in capsys.readouterr().out


def test_ops_and_formats(capsys):
    assert cli.main(["ops"]) == 0
    out = capsys.readouterr().out
    assert "spmm" in out and "sddmm" in out and "C[i, k] = sum_j A[i, j] * B[j, k]" in out
    assert cli.main(["formats"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("csr", "bsr", "ell")) and "ELLPACK" in out


def test_errors(capsys, tmp_path):
    base = ["--format", "csr", "--random", SMALL, "--feat", "8"]
    fails(capsys, ["run", "spmv", *base], "operator should be one of")
    fails(capsys, ["run", "spmm", "--format", "bsr", "--block", "3y5", "--feat", "8"], "block should be RxC")
    fails(capsys, ["run", "spmm", "--format", "csr", "--block", "2x2", "--feat", "8"], "--block")
    fails(capsys, ["run", "spmm", "--format", "csr", "--matrix", str(tmp_path / "no.npz"), "--feat", "8"],
          "does not exist")
    bad = tmp_path / "bad.npz"
    bad.write_text("not a matrix")
    fails(capsys, ["run", "spmm", "--format", "csr", "--matrix", str(bad), "--feat", "8"], "save_npz")
    for text in ("10,x", "10,10", "10,10,2", "-3,10,0.1"):
        fails(capsys, ["run", "spmm", "--format", "csr", "--random", text, "--feat", "8"], "--random")
    fails(capsys, ["run", "spmm", *base, "--dtype", "int32"], "int32")
    fails(capsys, ["run", "spmm", *base, "--target", "rocm"], "target should be")
    fails(capsys, ["build", "spmm", *base], "-o FILE or --emit-source")
    assert cli.main(["run", "spmm", "--format", "csr", "--feat", "0"]) == 2  # argparse: --feat must be positive
    assert cli.main(["frobnicate"]) == 2
    assert "usage" in capsys.readouterr().err
    for argv in (["--debug", "run", "spmv", *base], ["run", "spmv", *base, "--debug"]):
        with pytest.raises(ValueError):
            cli.main(argv)


def test_console_script():
    exe = shutil.which("sparsec")
    cmd = [exe] if exe else [sys.executable, "-m", "sparsec.cli"]
    res = subprocess.run(cmd + ["run", "spmm", "--format", "csr", "--random", "3000,2000,0.01", "--feat", "64",
                                "--target", "llvm", "--check", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    assert r["op"] == "spmm" and r["max_rel_err"] < 1e-5
    res = subprocess.run(cmd + ["run", "spmm", "--format", "csr", "--random", "bad", "--feat", "8"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and res.stderr.startswith("sparsec: error:") and "Traceback" not in res.stderr
