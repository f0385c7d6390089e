"""Imports flow one way and through one root.

* The layers tool (``../shared/tools/layers.py``, beside the checkout as CI clones it) finds no
  cycle, no upward import and no import of the package root, with the layer table of
  pyproject's ``[tool.sparsec.layers]``. ``SPARSEC_LAYERS_TOOL`` names the tool elsewhere.
* Nothing imports the top-level ``formats`` / ``schedules`` folders by their bare names: they
  are ``sparsec.formats`` / ``sparsec.schedules`` everywhere (library, tests, benchmarks,
  examples), so that an installed sparsec behaves as the checkout does.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BARE_IMPORT = re.compile(r"^\s*(from|import)\s+(formats|schedules)\b", re.MULTILINE)
SEARCHED = ("sparsec", "formats", "schedules", "tests", "benchmarks", "examples")


def layers_tool() -> Path:
    path = Path(os.environ.get("SPARSEC_LAYERS_TOOL") or ROOT.parent / "shared" / "tools" / "layers.py")
    if not path.is_file():
        pytest.fail(f"the import-layer checker is missing: no {path} (CI clones the repository with shared/ "
                    "beside it; elsewhere set SPARSEC_LAYERS_TOOL to the path of layers.py)")
    return path


needs_tomllib = pytest.mark.skipif(sys.version_info < (3, 11), reason="the checker reads pyproject's layer table "
                                   "with tomllib (Python 3.11+); without it, it checks its own default table")


@needs_tomllib
def test_the_layer_checker_finds_no_cycle_and_no_upward_import():
    res = subprocess.run([sys.executable, str(layers_tool()), str(ROOT)], capture_output=True, text=True)
    last = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
    assert res.returncode == 0 and last.endswith(" 0 problem(s)"), f"{res.stdout}\n{res.stderr}"


@needs_tomllib
def test_the_layer_table_is_read_from_pyproject():
    """The checker falls back to its own table without one (or without tomllib): make sure
    it checks ours, and that every layer the issue orders is there, top to bottom."""
    import tomllib

    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["sparsec"]["layers"]
    assert list(table) == ["cli", "apps", "tune", "build", "runtime", "lower", "schedules", "ir", "leaves"]
    assert "sparsec.cli" in table["cli"] and "sparsec.api" in table["apps"]


def test_formats_and_schedules_are_imported_only_through_sparsec():
    found = []
    for top in SEARCHED:
        for f in sorted((ROOT / top).rglob("*.py")):
            if ".venv" in f.parts:
                continue
            for m in BARE_IMPORT.finditer(f.read_text()):
                line = f.read_text().count("\n", 0, m.start()) + 1
                found.append(f"{f.relative_to(ROOT)}:{line}: {m.group(0).strip()}")
    assert not found, "bare imports of the top-level folders (use sparsec.formats / sparsec.schedules):\n" + \
        "\n".join(found)


def test_the_bare_import_pattern_catches_every_form():
    for text in ("from formats import nm", "import formats", "    from schedules.cuda import x",
                 "\timport schedules as s"):
        assert BARE_IMPORT.search(text), text
    for text in ("from sparsec.formats import nm", "from . import formats", "import formats_extra",
                 "x = 'from formats'"):
        assert not BARE_IMPORT.search(text), text
