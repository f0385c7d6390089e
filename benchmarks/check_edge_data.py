"""Edge data, trailing axes and indirect reads on the GPU: every new construct of issue 22
against a float64 reference, on NaN-poisoned outputs, over several formats.

    python3 benchmarks/check_edge_data.py [--target cuda|llvm] [--out DIR] [--quick]

Operators (tests/edge_ops.py): RGCN-homogeneous ``Y[i, g] += A[i, j] * W[E[i, j], f, g] * X[j, f]``
(an int32 edge type indexing W), the same by node type ``W[NT[j], f, g]``, an edge-weighted
SpMM (a second float sparse input), edge data outside a product with the matrix (padding
guarded by the slot mask), a multi-head SDDMM writing ``S[i, j, h]`` and a multi-head
aggregation reading ``L[i, j, h]``. Each runs on a small matrix with an empty row, a long row
and an explicit zero, and on a 600 x 500 power-law graph, in csr, bsr, ell, hyb and bsr+csr,
with its edge data given three ways: a per-entry numpy array, ``inst.edge_values(x)``, and
(CUDA, with torch) per-entry CUDA tensors (laid out by a gather on the GPU). Each result is
compared with an independent scipy/numpy float64 reference; an out-of-range edge type must be
refused before launch. Prints a table (worst relative error per operator x format, or the
failure), writes every row to DIR/check_edge_data.json, exits 1 on any failure.
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
from sparsec.formats import convert  # noqa: E402
from sparsec.reference import max_rel_err  # noqa: E402
from tests import edge_ops as E  # noqa: E402

FORMATS = ("csr", "bsr:2x2", "bsr:4x4", "ell", "hyb:1:1/2/4", "hyb:2:1/2/4/8", "bsr+csr:4x4,0.3")
TOL = 1e-4


def _graph(n=600, m=500, seed=0) -> sp.csr_matrix:
    """Power-law rows (a few long ones, many short, some empty) with float32 values."""
    rng = np.random.default_rng(seed)
    lens = np.minimum(m, (rng.pareto(1.3, n) * 2).astype(int))
    rows = np.repeat(np.arange(n), lens)
    cols = np.concatenate([rng.choice(m, k, replace=False) for k in lens]) if lens.sum() else np.zeros(0, int)
    vals = rng.standard_normal(rows.size).astype(np.float32)
    return sp.csr_matrix((vals, (rows, cols)), shape=(n, m))


def _cases():
    """(name, operator, params, inputs(inst, rng) -> per-entry/dense inputs, reference, edge input names)."""
    rel, fin, fout, heads, feat = 3, 8, 32, 2, 16

    def rgcn_in(inst, rng):
        nnz = inst.to_scipy().nnz
        return (rng.integers(0, rel, nnz).astype(np.int32), rng.standard_normal((rel, fin, fout)).astype(np.float32),
                rng.standard_normal((inst.shape[1], fin)).astype(np.float32))

    def nt_in(inst, rng):
        return (rng.integers(0, rel, inst.shape[1]).astype(np.int32),
                rng.standard_normal((rel, fin, fout)).astype(np.float32),
                rng.standard_normal((inst.shape[1], fin)).astype(np.float32))

    def wt_in(inst, rng):
        return (rng.standard_normal(inst.to_scipy().nnz).astype(np.float32),
                rng.standard_normal((inst.shape[1], feat)).astype(np.float32))

    def qk_in(inst, rng):
        return (rng.standard_normal((inst.shape[0], heads, feat)).astype(np.float32),
                rng.standard_normal((inst.shape[1], heads, feat)).astype(np.float32))

    def gat_in(inst, rng):
        return (rng.standard_normal((inst.to_scipy().nnz, heads)).astype(np.float32),
                rng.standard_normal((inst.shape[1], heads, feat)).astype(np.float32))

    return [
        ("rgcn_homo", E.rgcn_homo, dict(rel=rel, fin=fin, fout=fout), rgcn_in, E.ref_rgcn, (0,)),
        ("rgcn_node_types", E.rgcn_node_types, dict(rel=rel, fin=fin, fout=fout), nt_in, E.ref_rgcn_node_types, ()),
        ("spmm_weighted", E.spmm_weighted, dict(feat=feat), wt_in, E.ref_spmm_weighted, (0,)),
        ("spmm_edge_only", E.spmm_edge_only, dict(feat=feat), wt_in, E.ref_spmm_edge_only, (0,)),
        ("sddmm_multihead", E.sddmm_multihead, dict(heads=heads, feat=feat), qk_in, E.ref_sddmm_multihead, ()),
        ("gat_aggregate", E.gat_aggregate, dict(heads=heads, feat=feat), gat_in, E.ref_gat_aggregate, (0,)),
    ]


def _torch_cuda(target: str):
    if target != "cuda":
        return None
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def _check(kernel, inst, args, ref, edge_pos, sparse_out, torch):
    """Worst error over the three ways of giving edge data (numpy, EdgeValues, CUDA tensors)."""
    errs = {}
    ways = {"numpy": list(args)}
    if edge_pos:
        ways["edge_values"] = [inst.edge_values(a) if n in edge_pos else a for n, a in enumerate(args)]
    if torch is not None:
        ways["torch_cuda"] = [torch.from_numpy(a).cuda() for a in args]
    for way, given in ways.items():
        out = kernel(inst, *given, poison=True)
        if torch is not None and isinstance(out, torch.Tensor):
            out = out.cpu().numpy()
        out = np.asarray(out)
        if sparse_out:
            pad = out[~inst.valid_slots()]
            if pad.size and not (pad == 0).all():
                errs[way] = float("inf")  # padding slots must hold 0
                continue
            out = inst.coordinate_values(out)
        errs[way] = max_rel_err(out, ref)
    return errs


def _refusal(kernel, inst, args):
    """An out-of-range edge type must be refused before launch (numpy and EdgeValues)."""
    bad = args[0].copy()
    if not bad.size:
        return True
    bad[bad.size // 2] = 99
    for given in (bad, inst.edge_values(bad)):
        try:
            kernel(inst, given, *args[1:])
        except ValueError as e:
            if "out of range" not in str(e):
                return False
        else:
            return False
    return True


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="cuda", help="cuda (default) or llvm")
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for check_edge_data.json")
    p.add_argument("--quick", action="store_true", help="the small matrix and csr/bsr:2x2/hyb only")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    torch = _torch_cuda(args.target)
    matrices = {"edge_cases": E.edge_matrix()}
    if not args.quick:
        matrices["powerlaw_600x500"] = _graph()
    formats = ("csr", "bsr:2x2", "hyb:1:1/2/4") if args.quick else FORMATS
    rows, failed = [], 0
    for name, make, params, inputs, reference, edge_pos in _cases():
        for spec in formats:
            for mname, m in matrices.items():
                row = {"op": name, "format": spec, "matrix": mname}
                try:
                    inst = convert(m, spec)
                    try:
                        kernel = sparsec.compile(make(), inst, target=args.target, **params)
                    except ValueError as e:  # a combination sparsec refuses by name (build.refuse_on_cuda)
                        if "is not supported on" not in str(e):
                            raise
                        row.update(ok=True, refused=str(e)[:300])
                        rows.append(row)
                        print(json.dumps(row), flush=True)
                        continue
                    given = inputs(inst, np.random.default_rng(0))
                    ref = reference(inst, *given)
                    sparse_out = any(p.sparse for p in kernel.outputs)
                    row["errors"] = _check(kernel, inst, given, ref, edge_pos, sparse_out, torch)
                    row["worst"] = max(row["errors"].values())
                    row["ok"] = row["worst"] <= TOL
                    if name == "rgcn_homo":
                        row["refuses_out_of_range"] = _refusal(kernel, inst, given)
                        row["ok"] = row["ok"] and row["refuses_out_of_range"]
                except Exception as e:  # noqa: BLE001 - a row per failure, the table goes on
                    row.update(ok=False, error=f"{type(e).__name__}: {str(e)[:300]}")
                failed += not row["ok"]
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(f"\n{'operator':18s} " + " ".join(f"{s[:14]:>14s}" for s in formats))
    for name, *_ in _cases():
        cells = []
        for spec in formats:
            rs = [r for r in rows if r["op"] == name and r["format"] == spec]
            if any("error" in r for r in rs):
                cells.append("FAIL(error)")
            elif all("refused" in r for r in rs):
                cells.append("refused")
            else:
                worst = max(r["worst"] for r in rs if "worst" in r)
                cells.append(f"{worst:.1e}" + ("" if all(r["ok"] for r in rs) else "!"))
        print(f"{name:18s} " + " ".join(f"{c:>14s}" for c in cells))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "check_edge_data.json"), "w") as f:
        json.dump({"target": args.target, "torch_cuda": torch is not None, "tolerance": TOL,
                   "seconds": time.perf_counter() - t0, "rows": rows}, f, indent=1)
    print(f"\n{len(rows) - failed}/{len(rows)} ok ({time.perf_counter() - t0:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
