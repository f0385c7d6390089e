"""What the CLI does with bad input, as a new user meets it: matrix files that are not
matrices (exit 2 naming the file and what it is), the same acceptance as the API, JSON
without "inf" strings, --plot refused up front, and start-up without the compiler."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

import sparsec
from sparsec import cli, datasets
from sparsec.cli.common import dumps, jsonable

ARGS = ["--format", "csr", "--feat", "4", "--target", "llvm"]


def _fails(capsys, argv, *texts):
    code = cli.main(argv)
    _, err = capsys.readouterr()
    assert code == 2, err
    assert "Traceback" not in err and "sparsec: error:" in err, err
    for t in texts:
        assert t in err, err
    return err


def _short_indptr(path):
    """A save_npz layout whose indptr ends before the stored entries (scipy trims them)."""
    np.savez(path, data=np.ones(3, np.float32), indices=np.array([0, 1, 2], np.int32),
             indptr=np.array([0, 1, 2], np.int32), format=np.array(b"csr"), shape=np.array([2, 3]))


BAD_FILES = {
    "empty.npz": (lambda p: p.write_bytes(b""), "is empty (0 bytes)"),
    "array.npy": (lambda p: np.save(p, np.eye(3)), "is a .npy array"),
    "garbage.npz": (lambda p: p.write_bytes(b"definitely not a zip archive"), "is not a .npz file"),
    "arrays.npz": (lambda p: np.savez(p, a=np.ones(3)), "is a .npz of arrays ['a']"),
    "folder.npz": (lambda p: p.mkdir(), "is a directory"),
    "missing.npz": (lambda p: None, "does not exist"),
    "short.npz": (_short_indptr, "indptr should end at nnz"),
}


@pytest.mark.parametrize("name", list(BAD_FILES))
@pytest.mark.parametrize("command", ["run", "formats", "tune"])
def test_bad_matrix_files_exit_2_naming_the_file(capsys, tmp_path, name, command):
    make, what = BAD_FILES[name]
    path = tmp_path / name
    make(path)
    if command == "run":
        argv = ["run", "spmm", *ARGS, "--matrix", str(path)]
    elif command == "formats":
        argv = ["formats", "--describe", "csr", "--matrix", str(path)]
    else:
        argv = ["tune", "spmm", "--matrix", str(path), "--target", "llvm", "--trials", "1"]
    _fails(capsys, argv, str(path), what)


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.bool_])
def test_cli_and_api_refuse_integer_matrices_alike(capsys, tmp_path, dtype):
    m = sp.random(30, 20, 0.2, format="csr", random_state=0)
    m.data[:] = 1
    m = m.astype(dtype)
    path = tmp_path / "m.npz"
    sp.save_npz(path, m)
    with pytest.raises(TypeError) as api:
        sparsec.formats.convert(sp.load_npz(path), "csr")
    err = _fails(capsys, ["run", "spmm", *ARGS, "--matrix", str(path)], str(path), np.dtype(dtype).name)
    assert str(api.value) in err


def test_cli_and_api_refuse_a_short_indptr_alike(capsys, tmp_path):
    path = tmp_path / "short.npz"
    _short_indptr(path)
    with np.load(path) as z:
        raw = (z["data"], z["indices"], z["indptr"])
    with pytest.raises(ValueError, match="indptr should end at nnz"):
        sparsec.formats.convert(raw, "csr", shape=(2, 3))
    with pytest.raises(ValueError, match="indptr should end at nnz"):
        datasets.load_npz(path)


def test_good_files_load_as_before(tmp_path):
    m = sp.random(40, 30, 0.1, format="csc", dtype=np.float64, random_state=1)
    path = tmp_path / "m.npz"
    sp.save_npz(path, m)
    got = datasets.load_npz(path)
    assert got.format == "csr" and got.dtype == np.float64 and (got != m).nnz == 0
    assert datasets.default_matrix().dtype == np.float32


def test_json_numbers_are_numbers_or_null(capsys, monkeypatch):
    assert jsonable({"a": math.inf, "b": [np.float32("nan"), 1.5, 2], "c": -math.inf, "d": True}) == \
        {"a": None, "b": [None, 1.5, 2], "c": None, "d": True}
    assert json.loads(dumps({"x": float("inf")})) == {"x": None}
    # end to end: an infinite error (a reference that overflows) prints null, never "inf"
    from sparsec import workload

    monkeypatch.setattr(workload, "errors", lambda out, ref, exact: (math.inf, math.inf))
    code = cli.main(["run", "spmm", *ARGS, "--random", "50,40,0.1", "--check", "--json"])
    out, _ = capsys.readouterr()
    assert code == 1
    assert '"inf"' not in out and "Infinity" not in out
    r = json.loads(out)
    assert r["max_rel_err"] is None and r["max_abs_err"] is None


def test_tune_plot_without_matplotlib_is_refused_before_any_work(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    from sparsec.cli import tune as tune_cli

    monkeypatch.setattr(tune_cli, "_cases", lambda args: pytest.fail("work started before --plot was refused"))
    _fails(capsys, ["tune", "spmm", "--random", "50,40,0.1", "--target", "llvm", "--trials", "1",
                    "--plot", str(tmp_path / "p.png")], "--plot", "matplotlib", "sparsec[tune]")
    assert not (tmp_path / "p.png").exists()


def test_matplotlib_in_the_tune_extra():
    import tomllib
    from pathlib import Path

    extras = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    for extra in ("tune", "test"):
        assert any(d.startswith("matplotlib") for d in extras[extra]), extra


def test_tune_random_and_dtype_reach_the_tuner(capsys, monkeypatch):
    """--random ROWS,COLS,DENSITY[,SEED] and --dtype, as in sparsec run."""
    from sparsec.cli import tune as tune_cli

    seen = {}

    def fake_tune_cases(op, cases, **kw):
        seen.update(op=op, cases=cases, **kw)
        raise ValueError("stop here")

    import sparsec.tune.tuner as tuner

    monkeypatch.setattr(tuner, "tune_cases", fake_tune_cases)
    _fails(capsys, ["tune", "sddmm", "--random", "60,50,0.1,7", "--dtype", "float64", "--feat", "8", "16",
                    "--target", "llvm", "--trials", "2"], "stop here")
    assert seen["op"] == "sddmm" and seen["dtype"] == "float64"
    assert [c.feat for c in seen["cases"]] == [8, 16]
    m = seen["cases"][0].matrix
    ref = sp.random(60, 50, 0.1, format="csr", dtype=np.float32, random_state=np.random.default_rng(7))
    assert m.shape == (60, 50) and (m != ref).nnz == 0
    assert seen["cases"][0].name == "random-60x50-0.1-s7"
    assert tune_cli.TUNE_DTYPES == ("float32", "float64", "float16", "int8")  # int8: SR-BCRS on Tensor Cores
    _fails(capsys, ["tune", "spmm", "--random", "60,50", "--target", "llvm"], "--random should be")
    assert cli.main(["tune", "spmm", "--random", "60,50,0.1", "--dtype", "bfloat16"]) == 2  # argparse choices
    assert cli.main(["tune", "spmm", "--random", "6,5,0.1", "--matrix", "x.npz"]) == 2  # one source
    assert "not allowed with" in capsys.readouterr().err
    for opt, text in ((["--formats", "csr,nosuch"], "--formats takes"), (["--size", "huge"], "--size should be")):
        assert cli.main(["tune", "spmm", "--random", "60,50,0.1", *opt]) == 2  # argparse
        assert text in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--help"], ["ops"], ["formats"], ["formats", "--describe", "nm"]])
def test_listing_commands_do_not_load_the_compiler(argv):
    """sparsec --help / ops / formats start without TVM or torch (start-up <= 1 s)."""
    code = ("import sys, contextlib, io\nfrom sparsec.cli import main\n"
            f"with contextlib.redirect_stdout(io.StringIO()):\n    rc = main({argv!r})\n"
            "print(rc, sorted(m for m in ('tvm', 'torch', 'tvm_ffi') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split("\n")[-2] == "0 []", out.stdout + out.stderr


def test_inspect_reads_a_module_without_tvm(tmp_path):
    path = tmp_path / "k.so"
    assert cli.main(["build", "spmm", "--format", "csr", "--feat", "4", "-o", str(path)]) == 0
    code = ("import sys\nfrom sparsec.cli import main\n"
            f"rc = main(['inspect', {str(path)!r}, '--json'])\n"
            "print(rc, sorted(m for m in ('tvm', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    lines = out.stdout.strip().split("\n")
    assert lines[-1] == "0 []" and '"op": "spmm"' in out.stdout


def test_package_root_is_lazy():
    code = ("import sys, sparsec; print(sparsec.__version__, 'tvm' in sys.modules, 'torch' in sys.modules); "
            "from sparsec._version import __version__ as v; assert sparsec.__version__ == v; "
            "assert {'compile', 'load', 'Kernel', 'formats', 'ops'} <= set(dir(sparsec)); "
            "sparsec.formats; print('tvm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == [sparsec.__version__, "False", "False", "False"]
    with pytest.raises(AttributeError, match="nosuch"):
        sparsec.nosuch  # noqa: B018
    assert sparsec.Kernel.__name__ == "Kernel" and callable(sparsec.compile) and callable(sparsec.load)


def test_python_m_sparsec_cli():
    res = subprocess.run([sys.executable, "-m", "sparsec.cli", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0 and "exit status: 0 ok, 1 a --check failed" in res.stdout
