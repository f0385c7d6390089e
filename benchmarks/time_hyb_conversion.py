#!/usr/bin/env python3
"""Time the conversion to hyb (automatic col_parts and buckets) and report its padding.

    python benchmarks/time_hyb_conversion.py [--json FILE] [--repeat 5] [--cache DIR]

Matrices:

* ``rmat-1M``: an R-MAT graph (Chakrabarti et al. 2004; Graph500's parameters
  a, b, c, d = 0.57, 0.19, 0.19, 0.05), scale 16 (65,536 x 65,536), edges drawn with
  ``numpy.random.default_rng(2024)``; duplicates are dropped and a seeded random subset of
  exactly 1,000,000 distinct entries is kept (float32 values 1.0, directed, no
  symmetrisation). Also converted with SparseTIR's usual explicit ``hyb:8:1/2/4/8/16/32``.
* every real graph in ``benchmarks/data/cache/*.npz`` (written by
  ``benchmarks/data/fetch.py``; missing files are skipped).

For each: rows, nnz, the chosen col_parts and buckets, the number of parts, stored
slots, the padding ratio (stored / nnz) and the median conversion time of ``--repeat``
runs (``hyb.from_matrix`` on a scipy CSR input: validation, canonicalisation,
parameter choice and the split).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time

import numpy as np
import scipy.sparse as sp

import _preamble  # noqa: F401,E402  (the one preamble: checkout root and benchmarks/data on sys.path)

from sparsec.bench.suites import default_cache_dir  # noqa: E402
from sparsec.formats import hyb  # noqa: E402

RMAT = dict(scale=16, nnz=1_000_000, a=0.57, b=0.19, c=0.19, seed=2024)


def rmat(scale: int, nnz: int, a: float, b: float, c: float, seed: int) -> sp.csr_matrix:
    """An R-MAT matrix of 2**scale rows/cols with exactly ``nnz`` distinct entries."""
    rng = np.random.default_rng(seed)
    n = 1 << scale
    keys = np.zeros(0, np.int64)
    draw = int(nnz * 1.3)
    while keys.size < nnz:
        row = np.zeros(draw, np.int64)
        col = np.zeros(draw, np.int64)
        for level in range(scale):  # one quadrant choice per level, vectorised over edges
            u = rng.random(draw)
            down = u >= a + b                      # quadrants c and d: lower half
            right = ((u >= a) & (u < a + b)) | (u >= a + b + c)  # quadrants b and d
            row |= down.astype(np.int64) << level
            col |= right.astype(np.int64) << level
        keys = np.unique(np.concatenate([keys, row * n + col]))
    keys = np.sort(rng.choice(keys, size=nnz, replace=False))
    return sp.csr_matrix((np.ones(nnz, np.float32), (keys // n, keys % n)), shape=(n, n))


def measure(name: str, a: sp.csr_matrix, repeat: int, **params) -> dict:
    times, inst = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        inst = hyb.from_matrix(a, **params)
        times.append(time.perf_counter() - t0)
    s = hyb.stats(inst)
    return {"matrix": name, "rows": int(a.shape[0]), "cols": int(a.shape[1]), "nnz": int(a.nnz),
            "col_parts": s["col_parts"], "buckets": "/".join(map(str, s["buckets"])),
            "auto": not params, "parts": s["parts"], "stored": s["stored"],
            "padding_ratio": round(s["padding_ratio"], 4), "conversion_s": round(float(np.median(times)), 4)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the rows to this file")
    ap.add_argument("--repeat", type=int, default=5, help="runs per matrix; the median is reported (default 5)")
    ap.add_argument("--cache", default=str(default_cache_dir()), help="folder of real graphs (*.npz)")
    args = ap.parse_args(argv)

    rows = []
    t0 = time.perf_counter()
    a = rmat(**RMAT)
    print(f"# rmat-1M generated in {time.perf_counter() - t0:.1f} s: {RMAT}", file=sys.stderr)
    rows.append(measure("rmat-1M", a, args.repeat))
    rows.append(measure("rmat-1M", a, args.repeat, col_parts=8, buckets=(1, 2, 4, 8, 16, 32)))
    files = sorted(glob.glob(os.path.join(args.cache, "*.npz")))
    if not files:
        print(f"# no real graphs in {args.cache} (run benchmarks/data/fetch.py): skipped", file=sys.stderr)
    for path in files:
        try:
            m = sp.load_npz(path).tocsr()
        except Exception as e:  # a damaged or foreign file: say so, go on
            print(f"# {path}: skipped ({e})", file=sys.stderr)
            continue
        rows.append(measure(os.path.splitext(os.path.basename(path))[0], m, args.repeat))

    head = ["matrix", "rows", "nnz", "col_parts", "buckets", "auto", "parts", "stored", "padding_ratio", "conversion_s"]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for r in rows:
        print("| " + " | ".join(str(r[h]) for h in head) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rmat": RMAT, "repeat": args.repeat, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
