"""Where the host time of an eager GNN training step goes (issue 27): per phase (zero_grad,
forward, loss, backward, optimizer step) and per op, for sparsec.torch and PyG's paths on one
graph, side by side in one process.

    python3 benchmarks/profile_train_step.py [--graph email-Enron] [--models GCN GraphSAGE]

Phase times: ``steps`` back-to-back steps, ``time.perf_counter`` at each phase boundary, no
synchronisation inside (the host's share of each phase; kernels run asynchronously), median
over steps. Ops: ``torch.profiler`` over one step (CPU activity; the kernel-launch count
from the CUDA runtime calls it records). Writes DIR/train_step_profile.json; a table last.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

import _preamble  # noqa: F401

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

PHASES = ("zero_grad", "forward", "loss", "backward", "step")


def phase_times(torch, model_call, params, labels, steps: int):
    """Median host time of each phase over ``steps`` back-to-back steps (ms)."""
    opt = torch.optim.SGD(params, lr=1e-3)
    rows = []
    for _ in range(steps + 5):
        t = [time.perf_counter()]
        opt.zero_grad()
        t.append(time.perf_counter())
        out = model_call()
        t.append(time.perf_counter())
        loss = torch.nn.functional.cross_entropy(out, labels)
        t.append(time.perf_counter())
        loss.backward()
        t.append(time.perf_counter())
        opt.step()
        t.append(time.perf_counter())
        rows.append(np.diff(t))
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    med = np.median(np.array(rows[5:]), axis=0) * 1e3
    return dict(zip(PHASES, map(float, med)))


def op_profile(torch, model_call, params, labels, top: int):
    from torch.profiler import ProfilerActivity, profile

    opt = torch.optim.SGD(params, lr=1e-3)

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model_call(), labels).backward()
        opt.step()

    for _ in range(3):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    avg = prof.key_averages()
    launches = sum(e.count for e in avg if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx",
                                                     "cudaLaunchKernelExC"))
    ops = sorted(({"op": e.key, "count": e.count, "self_cpu_us": e.self_cpu_time_total} for e in avg),
                 key=lambda r: -r["self_cpu_us"])
    return {"launches": launches, "top_ops": ops[:top]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", default="email-Enron")
    ap.add_argument("--models", nargs="*", default=["GCN", "GraphSAGE"])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    import torch

    import gnn_peers as gp
    import sparsec.torch as st
    from gnn_train import copy_weights, pyg_models, sparsec_model
    from gnn import build_models

    device = "cuda" if torch.cuda.is_available() else "cpu"
    adj = gp.load_graph(args.graph)
    n = adj.shape[0]
    x, labels = gp.node_inputs(torch, n, 128, 16, device)
    ei = torch.from_numpy(gp.edge_index(adj)).to(device)
    adj_t = gp.torch_csr(torch, adj, device)
    GCN, SAGE = build_models(torch, st, 128, 64, 16)
    PGCN, PSAGE = pyg_models(torch, 128, 64, 16)
    LGCN, LSAGE = (sparsec_model(torch, layer, 128, 64, 16) for layer in (st.GCNConv, st.SAGEConv))
    results = []
    for mname in args.models:
        cls, lcls, pcls, mat = ((GCN, LGCN, PGCN, st.gcn_norm(adj)) if mname == "GCN" else
                                (SAGE, LSAGE, PSAGE, st.mean_adjacency(adj)))
        A = st.SparseTensor(mat, "auto", feat=64, device=device)
        composed = cls().to(device)
        pyg = {k: pcls().to(device) for k in ("pyg_edge_index", "pyg_adj_t")}
        for m in pyg.values():
            copy_weights(torch, mname, composed, m)
        ours = lcls().to(device).load_pyg(pyg["pyg_edge_index"])
        calls = {"sparsec": (ours, lambda: ours(x, A)),
                 "sparsec_composed": (composed, lambda: composed(st.spmm, A, x)),
                 "pyg_edge_index": (pyg["pyg_edge_index"], lambda: pyg["pyg_edge_index"](x, ei)),
                 "pyg_adj_t": (pyg["pyg_adj_t"], lambda: pyg["pyg_adj_t"](x, adj_t))}
        for k, (mod, call) in calls.items():
            rec = {"graph": args.graph, "model": mname, "contestant": k,
                   "phases_ms": phase_times(torch, call, list(mod.parameters()), labels, args.steps)}
            rec.update(op_profile(torch, call, list(mod.parameters()), labels, args.top))
            results.append(rec)
            print(json.dumps(rec), flush=True)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "train_step_profile.json"), "w") as f:
        json.dump({"device": name, "method": "phases: median host time over back-to-back steps, no sync inside; "
                   "ops: torch.profiler CPU activity over one step", "rows": results}, f, indent=1)
    print(f"\n{name}, {args.graph}: host ms per phase")
    print(f"{'model':<10} {'contestant':<15} " + " ".join(f"{p:>9}" for p in PHASES) + f" {'total':>7} {'launches':>8}")
    for r in results:
        ph = r["phases_ms"]
        print(f"{r['model']:<10} {r['contestant']:<15} " + " ".join(f"{ph[p]:>9.3f}" for p in PHASES)
              + f" {sum(ph.values()):>7.3f} {r['launches']:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
