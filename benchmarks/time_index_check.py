#!/usr/bin/env python3
"""What the index check made before a kernel launch costs (issue 21), on the CPU.

A kernel call checks the index arrays of any instance ``convert`` did not seal in this
process (built by hand, unpickled, changed since): ``formats.validate.check_before_launch``
runs the family's full check. A sealed instance takes the trusted path, a few attribute
reads. This times both on R-MAT matrices (``sparsec.bench.rmat``) of about 1M and 30M
non-zeros in csr, hyb and bsr:4x4: the median of ``--repeat`` full checks, the median
of 1000 trusted checks, and the conversion for scale. No GPU is involved (the check is
numpy on the host, before the launch), so the figures hold on the GPU host too.

    python3 benchmarks/time_index_check.py [--nnz 1M 30M] [--formats csr hyb bsr:4x4] [--out DIR]

Prints a table last; writes ``index_check.json`` to ``--out``. Exits 1 if a full check
fails to reject a corrupted copy (it must name the bad index), so a timing of a check that
checks nothing is never reported.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

import _preamble  # noqa: F401,E402  (the one preamble: checkout root and benchmarks/data on sys.path)

from sparsec.bench.rmat import rmat  # noqa: E402
from sparsec.formats import CompositeInstance, FormatInstance, convert, validate  # noqa: E402

SIZES = {"1M": (17, 1_000_000), "30M": (22, 30_000_000)}  # R-MAT scale (2**scale rows), non-zeros


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nnz", nargs="+", default=list(SIZES), choices=list(SIZES))
    p.add_argument("--formats", nargs="+", default=["csr", "hyb", "bsr:4x4"])
    p.add_argument("--repeat", type=int, default=5, help="full checks timed per case (median reported)")
    p.add_argument("--target", default="cuda", help="accepted for symmetry with the other scripts: the check "
                                                    "runs on the host whatever the target")
    p.add_argument("--out", default=None, help="folder for index_check.json")
    return p.parse_args(argv)


def unsealed_copy(inst):
    """The same matrix as an instance built by hand: index arrays of its own (writeable, not
    sealed), the values shared."""
    if isinstance(inst, CompositeInstance):
        return CompositeInstance(inst.format, inst.shape, [unsealed_copy(p) for p in inst.parts], inst.nnz)
    return FormatInstance(inst.format, inst.shape, {n: np.array(a) for n, a in inst.arrays.items()}, inst.data,
                          inst.nnz)


def corrupted(inst):
    """An unsealed copy with one column index set to 1e8 (the check must refuse it)."""
    bad = unsealed_copy(inst)
    part = bad.parts[-1] if hasattr(bad, "parts") else bad
    name = [n for n in part.format.index_array_names() if n in ("indices", "col_ids")][0]
    arr = part.arrays[name]
    live = np.flatnonzero(arr >= 0)
    arr[int(live[len(live) // 3])] = 10**8
    return bad


def time_case(m, spec, repeat):
    t0 = time.perf_counter()
    inst = convert(m, spec)
    convert_s = time.perf_counter() - t0
    assert validate.is_trusted(inst)
    trusted = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(1000):
            validate.check_before_launch(inst)
        trusted.append((time.perf_counter() - t) / 1000)
    copy = unsealed_copy(inst)
    full = []
    for _ in range(repeat):
        t = time.perf_counter()
        validate.check_before_launch(copy)
        full.append(time.perf_counter() - t)
    try:
        validate.check_before_launch(corrupted(inst))
        refused = False
    except ValueError as e:
        refused = "100000000" in str(e)
    index_bytes = sum(a.nbytes for p in (inst.parts if hasattr(inst, "parts") else (inst,))
                      for a in p.arrays.values())
    return {"format": inst.format.spec if not hasattr(inst, "parts") else spec, "nnz": int(m.nnz),
            "rows": int(m.shape[0]), "stored": int(inst.stored), "index_bytes": int(index_bytes),
            "convert_s": convert_s, "full_check_s": statistics.median(full), "full_check_all_s": full,
            "trusted_check_us": statistics.median(trusted) * 1e6, "refuses_corruption": refused}


def main(argv=None):
    args = parse_args(argv)
    rows = []
    for size in args.nnz:
        scale, nnz = SIZES[size]
        t = time.perf_counter()
        m = rmat(scale, nnz, seed=1)
        print(f"R-MAT scale {scale}, {m.nnz} non-zeros: {time.perf_counter() - t:.1f} s", flush=True)
        for spec in args.formats:
            r = time_case(m, spec, args.repeat)
            r["size"] = size
            rows.append(r)
            print(f"  {spec}: full {r['full_check_s'] * 1e3:.1f} ms, trusted {r['trusted_check_us']:.2f} us, "
                  f"convert {r['convert_s']:.2f} s, refuses 1e8: {r['refuses_corruption']}", flush=True)
        del m
    result = {"host": os.uname().nodename, "cpu_count": os.cpu_count(), "repeat": args.repeat, "rows": rows}
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "index_check.json"), "w") as f:
            json.dump(result, f, indent=1)
    print(f"\n{'size':>4} {'format':<9} {'nnz':>10} {'stored':>10} {'index MB':>9} {'full check ms':>14} "
          f"{'ms per 1M nnz':>14} {'trusted us':>11} {'convert s':>10} {'refuses':>8}")
    for r in rows:
        print(f"{r['size']:>4} {r['format'][:9]:<9} {r['nnz']:>10} {r['stored']:>10} {r['index_bytes'] / 2**20:>9.1f} "
              f"{r['full_check_s'] * 1e3:>14.1f} {r['full_check_s'] * 1e3 / (r['nnz'] / 1e6):>14.2f} "
              f"{r['trusted_check_us']:>11.2f} {r['convert_s']:>10.2f} {str(r['refuses_corruption']):>8}")
    return 0 if all(r["refuses_corruption"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
