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
    """A CUDA --check that cannot run (no GPU) says so and exits 3; JSON says checked: false."""
    code = cli.main(["run", "spmm", "--format", "ell", "--random", SMALL, "--feat", "16", "--target", "cuda:sm_90a",
                     "--check", "--json"])
    out, err = capsys.readouterr()
    r = json.loads(out)
    assert r["target"] == "cuda:sm_90a" and r["compile_s"] > 0 and r["knobs"]
    if not r["ran"]:  # no GPU here
        assert code == 3 and "check not run" in err and "no GPU" in err
        assert r["run_ms"] is None and r["max_rel_err"] is None and r["checked"] is False
        assert cli.main(["run", "spmm", "--format", "ell", "--random", SMALL, "--feat", "16",
                         "--target", "cuda:sm_90a", "--check"]) == 3
        assert "NOT RUN" in capsys.readouterr().out
        # without --check there is nothing to report: compiling only is a success
        assert cli.main(["run", "spmm", "--format", "ell", "--random", SMALL, "--feat", "16",
                         "--target", "cuda:sm_90a"]) == 0
    else:
        assert code == 0 and r["max_rel_err"] < 1e-5 and r["checked"] is True


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


# ---- new formats and knobs: hyb, nm, srbcrs, bsr+csr ---------------------------------------------
MID = "2000,1500,0.01"
NEW_FORMATS = {
    "hyb": ["--format", "hyb"],
    "hyb-4": ["--format", "hyb", "--col-parts", "4", "--buckets", "1,2,4,8,16,32"],
    "nm-2:4": ["--format", "nm", "--n", "2", "--m", "4"],
    "nm-1:8": ["--format", "nm", "--n", "1", "--m", "8"],
    "srbcrs-int8": ["--format", "srbcrs", "--vec", "8", "--dtype", "int8"],
    "srbcrs-int4": ["--format", "srbcrs", "--vec", "8", "--dtype", "int4"],
    "bsr+csr": ["--format", "bsr+csr", "--block", "4x4", "--block-fill", "0.3"],
}


def test_issue_hyb_command(capsys):
    """The issue's literal command (automatic col_parts and buckets)."""
    r = run_json(capsys, "spmm", "--format", "hyb", "--random", "20000,20000,0.001", "--feat", "64",
                 "--target", "llvm", "--check")
    assert (r["rows"], r["cols"], r["nnz"]) == (20000, 20000, 400000)
    assert r["format"].startswith("hyb:") and r["parts"] >= 1 and r["max_rel_err"] < 1e-5
    assert 1.0 <= r["padding_ratio"] < 2.0 and r["stored"] >= r["nnz"] and r["bytes"] > 0


@pytest.mark.parametrize("op", ["spmm", "sddmm"])
@pytest.mark.parametrize("name", list(NEW_FORMATS))
def test_issue_new_formats(capsys, op, name):
    r = run_json(capsys, op, *NEW_FORMATS[name], "--random", MID, "--feat", "32", "--target", "llvm", "--check")
    for key in ("parts", "stored", "padding_ratio", "bytes", "pruned", "quantized", "max_abs_err"):
        assert key in r
    family = NEW_FORMATS[name][1]
    assert r["format"].startswith(family + ":") and (r["rows"], r["cols"]) == (2000, 1500)
    assert r["stored"] >= r["nnz"] > 0 and r["padding_ratio"] == pytest.approx(r["stored"] / r["nnz"])
    assert r["bytes"] > 0 and r["parts"] >= 1
    assert r["pruned"] is (family == "nm")
    if name.startswith("srbcrs"):
        assert r["exact"] is True and r["dtype"] == name.split("-")[1]
        assert r["max_abs_err"] == 0.0 and r["max_rel_err"] == 0.0 and r["tolerance"] == 0.0
        assert r["quantized"] is True and r["scale"] > 0
    else:
        assert r["exact"] is False and r["max_rel_err"] < 1e-5 and r["quantized"] is False
    if name == "hyb-4":
        assert "col_parts=4" in r["format"] and "buckets=1/2/4/8/16/32" in r["format"] and r["parts"] > 1
    if family == "nm":
        n, m = (int(x) for x in name.split("-")[1].split(":"))
        assert r["stored"] == 2000 * -(-1500 // m) * n and r["nnz"] <= r["source_nnz"] == 30000


def test_nm_pruning_matches_prune():
    """Pruning the stored entries (no dense mask: large matrices) is formats.nm.prune's rule."""
    from sparsec.formats import nm
    from sparsec import workload

    for vec, (n, m) in ((1, (2, 4)), (1, (1, 8)), (4, (2, 4)), (2, (3, 8))):
        a = sp.random(61, 53, 0.3, format="csr", dtype=np.float32, random_state=np.random.default_rng(vec + n))
        a.data[::7] *= -1
        keep, c = nm.stored_keep_mask(a, n, m, vec)
        _, mask = nm.prune(a, n=n, m=m, vec=vec)
        rows = np.repeat(np.arange(61), np.diff(c.indptr))
        np.testing.assert_array_equal(keep, mask[rows, c.indices])
        pruned, src = workload.prune_nm(a, {"n": n, "m": m, "vec": vec})
        assert src == a.nnz and pruned.nnz == keep.sum()
        assert (pruned != sp.csr_matrix(np.where(mask, a.toarray(), 0))).nnz == 0
        nm.from_matrix(pruned, n=n, m=m, vec=vec)  # really N:M


def test_nm_summary_says_pruned(capsys):
    assert cli.main(["run", "spmm", "--format", "nm", "--n", "2", "--m", "4", "--vec", "4", "--random", SMALL,
                     "--feat", "8", "--check"]) == 0
    out = capsys.readouterr().out
    assert "pruned by magnitude" in out and "nm:2,4,4" in out and "ok" in out


def test_integer_exact_and_already_integer_matrix(capsys, tmp_path):
    # integer values in range are used as they are (no quantization)
    m = sp.random(90, 70, 0.1, format="csr", dtype=np.float64, random_state=4)
    m.data = np.rint(m.data * 14 - 7)
    path = tmp_path / "q.npz"
    sp.save_npz(path, m)
    for dt in ("int8", "int4"):
        r = run_json(capsys, "sddmm", "--format", "srbcrs", "--vec", "4", "--dtype", dt, "--matrix", str(path),
                     "--feat", "8", "--check")
        assert r["quantized"] is False and r["scale"] is None and r["nnz"] == m.nnz
        assert r["max_abs_err"] == 0.0 and r["max_rel_err"] == 0.0
    assert cli.main(["run", "spmm", "--format", "srbcrs:v2,int8", "--random", SMALL, "--feat", "8", "--check"]) == 0
    out = capsys.readouterr().out
    assert "quantized to int8" in out and "max_abs_err 0" in out and "(exact) ok" in out


def test_integer_mismatch_fails(capsys, monkeypatch):
    """Integer kernels must match exactly: an off-by-one reference fails the check (exit 1)."""
    from sparsec import reference

    real = reference.REFERENCES["spmm"]
    monkeypatch.setitem(reference.REFERENCES, "spmm", lambda A, B: real(A, B) + (np.arange(B.shape[1]) == 0))
    code = cli.main(["run", "spmm", "--format", "srbcrs", "--vec", "8", "--dtype", "int8", "--random", SMALL,
                     "--feat", "8", "--check", "--json"])
    out, err = capsys.readouterr()
    assert code == 1 and "exact" in err
    r = json.loads(out)
    assert r["max_abs_err"] == 1.0 and 0 < r["max_rel_err"] < 1e-2  # within a float tolerance, still a failure


def test_new_format_errors(capsys):
    base = ["--random", SMALL, "--feat", "8"]
    for fmt in (["--format", "csr"], ["--format", "hyb"], ["--format", "nm", "--n", "2", "--m", "4"]):
        for dt in ("int8", "int4"):
            fails(capsys, ["run", "spmm", *fmt, "--dtype", dt, *base], "integer kernels need --format srbcrs")
    fails(capsys, ["build", "spmm", "--format", "bsr+csr", "--dtype", "int8", "--emit-source"], "--format srbcrs")
    fails(capsys, ["run", "spmm", "--format", "srbcrs", "--vec", "8", *base], "srbcrs needs --dtype int8, int4")
    fails(capsys, ["run", "spmm", "--format", "srbcrs", "--vec", "8", "--dtype", "float32", *base], "srbcrs needs")
    fails(capsys, ["run", "spmm", "--format", "srbcrs:v8,int8", "--dtype", "int4", *base], "contradicts")
    fails(capsys, ["run", "spmm", "--format", "srbcrs", "--vec", "3", "--dtype", "int8", *base], "vec (V)")
    fails(capsys, ["run", "spmm", "--format", "nm", "--n", "2", *base], "nm needs --n N and --m M")
    fails(capsys, ["run", "spmm", "--format", "nm", "--n", "4", "--m", "4", *base], "1 <= N < M")
    fails(capsys, ["run", "spmm", "--format", "csr", "--n", "2", *base], "--n does not apply to format csr")
    fails(capsys, ["run", "spmm", "--format", "ell", "--col-parts", "2", *base], "--col-parts does not apply")
    fails(capsys, ["run", "spmm", "--format", "hyb", "--block-fill", "0.5", *base], "--block-fill does not apply")
    fails(capsys, ["run", "spmm", "--format", "hyb", "--block", "2x2", *base], "--block does not apply")
    fails(capsys, ["run", "spmm", "--format", "csr", "--vec", "2", *base], "--vec does not apply")
    assert cli.main(["run", "spmm", "--format", "hyb", "--buckets", "1,3", *base]) == 2  # argparse
    assert "powers of two" in capsys.readouterr().err
    assert cli.main(["run", "spmm", "--format", "bsr+csr", "--block-fill", "-1", *base]) == 2
    fails(capsys, ["formats", "--random", SMALL], "needs --describe")


def test_build_new_formats(capsys, tmp_path):
    # fully given knobs: no matrix needed
    assert cli.main(["build", "spmm", "--format", "nm", "--n", "2", "--m", "4", "--feat", "16", "--emit-source"]) == 0
    assert "define" in capsys.readouterr().out
    path = tmp_path / "k.so"
    assert cli.main(["build", "sddmm", "--format", "srbcrs", "--vec", "4", "--dtype", "int4", "--feat", "16",
                     "-o", str(path)]) == 0
    assert path.stat().st_size > 0 and "srbcrs:4,int4" in capsys.readouterr().out
    # automatic hyb knobs come from a matrix (quantization/pruning as in run)
    assert cli.main(["build", "spmm", "--format", "hyb", "--random", SMALL, "--feat", "16", "--emit-source"]) == 0
    assert "define" in capsys.readouterr().out
    assert cli.main(["build", "spmm", "--format", "nm", "--n", "1", "--m", "8", "--random", SMALL, "--feat", "16",
                     "--emit-source"]) == 0
    capsys.readouterr()


# ---- formats --describe ------------------------------------------------------------------------
DESCRIBE_KNOBS = {
    "csr": [], "bsr": ["--block", "3x5"], "ell": [], "nm": ["--n", "2", "--m", "4"],
    "srbcrs": ["--vec", "4", "--dtype", "int8"], "rell": [], "hyb": ["--col-parts", "2"],
    "bsr+csr": ["--block", "4x4", "--block-fill", "0.25"],
}


@pytest.mark.parametrize("family", list(DESCRIBE_KNOBS))
def test_formats_describe_family(capsys, family):
    assert cli.main(["formats", "--describe", family]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"family    {family}:") and "knobs" in out and "values" in out
    assert "DenseFixed" in out or "SparseFixed" in out
    assert cli.main(["formats", "--describe", family, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["name"] == family and d["description"] and d["parts"]
    for part in d["parts"]:
        assert part["axes"] and {"name", "kind", "dim", "scale", "flags"} <= set(part["axes"][0])
        assert set(part["value_layout"]) == {"chunk", "bits"}
    assert d["composite"] is (family in ("hyb", "bsr+csr"))
    if DESCRIBE_KNOBS[family] and family != "hyb":
        assert cli.main(["formats", "--describe", family, *DESCRIBE_KNOBS[family], "--json"]) == 0
        d = json.loads(capsys.readouterr().out)
        assert d["example"] is False


@pytest.mark.parametrize("family", [f for f in DESCRIBE_KNOBS if f != "rell"])
def test_formats_describe_matrix(capsys, family):
    argv = ["formats", "--describe", family, *DESCRIBE_KNOBS[family], "--random", SMALL]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "stored" in out and "padding" in out and "bytes" in out and "parts" in out and "converted" in out
    assert cli.main(argv + ["--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["shape"] == [300, 200] and d["family"] == family and d["bytes"] > 0
    assert d["padding_ratio"] == pytest.approx(d["stored"] / d["nnz"])
    assert sum(p["stored"] for p in d["parts"]) == d["stored"] and sum(p["nnz"] for p in d["parts"]) == d["nnz"]
    assert d["pruned"] is (family == "nm") and d["quantized"] is (family == "srbcrs")
    if family == "hyb":
        assert "col_parts=2" in d["format"] and len(d["parts"]) > 1


def test_formats_list_json(capsys):
    assert cli.main(["formats", "--json"]) == 0
    names = [f["name"] for f in json.loads(capsys.readouterr().out)]
    assert names == ["csr", "bsr", "ell", "nm", "srbcrs", "rell", "hyb", "bsr+csr", "mma_sp", "nm_tc", "tiled"]


@pytest.mark.parametrize("op", ["spmm", "sddmm"])
def test_bsr_csr_two_parts(capsys, tmp_path, op):
    """A matrix with dense 4x4 blocks and scattered entries splits into a BSR and a CSR part."""
    rng = np.random.default_rng(5)
    m = sp.random(400, 300, 0.005, format="lil", dtype=np.float32, random_state=rng)
    for br, bc in zip(rng.integers(0, 100, 40), rng.integers(0, 75, 40)):
        m[4 * br:4 * br + 4, 4 * bc:4 * bc + 4] = rng.standard_normal((4, 4))
    path = tmp_path / "blocks.npz"
    sp.save_npz(path, m.tocsr())
    r = run_json(capsys, op, "--format", "bsr+csr", "--block", "4x4", "--block-fill", "0.3", "--matrix", str(path),
                 "--feat", "16", "--check")
    assert r["parts"] == 2 and r["format"].endswith("[bsr:4x4+csr]") and r["max_rel_err"] < 1e-5


def test_run_format_auto_takes_the_tuning_logs_pick_and_says_whose(capsys):
    """--format auto: on llvm (no tuning log) the rule-based default format, checked; on
    cuda:sm_90a the shipped log's model picks format, format knobs and schedule knobs (the
    power grid is not a logged matrix), compiled without a GPU; the pick's knobs are the
    kernel's. Format knob options are refused with it, by name."""
    from sparsec.formats.choose import default_format, row_stats

    r = run_json(capsys, "spmm", "--format", "auto", "--feat", "64", "--target", "llvm", "--check")
    assert r["format_source"] == "default" and r["max_rel_err"] < 1e-5
    assert r["format"].split(":")[0] == default_format("spmm", row_stats(datasets.default_matrix()), 64)
    code = cli.main(["run", "spmm", "--format", "auto", "--feat", "32", "--target", "cuda:sm_90a", "--json"])
    r = json.loads(capsys.readouterr().out)
    assert code == 0 and r["format_source"] == "model" and r["knobs_source"] == "model"
    from sparsec.tune.apply import tuned_config

    cand, source = tuned_config("spmm", datasets.default_matrix(), 32, "cuda:sm_90a")
    assert source == "model" and r["format"].startswith(cand["format"])
    assert {k: r["knobs"][k] for k in cand["schedule_knobs"]} == cand["schedule_knobs"]
    for flag in (["--block", "4x4"], ["--width", "8"], ["--col-parts", "2"]):
        fails(capsys, ["run", "spmm", "--format", "auto", *flag], f"{flag[0]} does not apply to --format auto")
    fails(capsys, ["run", "attention", "--format", "auto"],
          "--format auto picks formats for spmm and sddmm (the operators the tuner measures); name a format for "
          "attention")
    fails(capsys, ["run", "spmm", "--format", "auto", "--dtype", "int8"],
          "--format auto picks among float formats (float32, float64, float16); for --dtype int8 name a format")
