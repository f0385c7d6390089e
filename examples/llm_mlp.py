#!/usr/bin/env python3
"""A Llama-style MLP, ``down(silu(gate(x)) * up(x))``, with its three weights pruned by
magnitude to unstructured sparsity and held in sparsec's ``tiled`` format (``SparseLinear``),
checked against the same MLP in dense PyTorch with the same pruned weights and timed beside
it (issue 25).

    python examples/llm_mlp.py                              # 4096 -> 11008 -> 4096, fp16, on the GPU
    python examples/llm_mlp.py --sparsity 0.8 --tokens 16 --out mlp.json
    python examples/llm_mlp.py --device cpu --dims 128 352  # a small CPU run (correctness only)

Weights are drawn from normal(0, 1/sqrt(fan_in)); sparsity in {0.5, 0.7, 0.8, 0.9}, tokens in
{1, 8, 16, 32, 64, 128, 1024}. On CUDA, ``SparseLinear``'s float16 SpMM on the tiled weights
is the Tensor Core kernel ``sparsec.compile`` picks for that structure
(``schedules/tiled_tensorcore.py``, default knobs). Timing: ``sparsec.measure.Timer``
(CUDA-graph replay, median); the table is printed last.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SPARSITY = (0.5, 0.7, 0.8, 0.9)
TOKENS = (1, 8, 16, 32, 64, 128, 1024)
TOL = {"float16": 2e-2, "float32": 1e-4}


def pruned_weights(hidden: int, inter: int, sparsity: float, seed: int = 0):
    """{name: float32 (out, in) weight pruned by magnitude to ``sparsity``} for gate, up, down."""
    from sparsec.formats import tiled

    rng = np.random.default_rng(seed)
    out = {}
    for name, (o, i) in (("gate", (inter, hidden)), ("up", (inter, hidden)), ("down", (hidden, inter))):
        w = (rng.standard_normal((o, i)) / np.sqrt(i)).astype(np.float32)
        _, keep = tiled.prune(w, sparsity=sparsity)
        out[name] = np.where(keep, w, 0).astype(np.float32)
    return out


class MLP:
    """The MLP on three linear maps (each ``x -> x @ W^T``), sparse or dense."""

    def __init__(self, gate, up, down):
        self.gate, self.up, self.down = gate, up, down

    def __call__(self, x):
        import torch

        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


def sparse_mlp(weights, fmt: str, device: str, dtype):
    from sparsec.torch import SparseLinear

    import torch

    lin = {n: SparseLinear.from_dense(torch.from_numpy(w), fmt=fmt, device=device, dtype=str(dtype).split(".")[-1])
           for n, w in weights.items()}
    return MLP(lin["gate"], lin["up"], lin["down"])


def dense_mlp(weights, device: str, dtype):
    import torch

    ws = {n: torch.from_numpy(w).to(device=device, dtype=dtype) for n, w in weights.items()}
    return MLP(*(lambda x, W=ws[n]: torch.nn.functional.linear(x, W) for n in ("gate", "up", "down")))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dims", nargs=2, type=int, default=[4096, 11008], metavar=("HIDDEN", "INTER"))
    ap.add_argument("--sparsity", nargs="*", type=float, default=list(SPARSITY))
    ap.add_argument("--tokens", nargs="*", type=int, default=list(TOKENS))
    ap.add_argument("--fmt", default="tiled", help="sparsec format of the weights (default tiled, 64x64 tiles)")
    ap.add_argument("--device", default=None, help="cuda (default when there is a GPU) or cpu")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    import torch

    from sparsec.measure import Timer
    from sparsec.reference import max_rel_err

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.float16 if device == "cuda" else torch.float32
    timer = Timer(device, warmup_ms=10.0, budget_ms=60.0, max_reps=100)
    hidden, inter = args.dims
    rows, bad = [], 0
    for s in args.sparsity:
        weights = pruned_weights(hidden, inter, s)
        sparse, dense = sparse_mlp(weights, args.fmt, device, dtype), dense_mlp(weights, device, dtype)
        ref64 = {n: torch.from_numpy(w).double() for n, w in weights.items()}
        for t in args.tokens:
            x = torch.randn(t, hidden, dtype=torch.float32).to(dtype)
            with torch.no_grad():
                want = MLP(*(lambda v, W=ref64[n]: v @ W.T for n in ("gate", "up", "down")))(x.double())
                got = sparse(x.to(device))
                err = float(max_rel_err(got.float().cpu().numpy(), want.numpy()))
                ok = err < TOL[str(dtype).split(".")[-1]]
                bad += not ok
                xd = x.to(device)
                ms = {name: timer.measure([lambda f=f: f(xd)]).median_ms for name, f in (("sparsec", sparse),
                                                                                      ("dense", dense))}
            row = {"hidden": hidden, "inter": inter, "sparsity": s, "tokens": t, "fmt": args.fmt,
                   "dtype": str(dtype).split(".")[-1], "device": torch.cuda.get_device_name() if device == "cuda"
                   else "cpu", "max_rel_err": err, "ok": ok, "sparsec_ms": ms["sparsec"], "dense_ms": ms["dense"],
                   "speedup": ms["dense"] / ms["sparsec"]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"\n{'sparsity':>8} {'tokens':>6} {'sparsec ms':>10} {'dense ms':>9} {'x dense':>7} {'max err':>8}")
    for r in rows:
        print(f"{r['sparsity']:8.2f} {r['tokens']:6d} {r['sparsec_ms']:10.4f} {r['dense_ms']:9.4f} "
              f"{r['speedup']:7.2f} {r['max_rel_err']:8.1e}" + ("" if r["ok"] else "  WRONG"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
