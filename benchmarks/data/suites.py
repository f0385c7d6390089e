#!/usr/bin/env python3
"""Describe the benchmark suites of ``sparsec.bench.suites`` (generating the R-MAT graphs
on first use): name, shape, nnz, row lengths / block and sparsity of every case.

    python benchmarks/data/suites.py [--cache DIR] [--no-rmat] [--suite graphs|blocks|all]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import _preamble  # noqa: F401  (the checkout root on sys.path: benchmarks/_preamble.py)
from sparsec.bench.suites import RMAT_SPECS, default_cache_dir, describe


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, default=default_cache_dir(), help="cache folder (default: %(default)s)")
    ap.add_argument("--suite", choices=("graphs", "blocks", "all"), default="all")
    ap.add_argument("--no-rmat", action="store_true", help="leave the R-MAT graphs out")
    args = ap.parse_args(argv)
    describe(args.cache, args.suite, () if args.no_rmat else RMAT_SPECS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
