#!/usr/bin/env python3
"""Does an exported hyb / bsr+csr module, built for one graph, run correctly on other graphs?

    python3 benchmarks/check_composite_reuse.py [--target cuda] [--out DIR]
    python3 benchmarks/check_composite_reuse.py --target llvm          # the CPU run CI can do

For each composite format (hyb with its automatic parameters, bsr+csr:4x4) and operator
(spmm, sddmm): compile for an R-MAT graph (``sparsec.bench.rmat``), export the kernel
(CUDA: SASS by nvcc), load the file with ``sparsec.load`` and run it on the other graphs
converted with the spec the module records (``convert_spec``): a larger R-MAT graph (split
rows), a graph whose bucket 2 is empty, and one whose rows are all short (every bucket
but the first empty, no split row, no dense block: the BSR part empty). Outputs are
NaN-poisoned first and compared with a float64 scipy reference. Two refusals are checked
too: a matrix converted with plain ``hyb`` that resolves to other buckets, and a module
compiled for a graph without split rows handed one with them (its metadata lists the
requirement). Prints a table last; ``--out DIR`` gets composite_reuse.json; exits 1 if any
check fails.

Where nvcc is missing on the GPU host, export on a machine with nvcc first
(``--export-only DIR --target cuda``) and run with ``--modules DIR``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

import _preamble  # noqa: F401,E402  (the one preamble: checkout root and benchmarks/data on sys.path)

FEAT = 64
TOL = 1e-5  # float32: max |out - ref| / max |ref|
FORMATS = ("hyb", "bsr+csr:4x4")
OPS = ("spmm", "sddmm")


# ---------------------------------------------------------------- graphs


STRIDE = 7919  # a prime: coprime to the column counts below, so a row's columns never repeat


def _rows_of_lengths(n_rows, n_cols, lengths, seed):
    """Row r holds exactly ``lengths[r]`` entries: columns start_r + t * STRIDE (mod n_cols)."""
    rng = np.random.default_rng(seed)
    lengths = np.minimum(np.asarray(lengths, dtype=np.int64), n_cols)
    rows = np.repeat(np.arange(n_rows), lengths)
    within = np.arange(rows.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    cols = (rng.integers(0, n_cols, n_rows)[rows] + within * STRIDE) % n_cols
    m = sp.csr_matrix((np.ones(rows.size, np.float32), (rows, cols)), shape=(n_rows, n_cols))
    m.sum_duplicates()
    assert m.nnz == rows.size
    m.data = rng.uniform(-1, 1, m.nnz).astype(np.float32)
    return m


def graphs():
    """(name, matrix) pairs: the first is the one modules are compiled for."""
    from sparsec.bench.rmat import rmat

    def values(m, seed):
        m = sp.csr_matrix(m, dtype=np.float32)
        m.data = np.random.default_rng(seed).uniform(-1, 1, m.nnz).astype(np.float32)
        return m

    rng = np.random.default_rng(3)
    n = 12_000
    # bucket 2 empty: lengths 1, 3..8 and a few long rows (split), never 2
    lengths = rng.choice([0, 1, 3, 4, 6, 8, 12, 30], n, p=[.1, .3, .2, .1, .1, .1, .05, .05])
    lengths[:5] = 2_000
    short = rng.choice([0, 1], 9_000)  # every row one entry or none
    return [
        ("rmat-s14", values(rmat(14, 200_000, seed=14), 14)),
        ("rmat-s15", values(rmat(15, 500_000, seed=15), 15)),
        ("no-bucket-2", _rows_of_lengths(n, 10_000, lengths, 4)),
        ("short-rows", _rows_of_lengths(9_000, 7_000, short, 5)),
    ]


# ---------------------------------------------------------------- references


def reference(op, A, m, dense):
    if op == "spmm":
        return m.astype(np.float64) @ dense[0].astype(np.float64)
    rows, cols = A.stored_coords()
    ok = rows >= 0
    out = np.zeros(A.stored)
    X, Y = (d.astype(np.float64) for d in dense)
    out[ok] = A.slot_values()[ok].astype(np.float64) * np.einsum("ij,ij->i", X[rows[ok]], Y[cols[ok]])
    return out


def rel_err(out, ref):
    out = np.asarray(out, dtype=np.float64)
    if not np.all(np.isfinite(out)):
        return float("nan")  # an element left unwritten (NaN poison) or a non-finite result
    return float(np.abs(out - ref).max(initial=0.0) / max(float(np.abs(ref).max(initial=0.0)), 1e-30))


def dense_inputs(op, m, rng):
    if op == "spmm":
        return (rng.standard_normal((m.shape[1], FEAT)).astype(np.float32),)
    return (rng.standard_normal((m.shape[0], FEAT)).astype(np.float32),
            rng.standard_normal((m.shape[1], FEAT)).astype(np.float32))


# ---------------------------------------------------------------- modules


def module_name(op, fmt, tag=""):
    return f"{op}_{fmt.replace(':', '_').replace('+', '_')}{tag}.so"


def build_modules(target, graph_list, out_dir: Path):
    """Compile and export every (format, op) for the first graph, and the split-row case."""
    import sparsec
    from sparsec import formats

    name0, m0 = graph_list[0]
    built = []
    for fmt in FORMATS:
        A = formats.convert(m0, fmt)
        for op in OPS:
            t0 = time.perf_counter()
            k = sparsec.compile(op, A, target=target, feat=FEAT)
            path = out_dir / module_name(op, fmt)
            k.export(str(path))
            built.append((path.name, time.perf_counter() - t0))
    # a graph without split rows compiles a widest bucket that stores rows once: refuses split rows
    short = dict(graph_list)["short-rows"]
    spec = formats.convert(m0, "hyb").format.family_spec
    t0 = time.perf_counter()
    k = sparsec.compile("spmm", formats.convert(short, spec), target=target, feat=FEAT)
    k.export(str(out_dir / module_name("spmm", "hyb", "_no_split")))
    built.append((module_name("spmm", "hyb", "_no_split"), time.perf_counter() - t0))
    return built


def check_modules(mod_dir: Path, graph_list, rng):
    import sparsec
    from sparsec import formats

    rows = []
    for fmt in FORMATS:
        for op in OPS:
            k = sparsec.load(str(mod_dir / module_name(op, fmt)))
            meta = k.extra["metadata"]
            spec = meta["convert_spec"]
            for gname, m in graph_list:
                A = formats.convert(m, spec)
                dense = dense_inputs(op, m, rng)
                row = {"format": fmt, "op": op, "graph": gname, "spec": spec, "rows": m.shape[0], "nnz": int(m.nnz),
                       "parts": len(A.parts), "empty_parts": sum(1 for p in A.parts if p.nnz == 0),
                       "split_rows": any(not p.format.axes[0].unique for p in A.parts),
                       "requirements": meta["matrix_requirements"]}
                try:
                    out = k(A, *dense, poison=True)
                    err = rel_err(out, reference(op, A, m, dense))
                    row.update(max_rel_err=err, ok=bool(err <= TOL), note="")
                except Exception as e:  # noqa: BLE001 - recorded as a failed check
                    row.update(max_rel_err=None, ok=False, note=f"{type(e).__name__}: {str(e)[:200]}")
                rows.append(row)
    rows += refusals(mod_dir, graph_list, rng)
    return rows


def refusals(mod_dir: Path, graph_list, rng):
    """The two matrix differences a module must refuse by name."""
    import sparsec
    from sparsec import formats

    out = []
    k = sparsec.load(str(mod_dir / module_name("spmm", "hyb")))
    spec = k.extra["metadata"]["convert_spec"]
    name, short = "short-rows", dict(graph_list)["short-rows"]
    other = formats.convert(short, "hyb")  # resolves to other buckets than the module's
    out.append(_refused(k, other, short, rng, f"convert the matrix with spec '{spec}'",
                        "plain hyb resolving differently", name))
    k2 = sparsec.load(str(mod_dir / module_name("spmm", "hyb", "_no_split")))
    reqs = k2.extra["metadata"]["matrix_requirements"]
    gname, big = graph_list[1]
    row = _refused(k2, formats.convert(big, spec), big, rng, "lists each row once", "split rows, module without", gname)
    row["requirements"] = reqs
    row["ok"] = bool(row["ok"] and reqs)
    out.append(row)
    return out


def _refused(k, A, m, rng, expect, what, gname):
    row = {"format": "hyb", "op": "spmm", "graph": gname, "spec": A.format.family_spec, "rows": m.shape[0],
           "nnz": int(m.nnz), "parts": len(A.parts), "empty_parts": sum(1 for p in A.parts if p.nnz == 0),
           "split_rows": any(not p.format.axes[0].unique for p in A.parts), "max_rel_err": None, "refusal": what}
    try:
        k(A, *dense_inputs("spmm", m, rng))
        row.update(ok=False, note="ran: expected a refusal")
    except ValueError as e:
        row.update(ok=expect in str(e), note=str(e)[:300])
    return row


# ---------------------------------------------------------------- main


def table(rows):
    head = f"{'format':<12} {'op':<6} {'graph':<12} {'rows':>7} {'nnz':>8} {'parts':>5} {'empty':>5} {'split':>5} " \
           f"{'max_rel_err':>11}  result"
    lines = [head, "-" * len(head)]
    for r in rows:
        err = "-" if r["max_rel_err"] is None else f"{r['max_rel_err']:.2e}"
        res = ("ok" if r["ok"] else "FAIL") + (f" (refused: {r['refusal']})" if "refusal" in r else "")
        if not r["ok"] and r.get("note"):
            res += f" {r['note'][:120]}"
        lines.append(f"{r['format']:<12} {r['op']:<6} {r['graph']:<12} {r['rows']:>7} {r['nnz']:>8} {r['parts']:>5} "
                     f"{r['empty_parts']:>5} {str(r['split_rows']):>5} {err:>11}  {res}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="cuda", help="cuda (default), cuda:sm_90a or llvm")
    ap.add_argument("--out", metavar="DIR", help="write composite_reuse.json there")
    ap.add_argument("--modules", metavar="DIR", help="load the modules from DIR (made by --export-only) "
                                                     "instead of exporting them here")
    ap.add_argument("--export-only", metavar="DIR", help="export the modules into DIR and stop (needs nvcc for cuda)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    graph_list = graphs()
    rng = np.random.default_rng(0)
    if args.export_only:
        Path(args.export_only).mkdir(parents=True, exist_ok=True)
        for name, s in build_modules(args.target, graph_list, Path(args.export_only)):
            print(f"exported {name} ({s:.1f} s)")
        return 0
    with tempfile.TemporaryDirectory(prefix="sparsec-reuse-") as tmp:
        mod_dir = Path(args.modules) if args.modules else Path(tmp)
        built = [] if args.modules else build_modules(args.target, graph_list, mod_dir)
        rows = check_modules(mod_dir, graph_list, rng)
    failed = [r for r in rows if not r["ok"]]
    result = {"target": args.target, "feat": FEAT, "tolerance": TOL, "built": built, "checks": rows,
              "failed": len(failed), "seconds": time.perf_counter() - t0}
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "composite_reuse.json"), "w") as f:
            json.dump(result, f, indent=1, default=str)
    print(table(rows))
    print(f"{len(rows) - len(failed)}/{len(rows)} checks passed on {args.target} in {result['seconds']:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
