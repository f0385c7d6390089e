"""Structures with an outer axis on the GPU: ``rgcn`` (relations above the rows, the segment
contraction schedule on CUDA) and ``batched_spmm`` (a batch of graphs) against float64
references, on NaN-poisoned outputs, over several formats of the stacked matrix.

    python3 benchmarks/check_axis_trees.py [--target cuda|llvm] [--out DIR]

Matrices: an edge-case graph (an empty row, a long row, explicit zeros, odd sizes) and a
2000-node power-law graph; relations drawn per entry, (fin, fout) in {(64, 64), (64, 16),
(8, 40), (8, 1), (16, 3)} (below 4 output columns a chunk holds more segments than a block has positions). The reference is sum_r A_r X W_r computed per relation with scipy (and, for the
batch, one SpMM per graph) -- independent of the stacked layout. Prints a table, writes
DIR/check_axis_trees.json, exits 1 on any failure.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import scipy.sparse as sp

import _preamble  # noqa: F401
import sparsec  # noqa: E402
from sparsec import ops  # noqa: E402
from sparsec.formats import convert, stack_rows, unstack_rows  # noqa: E402
from sparsec.reference import max_rel_err  # noqa: E402

FORMATS = ("csr", "hyb", "ell", "rell:4,dup")
TOL = 1e-4


def _edge_case(seed=0) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    n, m = 37, 37
    a = sp.random(n, m, density=0.12, random_state=seed, format="lil", dtype=np.float32)
    a[5, :] = 0  # an empty row
    a[7, :] = rng.standard_normal(m).astype(np.float32)  # a long (full) row
    a = sp.csr_matrix(a)
    a.eliminate_zeros()
    a.data[::9] = 0.0  # explicit zeros stay entries
    return a


def _power_law(n=2000, seed=1) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    lens = np.minimum(n, (rng.pareto(1.3, n) * 3).astype(int))
    rows = np.repeat(np.arange(n), lens)
    cols = np.concatenate([rng.choice(n, k, replace=False) for k in lens])
    return sp.csr_matrix((rng.standard_normal(rows.size).astype(np.float32), (rows, cols)), shape=(n, n))


def rgcn_reference(stacked: sp.csr_matrix, rel: int, X: np.ndarray, W: np.ndarray) -> np.ndarray:
    """sum_r A_r X W_r in float64, one scipy SpMM per relation (independent of the stacking)."""
    return sum(a.astype(np.float64) @ (X.astype(np.float64) @ W[r].astype(np.float64))
               for r, a in enumerate(unstack_rows(stacked, rel)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="cuda")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    rng = np.random.default_rng(22)
    rows = []
    for gname, adj in (("edge-case", _edge_case()), ("power-law-2000", _power_law())):
        for rel, fin, fout in ((3, 64, 64), (16, 64, 16), (5, 8, 40), (4, 8, 1), (6, 16, 3)):
            types = rng.integers(0, rel, adj.nnz)
            stacked = stack_rows(adj, types, rel).astype(np.float32)
            X = rng.standard_normal((adj.shape[1], fin)).astype(np.float32)
            W = rng.standard_normal((rel, fin, fout)).astype(np.float32)
            b = rng.standard_normal(fout).astype(np.float32)
            ref = rgcn_reference(stacked, rel, X, W)
            for fmt in FORMATS:
                for name, extra, expected in (("rgcn", (), ref), ("rgcn_bias", (b,), ref + b)):
                    row = {"op": name, "graph": gname, "rel": rel, "fin": fin, "fout": fout, "fmt": fmt}
                    try:
                        inst = convert(stacked, fmt)
                        k = sparsec.compile(name, inst, target=args.target, rel=rel, fin=fin, fout=fout)
                        row["launches"] = k.source().count("__global__") // 2 if args.target == "cuda" else None
                        row["segment_contract"] = "l__Zs" in k.source() if args.target == "cuda" else None
                        # three calls: a kernel must give the same answer every time it is called
                        # (nothing it leaves behind -- an output, a cached array -- may leak into the next)
                        row["err"] = max(max_rel_err(k(inst, X, W, *extra, poison=True), expected) for _ in range(3))
                    except Exception as e:  # noqa: BLE001 - reported per case
                        row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                    row["ok"] = row.get("err", np.inf) <= TOL
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        batch, feat = 3, 32
        mats = [sp.csr_matrix(adj[np.random.default_rng(b).permutation(adj.shape[0])]) for b in range(batch)]
        stacked = stack_rows(mats).astype(np.float32)
        X = rng.standard_normal((batch, adj.shape[1], feat)).astype(np.float32)
        ref = np.stack([m.astype(np.float64) @ X[b].astype(np.float64) for b, m in enumerate(mats)])
        for fmt in FORMATS:
            row = {"op": "batched_spmm", "graph": gname, "batch": batch, "feat": feat, "fmt": fmt}
            try:
                inst = convert(stacked, fmt)
                k = sparsec.compile(ops.batched_spmm(), inst, target=args.target, batch=batch, feat=feat)
                row["err"] = max_rel_err(k(inst, X, poison=True), ref)
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            row["ok"] = row.get("err", np.inf) <= TOL
            rows.append(row)
            print(json.dumps(row), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "check_axis_trees.json"), "w") as f:
        json.dump({"target": args.target, "rows": rows}, f, indent=1)
    print(f"\n{'op':13} {'graph':15} {'shape':12} {'fmt':11} {'result'}")
    for r in rows:
        shape = f"{r.get('rel', r.get('batch'))}x{r.get('fin', r.get('feat'))}x{r.get('fout', '')}"
        res = f"{r['err']:.1e}" if "err" in r else r["error"][:60]
        print(f"{r['op']:13} {r['graph']:15} {shape:12} {r['fmt']:11} {res} {'ok' if r['ok'] else 'WRONG'}")
    bad = sum(not r["ok"] for r in rows)
    print(f"{len(rows) - bad}/{len(rows)} ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
