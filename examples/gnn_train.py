#!/usr/bin/env python3
"""GNN training steps in eager PyTorch and captured as a CUDA graph: sparsec.torch against
PyG (its ``edge_index`` path and its ``adj_t`` path on a torch sparse CSR tensor) and
``torch.sparse.mm``, the same two-layer GCN and GraphSAGE (same weights, outputs checked
against each other), and GAT against PyG's GATConv (``edge_index``; 4 heads, then 1, as
``examples/gat.py``), side by side in one run.

    python examples/gnn_train.py                               # GPU host: the default graphs
    python examples/gnn_train.py --graph karate --steps 20     # any machine (CPU: correctness)

Per (graph, model, contestant), each named in its record's ``method`` fields and never mixed
within one ratio:
  * ``eager_ms``: wall time per step of ``steps`` back-to-back eager steps (``zero_grad()``
    with PyTorch's default ``set_to_none=True``, forward, cross-entropy, backward, SGD), one
    synchronisation at the end, best of ``--rounds`` rounds, the contestants' rounds
    interleaved (the host's load drifts within a run);
  * ``host_ms``: the median time a step's Python call takes to return when the GPU starts
    idle (the host's share: kernels run asynchronously);
  * ``captured_ms`` (sparsec): a whole step captured once with ``torch.cuda.graph`` (after a
    warm-up on a side stream) and replayed, CUDA events around ``steps`` replays.
sparsec's model is two of its layers (``sparsec.torch.GCNConv``, ``SAGEConv``: one autograd
node each); torch.sparse's the same function composed of Linear, ``torch.sparse.mm`` and bias
(``examples/gnn.py``). PyG's GCNConv runs with ``cached=True`` (its normalisation once, as
sparsec's A_hat) and SAGEConv with mean aggregation. Results: ``--out`` JSON (``benchmarks/results/gnn_train_<gpu>.json``);
a table last.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))
DEFAULT_GRAPHS = ["email-Enron", "as-22july06", "cond-mat-2005", "mdual", "rmat-s16", "rmat-s18", "rmat-1M-30M"]


def pyg_models(torch, n_in, hidden, classes):
    """(GCN, SAGE) on PyG's layers, ``forward(x, graph)`` with graph an edge_index or an adj_t."""
    from torch_geometric.nn import GCNConv, SAGEConv

    class GCN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = GCNConv(n_in, hidden, cached=True), GCNConv(hidden, classes, cached=True)

        def forward(self, x, g):
            return self.c2(torch.relu(self.c1(x, g)), g)

    class SAGE(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = SAGEConv(n_in, hidden, aggr="mean"), SAGEConv(hidden, classes, aggr="mean")

        def forward(self, x, g):
            return self.c2(torch.relu(self.c1(x, g)), g)

    return GCN, SAGE


def sparsec_model(torch, layer, n_in, hidden, classes):
    """Two of sparsec.torch's layers (``GCNConv`` or ``SAGEConv``: one autograd node each) with a
    ReLU between, ``forward(x, A)``."""

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = layer(n_in, hidden), layer(hidden, classes)

        def forward(self, x, a):
            return self.c2(a, torch.relu(self.c1(a, x)))

        def load_pyg(self, pyg):
            """The weights of a model of :func:`pyg_models` (its layers ``c1``, ``c2``)."""
            self.c1.load_pyg(pyg.c1)
            self.c2.load_pyg(pyg.c2)
            return self

    return Model


def copy_weights(torch, mname, ours, pyg):
    """PyG's layers given the weights of gnn.py's models (same function, other parameter names)."""
    with torch.no_grad():
        if mname == "GCN":
            for conv, w, b in ((pyg.c1, ours.w1, ours.b1), (pyg.c2, ours.w2, ours.b2)):
                conv.lin.weight.copy_(w.weight)
                conv.bias.copy_(b)
        else:  # SAGEConv: lin_l (with the bias) on the neighbour mean, lin_r on the node itself
            for conv, own, neigh in ((pyg.c1, ours.self1, ours.neigh1), (pyg.c2, ours.self2, ours.neigh2)):
                conv.lin_l.weight.copy_(neigh.weight)
                conv.lin_l.bias.copy_(own.bias)
                conv.lin_r.weight.copy_(own.weight)


def host_ms(step, steps, sync) -> float:
    times = []
    for _ in range(steps):
        sync()
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    sync()
    return float(np.median(times)) * 1e3


def captured_ms(torch, step, steps) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / steps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", nargs="*", default=DEFAULT_GRAPHS)
    ap.add_argument("--features", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--classes", type=int, default=16)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=11, help="eager timing rounds, interleaved across contestants")
    ap.add_argument("--models", nargs="*", default=["GCN", "GraphSAGE", "GAT"])
    ap.add_argument("--out", help="write the results as JSON")
    args = ap.parse_args(argv)
    import torch

    import gnn_peers as gp
    import sparsec.torch as st
    from gat import models as gat_models
    from gnn import build_models
    from sparsec.measure import back_to_back_ms
    from sparsec.reference import max_rel_err

    device = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    torch.backends.cuda.matmul.allow_tf32 = False
    GCN, SAGE = build_models(torch, st, args.features, args.hidden, args.classes)
    LGCN, LSAGE = (sparsec_model(torch, layer, args.features, args.hidden, args.classes)
                   for layer in (st.GCNConv, st.SAGEConv))
    PGCN, PSAGE = pyg_models(torch, args.features, args.hidden, args.classes)
    rows = []
    for gname in args.graph:
        adj = gp.load_graph(gname)
        n = adj.shape[0]
        x, labels = gp.node_inputs(torch, n, args.features, args.classes, device)
        ei = torch.from_numpy(gp.edge_index(adj)).to(device)
        adj_t = gp.torch_csr(torch, adj, device)  # PyG's adj_t: row i lists the neighbours i aggregates
        for mname in args.models:
            if mname == "GAT":
                A = st.gat_graph(ei, n, device=device)  # + self-loops, as PyG's GATConv
                torch.manual_seed(1)
                ours_gat, pyg_gat = (m.to(device) for m in gat_models(torch, st, args.features, args.hidden,
                                                                       args.classes, 4, 1))
                a_sparsec = A
                params = {"sparsec": ours_gat, "pyg_edge_index": pyg_gat}
                calls = {"sparsec": lambda m=ours_gat: m(x, A),
                         "pyg_edge_index": lambda m=pyg_gat: m(x, {"edge_index": ei})}
            else:
                cls, lcls, pcls, mat = ((GCN, LGCN, PGCN, st.gcn_norm(adj)) if mname == "GCN" else
                                        (SAGE, LSAGE, PSAGE, st.mean_adjacency(adj)))
                a_sparsec = st.SparseTensor(mat, "auto", feat=args.hidden, device=device)
                a_torch = gp.torch_csr(torch, mat, device)
                torch.manual_seed(1)
                ours = {"torch.sparse": cls().to(device)}
                pyg = {k: pcls().to(device) for k in ("pyg_edge_index", "pyg_adj_t")}
                for m in pyg.values():
                    copy_weights(torch, mname, ours["torch.sparse"], m)
                ours["sparsec"] = lcls().to(device).load_pyg(pyg["pyg_edge_index"])
                params = {"sparsec": ours["sparsec"], "torch.sparse": ours["torch.sparse"], **pyg}
                calls = {"sparsec": lambda m=ours["sparsec"], a=a_sparsec: m(x, a),
                         "torch.sparse": lambda m=ours["torch.sparse"], a=a_torch: m(torch.sparse.mm, a, x),
                         "pyg_edge_index": lambda m=pyg["pyg_edge_index"]: m(x, ei),
                         "pyg_adj_t": lambda m=pyg["pyg_adj_t"]: m(x, adj_t)}
            with torch.no_grad():
                outs = {k: f().double() for k, f in calls.items()}
            row = {"graph": gname, "nodes": n, "edges": int(adj.nnz), "model": mname, "format": a_sparsec.format,
                   "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                   "max_rel_err_vs_sparsec": {k: max_rel_err(o, outs["sparsec"]) for k, o in outs.items()}}
            row["correct"] = all(e < 1e-4 for e in row["max_rel_err_vs_sparsec"].values())
            steps = {}
            for k, f in calls.items():
                opt = torch.optim.SGD(params[k].parameters(), lr=1e-3)

                def step(f=f, opt=opt):
                    opt.zero_grad()  # PyTorch's default, set_to_none=True; also inside the captured graph
                    torch.nn.functional.cross_entropy(f(), labels).backward()
                    opt.step()

                step()
                steps[k] = step
            # rounds interleaved across contestants, best round each: the host's load drifts
            # over a run, and every contestant then sees the same drift
            for k in steps:
                row[f"{k}_eager_ms"] = float("inf")
            for _ in range(args.rounds):
                for k, step in steps.items():
                    row[f"{k}_eager_ms"] = min(row[f"{k}_eager_ms"], back_to_back_ms(step, args.steps, 1, sync))
            for k, step in steps.items():
                row[f"{k}_host_ms"] = host_ms(step, min(args.steps, 20), sync)
                if k == "sparsec" and device == "cuda":
                    row["sparsec_captured_ms"] = captured_ms(torch, step, args.steps)
            best_pyg = min(row[f"{k}_eager_ms"] for k in calls if k.startswith("pyg"))
            row["eager_speedup_vs_pyg_best"] = best_pyg / row["sparsec_eager_ms"]
            if "sparsec_captured_ms" in row:
                row["captured_speedup_vs_pyg_best_eager"] = best_pyg / row["sparsec_captured_ms"]
            row["methods"] = {"eager_ms": f"wall per step, {args.steps} back-to-back steps (zero_grad set_to_none), "
                                          f"best of {args.rounds} rounds interleaved across contestants",
                              "host_ms": "median return time of one step's call, GPU idle before it",
                              "captured_ms": f"CUDA events around {args.steps} graph replays"}
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.out:  # after every record: a run cut short keeps what it measured
                with open(args.out, "w") as fh:
                    json.dump({"device": rows[0]["device"], "command": "python3 examples/gnn_train.py "
                               + " ".join(sys.argv[1:]), "rows": rows}, fh, indent=1)
    print(f"\n{rows[0]['device'] if rows else device}")
    print(f"{'graph':<14} {'model':<9} {'nodes':>8} {'sparsec eager':>13} {'captured':>9} {'pyg ei':>8} "
          f"{'pyg adj_t':>9} {'torch.sp':>8} {'eager x':>8} {'capt x':>7} ok")
    def ms(r, k):
        v = r.get(k)
        return "-" if v is None else f"{v:.3f}"

    for r in rows:
        print(f"{r['graph']:<14} {r['model']:<9} {r['nodes']:>8} {ms(r, 'sparsec_eager_ms'):>13} "
              f"{ms(r, 'sparsec_captured_ms'):>9} {ms(r, 'pyg_edge_index_eager_ms'):>8} "
              f"{ms(r, 'pyg_adj_t_eager_ms'):>9} {ms(r, 'torch.sparse_eager_ms'):>8} "
              f"{r['eager_speedup_vs_pyg_best']:>8.2f} {r.get('captured_speedup_vs_pyg_best_eager', float('nan')):>7.2f} "
              f"{r['correct']}")
    return 0 if all(r["correct"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
