"""Benchmark scripts imported as modules by the tests, the way they run: their folder and the
checkout root first on sys.path (for ``_preamble``, sibling helpers and the ``tests`` operators
they import -- the root too, since a preamble already imported puts nothing there again), then
sys.path and the environment restored (a preamble sets SPARSEC_DATA_DIR), so no test's imports
depend on which script another test loaded first."""
import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_script(path: Path, module_name: str):
    saved_path, saved_env = list(sys.path), dict(os.environ)
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.path[:0] = [str(path.parent), str(ROOT)]
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved_path
        os.environ.clear()
        os.environ.update(saved_env)
    return module
