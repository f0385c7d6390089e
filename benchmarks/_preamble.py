"""The one preamble of every benchmark script: ``import _preamble`` first, then sparsec.

Run from a source checkout (``python3 benchmarks/run_suite.py``), a script finds this file
beside it; importing it

* puts the checkout root first on ``sys.path`` (this checkout's sparsec, not an installed
  one) and ``benchmarks/data`` after it (the data helpers: ``structured``, ``lowprec``, ...);
* points ``SPARSEC_DATA_DIR`` (where ``sparsec.bench.suites`` keeps the suites' data) at
  ``benchmarks/data/cache`` unless it is set, so the scripts and ``fetch.py`` share that
  folder, as on the GPU host where it is carried.

Scripts in ``benchmarks/data`` import ``benchmarks/data/_preamble.py``, which runs this one.
"""
import os
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent
ROOT = BENCHMARKS.parent
DATA = BENCHMARKS / "data"
RESULTS = BENCHMARKS / "results"

for _path in (str(DATA), str(ROOT)):  # ROOT ends first
    if _path in sys.path:
        sys.path.remove(_path)
    sys.path.insert(0, _path)
os.environ.setdefault("SPARSEC_DATA_DIR", str(DATA / "cache"))
