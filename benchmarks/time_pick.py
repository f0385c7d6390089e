#!/usr/bin/env python3
"""How long the learned default's pick takes on the CPU (issue 26: at most 0.2 s for a
1M-entry matrix on 2 cores): ``tuned_config`` (format, format knobs and schedule knobs from
the shipped model) and ``formats.convert(m, "auto")`` (the pick, then the conversion) on a
1M-entry R-MAT, each in a fresh process, so that a process's first pick -- which imports
the tuner's space and features and reads the model file -- is measured as users meet it,
beside the picks that follow it. Each process also says whether the pick imported TVM,
torch or xgboost (it should not).

    python3 benchmarks/time_pick.py [--runs 5] [--out FILE]

Prints a table last; writes FILE (default ``$OUT/pick_time.json`` when ``$OUT`` is set).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

import _preamble  # noqa: F401  (the checkout on sys.path; the child processes get it through PYTHONPATH)

CHILD = """
import json, sys, time
from sparsec.bench.rmat import rmat
from sparsec import formats
from sparsec.tune.apply import tuned_config
m = rmat(17, 1_000_000, seed=0).tocsr()
out = {"nnz": int(m.nnz), "rows": int(m.shape[0])}
for key, call in (("first_pick", lambda: tuned_config("spmm", m, 32, "cuda:sm_90a")),
                  ("next_pick_f128", lambda: tuned_config("spmm", m, 128, "cuda:sm_90a")),
                  ("next_pick_f512", lambda: tuned_config("spmm", m, 512, "cuda:sm_90a")),
                  ("convert_auto_f64", lambda: formats.convert(m, "auto", op="spmm", feat=64, target="cuda:sm_90a"))):
    t = time.perf_counter()
    call()
    out[key] = time.perf_counter() - t
out["imported"] = sorted(n for n in ("tvm", "tvm_ffi", "torch", "xgboost") if n in sys.modules)
print(json.dumps(out))
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="fresh processes (default 5)")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(_preamble.ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as an installed package runs: compiled modules cached
    subprocess.run([sys.executable, "-c", "import sparsec.tune.space, sparsec.tune.features"], env=env, check=True)
    runs = []
    for _ in range(args.runs):
        done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    keys = ("first_pick", "next_pick_f128", "next_pick_f512", "convert_auto_f64")
    result = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "python": platform.python_version(),
              "runs": runs, "median_s": {k: statistics.median(r[k] for r in runs) for k in keys},
              "max_s": {k: max(r[k] for r in runs) for k in keys},
              "imported": sorted({n for r in runs for n in r["imported"]})}
    path = args.out or (os.environ.get("OUT") and os.path.join(os.environ["OUT"], "pick_time.json"))
    if path:
        Path(path).write_text(json.dumps(result, indent=1))
    print(f"1M-entry R-MAT ({runs[0]['rows']} rows), {args.runs} fresh processes; imported: {result['imported'] or 'none'}")
    print(f"{'call':<18} {'median s':>9} {'max s':>7}")
    for k in keys:
        print(f"{k:<18} {result['median_s'][k]:>9.3f} {result['max_s'][k]:>7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
