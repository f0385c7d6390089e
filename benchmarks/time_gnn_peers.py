#!/usr/bin/env python3
"""The numbers sparsec's relational and attention GNN operators have to beat: PyG's
RGCNConv and FastRGCNConv, RGCN as a per-relation torch.sparse loop, and PyG's GATConv,
each as a two-layer model (layer -> ReLU -> layer), forward and one training step.

    python3 benchmarks/time_gnn_peers.py [--graph mdual rmat-s18] [--relations 4 16 64] [--out DIR]

Relations are drawn per edge with a fixed seed (``examples/gnn_peers.RELATION_SEED``).
Every RGCN peer gets the same weights, and their outputs are checked against the first's
(``rel err``: they compute the same function).
Forward is timed from CUDA-graph replays where the peer can be captured, else eagerly (the
JSON says which); training steps eagerly. A peer that runs out of memory (FastRGCNConv
materialises one weight matrix per edge) is recorded as such. Prints a table last and
writes ``gnn_peers.json`` to --out, with the PyG backend paths found.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

import _preamble  # noqa: F401  (checkout root and benchmarks/data on sys.path)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
import gnn_peers as gp  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", nargs="*", default=["mdual", "rmat-s18", "email-Enron", "as-22july06"])
    ap.add_argument("--relations", nargs="*", type=int, default=[4, 16, 64])
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--classes", type=int, default=16)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)

    import torch

    from sparsec.bench.report import finish
    from sparsec.measure import Timer
    from sparsec.reference import max_rel_err

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    timer = Timer(device, mode="graph", warmup_ms=30, budget_ms=300, max_reps=30, batch=3)
    rows = []
    for gname in args.graph:
        t0 = time.perf_counter()
        adj = gp.load_graph(gname)
        n = adj.shape[0]
        x, labels = gp.node_inputs(torch, n, args.features, args.classes, device)
        print(f"# {gname}: {n:,} nodes, {adj.nnz:,} edges ({time.perf_counter() - t0:.1f} s)", flush=True)
        cases = [("RGCN", r) for r in args.relations] + [("GAT", args.heads)]
        for model_name, k in cases:
            if model_name == "RGCN":
                etype = gp.draw_relations(adj, k)
                g = gp.rgcn_graph(torch, adj, etype, k, device)
                layers = gp.rgcn_layers(torch, k)
            else:
                g = {"edge_index": torch.from_numpy(gp.edge_index(adj)).to(device)}
                layers = {"pyg_GATConv": gp.gat_layer(torch, k)}
            outs = {}
            first = None
            for peer, cls in layers.items():
                row = {"graph": gname, "nodes": n, "edges": int(adj.nnz), "model": model_name,
                       "relations" if model_name == "RGCN" else "heads": k, "peer": peer,
                       "features": args.features, "hidden": args.hidden, "classes": args.classes}
                try:
                    torch.manual_seed(1)
                    model = gp.two_layer(torch, cls, args.features, args.hidden, args.classes)().to(device)
                    if model_name == "RGCN":  # every peer starts from the first one's weights
                        if first is None:
                            first = [tuple(t.detach().clone() for t in gp.rgcn_weights(layer))
                                     for layer in (model.l1, model.l2)]
                        for layer, weights in zip((model.l1, model.l2), first):
                            gp.set_rgcn_weights(torch, layer, weights)
                    fwd, step = gp.step_functions(torch, model, x, g, labels)
                    outs[peer] = fwd().double()
                    for what, fn in (("forward", fwd), ("train_step", step)):
                        t = timer.measure([fn])
                        row[f"{what}_ms"], row[f"{what}_method"] = t.median_ms, t.method
                except torch.OutOfMemoryError as e:
                    row["error"] = f"out of memory: {str(e).splitlines()[0]}"
                    torch.cuda.empty_cache()
                if peer in outs and len(outs) > 1:
                    row["rel_err_vs_first"] = max_rel_err(outs[peer], next(iter(outs.values())))
                rows.append(row)
                print(json.dumps(row), flush=True)
                model = fwd = step = None  # free the peer's memory before the next one
            del g
            if device == "cuda":
                torch.cuda.empty_cache()
    fastest = {}
    for r in rows:
        key = (r["graph"], r["model"], r.get("relations", r.get("heads")))
        if "forward_ms" in r:
            f = fastest.setdefault(key, {"forward_ms": np.inf, "train_step_ms": np.inf})
            f["forward_ms"] = min(f["forward_ms"], r["forward_ms"])
            f["train_step_ms"] = min(f["train_step_ms"], r["train_step_ms"])
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "gnn_peers.json")
    columns = [("graph", lambda r: r["graph"]), ("model", lambda r: r["model"]),
               ("R / heads:", lambda r: r.get("relations", r.get("heads"))), ("peer", lambda r: r["peer"]),
               ("forward ms:", lambda r: f"{r['forward_ms']:.3f}" if "forward_ms" in r else r.get("error", "")[:30]),
               ("how", lambda r: r.get("forward_method", "")),
               ("train step ms:", lambda r: f"{r['train_step_ms']:.3f}" if "train_step_ms" in r else ""),
               ("rel err:", lambda r: f"{r['rel_err_vs_first']:.1e}" if "rel_err_vs_first" in r else "")]
    finish(rows, columns, device, path, note=f"; PyG backends: {gp.pyg_paths()}")
    with open(path) as f:
        result = json.load(f)
    result["pyg_paths"] = gp.pyg_paths()
    result["fastest"] = [{"graph": k[0], "model": k[1], "k": k[2], **v} for k, v in fastest.items()]
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
