"""A whole GCN or GraphSAGE training step (forward, backward, optimizer step) with sparsec.torch ops inside,
captured once as a CUDA graph and replayed (issue 27's captured path), against the same
steps run eagerly on a copy of the model: parameters after each of several steps must
match, and the step's device time is reported both ways.

    python3 benchmarks/check_captured_training.py [--graph karate power-grid mdual] [--models GCN GraphSAGE] [--steps 5]

The recipe (README, "PyTorch"): run a few eager steps on a side stream first (kernels
compile, per-matrix caches fill), then capture ``zero_grad; loss.backward(); opt.step()``
with ``torch.cuda.graph`` on static input tensors, and replay. sparsec launches on torch's
current stream, and its outputs are torch allocations, so the graph records them like any
op. Writes DIR/captured_training.json; exits 1 on a mismatch.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys


import _preamble  # noqa: F401

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))


def model_and_data(torch, st, adj, model="GCN", features=128, hidden=64, classes=16, device="cuda"):
    """Two sparsec layers (``GCNConv`` on A_hat, or ``SAGEConv`` on the mean adjacency) with a
    ReLU between, and fixed random inputs and labels."""
    layer, mat = (st.GCNConv, st.gcn_norm(adj)) if model == "GCN" else (st.SAGEConv, st.mean_adjacency(adj))
    a = st.SparseTensor(mat, "auto", device=device, feat=hidden)
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(adj.shape[0], features, generator=g).to(device)
    y = torch.randint(0, classes, (adj.shape[0],), generator=g).to(device)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = layer(features, hidden), layer(hidden, classes)

        def forward(self, x):
            return self.c2(a, torch.relu(self.c1(a, x)))

    torch.manual_seed(0)
    return Net().to(device), x, y


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", nargs="*", default=["karate", "power-grid", "mdual"])
    ap.add_argument("--models", nargs="*", default=["GCN", "GraphSAGE"])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("needs a CUDA GPU (CUDA graphs)")
        return 0
    import gnn_peers as gp
    import sparsec.torch as st

    rows = []
    for gname, mname in ((g, m) for g in args.graph for m in args.models):
        adj = gp.load_graph(gname)
        model, x, y = model_and_data(torch, st, adj, mname)
        eager = copy.deepcopy(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
        loss_fn = torch.nn.functional.cross_entropy

        def step(m, o):
            o.zero_grad(set_to_none=False)
            loss = loss_fn(m(x), y)
            loss.backward()
            o.step()
            return loss

        # warm-up on a side stream (compiles kernels, fills caches); the eager copy takes the same steps
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step(model, opt)
                step(eager, opt_e)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_loss = step(model, opt)
        # capture ran nothing: both models are where the warm-up left them
        worst = 0.0
        for _ in range(args.steps):
            graph.replay()
            step(eager, opt_e)
            torch.cuda.synchronize()
            worst = max(worst, max(float((p - q).abs().max() / q.abs().max().clamp_min(1e-30))
                                   for p, q in zip(model.parameters(), eager.parameters())))
        times = {}
        for name, fn in (("captured", graph.replay), ("eager", lambda: step(eager, opt_e))):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
            start.record()
            for _ in range(50):
                fn()
            end.record()
            torch.cuda.synchronize()
            times[name] = start.elapsed_time(end) / 50
        row = {"graph": gname, "model": mname, "nodes": adj.shape[0], "edges": int(adj.nnz), "steps_compared": args.steps,
               "max_rel_param_diff": worst, "ok": worst <= 1e-4, "loss": float(static_loss),
               "captured_step_ms": times["captured"], "eager_step_ms": times["eager"],
               "method": "CUDA events around 50 back-to-back steps (captured: graph replays; eager: Python steps)"}
        rows.append(row)
        print(json.dumps(row), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "captured_training.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    print(f"\n{torch.cuda.get_device_name()}")
    print(f"{'graph':<12} {'model':<10} {'nodes':>8} {'eager ms':>9} {'captured ms':>12} {'speedup':>8}  params")
    for r in rows:
        print(f"{r['graph']:<12} {r['model']:<10} {r['nodes']:>8} {r['eager_step_ms']:>9.3f} {r['captured_step_ms']:>12.3f} "
              f"{r['eager_step_ms'] / r['captured_step_ms']:>8.2f}  {'match' if r['ok'] else 'DIFFER'}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
