#!/usr/bin/env python3
"""Per-kernel device time of a GNN model's forward pass and training step (GPU host): RGCN
and GAT with sparsec, and their fastest peers, so a slow model can be traced to its kernel.

    python3 benchmarks/profile_gnn.py --graph rmat-s18 --relations 16

Prints, per model and pass, the kernels by total device time (launches per call x mean us)
and writes $OUT/profile_gnn.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import _preamble  # noqa: F401,E402
sys.path.insert(0, str(_preamble.ROOT / "examples"))
from profile_kernels import kernel_times  # noqa: E402

import gnn_peers as gp  # noqa: E402


def rgcn_models(torch, adj, R: int, dims, device):
    import rgcn as ex
    from sparsec.torch_rgcn import RelationalGraph

    etype = gp.draw_relations(adj, R)
    g = gp.rgcn_graph(torch, adj, etype, R, device)
    g["sparsec"] = RelationalGraph(adj, etype, R, device=device)
    peers = gp.rgcn_layers(torch, R)
    out = {}
    for name, cls in (("sparsec", ex.sparsec_layer(torch, R)), ("torch_sparse_loop", peers["torch_sparse_loop"])):
        torch.manual_seed(1)
        out[f"RGCN/{name}"] = (gp.two_layer(torch, cls, *dims)().to(device), g)
    return out


def gat_models(torch, adj, dims, device):
    import gat as ex
    import sparsec.torch as st

    ei = torch.from_numpy(gp.edge_index(adj)).to(device)
    A = st.gat_graph(ei, adj.shape[0], device=device)
    torch.manual_seed(1)
    ours, theirs = (m.to(device) for m in ex.models(torch, st, dims[0], dims[1], dims[2], 4, 1))
    return {"GAT/sparsec": (ours, A), "GAT/pyg": (theirs, {"edge_index": ei})}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", nargs="*", default=["rmat-s18"])
    ap.add_argument("--relations", type=int, default=16)
    ap.add_argument("--models", nargs="*", default=["rgcn", "gat"])
    args = ap.parse_args(argv)
    import torch
    import tvm_ffi

    dims = (64, 64, 16)
    device = torch.device("cuda")
    results = []
    for gname in args.graph:
        adj = gp.load_graph(gname)
        n = adj.shape[0]
        x, labels = gp.node_inputs(torch, n, dims[0], dims[2], device)
        models = {}
        if "rgcn" in args.models:
            models.update(rgcn_models(torch, adj, args.relations, dims, device))
        if "gat" in args.models:
            models.update(gat_models(torch, adj, dims, device))
        for name, (model, g) in models.items():
            fwd, step = gp.step_functions(torch, model, x, g, labels)
            for what, fn in (("forward", fwd), ("train_step", step)):
                with tvm_ffi.use_torch_stream():
                    ks = kernel_times(fn, calls=10)
                total = sum(c * us for c, us in ks.values())
                results.append({"graph": gname, "model": name, "pass": what, "total_us": total,
                                "kernels": {k: {"per_call": c, "mean_us": us} for k, (c, us) in ks.items()}})
                print(f"\n{gname} {name} {what}: {total / 1e3:.3f} ms of kernels")
                for k, (c, us) in sorted(ks.items(), key=lambda kv: -kv[1][0] * kv[1][1])[:12]:
                    print(f"   {c:4.1f} x {us:9.1f} us  {k[:100]}")
    with open(os.path.join(os.environ.get("OUT", "."), "profile_gnn.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "cases": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
