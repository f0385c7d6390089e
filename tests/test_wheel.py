"""The wheel works installed: built from the checkout, installed non-editable into a fresh
venv, and used from outside the checkout (tests/installed_check.py: every module imports
under ``sparsec``, every format family converts and compiles on the CPU, N:M Tensor Core
pruning, export and load). Tests run against the editable install, which maps the
top-level formats/ and schedules/ folders in, so a bare ``import formats`` there would go
unnoticed; this is where it would fail.

The fresh venv takes the dependencies (TVM, numpy, scipy, torch, ...) from the running
interpreter's site-packages through a ``.pth`` file: plain path lines, so the ``.pth`` files
in those folders (the editable sparsec's finder) are not run there.
"""
from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# what the wheel is built from (pyproject's package-dir); copied so the build writes nothing
# into the checkout
SOURCES = ("pyproject.toml", "README.md", "sparsec", "formats", "schedules", "tuning_logs")


def _setuptools_ok() -> bool:
    """Whether this interpreter's setuptools builds the wheel (pyproject asks for >= 68):
    then no build isolation, no download."""
    try:
        major = int(metadata.version("setuptools").split(".")[0])
    except (metadata.PackageNotFoundError, ValueError):
        return False
    return major >= 68


def _run(cmd, **kw):
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert res.returncode == 0, f"{' '.join(map(str, cmd))} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
    return res


def _clean_env():
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env["PYTHONNOUSERSITE"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


@pytest.mark.slow
def test_the_installed_wheel_works_outside_the_checkout(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        p = ROOT / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
        else:
            shutil.copy2(p, src / name)
    env = _clean_env()
    wheels = tmp_path / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(src)]
    if _setuptools_ok():
        build.insert(5, "--no-build-isolation")
    _run(build, cwd=tmp_path, env=env)
    (wheel,) = wheels.glob("sparsec-*.whl")

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], env=env)
    python = venv / "bin" / "python"
    purelib = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        env=env).stdout.strip())
    # this interpreter's pip installs the files (a venv made without pip starts in a second)
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(purelib),
          str(wheel)], cwd=tmp_path, env=env)
    deps = [p for p in [*site.getsitepackages(), sysconfig.get_paths()["purelib"]] if os.path.isdir(p)]
    (purelib / "_running_interpreter_deps.pth").write_text("".join(f"{p}\n" for p in dict.fromkeys(deps)))

    work = tmp_path / "elsewhere"
    work.mkdir()
    script = work / "installed_check.py"
    shutil.copy2(ROOT / "tests" / "installed_check.py", script)
    res = _run([str(python), str(script)], cwd=work, env=env, timeout=300)
    assert res.stdout.strip().endswith("installed sparsec ok"), res.stdout
