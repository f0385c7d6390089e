"""For the scripts of benchmarks/data run directly: the one preamble, ``benchmarks/_preamble.py``."""
import runpy
from pathlib import Path

_shared = runpy.run_path(str(Path(__file__).resolve().parents[1] / "_preamble.py"))
BENCHMARKS, ROOT, DATA, RESULTS = (_shared[k] for k in ("BENCHMARKS", "ROOT", "DATA", "RESULTS"))
