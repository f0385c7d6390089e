"""Host time of one eager sparsec.torch call against torch's own sparse op, side by side in
one process (issue 27's first line): ``repeat`` rounds of ``calls`` back-to-back calls on a
small graph, where the kernels take a few microseconds and the host's per-call cost decides
the time; per call, the best round's wall time / calls (the device queue never fills: one
synchronisation per round).

    python3 benchmarks/time_host_cost.py [--graph karate power-grid] [--feat 16] [--calls 1000]

Ops: SpMM (``sparsec.torch.spmm`` against ``torch.sparse.mm`` on a CSR tensor), SDDMM
(against ``torch.sparse.sampled_addmm``) and SpMM forward + backward (B requiring grad, against
torch.sparse.mm's autograd on a CSR tensor; sparsec's backward is an SpMM on A's transpose). Each result is checked against the peer's first. Writes
DIR/host_cost.json; prints a table last.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

import _preamble  # noqa: F401

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))


def per_call_us(fn, calls: int, repeat: int, sync) -> float:
    """Best of ``repeat`` rounds: wall time of ``calls`` calls, then one synchronisation, per call."""
    from sparsec.measure import back_to_back_ms

    return back_to_back_ms(fn, calls, repeat, sync, warmup=20) * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", nargs="*", default=["karate", "power-grid"])
    ap.add_argument("--feat", type=int, default=16)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    import torch

    import gnn_peers as gp
    import sparsec.torch as st
    from sparsec.bench.report import finish

    device = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rows = []
    for gname in args.graph:
        adj = gp.load_graph(gname)
        adj.data = np.random.default_rng(0).standard_normal(adj.nnz).astype(np.float32)
        n, feat = adj.shape[0], args.feat
        A = st.SparseTensor(adj, "csr", device=device)  # values without grad: both sides differentiate B only
        T = torch.sparse_csr_tensor(torch.from_numpy(adj.indptr.astype(np.int64)),
                                    torch.from_numpy(adj.indices.astype(np.int64)),
                                    torch.from_numpy(adj.data), size=adj.shape, device=device)
        g = torch.Generator(device="cpu").manual_seed(0)
        B, X, Y = (torch.randn(n, feat, generator=g).to(device) for _ in range(3))
        Bg = B.clone().requires_grad_(True)
        with torch.no_grad():
            pairs = {
                "spmm": (lambda: st.spmm(A, B), lambda: torch.sparse.mm(T, B)),
                "sddmm": (lambda: st.sddmm(A, X, Y),
                          lambda: torch.sparse.sampled_addmm(T, X, Y.T, beta=0.0, alpha=1.0)),
            }
            checks = {
                "spmm": float((st.spmm(A, B) - torch.sparse.mm(T, B)).abs().max()),
                # sparsec's SDDMM scales by A's values; torch's samples X Y^T on T's pattern (same slot order)
                "sddmm": float((st.sddmm(A, X, Y) - A.values * torch.sparse.sampled_addmm(
                    T, X, Y.T, beta=0.0, alpha=1.0).values()).abs().max()),
            }

        def ours_train():
            st.spmm(A, Bg).sum().backward()

        def peer_train():
            torch.sparse.mm(T, Bg).sum().backward()

        pairs["spmm_fwd_bwd"] = (ours_train, peer_train)
        ours_train()
        g_ours = Bg.grad.clone()
        Bg.grad = None
        peer_train()
        checks["spmm_fwd_bwd"] = float((g_ours - Bg.grad).abs().max())
        Bg.grad = None
        for op, (ours, peer) in pairs.items():
            ctx = torch.no_grad() if op != "spmm_fwd_bwd" else torch.enable_grad()
            with ctx:
                o, p = per_call_us(ours, args.calls, args.repeat, sync), per_call_us(peer, args.calls, args.repeat, sync)
            row = {"graph": gname, "nodes": n, "edges": int(adj.nnz), "feat": feat, "op": op, "device": device,
                   "sparsec_us": o, "peer_us": p, "ratio": o / p, "method": f"wall / {args.calls} calls, best of "
                   f"{args.repeat}, one sync per round", "max_abs_diff": checks.get(op)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    os.makedirs(args.out, exist_ok=True)
    finish(rows, [("graph", lambda r: r["graph"]), ("op", lambda r: r["op"]),
                  ("sparsec us:", lambda r: f"{r['sparsec_us']:.1f}"), ("peer us:", lambda r: f"{r['peer_us']:.1f}"),
                  ("ratio:", lambda r: f"{r['ratio']:.2f}")], device, os.path.join(args.out, "host_cost.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
