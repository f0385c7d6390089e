"""RGCN with sparsec against PyG: outputs and gradients on the same weights, then forward and
training-step times, side by side in one run.

    python examples/rgcn.py --graph power-grid --relations 4        # any machine (CPU: llvm)
    python examples/rgcn.py                                         # GPU host: mdual, rmat-s18

The model is two layers (64 -> 64 -> 16, ReLU between) of PyG's RGCNConv semantics (mean per
relation, root weight, bias). sparsec's layer (``sparsec.torch_rgcn.RGCNConv``) is one
``rgcn`` launch per layer for all relations and the root term; the peers are PyG's
``RGCNConv`` and ``FastRGCNConv`` and a loop of ``torch.sparse.mm`` per relation
(``examples/gnn_peers.py``). Results go to ``<out>/gnn_ops.json`` (rows of other models kept).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import gnn_peers as gp  # noqa: E402


def sparsec_layer(torch, relations: int):
    from sparsec.torch_rgcn import RGCNConv

    class Sparsec(torch.nn.Module):
        def __init__(self, n_in, n_out):
            super().__init__()
            self.conv = RGCNConv(n_in, n_out, relations)

        def forward(self, x, g):
            return self.conv(g["sparsec"], x)

    return Sparsec


def merge_rows(path: str, model: str, rows: list, device: str) -> None:
    """Write ``rows`` into the JSON at ``path``, replacing that model's earlier rows only."""
    old = {}
    if os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
    kept = [r for r in old.get("rows", []) if r.get("model") != model]
    out = {**old, "device": device, "rows": kept + rows, "pyg_paths": gp.pyg_paths()}
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", nargs="*", default=["mdual", "rmat-s18"])
    ap.add_argument("--relations", nargs="*", type=int, default=[4, 16, 64])
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--classes", type=int, default=16)
    ap.add_argument("--fmt", default="csr", help="sparsec format of the stacked relations (csr, hyb, ell)")
    ap.add_argument("--peers", nargs="*", default=["pyg_RGCNConv", "pyg_FastRGCNConv", "torch_sparse_loop"])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)

    import torch

    from sparsec.measure import Timer
    from sparsec.reference import max_rel_err
    from sparsec.torch_rgcn import RelationalGraph

    device = "cuda" if torch.cuda.is_available() else "cpu"
    gpu = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    timer = Timer(device, mode="graph", warmup_ms=30, budget_ms=300, max_reps=30, batch=3)
    rows = []
    for gname in args.graph:
        adj = gp.load_graph(gname)
        n = adj.shape[0]
        x, labels = gp.node_inputs(torch, n, args.features, args.classes, device)
        print(f"# {gname}: {n:,} nodes, {adj.nnz:,} edges", flush=True)
        for R in args.relations:
            etype = gp.draw_relations(adj, R)
            g = gp.rgcn_graph(torch, adj, etype, R, device)
            t0 = time.perf_counter()
            g["sparsec"] = RelationalGraph(adj, etype, R, device=device, fmt=args.fmt)
            convert_s = time.perf_counter() - t0
            peers = gp.rgcn_layers(torch, R)
            layers = {"sparsec": sparsec_layer(torch, R), **{p: peers[p] for p in args.peers}}
            torch.manual_seed(1)
            ref_model = gp.two_layer(torch, layers["sparsec"], args.features, args.hidden, args.classes)().to(device)
            weights = [tuple(t.detach().clone() for t in gp.rgcn_weights(l.conv)) for l in (ref_model.l1, ref_model.l2)]
            results = {}
            for name, cls in layers.items():
                row = {"graph": gname, "nodes": n, "edges": int(adj.nnz), "model": "RGCN", "relations": R,
                       "impl": name, "features": args.features, "hidden": args.hidden, "classes": args.classes}
                if name == "sparsec":
                    row.update(fmt=args.fmt, convert_s=round(convert_s, 3))
                try:
                    model = gp.two_layer(torch, cls, args.features, args.hidden, args.classes)().to(device)
                    for layer, w in zip((model.l1, model.l2), weights):
                        gp.set_rgcn_weights(torch, layer.conv if name == "sparsec" else layer, w)
                    model.zero_grad()
                    out = model(x, g)
                    torch.nn.functional.cross_entropy(out, labels).backward()
                    grads = [p.grad.detach().double().clone() for p in
                             (model.l1.conv.weight, model.l1.conv.root, model.l2.conv.weight, model.l2.conv.root)] \
                        if name != "torch_sparse_loop" else None
                    results[name] = (out.detach().double(), grads)
                    fwd, step = gp.step_functions(torch, model, x, g, labels)
                    for what, fn in (("forward", fwd), ("train_step", step)):
                        t = timer.measure([fn])
                        row[f"{what}_ms"], row[f"{what}_method"] = t.median_ms, t.method
                except torch.OutOfMemoryError as e:
                    row["error"] = f"out of memory: {str(e).splitlines()[0]}"
                    torch.cuda.empty_cache()
                if name != "sparsec" and name in results:
                    row["out_err_vs_sparsec"] = max_rel_err(results["sparsec"][0], results[name][0])
                    if results[name][1] is not None:
                        row["grad_err_vs_sparsec"] = max(max_rel_err(a, b) for a, b in
                                                         zip(results["sparsec"][1], results[name][1]))
                rows.append(row)
                print(json.dumps(row), flush=True)
                model = None
            peer_rows = [r for r in rows[-len(layers):] if r["impl"] != "sparsec" and "forward_ms" in r]
            ours = rows[-len(layers)]
            if peer_rows and "forward_ms" in ours:
                best_f = min(r["forward_ms"] for r in peer_rows)
                best_t = min(r["train_step_ms"] for r in peer_rows)
                ours["speedup_forward_vs_fastest"] = best_f / ours["forward_ms"]
                ours["speedup_train_vs_fastest"] = best_t / ours["train_step_ms"]
            del g
            if device == "cuda":
                torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "gnn_ops.json")
    merge_rows(path, "RGCN", rows, gpu)
    print(f"\n{'graph':10} {'R':>3} {'impl':18} {'fwd ms':>8} {'train ms':>9} {'fwd x':>6} {'train x':>7} {'err':>8}")
    for r in rows:
        print(f"{r['graph']:10} {r['relations']:3d} {r['impl']:18} {r.get('forward_ms', float('nan')):8.3f} "
              f"{r.get('train_step_ms', float('nan')):9.3f} {r.get('speedup_forward_vs_fastest', float('nan')):6.2f} "
              f"{r.get('speedup_train_vs_fastest', float('nan')):7.2f} "
              f"{max(r.get('out_err_vs_sparsec', 0), r.get('grad_err_vs_sparsec', 0)):8.1e}")
    print(f"written {path} ({gpu})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
