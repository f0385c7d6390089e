#!/usr/bin/env python3
"""A two-layer GAT (64 -> 64 -> 16; 4 heads concatenated in layer 1, 1 head in layer 2) with
sparsec (``sparsec.torch.GATConv``: each layer's aggregation one operator, ``ops.gat``, its
backward pass two more, ``ops.gat_grad_rows`` and ``ops.gat_grad_cols``) and
with PyG's ``GATConv`` on the same weights: outputs and gradients checked against PyG's, then
forward (no grad) and one training step (forward, cross-entropy, backward, SGD) timed for both.

    python examples/gat.py                         # mdual, rmat-s18 and the cached graph-tool graphs
    python examples/gat.py --graph power-grid      # the embedded graph: works on a fresh machine
    python examples/gat.py --out benchmarks/results

Graphs and PyG's layers come from ``examples/gnn_peers.py`` (the peers every GNN example and
``benchmarks/time_gnn_peers.py`` share): symmetrised, no self-loops; both models add one
self-loop per node (PyG inside GATConv, sparsec in ``gat_graph``). ``edge_index = [j, i]``.
Timing: ``sparsec.measure.Timer``, the median of CUDA-event samples after a warm-up, eager
(every call's host cost included, as PyG is timed in gnn_peers_H200.json; ``--timing graph``
replays CUDA graphs where a model captures). On a machine without a GPU it runs on the CPU
(a smoke test: the timings mean little there).

Writes ``gnn_ops_<gpu>.json`` to ``--out``, merged into an existing file: rows of other models
(RGCN) and of graphs not run now are kept, this run's GAT rows replace older ones.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
import gnn_peers as gp  # noqa: E402

GRAPH_TOOL = ("email-Enron", "pgp-strong-2009", "cond-mat-2005", "astro-ph", "as-22july06")
MODEL = "GAT"


def default_graphs():
    """mdual and R-MAT s18 (generated and cached on first use), the graph-tool graphs of
    ../shared/DATA.md found in the cache; the embedded power grid when none is there."""
    names = [n for n in ("mdual",) + GRAPH_TOOL if (gp.CACHE / f"{n}.npz").exists()]
    names.insert(min(1, len(names)), "rmat-s18")
    return names


def load(name: str) -> sp.csr_matrix:
    if name == "tiny":  # the test suite's smoke run: 300 nodes, seconds on a CPU
        rng = np.random.default_rng(0)
        m = sp.random(300, 300, density=0.02, format="csr", random_state=rng)
        m = ((m + m.T) > 0).astype(np.float32).tocsr()
        m.setdiag(0)
        m.eliminate_zeros()
        m.sort_indices()
        return m
    return gp.load_graph(name)


def models(torch, st, n_in, hidden, classes, heads, heads2):
    """(sparsec model, PyG model) of the same shape; the sparsec one gets PyG's weights."""
    from torch_geometric.nn import GATConv

    for w, h in ((hidden, heads), (classes, heads2)):
        if w % h:
            raise SystemExit(f"width {w} should be a multiple of its layer's heads ({h})")

    class PyG(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l1 = GATConv(n_in, hidden // heads, heads=heads)
            self.l2 = GATConv(hidden, classes // heads2, heads=heads2)

        def forward(self, x, g):
            return self.l2(torch.relu(self.l1(x, g["edge_index"])), g["edge_index"])

    class Sparsec(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l1 = st.GATConv(n_in, hidden // heads, heads=heads)
            self.l2 = st.GATConv(hidden, classes // heads2, heads=heads2)

        def forward(self, x, A):
            return self.l2(A, torch.relu(self.l1(A, x)))

    theirs = PyG()
    ours = Sparsec()
    ours.l1.load_pyg(theirs.l1)
    ours.l2.load_pyg(theirs.l2)
    return ours, theirs


def grads(torch, model, x, g, labels):
    model.zero_grad(set_to_none=True)
    out = model(x, g)
    torch.nn.functional.cross_entropy(out, labels).backward()
    return out.detach(), [p.grad.detach().clone() for p in (model.l1.lin.weight, model.l1.att_src, model.l1.att_dst,
                                                             model.l1.bias, model.l2.lin.weight, model.l2.att_src,
                                                             model.l2.att_dst, model.l2.bias)]


def gat_launches(A, heads: int, feat: int, slope: float):
    """Kernel launches of one GAT layer on CUDA for A's format: (forward without grad, ``ops.gat``;
    training step: ``gat(stats=True)`` on A, then ``gat_grad_rows`` on A and ``gat_grad_cols``
    on A's transpose). Read from the kernels the run compiled."""
    import re

    from sparsec import ops
    from sparsec.torch_launch import compiled

    params = (("feat", feat), ("heads", heads))

    def count(op, key):
        k = compiled(op.name, key, "float32", params, "cuda")
        return len(set(re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", k.source())))

    train = (count(ops.gat(slope, stats=True), A.key) + count(ops.gat_grad_rows(slope), A.key)
             + count(ops.gat_grad_cols(slope), A.transpose[0]))
    return count(ops.gat(slope), A.key), train


def out_path(out_dir: str, device_name: str) -> Path:
    short = "cpu" if device_name == "cpu" else device_name.split()[-1]
    return Path(out_dir) / f"gnn_ops_{short}.json"


def merge(path: Path, device_name: str, rows, extra) -> dict:
    """The file at ``path`` with this run's rows: rows of other models, and of this model on
    graphs not run now, are kept."""
    old = json.loads(path.read_text()) if path.exists() else {}
    ran = {(r["model"], r["graph"]) for r in rows}
    kept = [r for r in old.get("rows", []) if (r.get("model"), r.get("graph")) not in ran]
    result = {**old, "device": device_name, "rows": kept + list(rows)}
    result.setdefault("models", {})[MODEL] = extra
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", nargs="*", default=None)
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--classes", type=int, default=16)
    ap.add_argument("--heads", type=int, default=4, help="heads of layer 1 (concatenated)")
    ap.add_argument("--heads2", type=int, default=1, help="heads of layer 2")
    ap.add_argument("--format", default="auto",
                    help="sparsec's format for the graph (csr, ell, bsr:RxC, hyb; auto: hyb for skewed degrees, "
                         "else csr: sparsec.torch_gnn.gat_format)")
    ap.add_argument("--timing", choices=("eager", "graph"), default="eager")
    ap.add_argument("--runs", type=int, default=50, help="timed calls at most per measurement")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)

    import torch

    import sparsec.torch as st
    from sparsec.bench.report import table, write_json
    from sparsec.measure import Timer
    from sparsec.reference import max_rel_err

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    timer = Timer(device, mode=args.timing, warmup_ms=30, budget_ms=300, max_reps=args.runs, min_reps=2,
                  batch=3 if device == "cuda" else 1)
    rows = []
    for gname in args.graph or default_graphs():
        t0 = time.perf_counter()
        adj = load(gname)
        n = adj.shape[0]
        x, labels = gp.node_inputs(torch, n, args.features, args.classes, device)
        ei = torch.from_numpy(gp.edge_index(adj)).to(device)
        t1 = time.perf_counter()
        A = st.gat_graph(ei, n, fmt=args.format, device=device)  # + self-loops, as PyG's GATConv
        setup_s = time.perf_counter() - t1
        torch.manual_seed(1)
        ours, theirs = (m.to(device) for m in models(torch, st, args.features, args.hidden, args.classes,
                                                      args.heads, args.heads2))
        graphs = {"ours": A, "theirs": {"edge_index": ei}}
        t1 = time.perf_counter()
        out_o, g_o = grads(torch, ours, x, A, labels)  # compiles sparsec's kernels for this graph
        compile_s = time.perf_counter() - t1
        out_t, g_t = grads(torch, theirs, x, graphs["theirs"], labels)
        row = {"graph": gname, "nodes": n, "edges": int(adj.nnz), "edges_with_self_loops": int(A.instance.to_scipy().nnz),
               "model": MODEL,
               "heads": [args.heads, args.heads2], "features": args.features, "hidden": args.hidden,
               "classes": args.classes, "format": A.format, "setup_s": setup_s, "compile_s": compile_s,
               "max_rel_err_out": max_rel_err(out_o, out_t),
               "max_rel_err_grad": max(max_rel_err(a, b) for a, b in zip(g_o, g_t))}
        for who, model in (("sparsec", ours), ("pyg", theirs)):
            fwd, step = gp.step_functions(torch, model, x, graphs["ours" if who == "sparsec" else "theirs"], labels)
            for what, fn in (("forward", fwd), ("train_step", step)):
                t = timer.measure([fn])
                row[f"{who}_{what}_ms"], row[f"{who}_{what}_method"] = t.median_ms, t.method
        row["forward_speedup"] = row["pyg_forward_ms"] / row["sparsec_forward_ms"]
        row["train_step_speedup"] = row["pyg_train_step_ms"] / row["sparsec_train_step_ms"]
        if device == "cuda":
            row["gat_launches_per_layer"], row["gat_train_launches_per_layer"] = gat_launches(
                A, args.heads, args.hidden // args.heads, ours.l1.negative_slope)
        row["prep_s"] = time.perf_counter() - t0
        rows.append(row)
        print(json.dumps(row), flush=True)
        del A, ours, theirs, graphs
        if device == "cuda":
            torch.cuda.empty_cache()
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    paths = gp.pyg_paths()
    path = out_path(args.out, name)
    os.makedirs(path.parent, exist_ok=True)
    write_json(merge(path, name, rows, {"pyg_paths": paths, "timing": args.timing,
                                        "layers": f"GATConv({args.features}, {args.hidden // args.heads}, "
                                                  f"heads={args.heads}) -> ReLU -> GATConv({args.hidden}, "
                                                  f"{args.classes // args.heads2}, heads={args.heads2})"}), str(path))
    print(f"device: {name}; PyG backends: {paths}; wrote {path}")
    print(table([("graph", lambda r: r["graph"]), ("edges:", lambda r: f"{r['edges']:,}"),
                 ("sparsec fwd ms:", lambda r: f"{r['sparsec_forward_ms']:.3f}"),
                 ("PyG fwd ms:", lambda r: f"{r['pyg_forward_ms']:.3f}"),
                 ("fwd x:", lambda r: f"{r['forward_speedup']:.2f}"),
                 ("sparsec step ms:", lambda r: f"{r['sparsec_train_step_ms']:.3f}"),
                 ("PyG step ms:", lambda r: f"{r['pyg_train_step_ms']:.3f}"),
                 ("step x:", lambda r: f"{r['train_step_speedup']:.2f}"),
                 ("out err:", lambda r: f"{r['max_rel_err_out']:.1e}"),
                 ("grad err:", lambda r: f"{r['max_rel_err_grad']:.1e}")], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
