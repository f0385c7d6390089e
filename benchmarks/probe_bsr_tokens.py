#!/usr/bin/env python3
"""``schedules/bsr_tokens.py`` (BSR weight x token-major activations, Y token-major) built
directly and run on the GPU host: checked against float64 on NaN-poisoned outputs, then timed
beside dense ``F.linear`` fp16 on the same inputs (CUDA-graph medians).

    python3 benchmarks/probe_bsr_tokens.py [--check-only] [--layers ..] [--blocks 32 64]
                                           [--sparsity 90 70 50] [--tokens 1024 4096]
                                           [--knob-sets JSON] [--out FILE]

Checks: odd token counts (1, 77, 1000), out / in not multiples of the block, an empty
weight, a block row holding every block column among empty ones, explicit zeros, bias and
ReLU, float32 and bfloat16, every knob value. Timing: the layers of ``weights.py`` with
768 x 3072 weights or more, blocks pruned by norm (``prune_blocks``), each knob set of
``--knob-sets`` (default: the kernel's defaults and a few neighbours). Writes
``$OUT/probe_bsr_tokens.json``; prints a table last; exits 1 on any wrong result.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np

import _preamble  # noqa: F401,E402

TOL = 1e-2
SETS = [{}, {"tile": 256, "warps_m": 8, "warps_n": 1, "tiles": 4},
        {"tile": 256, "warps_m": 8, "warps_n": 1, "tiles": 2, "stages": 3},
        {"tile": 256, "warps_m": 8, "warps_n": 1, "tiles": 2, "direct": 1},
        {"tile": 128, "warps_m": 4, "warps_n": 1, "tiles": 2, "direct": 1},
        {"tile": 128, "warps_m": 4, "warps_n": 1, "tiles": 4, "direct": 1, "stages": 3},
        {"tile": 256, "warps_m": 4, "warps_n": 1, "tiles": 1}, {"tile": 256, "warps_m": 4, "warps_n": 1, "tiles": 2},
        {"tile": 256, "warps_m": 4, "warps_n": 1, "tiles": 2, "direct": 1},
        {"tile": 128, "warps_m": 4, "warps_n": 1, "tiles": 2}]
# sets that gave wrong results before the consumers fenced their reads against the copy
# engine's refills (b32 at 5 CTAs an SM: 1-4 of 20-40 calls): rerun on long walks, and the defaults
STRESS = [((32, 32), {"tile": 128, "warps_m": 4, "warps_n": 1, "tiles": 1, "direct": 1}),
          ((32, 32), {"tile": 256, "warps_m": 8, "warps_n": 1}), ((64, 64), {}), ((32, 32), {})]


def bsr_arrays(w16, block):
    """(indptr, indices, values) of the float16 weight as ``formats.bsr`` stores it, on CUDA."""
    import torch

    from sparsec import formats

    inst = formats.convert(w16, f"bsr:{block[0]}x{block[1]}", dtype="float16")
    a = inst.arrays
    # an empty weight's arrays padded to one block (the kernel reads none of it; a tensor map
    # needs memory to point at)
    indices = a["indices"] if len(a["indices"]) else np.zeros(1, np.int32)
    values = inst.data if len(inst.data) else np.zeros(block[0] * block[1], np.float16)
    return inst, [torch.from_numpy(np.ascontiguousarray(a["indptr"])).cuda(),
                  torch.from_numpy(np.ascontiguousarray(indices)).cuda(),
                  torch.from_numpy(np.ascontiguousarray(values)).cuda()]


_BUILT = {}


def kernel(block, tokens, **kw):
    from sparsec.schedules import bsr_tokens

    key = (tuple(block), tokens, json.dumps(kw, sort_keys=True))
    if key not in _BUILT:
        ex = bsr_tokens.build(tuple(block), tokens, **kw)
        _BUILT[key] = ex[kw.get("name", "bsr_tokens")]
    return _BUILT[key]


def run(block, w, tokens, dtype="float16", out_dtype="float16", bias=False, activation="none", seed=0,
        bias_dtype="float32", **knobs):
    """(max error relative to the largest |Y|, the call, its arguments)."""
    import torch

    tdt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(seed)
    rows, cols = w.shape
    _, arrs = bsr_arrays(w.astype(np.float16), block)
    wt = torch.from_numpy(w.astype(np.float16)).to(tdt)
    if dtype == "bfloat16":  # the float16 weight's values, as bfloat16
        arrs[2] = arrs[2].float().to(torch.bfloat16)
        wt = torch.from_numpy(w.astype(np.float16)).float().to(torch.bfloat16)
    x = torch.randn(tokens, cols, device="cuda", generator=g).to(tdt)
    b = torch.randn(rows, device="cuda", generator=g).to(getattr(torch, bias_dtype)) if bias else None
    y = torch.full((tokens, rows), float("nan"), device="cuda", dtype=getattr(torch, out_dtype))
    f = kernel(block, tokens, dtype=dtype, out_dtype=out_dtype, bias=bias, bias_dtype=bias_dtype,
               activation=activation, **knobs)
    args = arrs + [x] + ([b] if bias else []) + [y]
    f(*args)
    torch.cuda.synchronize()
    ref = x.double() @ wt.cuda().double().t()
    if bias:
        ref = ref + b.double()
    if activation == "relu":
        ref = ref.clamp_min(0)
    scale = max(ref.abs().max().item(), 1e-30)
    err = (y.double() - ref).abs().max().item() / scale if y.numel() else 0.0
    if y.numel() and torch.isnan(y).any():
        err = float("inf")
    return err, f, args


def block_pruned(rng, shape, block, sparsity):
    r, c = block
    grid = (-(-shape[0] // r), -(-shape[1] // c))
    keep = np.kron(rng.random(grid) >= sparsity, np.ones((r, c), bool))[:shape[0], :shape[1]]
    return np.where(keep, rng.standard_normal(shape), 0).astype(np.float32)


def checks():
    """[(name, block, weight, tokens, options)]."""
    rng = np.random.default_rng(7)
    one = np.zeros((256, 64 * 70), np.float32)
    one[64:128] = rng.standard_normal((64, 64 * 70))  # block row 1 holds all 70 block columns
    zeros = block_pruned(rng, (128, 256), (32, 32), 0.5)
    zeros[:32, :32] = rng.standard_normal((32, 32))
    zeros[:32, :24] = 0  # a stored block mostly of zeros, and a zero row across it
    zeros[40] = 0
    out = [
        ("odd-200x312-b32-s70", (32, 32), block_pruned(rng, (200, 312), (32, 32), 0.7), 77, {}),
        ("odd-1000x776-b16-s90", (16, 16), block_pruned(rng, (1000, 776), (16, 16), 0.9), 1000, {}),
        ("odd-328x1112-b64-s70", (64, 64), block_pruned(rng, (328, 1112), (64, 64), 0.7), 1, {}),
        ("b48x32-s50", (48, 32), block_pruned(rng, (144, 320), (48, 32), 0.5), 130, {}),
        ("b32x64-s70", (32, 64), block_pruned(rng, (320, 640), (32, 64), 0.7), 300, {}),
        ("b64x16-s70", (64, 16), block_pruned(rng, (256, 400), (64, 16), 0.7), 129, {}),
        ("empty-128x256", (32, 32), np.zeros((128, 256), np.float32), 64, {}),
        ("one-long-row", (64, 64), one, 200, {}),
        ("zeros-in-blocks", (32, 32), zeros, 128, {}),
        ("bias-relu", (64, 64), block_pruned(rng, (512, 1024), (64, 64), 0.7), 500,
         {"bias": True, "activation": "relu"}),
        ("float32-out", (32, 32), block_pruned(rng, (256, 512), (32, 32), 0.7), 256, {"out_dtype": "float32"}),
        ("bfloat16", (64, 64), block_pruned(rng, (256, 512), (64, 64), 0.7), 256,
         {"dtype": "bfloat16", "out_dtype": "bfloat16"}),
    ]
    w = block_pruned(rng, (512, 1024), (64, 64), 0.7)
    from sparsec.schedules import bsr_tokens

    for s in SETS[1:]:
        try:
            bsr_tokens.plan((64, 64), 333, **{**bsr_tokens.default_knobs((64, 64), 333), **s})
        except ValueError:
            continue  # a set these blocks cannot take (timed where they can)
        out.append((f"knobs-{json.dumps(s)}", (64, 64), w, 333, dict(s)))
    out.append(("knobs-b32-tiles4", (32, 32), block_pruned(rng, (512, 1024), (32, 32), 0.7), 1333,
                {"tiles": 4, "tile": 256, "warps_m": 8, "warps_n": 1}))
    out.append(("bias-float16-tiles-f32out", (32, 32), block_pruned(rng, (512, 1024), (32, 32), 0.7), 900,
                {"tiles": 2, "bias": True, "bias_dtype": "float16", "out_dtype": "float32"}))
    out.append(("knobs-b32-warps_n1", (32, 32), block_pruned(rng, (512, 1024), (32, 32), 0.7), 333,
                {"warps_n": 1, "warps_m": 4}))
    # bsr_tokens.UNCHECKED: values the plan takes that no set above does, checked here before
    # they join the knobs (every value then runs at least once)
    w32 = block_pruned(rng, (768, 1024), (32, 32), 0.7)
    for s in ({"tile": 128, "warps_m": 2, "warps_n": 2, "stages": 6}, {"tile": 64, "warps_m": 1, "warps_n": 2},
              {"tile": 64, "warps_m": 4, "warps_n": 2, "stages": 8, "per_stage": 2},
              {"tile": 128, "warps_m": 2, "warps_n": 2, "tiles": 8}):
        out.append((f"knobs-b32-{json.dumps(s)}", (32, 32), w32, 2000, {**s, "unchecked": True}))
    out.append(("knobs-b64-warps_n4", (64, 64), block_pruned(rng, (512, 1024), (64, 64), 0.7), 700,
                {"tile": 128, "warps_m": 2, "warps_n": 4, "stages": 3, "per_stage": 2, "unchecked": True}))
    return out


def compiled_cases():
    """[(name, block, weight, tokens, options)] for :func:`compiled_err`."""
    rng = np.random.default_rng(5)
    return [("odd-tokens-bias-relu", (32, 32), block_pruned(rng, (320, 640), (32, 32), 0.7), 333,
             {"bias": "float32", "act": "relu"}),
            ("b64-f32-out", (64, 64), block_pruned(rng, (512, 1024), (64, 64), 0.9), 1024, {"out_dtype": "float32"}),
            ("b16-half-bias", (16, 16), block_pruned(rng, (256, 256), (16, 16), 0.5), 4096, {"bias": "float16"}),
            ("empty", (32, 32), np.zeros((128, 256), np.float32), 200, {})]


def compiled_err(block, w, tokens, bias=None, act=None, out_dtype="float16"):
    """A user's token-major linear operator compiled by ``sparsec.compile`` for ``w`` and run
    on NaN-poisoned outputs: the error against float64 (the kernel must be ``bsr_tokens``)."""
    import torch

    import sparsec
    from sparsec import formats
    from sparsec.schedules import bsr_tokens

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from test_bsr_tokens import linear_op

    inst = formats.convert(w.astype(np.float16), f"bsr:{block[0]}x{block[1]}", dtype="float16")
    k = sparsec.compile(linear_op(out_dtype=out_dtype, bias=bias, act=act), inst, target="cuda", dtype="float16",
                        feat=tokens)
    if set(k.knobs) != set(bsr_tokens.KNOBS):
        raise AssertionError(f"sparsec.compile built another kernel: {k.knobs}")
    g = torch.Generator(device="cuda").manual_seed(tokens)
    x = torch.randn(tokens, w.shape[1], device="cuda", generator=g).half()
    args = [x]
    ref = x.double() @ torch.from_numpy(w.astype(np.float16)).cuda().double().t()
    if bias:
        b = torch.randn(w.shape[0], device="cuda", generator=g).to(getattr(torch, bias))
        args.append(b)
        ref = ref + b.double()
    if act == "relu":
        ref = ref.clamp_min(0)
    y = k(inst, *args, poison=True)
    if torch.isnan(y).any():
        return float("inf")
    return (y.double() - ref).abs().max().item() / max(ref.abs().max().item(), 1e-30)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check-only", action="store_true")
    ap.add_argument("--skip-checks", action="store_true")
    ap.add_argument("--only", default=None, help="run only the checks whose name starts with this")
    ap.add_argument("--layers", nargs="+", default=["bert-ffn", "square", "llm"])
    ap.add_argument("--blocks", nargs="+", type=int, default=[32, 64])
    ap.add_argument("--sparsity", nargs="+", type=int, default=[90, 70, 50])
    ap.add_argument("--tokens", nargs="+", type=int, default=[1024, 4096])
    ap.add_argument("--knob-sets", type=json.loads, default=None)
    ap.add_argument("--same-x", action="store_true", help="--repeat: every call on the same X")
    ap.add_argument("--repeat", type=int, default=0,
                    help="instead of timing: call each set this many times per case, every output checked")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import torch
    import torch.nn.functional as F

    from sparsec.bench.suites import prune_blocks
    from sparsec.measure import Timer
    from weights import BIG, layers

    doc = {"device": torch.cuda.get_device_name(), "checks": [], "rows": []}
    path = args.out or os.path.join(os.environ.get("OUT", "."), "probe_bsr_tokens.json")
    wrong = 0
    for name, block, w, tokens, opts in ([] if args.skip_checks else checks()):
        if args.only and not name.startswith(args.only):
            continue
        try:
            err, _, _ = run(block, w, tokens, **opts)
            ok = err <= TOL
        except Exception as e:  # noqa: BLE001 - a refused case is a result, said why
            err, ok = f"{type(e).__name__}: {str(e)[:200]}", False
        wrong += not ok
        doc["checks"].append({"case": name, "block": block, "shape": list(w.shape), "tokens": tokens, "opts": opts,
                              "err": err, "ok": ok})
        print(f"{'ok ' if ok else 'BAD'} {name:<40} {err}", flush=True)
    for name, block, w, tokens, opts in ([] if args.skip_checks or args.only else compiled_cases()):
        try:  # through sparsec.compile: a user's operator, the kernel's own output poisoned with NaN
            err = compiled_err(block, w, tokens, **opts)
            ok = err <= TOL
        except Exception as e:  # noqa: BLE001
            err, ok = f"{type(e).__name__}: {str(e)[:200]}", False
        wrong += not ok
        doc["checks"].append({"case": "compiled-" + name, "block": block, "shape": list(w.shape), "tokens": tokens,
                              "opts": opts, "err": err, "ok": ok})
        print(f"{'ok ' if ok else 'BAD'} compiled-{name:<31} {err}", flush=True)
    rng = np.random.default_rng(11)
    for block, ks in ([] if args.skip_checks or args.only else STRESS):  # the same call 12 times on a long walk, each output checked
        w = block_pruned(rng, (4096, 4096), block, 0.5)
        errs = []
        for rep in range(12):
            err, _, _ = run(block, w, 4096, seed=rep, **ks)
            errs.append(err)
        ok = max(errs) <= TOL
        wrong += not ok
        doc["checks"].append({"case": f"stress-b{block[0]}-{json.dumps(ks)}", "errs": errs, "ok": ok})
        print(f"{'ok ' if ok else 'BAD'} stress b{block[0]} {json.dumps(ks)}: worst {max(errs):.2e}", flush=True)
    if args.check_only:
        json.dump(doc, open(path, "w"), indent=1)
        return 1 if wrong else 0
    timer = Timer("cuda", warmup_ms=10.0, budget_ms=60.0, max_reps=100)
    sets = args.knob_sets or SETS
    for lname, w in layers(args.layers):
        if w.size < BIG:
            continue
        for b in args.blocks:
            for s in args.sparsity:
                wp = prune_blocks(w, b, s / 100)
                w16 = torch.from_numpy(wp).half().cuda()
                _, arrs = bsr_arrays(wp.astype(np.float16), (b, b))
                for t in args.tokens:
                    xs = [torch.randn(t, w.shape[1], device="cuda", dtype=torch.float16) for _ in range(2)]
                    dense = timer.measure([lambda x=x: F.linear(x, w16) for x in xs]).median_ms
                    ref = xs[0].double() @ w16.double().t()
                    row = {"layer": lname, "rows": w.shape[0], "cols": w.shape[1], "block": b, "sparsity": s,
                           "tokens": t, "dense_ms": dense, "sets": []}
                    if args.repeat:
                        for ks in sets:
                            errs, where = [], []
                            for rep in range(args.repeat):
                                x = xs[0 if args.same_x else rep % 2]
                                y = torch.full((t, w.shape[0]), float("nan"), device="cuda", dtype=torch.float16)
                                kernel((b, b), t, **ks)(*arrs, x, y)
                                torch.cuda.synchronize()
                                r = x.double() @ w16.double().t()
                                errs.append(((y.double() - r).abs().max() / r.abs().max()).item())
                                off = ((y.double() - r).abs() > TOL * r.abs().max()).nonzero()
                                if len(off):  # which tokens and outputs came out wrong
                                    where.append({"n": len(off), "tokens": sorted(set(off[:, 0].tolist()))[:64],
                                                  "block_rows": sorted(set((off[:, 1] // b).tolist()))[:64],
                                                  "token_tiles_128": sorted(set((off[:, 0] // 128).tolist()))})
                            bad = sum(e > TOL or e != e for e in errs)
                            wrong += bad
                            row["sets"].append({"knobs": ks, "errs": errs, "bad": bad, "where": where})
                            print(f"{lname} b{b} {s}% {t}: {json.dumps(ks)} {bad}/{args.repeat} wrong, worst "
                                  f"{max(errs):.3g}", flush=True)
                        doc["rows"].append(row)
                        json.dump(doc, open(path, "w"), indent=1)
                        continue
                    for ks in sets:
                        rec = {"knobs": ks}
                        try:
                            f = kernel((b, b), t, **ks)
                            ys = [torch.full((t, w.shape[0]), float("nan"), device="cuda", dtype=torch.float16)
                                  for _ in xs]
                            f(*arrs, xs[0], ys[0])
                            torch.cuda.synchronize()
                            rec["err"] = ((ys[0].double() - ref).abs().max() / ref.abs().max()).item()
                            rec["ok"] = rec["err"] <= TOL
                            wrong += not rec["ok"]
                            rec["ms"] = timer.measure([lambda x=x, y=y: f(*arrs, x, y) for x, y in zip(xs, ys)]).median_ms
                            rec["speedup"] = dense / rec["ms"]
                            rec["tflops_nonzero"] = 2 * t * arrs[2].numel() / rec["ms"] / 1e9
                        except Exception as e:  # noqa: BLE001
                            rec["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                        row["sets"].append(rec)
                    best = max((r for r in row["sets"] if r.get("ok")), key=lambda r: r["speedup"], default=None)
                    row["best"] = best
                    doc["rows"].append(row)
                    json.dump(doc, open(path, "w"), indent=1)
                    d = row["sets"][0]
                    print(f"{lname:<14} b{b} {s}% {t:>5}: dense {dense * 1e3:7.1f} us  default "
                          + (f"x{d['speedup']:.2f} ({d['tflops_nonzero']:.0f} TF/s)" if "speedup" in d else
                             d.get("error", "?"))
                          + (f"  best x{best['speedup']:.2f} {json.dumps(best['knobs'])}" if best else ""), flush=True)
    print(f"\n{doc['device']}: {wrong} wrong")
    print(f"{'block':>5} {'sparsity':>8} {'default geomean':>16} {'best geomean':>13}")
    for b in args.blocks:
        for s in args.sparsity:
            rs = [r for r in doc["rows"] if r["block"] == b and r["sparsity"] == s and r.get("best")]
            if rs:
                dg = math.exp(np.mean([math.log(r["sets"][0].get("speedup", 1e-9)) for r in rs]))
                bg = math.exp(np.mean([math.log(r["best"]["speedup"]) for r in rs]))
                print(f"{b:>5} {s:>7}% {dg:>15.2f}x {bg:>12.2f}x")
    json.dump(doc, open(path, "w"), indent=1)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
