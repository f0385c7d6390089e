#!/usr/bin/env python3
"""Generate one R-MAT graph (``sparsec.bench.rmat``) and print its row-length statistics.

    python benchmarks/data/rmat.py SCALE NNZ [--rows N] [--seed S] [--out FILE.npz]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

import _preamble  # noqa: F401  (the checkout root on sys.path: benchmarks/_preamble.py)
from sparsec.bench.rmat import rmat


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scale", type=int)
    ap.add_argument("nnz", type=int)
    ap.add_argument("--rows", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="write the matrix here (save_npz)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    a = rmat(args.scale, args.nnz, args.seed, rows=args.rows)
    t1 = time.perf_counter()
    deg = np.diff(a.indptr)
    print(f"rmat scale={args.scale} rows={a.shape[0]:,} nnz={a.nnz:,} seed={args.seed}: "
          f"{t1 - t0:.1f} s; row length mean {deg.mean():.1f} max {deg.max():,}, "
          f"empty rows {(deg == 0).sum():,}")
    if args.out is not None:
        sp.save_npz(args.out, a, compressed=False)
        print(f"written to {args.out} in {time.perf_counter() - t1:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
