#!/usr/bin/env python3
"""Two-layer GCN and GraphSAGE with sparsec's SpMM (``sparsec.torch``) against the same
models on ``torch.sparse.mm`` (cuSPARSE): same weights, outputs and gradients checked
against each other, then inference and one training step (forward, cross-entropy,
backward, SGD) timed side by side.

    python examples/gnn.py                        # the largest cached real graph and R-MAT s18
    python examples/gnn.py --graph mdual --hidden 64 --out gnn.json

Graphs come from ``benchmarks/data/cache`` (``benchmarks/data/fetch.py`` and
``suites.py`` put them there); without them the embedded power-grid matrix is used.
On a machine without a GPU it runs on the CPU (correctness only: the timings are not
meaningful there). Timing: ``sparsec.measure.Timer``, median after warm-up, by
default of CUDA-graph replays (device time; ``--timing eager`` adds every call's host cost).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CACHE = ROOT / "benchmarks" / "data" / "cache"


def graphs(names):
    """[(name, symmetric adjacency CSR)]: the named cached graphs, or by default the largest
    real graph in the cache and R-MAT s18."""
    from sparsec.datasets import default_matrix, load_npz

    cached = {p.stem: p for p in CACHE.glob("*.npz")}
    if not names:
        real = [n for n in cached if not n.startswith("rmat-")]
        names = [max(real, key=lambda n: load_npz(cached[n]).nnz)] if real else []
        names += ["rmat-s18"] if "rmat-s18" in cached else []
    out = []
    for n in names:
        m = load_npz(cached[n]) if n in cached else (default_matrix() if n == "power-grid" else None)
        if m is None:
            raise SystemExit(f"no graph {n!r} in {CACHE} (run benchmarks/data/fetch.py / suites.py)")
        m = sp.csr_matrix((np.ones(m.nnz, np.float32), m.indices, m.indptr), shape=m.shape)
        out.append((n, ((m + m.T) > 0).astype(np.float32).tocsr()))
    return out or [("power-grid", default_matrix())]


def build_models(torch, st, n_in, hidden, classes):
    """(GCN, SAGE) model classes parameterised by an ``aggregate(a, x)`` function."""

    class GCN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w1 = torch.nn.Linear(n_in, hidden, bias=False)
            self.w2 = torch.nn.Linear(hidden, classes, bias=False)
            self.b1, self.b2 = torch.nn.Parameter(torch.zeros(hidden)), torch.nn.Parameter(torch.zeros(classes))

        def forward(self, agg, a, x):
            h = torch.relu(agg(a, self.w1(x)) + self.b1)
            return agg(a, self.w2(h)) + self.b2

    class SAGE(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.self1, self.neigh1 = torch.nn.Linear(n_in, hidden), torch.nn.Linear(n_in, hidden, bias=False)
            self.self2, self.neigh2 = torch.nn.Linear(hidden, classes), torch.nn.Linear(hidden, classes, bias=False)

        def forward(self, agg, a, x):  # mean of neighbours, projected after aggregation (as PyG's SAGEConv)
            h = torch.relu(self.self1(x) + self.neigh1(agg(a, x)))
            return self.self2(h) + self.neigh2(agg(a, h))

    return GCN, SAGE


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graph", nargs="*", default=[], help="cached graph names (default: largest real + rmat-s18)")
    ap.add_argument("--features", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--classes", type=int, default=16)
    ap.add_argument("--timing", choices=("graph", "eager"), default="graph",
                    help="graph: device time of each call, replayed from a CUDA graph (falls back to eager "
                         "per contestant where capture fails; the JSON says which); eager: host costs included")
    ap.add_argument("--out", help="write the results as JSON")
    args = ap.parse_args()

    import torch

    import sparsec.torch as st
    from sparsec.bench.report import finish
    from sparsec.measure import Timer
    from sparsec.reference import max_rel_err

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 everywhere, as the sparse kernels compute
    timer = Timer(device, mode=args.timing, warmup_ms=50, budget_ms=400, max_reps=40, batch=5)
    GCN, SAGE = build_models(torch, st, args.features, args.hidden, args.classes)
    rows = []
    for gname, adj in graphs(args.graph):
        n = adj.shape[0]
        mats = {"GCN": st.gcn_norm(adj), "GraphSAGE": st.mean_adjacency(adj)}
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(n, args.features, generator=gen).to(device)
        labels = torch.randint(0, args.classes, (n,), generator=gen).to(device)
        for mname, cls in (("GCN", GCN), ("GraphSAGE", SAGE)):
            a = mats[mname]
            a_sparsec = st.SparseTensor(a, "auto", feat=args.hidden, device=device)  # csr or hyb by row skew
            a_torch = torch.sparse_csr_tensor(torch.from_numpy(a.indptr.astype(np.int64)),
                                              torch.from_numpy(a.indices.astype(np.int64)),
                                              torch.from_numpy(a.data), a.shape).to(device)
            contestants = {"sparsec": (st.spmm, a_sparsec), "torch.sparse": (torch.sparse.mm, a_torch)}
            torch.manual_seed(1)
            models = {k: cls().to(device) for k in contestants}
            models["torch.sparse"].load_state_dict(models["sparsec"].state_dict())
            row = {"graph": gname, "nodes": n, "edges": int(a.nnz), "model": mname, "format": a_sparsec.format,
                   "features": args.features, "hidden": args.hidden, "classes": args.classes}
            outs, grads = {}, {}
            for k, (agg, am) in contestants.items():
                model = models[k]
                out = model(agg, am, x)
                torch.nn.functional.cross_entropy(out, labels).backward()
                outs[k] = out.detach().double()
                grads[k] = [p.grad.detach().double() for p in model.parameters()]
            row["forward_rel_err"] = max_rel_err(outs["sparsec"], outs["torch.sparse"])
            row["grad_rel_err"] = max(max_rel_err(g1, g2) for g1, g2 in zip(grads["sparsec"], grads["torch.sparse"]))
            row["correct"] = row["forward_rel_err"] < 1e-4 and row["grad_rel_err"] < 1e-3
            for k, (agg, am) in contestants.items():
                model = models[k]
                opt = torch.optim.SGD(model.parameters(), lr=1e-3)

                def infer(model=model, agg=agg, am=am):
                    with torch.no_grad():
                        return model(agg, am, x)

                def train_step(model=model, agg=agg, am=am, opt=opt):
                    opt.zero_grad(set_to_none=True)
                    torch.nn.functional.cross_entropy(model(agg, am, x), labels).backward()
                    opt.step()

                for what, fn in (("forward", infer), ("train_step", train_step)):
                    t = timer.measure([fn])
                    row[f"{k}_{what}_ms"], row[f"{k}_{what}_method"] = t.median_ms, t.method
            row["forward_speedup"] = row["torch.sparse_forward_ms"] / row["sparsec_forward_ms"]
            row["train_step_speedup"] = row["torch.sparse_train_step_ms"] / row["sparsec_train_step_ms"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    columns = [("graph", lambda r: r["graph"]), ("model", lambda r: r["model"]),
               ("sparsec format", lambda r: r["format"].split("[")[0]), ("nodes:", lambda r: r["nodes"]),
               ("edges:", lambda r: r["edges"]),
               ("forward ms sparsec / torch.sparse",
                lambda r: f"{r['sparsec_forward_ms']:.3f} / {r['torch.sparse_forward_ms']:.3f}"),
               ("speedup:", lambda r: f"{r['forward_speedup']:.2f}x"),
               ("train step ms sparsec / torch.sparse",
                lambda r: f"{r['sparsec_train_step_ms']:.3f} / {r['torch.sparse_train_step_ms']:.3f}"),
               ("speedup:", lambda r: f"{r['train_step_speedup']:.2f}x"), ("correct", lambda r: r["correct"])]
    finish(rows, columns, device, args.out)


if __name__ == "__main__":
    main()
