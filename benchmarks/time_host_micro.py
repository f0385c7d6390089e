"""Host cost of the pieces an eager training step is made of (issue 27): one small CUDA op,
a matmul, an autograd node (built-in and a Python ``autograd.Function``), ``backward()`` on a
trivial graph, and sparsec.torch's SpMM forward and backward, on this host. Each: ``calls``
back-to-back calls, one synchronisation, best of ``repeat`` rounds (``back_to_back_ms``).

    python3 benchmarks/time_host_micro.py [--calls 500]

Writes DIR/host_micro.json; a table last.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading


import _preamble  # noqa: F401

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--graph", default="power-grid")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    import torch

    import gnn_peers as gp
    import sparsec.torch as st
    from sparsec.bench.report import finish
    from sparsec.measure import back_to_back_ms

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    adj = gp.load_graph(args.graph)
    n = adj.shape[0]
    A = st.SparseTensor(st.gcn_norm(adj), "csr", device=dev)
    a, b = torch.randn(n, 16, device=dev), torch.randn(n, 16, device=dev)
    w = torch.randn(16, 16, device=dev)
    xg = torch.randn(n, 16, device=dev, requires_grad=True)

    class Identity(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            return g

    class SpMMInBackward(torch.autograd.Function):  # identity forward; backward = one eager SpMM on A
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            return st.spmm(A, g)

    def chain(k, fn):
        def run():
            y = xg
            for _ in range(k):
                y = fn(y)
            y.sum().backward()
        return run

    cases = {
        "add (small CUDA op)": lambda: a + b,
        "mm n x 16 @ 16 x 16": lambda: a @ w,
        "empty": lambda: torch.empty((n, 16), device=dev),
        "sparsec spmm, no grad": lambda: st.spmm(A, a),
        "torch.sparse.mm, no grad": (lambda T=gp.torch_csr(torch, st.gcn_norm(adj), dev): torch.sparse.mm(T, a)),
        "sum().backward(), 1 node": chain(0, None),
        "+ 8 relu nodes": chain(8, torch.relu),
        "+ 8 Python Function nodes": chain(8, Identity.apply),
        "+ 8 sparsec spmm nodes": chain(8, lambda y: st.spmm(A, y)),
        "+ 8 torch.sparse.mm nodes": (lambda T=gp.torch_csr(torch, st.gcn_norm(adj), dev):
                                      chain(8, lambda y: torch.sparse.mm(T, y)))(),
        "+ 8 spmm forwards (grad), no backward": lambda: [st.spmm(A, xg) for _ in range(8)],
        "+ 8 Function nodes, SpMM in backward": chain(8, SpMMInBackward.apply),
    }
    method = f"wall / {args.calls} back-to-back calls, one sync, best of {args.repeat}"

    def on_thread():  # an eager SpMM from another Python thread (backward runs on torch's device thread)
        out = {}
        t = threading.Thread(target=lambda: out.setdefault("us", back_to_back_ms(
            lambda: st.spmm(A, a), args.calls, args.repeat, sync, warmup=20) * 1e3))
        t.start()
        t.join()
        return out["us"]

    rows = []
    for name, fn in cases.items():
        ctx = torch.no_grad() if "no grad" in name else torch.enable_grad()
        with ctx:
            us = back_to_back_ms(fn, args.calls, args.repeat, sync, warmup=20) * 1e3
        rows.append({"case": name, "us_per_call": us, "graph": args.graph, "method": method})
        print(json.dumps(rows[-1]), flush=True)
    with torch.no_grad():
        rows.append({"case": "sparsec spmm, no grad, other thread", "us_per_call": on_thread(), "graph": args.graph,
                     "method": method})
    os.makedirs(args.out, exist_ok=True)
    finish(rows, [("case", lambda r: r["case"]), ("us per call:", lambda r: f"{r['us_per_call']:.1f}")], dev,
           os.path.join(args.out, "host_micro.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
