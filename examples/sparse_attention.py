#!/usr/bin/env python3
"""Block-sparse attention with a Longformer mask (a band of +-window keys plus global
tokens) as one sparsec operator: SDDMM -> softmax -> SpMM written in the DSL
(``sparsec.ops.attention``), compiled once and called once for all heads, which are folded
into the rows. The scores live on the mask's entries and the probabilities are recomputed
inside the SpMM, so nothing of size L x L is ever stored.

    python examples/sparse_attention.py --device cuda                 # L 4096, window 256, 16 global, 12 heads, d 64
    python examples/sparse_attention.py --device cuda --length 4096 16384 --check-rows 4096 --out attention.json
    python examples/sparse_attention.py --device cpu --small          # correctness only, on the CPU (llvm)

Every output is checked against float64 masked softmax attention computed densely (all
query rows, or ``--check-rows`` sampled ones), and the PyTorch baselines run on the same
inputs: ``scaled_dot_product_attention`` with a boolean mask in float32 and float16, and
dense masked attention by hand (matmul, masked_fill, softmax, matmul) in float32. sparsec
runs in float32 and in float16 (fp16 Q, K, V and mask values, float32 accumulation and
output), with the heads folded in two row orders (``sparsec.masks.fold_heads``):
head-major (a block-diagonal mask, Q/K/V as (heads * L, d)) and interleaved (row
i * heads + h, Q/K/V as a projection writes them, (L * heads, d)). On CUDA each is timed
with ``sparsec.measure.Timer`` (median of CUDA-graph replays after a warm-up;
``--timing eager`` includes host costs). sparsec is timed as a prepared launch (arguments
and the intermediates' memory set up once, as a model would hold them) and as a plain
kernel call (allocating its output and intermediates each time). Results go to
``$OUT/attention.json`` when ``OUT`` is set and to ``--out``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FULL = dict(length=[4096], window=256, global_tokens=16, heads=12, head_dim=64)
SMALL = dict(length=[203], window=16, global_tokens=3, heads=2, head_dim=32)


def reference(torch, mask, Q, K, V, heads, rows, chunk=1024):
    """float64 masked softmax attention of the query ``rows`` (global indices into the
    stacked heads), computed densely on the inputs' device: scores = mask value * q . k on the
    mask's entries, -inf elsewhere, softmax over each row, times V."""
    length = mask.shape[0] // heads
    out = torch.empty(len(rows), Q.shape[1], dtype=torch.float64, device=Q.device)
    Q, K, V = (x.double() for x in (Q, K, V))
    done = 0
    for h in range(heads):
        mine = rows[(rows >= h * length) & (rows < (h + 1) * length)]
        keys = slice(h * length, (h + 1) * length)
        for s in range(0, len(mine), chunk):
            r = mine[s:s + chunk]
            sub = mask[r][:, keys]
            pattern = sp.csr_matrix((np.ones(sub.nnz, bool), sub.indices, sub.indptr), shape=sub.shape).toarray()
            scale = torch.from_numpy(sub.toarray().astype(np.float64)).to(Q.device)
            scores = (Q[torch.from_numpy(r).to(Q.device)] @ K[keys].T) * scale
            scores = scores.masked_fill(~torch.from_numpy(pattern).to(Q.device), float("-inf"))
            out[done:done + len(r)] = torch.softmax(scores, dim=1) @ V[keys]
            done += len(r)
    return out


def check_rows(n_rows, heads, length, global_tokens, count, seed=0):
    """All rows (count 0 or >= n_rows), else ``count`` rows: every head's global tokens,
    first and last rows, and a random draw of the rest (sorted)."""
    if count <= 0 or count >= n_rows:
        return np.arange(n_rows)
    fixed = [h * length + r for h in range(heads) for r in
             set(range(min(global_tokens, length))) | {global_tokens, length // 2, length - 1} if r < length]
    rest = np.random.default_rng(seed).choice(n_rows, size=max(0, count - len(fixed)), replace=False)
    return np.unique(np.concatenate([np.asarray(fixed, np.int64), rest]))


def baselines(torch, Q, K, V, pattern, heads, scale):
    """The PyTorch contestants on (1, heads, L, d) views of the head-major inputs."""
    F = torch.nn.functional
    length, d = pattern.shape[0], Q.shape[1]

    def view(x, dtype):
        return x.to(dtype).view(1, heads, length, d)

    q32, k32, v32 = (view(x, torch.float32) for x in (Q, K, V))
    q16, k16, v16 = (view(x, torch.float16) for x in (Q, K, V))

    def sdpa32():
        return F.scaled_dot_product_attention(q32, k32, v32, attn_mask=pattern, scale=scale)

    def sdpa16():
        return F.scaled_dot_product_attention(q16, k16, v16, attn_mask=pattern, scale=scale)

    def dense_by_hand32():
        s = torch.matmul(q32, k32.transpose(-1, -2)) * scale
        return torch.matmul(torch.softmax(s.masked_fill(~pattern, float("-inf")), dim=-1), v32)

    return {"torch SDPA fp32": (sdpa32, "float32"), "torch SDPA fp16": (sdpa16, "float16"),
            "torch dense masked fp32": (dense_by_hand32, "float32")}


def interleave(x, heads):
    """(heads * L, d) head-major rows -> (L * heads, d), row i * heads + h (and back with
    ``heads`` = L): the interleaved layout's Q, K, V, as a projection writes them."""
    n, d = x.shape
    return x.view(heads, n // heads, d).transpose(0, 1).reshape(n, d).contiguous()


def sparsec_contestants(torch, sparsec, kernels, length, args, target, Q, K, V):
    """{name: (checked output in head-major rows, dtype, prepared launch, plain call, layout)} for
    every sparsec dtype x layout. Outputs come from a first call on NaN-poisoned output and
    intermediates. The kernel is compiled once per dtype (it is bound to the format, not to
    one matrix) and called on the mask of each layout."""
    from sparsec import masks
    from sparsec.formats import convert
    from sparsec.kernel import on_torch_stream

    heads, d = args.heads, args.head_dim
    on_cuda = Q.device.type == "cuda"
    out = {}
    for layout in args.layout:
        mask = masks.longformer(length, args.window, args.global_tokens, heads, value=1.0 / math.sqrt(d),
                                layout=layout)
        qkv = (Q, K, V) if layout == "head-major" else tuple(interleave(x, heads) for x in (Q, K, V))
        for dtype in args.sparsec_dtypes:
            A = convert(mask, "csr", dtype=dtype)
            if dtype not in kernels:
                kernels[dtype] = sparsec.compile("attention", A, feat=d, target=target)
            kernel = kernels[dtype]
            q, k, v = (x.to(getattr(torch, dtype)).contiguous() for x in qkv)
            result = kernel(A, q, k, v, poison=True)
            if layout == "interleaved":
                result = interleave(result, length)
            args_once, _, _ = kernel.prepare(A, q, k, v)  # output and intermediates allocated once
            func = kernel.executable[kernel.op_name]

            def launch(func=func, a=args_once):
                with on_torch_stream(on_cuda):
                    func(*a)

            def call(kernel=kernel, A=A, ins=(q, k, v)):
                return kernel(A, *ins)

            name = f"sparsec {'fp32' if dtype == 'float32' else 'fp16'}" + ("" if layout == "head-major" else
                                                                              " interleaved")
            out[name] = (result, dtype, launch, call, layout)
    return out


def run_case(torch, sparsec, timer, kernels, device, length, args):
    """One sequence length: every contestant checked against float64 (and sparsec against
    SDPA fp32), then, on CUDA, timed. Returns the JSON record."""
    heads, d, w, g = args.heads, args.head_dim, args.window, args.global_tokens
    from sparsec import masks
    from sparsec.reference import TOLERANCE, max_rel_err

    scale = 1.0 / math.sqrt(d)
    mask = masks.longformer(length, w, g, heads, value=scale)  # head-major: the reference's rows
    n = heads * length
    gen = torch.Generator().manual_seed(0)
    Q, K, V = (torch.randn(n, d, generator=gen).to(device) for _ in range(3))
    pattern = torch.from_numpy(mask[:length, :length].toarray() != 0).to(device)  # one head, for torch
    rows = check_rows(n, heads, length, g, args.check_rows)
    row_idx = torch.from_numpy(rows).to(device)
    rec = {"length": length, "window": w, "global_tokens": g, "heads": heads, "head_dim": d, "rows": n,
           "nnz": int(mask.nnz), "density": mask.nnz / (heads * length * length), "checked_rows": len(rows)}
    refs = {"float32": reference(torch, mask, Q, K, V, heads, rows)}
    # fp16 contestants are checked against the same math on their fp16-rounded inputs and scale
    mask16 = sp.csr_matrix((mask.data.astype(np.float16).astype(np.float32), mask.indices, mask.indptr), mask.shape)
    refs["float16"] = reference(torch, mask16, *(x.half().float() for x in (Q, K, V)), heads, rows)

    target = "llvm" if device == "cpu" else "cuda"
    mine = sparsec_contestants(torch, sparsec, kernels, length, args, target, Q, K, V)
    rec["layouts"] = {name: c[4] for name, c in mine.items()}
    rec["compile_s"] = {dtype: k.compile_s for dtype, k in kernels.items()}
    outs = {name: (c[0], c[1]) for name, c in mine.items()}
    theirs = baselines(torch, Q, K, V, pattern, heads, scale)
    for name, (fn, dtype) in theirs.items():
        with torch.no_grad():
            outs[name] = (fn().reshape(n, d), dtype)
    rec["errors"] = {name: max_rel_err(out[row_idx], refs[dtype]) for name, (out, dtype) in outs.items()}
    rec["correct"] = {name: rec["errors"][name] < TOLERANCE[dtype] for name, (_, dtype) in outs.items()}
    if "sparsec fp32" in outs:  # the sparse operator against the PyTorch baseline directly
        rec["sparsec_fp32_vs_torch_sdpa_fp32"] = max_rel_err(outs["sparsec fp32"][0][row_idx],
                                                      outs["torch SDPA fp32"][0][row_idx])
    del outs
    if device == "cuda":
        timed = {name: c[2] for name, c in mine.items()}
        timed.update({f"{name} (call)": c[3] for name, c in mine.items()})
        timed.update({name: fn for name, (fn, _) in theirs.items()})
        rec["timings"] = {}
        for name, fn in timed.items():
            with torch.no_grad():
                rec["timings"][name] = timer.measure([fn]).as_dict()
            torch.cuda.empty_cache()
        ms = {k: v["median_ms"] for k, v in rec["timings"].items()}
        rec["speedup"] = {name: {b: ms[b] / ms[name] for b in theirs} for name in mine}  # > 1: sparsec faster
    return rec


def table(records, device):
    """Markdown: one line per length and contestant; a sparsec line's speedups are each
    baseline's time over its own (> 1: sparsec is faster)."""
    bases = ("torch SDPA fp32", "torch SDPA fp16", "torch dense masked fp32")
    lines = [f"device: {device}",
             "| L | heads x d | window / global | nnz (density) | contestant | max rel err | correct | median ms | "
             "plain call ms | vs SDPA fp32 | vs SDPA fp16 | vs dense fp32 |",
             "|---:|---|---|---|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in records:
        case = (f"| {r['length']} | {r['heads']} x {r['head_dim']} | {r['window']} / {r['global_tokens']} | "
                f"{r['nnz']} ({r['density']:.3f}) |")
        times = {k: v["median_ms"] for k, v in r.get("timings", {}).items()}
        for k, err in r["errors"].items():
            ms = [f"{times[t]:.3f}" if t in times else "-" for t in (k, f"{k} (call)")]
            ups = [f"{r['speedup'][k][b]:.2f}x" if k in r.get("speedup", {}) else "-" for b in bases]
            lines.append(f"{case} {k} | {err:.1e} | {r['correct'][k]} | {' | '.join(ms)} | {' | '.join(ups)} |")
    return "\n".join(lines)


def _count(least):
    """argparse type: an int >= ``least``."""
    def parse(text):
        try:
            v = int(text)
        except ValueError:
            v = least - 1
        if v < least:
            raise argparse.ArgumentTypeError(f"should be an integer >= {least}, got {text!r}")
        return v
    return parse


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda when available")
    ap.add_argument("--small", action="store_true", help=f"small sizes {SMALL} (the default on the CPU)")
    ap.add_argument("--length", type=_count(1), nargs="+", help=f"sequence lengths (default {FULL['length']})")
    ap.add_argument("--window", type=_count(0), help=f"keys on each side of the query (default {FULL['window']})")
    ap.add_argument("--global-tokens", type=_count(0),
                    help=f"leading global positions (default {FULL['global_tokens']})")
    ap.add_argument("--heads", type=_count(1), help=f"default {FULL['heads']}")
    ap.add_argument("--head-dim", type=_count(1), help=f"default {FULL['head_dim']}")
    ap.add_argument("--sparsec-dtypes", nargs="+", choices=("float32", "float16"), default=["float32", "float16"])
    ap.add_argument("--layout", nargs="+", choices=("head-major", "interleaved"), default=["head-major", "interleaved"],
                    help="heads folded into rows: block-diagonal (head-major) and/or interleaved by position")
    ap.add_argument("--check-rows", type=_count(0), default=0, help="query rows checked in float64 (0: all)")
    ap.add_argument("--timing", choices=("graph", "eager"), default="graph")
    ap.add_argument("--out", help="also write the JSON results here")
    args = ap.parse_args()

    import torch

    import sparsec
    from sparsec.measure import Timer

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no GPU")
    sizes = SMALL if args.small or (device == "cpu" and args.length is None) else FULL
    for k, v in sizes.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 baselines in fp32, as sparsec computes
        torch.backends.cudnn.allow_tf32 = False
    timer = Timer(device, mode=args.timing, warmup_ms=50, budget_ms=400, max_reps=40, batch=5)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    records, kernels = [], {}
    for length in args.length:
        rec = run_case(torch, sparsec, timer, kernels, device, length, args)
        records.append(rec)
        print(json.dumps(rec), flush=True)
    result = {"device": name, "command": " ".join([Path(sys.executable).name] + sys.argv), "records": records}
    paths = [Path(os.environ["OUT"]) / "attention.json"] if os.environ.get("OUT") else []
    paths += [Path(args.out)] if args.out else []
    for p in paths:
        p.write_text(json.dumps(result, indent=1))
    print(table(records, name))
    bad = [(r["length"], k) for r in records for k, ok in r["correct"].items() if not ok]
    if bad:
        print(f"incorrect: {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
