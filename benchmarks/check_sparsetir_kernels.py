"""SparseTIR's 19 test kernels on the GPU: every kernel x format family against its float64 reference.

    python3 benchmarks/check_sparsetir_kernels.py [--target cuda|llvm] [--out DIR] [--feat 32]
        [--kernels csrmm sddmm ...] [--families csr bsr:4x4 ...] [--matrices random power_grid dense]

The kernels are tests/sparsetir_ops.py's: each SparseTIR script's semantics as a sparsec DSL
operator, with a numpy/scipy float64 reference written from the kernel's definition (not
``sparsec.reference.evaluate``) and an input generator. For each matrix -- a random one of odd
size with empty rows, a long row and explicit zeros, the embedded power grid
(``sparsec.datasets.default_matrix()``) and a 30%-dense one that N:M can hold -- and each
family the kernel applies to, the kernel runs on NaN-poisoned outputs and is compared with the reference (sparse outputs on the
matrix's coordinates, padding slots 0). A family that pads the matrix more than 40x is
skipped; a kernel that needs a DSL feature not there yet is run anyway and reported "needs"
when it fails (and "ok" when the feature has landed).

Prints a kernels x families table (ok / err / needs / skip) last, writes every row to
DIR/check_sparsetir_kernels.json and exits 1 when a kernel that needs nothing is wrong.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

import _preamble  # noqa: F401  (the one preamble: checkout root and benchmarks/data on sys.path)
import sparsec  # noqa: E402
from sparsec.datasets import default_matrix  # noqa: E402
from tests.sparsetir_ops import ALL_FAMILIES, KERNELS, check, edge_case_matrix, instance  # noqa: E402

MAX_PADDING = 40.0  # stored slots / entries above this: the family is skipped for the matrix
TOL = 1e-4  # 10x float32's tolerance: several kernels chain reductions


def matrices(names):
    for name in names:
        if name == "random":
            yield "random_20011x15013", edge_case_matrix(20011, 15013, 0.0004, 11)
        elif name == "dense":  # dense enough for N:M to store it without padding it 40x
            yield "dense_129x250", edge_case_matrix(129, 250, 0.3, 12)
        elif name == "power_grid":
            m = default_matrix().astype(np.float32)
            m.sort_indices()
            yield "power_grid", m
        else:
            raise SystemExit(f"unknown matrix {name!r}: random, power_grid or dense")


_KERNELS: dict = {}


def compiled(name, A, params, target):
    """One build per (kernel, format spec, dtype, compile-time extents): matrices share it."""
    key = (name, A.format.spec, A.value_dtype, tuple(sorted(params.items())))
    if key not in _KERNELS:
        t = time.perf_counter()
        _KERNELS[key] = (sparsec.compile(KERNELS[name].build(), A, target=target, **params),
                         time.perf_counter() - t)
    return _KERNELS[key]


def run_one(name, family, base, target, feat, seed):
    k = KERNELS[name]
    row = {"kernel": name, "family": family, "needs": k.needs}
    p = k.inputs(np.random.default_rng(seed), base, feat=feat)
    A, p = instance(p, family)
    row.update(rows=int(p.matrix.shape[0]), cols=int(p.matrix.shape[1]), nnz=int(A.nnz), stored=int(A.stored))
    if A.stored > MAX_PADDING * max(A.nnz, 1):
        row["status"] = "skip"
        row["why"] = f"padding {A.stored / max(A.nnz, 1):.0f}x"
        return row
    kern, compile_s = compiled(name, A, p.params, target)
    out = kern(A, *p.dense, poison=True)
    res = check(k, p, A, out, tol=TOL)
    row.update(res, compile_s=round(compile_s, 2))
    row["status"] = "ok" if res["ok"] else ("needs" if k.needs else "err")
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="cuda", help="cuda (default) or llvm")
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for check_sparsetir_kernels.json")
    p.add_argument("--feat", type=int, default=32)
    p.add_argument("--kernels", nargs="+", default=list(KERNELS), help="kernel names (default: all 19)")
    p.add_argument("--families", nargs="+", default=list(ALL_FAMILIES), help="format families (default: all)")
    p.add_argument("--matrices", nargs="+", default=["random", "power_grid", "dense"],
                   help="random (20011 x 15013), power_grid (the embedded matrix), dense (129 x 250, 30%%: N:M)")
    args = p.parse_args(argv)
    names, families = args.kernels, args.families
    unknown = [n for n in names if n not in KERNELS]
    if unknown:
        raise SystemExit(f"unknown kernels {unknown}; known: {', '.join(KERNELS)}")
    rows, t0 = [], time.perf_counter()
    for mname, base in matrices(args.matrices):
        print(f"# {mname}: {base.shape[0]} x {base.shape[1]}, nnz {base.nnz}", flush=True)
        for name in names:
            for family in (f for f in families if f in KERNELS[name].families):
                try:
                    row = run_one(name, family, base, args.target, args.feat, seed=len(name) + len(family))
                except Exception as e:  # a refusal or a failure of a kernel that needs a feature
                    row = {"kernel": name, "family": family, "needs": KERNELS[name].needs,
                           "status": "needs" if KERNELS[name].needs else "err",
                           "why": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
                row["matrix"] = mname
                rows.append(row)
                if row["status"] in ("err",) or (row["status"] == "ok" and row["needs"]):
                    print(f"  {name:<22} {family:<16} {row['status']}: {row.get('why') or 'feature landed'}",
                          flush=True)
            print(f"  {name} done ({time.perf_counter() - t0:.0f} s)", flush=True)
    # one cell per (kernel, family): the worst status over the matrices
    rank = {"err": 3, "needs": 2, "ok": 1, "skip": 0}
    cells: dict = {}
    for r in rows:
        key = (r["kernel"], r["family"])
        if key not in cells or rank[r["status"]] > rank[cells[key]]:
            cells[key] = r["status"]
    bad = [r for r in rows if r["status"] == "err"]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "check_sparsetir_kernels.json"), "w") as f:
        json.dump({"target": args.target, "feat": args.feat, "tolerance": TOL,
                   "seconds": round(time.perf_counter() - t0, 1), "errors": len(bad), "rows": rows},
                  f, indent=1, default=float)
    needs = sorted({r["needs"] for r in rows if r["status"] == "needs"})
    width = max(len(n) for n in names)
    print(f"\nSparseTIR kernels on {args.target} vs their float64 references (tolerance {TOL}): "
          "ok / err / needs (a DSL feature not there yet) / skip (padding > 40x) / - (not applicable)")
    print(" " * width + " | " + " | ".join(f"{f:>15}" for f in families))
    for name in names:
        print(f"{name:<{width}} | " + " | ".join(f"{cells.get((name, f), '-'):>15}" for f in families))
    for n in needs:
        print(f"needs: {n}")
    print(f"{len(rows)} checks, {sum(r['status'] == 'ok' for r in rows)} ok, {len(bad)} err, "
          f"{time.perf_counter() - t0:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
