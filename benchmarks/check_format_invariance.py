"""Format invariance on the GPU: every format family x operator gives the CSR result.

    python3 benchmarks/check_format_invariance.py [--target cuda] [--out DIR] [--feat 32]

An operator's value is defined on the matrix's coordinates, whatever format stores it
(``sparsec.formats.base``: padding). For each matrix -- a small one with empty rows, a long
row, a row of explicit zeros and odd sizes; the smallest real graph of the bench suite in
$SPARSEC_DATA_DIR when fetched, else the embedded power grid -- each family (bsr of several block shapes, ell, rell, hyb with split rows and with column
ranges, bsr+csr, N:M element- and vector-wise on the pruned matrix, SR-BCRS float16) runs the
library spmm, sddmm and attention and the user-written row softmax, row max, row-normalised
SpMM, edge softmax and edge softmax -> SpMM (tests/dsl_ops.py) on NaN-poisoned outputs. Each
result is compared with the float64 reference on the logical pattern (slot by slot for sparse
outputs: 0 at padding) and with the CSR kernel's result on the same logical matrix.

Prints a families x operators table of the worst relative error over the matrices (or
"refused: why"), writes every row to DIR/check_format_invariance.json, and exits 1 on any
mismatch. Runs on the CPU too (``--target llvm``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import scipy.sparse as sp

import _preamble  # noqa: F401  (the one preamble: checkout root and benchmarks/data on sys.path)
import sparsec  # noqa: E402
from sparsec import formats, ops, reference  # noqa: E402
from sparsec.bench import suites  # noqa: E402
from sparsec.datasets import default_matrix  # noqa: E402
from sparsec.formats import nm  # noqa: E402
from tests.dsl_ops import NONLINEAR_OPS, on_coordinates, rel_err  # noqa: E402

FAMILIES = ("csr", "bsr:4x4", "bsr:2x8", "bsr:16x16", "ell", "rell", "hyb:1:1/2/4", "hyb:2:1/2/4/8/16/32",
            "bsr+csr:4x4,0.3", "nm:2:4", "nm:2:4:v4", "srbcrs:v4,float16", "tiled", "tiled:16x32")
OPS = ("spmm", "sddmm", "attention") + tuple(NONLINEAR_OPS)
MAX_PADDING = 40.0  # stored / nnz above this: the family is skipped for the matrix (ell on a hub graph)
MAX_REF_NNZ = 3_000_000  # the generic float64 reference holds nnz x feat values per statement


def edge_case_matrix(rows: int, cols: int, density: float, seed: int) -> sp.csr_matrix:
    """Positive weights with two empty rows, a long row, every 6th entry an explicit zero and
    row 0 holding explicit zeros only."""
    rng = np.random.default_rng(seed)
    m = sp.random(rows, cols, density=density, format="lil", random_state=seed)
    m[3, :] = 0
    m[4, :] = 0
    m[0, :] = 0
    m[7, ::2] = rng.uniform(0.1, 1.0, len(range(0, cols, 2)))
    c = m.tocoo()
    data = np.where(np.arange(c.nnz) % 6 == 0, 0.0, np.abs(c.data) + 0.1)
    r = np.concatenate([c.row, [0, 0]])
    k = np.concatenate([c.col, [1, 5]])
    out = sp.csr_matrix((np.concatenate([data, [0.0, 0.0]]).astype(np.float32), (r, k)), shape=(rows, cols))
    out.sort_indices()
    return out


def positive(m: sp.csr_matrix) -> sp.csr_matrix:
    """The pattern with positive weights (a row-normalised SpMM divides by row sums)."""
    out = sp.csr_matrix(m, dtype=np.float32, copy=True)
    out.data = np.abs(out.data) + np.float32(0.1)
    return out


def matrices(quick: bool, graph_only: bool = False):
    if not graph_only:
        yield "edge_cases_37x53", edge_case_matrix(37, 53, 0.08, 1)
    if quick:
        return
    graphs = suites.real_graphs(os.environ.get("SPARSEC_DATA_DIR", suites.default_cache_dir()))
    if graphs:  # the smallest graph of the bench suite, when fetched
        yield graphs[0][0], positive(graphs[0][1])
    else:
        yield "power_grid", positive(default_matrix())


def convert(m: sp.csr_matrix, family: str):
    if family.startswith("nm:"):
        n, mw, *v = (int(x.strip("v")) for x in family[3:].split(":"))
        return formats.convert(nm.prune_stored(m, n=n, m=mw, vec=v[0] if v else 1), family)
    return formats.convert(m, family)


def operator(name: str):
    return ops.get(name) if name in ops.LIBRARY else NONLINEAR_OPS[name][0]()


def dense_inputs(op, A, dtype: str, feat: int, seed: int):
    rng = np.random.default_rng(seed)
    row, col = op.structure()
    return [rng.standard_normal(tuple(A.shape[0] if a is row else A.shape[1] if a is col else feat
                                      for a in b.axes)).astype(dtype)
            for b in op.inputs() if not b.sparse]


def float64_reference(op_name, op, A, dense, feat, out_dtype):
    if op_name in reference.REFERENCES:  # the library's, fast at any size
        return reference.REFERENCES[op_name](A, *dense)
    if A.nnz > MAX_REF_NNZ:
        return None
    return reference.evaluate(op, A, *dense, params={"feat": feat}, dtype=out_dtype)


_KERNELS: dict = {}


def kernel(op_name, A, target, feat):
    """Compiled once per (operator, format spec, dtype): matrices in one spec share it."""
    key = (op_name, A.format.spec, A.value_dtype)
    if key not in _KERNELS:
        op = operator(op_name)
        _KERNELS[key] = sparsec.compile(op, A, target=target, **({"feat": feat} if op.params() else {}))
    return _KERNELS[key]


def check_one(op_name, A, C, target, feat, tol):
    """One (operator, instance): its errors against the reference and against CSR (``C``)."""
    op = operator(op_name)
    k = kernel(op_name, A, target, feat)
    kc = kernel(op_name, C, target, feat)
    dense = dense_inputs(op, A, k.dtypes.dense, feat, seed=len(op_name))
    out = k(A, *dense, poison=True)
    out_csr = kc(C, *dense, poison=True)
    ref = float64_reference(op_name, op, A, dense, feat, k.dtypes.out)
    err_ref = None if ref is None else rel_err(np.asarray(out, np.float64), ref)
    err_csr = rel_err(on_coordinates(op, A, out), on_coordinates(op, C, out_csr))
    worst = max(e for e in (err_ref, err_csr) if e is not None)
    return {"err_ref": err_ref, "err_csr": err_csr, "ok": bool(worst <= tol), "worst": worst}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="cuda", help="cuda (default) or llvm")
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for check_format_invariance.json")
    p.add_argument("--feat", type=int, default=32)
    p.add_argument("--quick", action="store_true", help="the small matrix only")
    p.add_argument("--graph-only", action="store_true",
                   help="the suite graph only (on CUDA each matrix takes minutes of compiles: run them apart)")
    args = p.parse_args(argv)
    rows, cells = [], {}
    t0 = time.perf_counter()
    for mname, m in matrices(args.quick, args.graph_only):
        print(f"# {mname}: {m.shape[0]} x {m.shape[1]}, nnz {m.nnz}", flush=True)
        for family in FAMILIES:
            try:
                A = convert(m, family)
            except ValueError as e:
                for op_name in OPS:
                    rows.append({"matrix": mname, "family": family, "op": op_name, "refused": f"convert: {e}"})
                continue
            if A.stored > MAX_PADDING * max(A.nnz, 1):
                for op_name in OPS:
                    rows.append({"matrix": mname, "family": family, "op": op_name,
                                 "skipped": f"padding {A.stored / max(A.nnz, 1):.0f}x"})
                continue
            C = formats.convert(A.to_scipy(), "csr", dtype=A.value_dtype)  # the same logical matrix
            tol = 10 * reference.TOLERANCE[A.value_dtype]
            print(f"  {family} ({time.perf_counter() - t0:.0f} s)", flush=True)
            for op_name in OPS:
                row = {"matrix": mname, "family": family, "format": A.format.spec, "op": op_name,
                       "nnz": int(A.nnz), "stored": int(A.stored), "tolerance": tol}
                try:
                    row.update(check_one(op_name, A, C, args.target, args.feat, tol))
                except ValueError as e:  # a refusal names the combination
                    row["refused"] = str(e).splitlines()[0][:160]
                rows.append(row)
                status = "refused" if "refused" in row else ("ok" if row["ok"] else "MISMATCH")
                if status != "ok":
                    print(f"  {family:<20} {op_name:<18} {status}: {row.get('refused', row.get('worst'))}",
                          flush=True)
    for row in rows:
        key = (row["family"], row["op"])
        prev = cells.get(key)
        if "refused" in row or "skipped" in row:
            text = ("refused: " + row["refused"]) if "refused" in row else ("skipped: " + row["skipped"])
            cells[key] = prev if prev is not None and not prev[1].startswith(("refused", "skipped")) else (None, text)
        elif prev is None or prev[0] is None or row["worst"] > prev[0]:
            cells[key] = (row["worst"], f"{row['worst']:.1e}" + ("" if row["ok"] else " FAIL"))
    os.makedirs(args.out, exist_ok=True)
    bad = [r for r in rows if r.get("ok") is False]
    with open(os.path.join(args.out, "check_format_invariance.json"), "w") as f:
        json.dump({"target": args.target, "feat": args.feat, "seconds": time.perf_counter() - t0,
                   "mismatches": len(bad), "rows": rows}, f, indent=1, default=float)
    width = max(len(f) for f in FAMILIES)
    print(f"\nworst relative error over the matrices, {args.target} (vs the float64 logical reference and "
          f"vs csr); tolerance 10x the dtype's")
    print(" " * width + " | " + " | ".join(f"{o:>17}" for o in OPS))
    for family in FAMILIES:
        texts = [cells.get((family, o), (None, "-"))[1] for o in OPS]
        print(f"{family:<{width}} | " + " | ".join(f"{t[:17]:>17}" for t in texts))
    refusals = sorted({c[1] for c in cells.values() if c[1].startswith("refused")})
    for r in refusals:
        print(r)
    print(f"{len(rows)} checks, {len(bad)} mismatches, {time.perf_counter() - t0:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
