"""Benchmark scripts imported as modules by the tests, the way they run: their folder first on
sys.path (for ``_preamble`` and sibling helpers), sys.path and the environment restored after
(a preamble sets SPARSEC_DATA_DIR)."""
import importlib.util
import os
import sys
from pathlib import Path


def load_script(path: Path, module_name: str):
    saved_path, saved_env = list(sys.path), dict(os.environ)
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved_path
        os.environ.clear()
        os.environ.update(saved_env)
    return module
