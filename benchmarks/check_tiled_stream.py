#!/usr/bin/env python3
"""The streaming Tensor Core SpMM for ``tiled`` weights (``schedules/tiled_stream.py``)
against float64 on the GPU host, then its time beside dense cuBLAS fp16 at LLM shapes.

    python3 benchmarks/check_tiled_stream.py [--quick] [--skip-checks] [--skip-speed]
        [--shapes 4096x4096 ..] [--sparsity 0.5 ..] [--tokens 1 8 16 32] [--tiles 16x64 ..] [--variants 7]

Checks (the kernel called directly, C NaN-poisoned, each call twice): tiles 16x64, 16x128,
32x64, 64x64, 16x16 and 48x32; every knob (nb 8-64, warps 2-8, stages 2-4, cluster 1-8);
weights of odd sizes pruned to 50 % and 90 %, one with whole tiles empty and explicit zeros,
a dense one, one with a single dense row among empty ones; N = 1, 5, 8, 16, 17, 32, 40, 64.
Speed: C = W @ X for W (out, in) pruned by magnitude, X (in, tokens), each knob setting in
the sweep and dense ``torch.mm`` on the pruned weight, CUDA-graph medians over enough weight
copies to leave L2 cold; bytes read (values, bitmap, offsets; X and C) and the fraction of
the device's copy bandwidth. Writes ``$OUT/check_tiled_stream.json``; prints a table last;
exits 1 on any wrong result.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import scipy.sparse as sp

import _preamble  # noqa: F401,E402
from check_tiled_tc import weights  # noqa: E402

TOL = 1e-2  # float16 products summed in float32, against float64

# (tile, N, knobs) of the checks: every knob value at least once, odd N, non-vector B (N % 8)
CHECKS = [
    ((16, 64), 16, {}), ((16, 64), 1, {"nb": 8}), ((16, 64), 5, {"nb": 8, "stages": 3}),
    ((16, 64), 17, {"nb": 32, "warps": 4, "cluster": 2}), ((16, 64), 40, {"nb": 64, "warps": 4, "cluster": 1}),
    ((16, 64), 32, {"nb": 32, "stages": 2, "cluster": 4}), ((16, 64), 64, {"nb": 16, "warps": 2, "cluster": 8}),
    ((16, 128), 16, {"warps": 4}), ((16, 128), 8, {"nb": 8, "warps": 4, "stages": 3, "cluster": 1}),
    ((32, 64), 16, {"warps": 4}), ((32, 64), 33, {"nb": 16, "warps": 4, "stages": 3}),
    ((64, 64), 16, {"warps": 2}), ((64, 64), 1, {"nb": 8, "warps": 2, "stages": 3, "cluster": 4}),
    ((16, 16), 16, {}), ((48, 32), 24, {"nb": 32, "warps": 4}),
    ((16, 64), 16, {"cap": 4, "stages": 8}), ((16, 64), 1, {"nb": 8, "cap": 2, "stages": 6}),
    ((32, 64), 8, {"nb": 8, "warps": 4, "cap": 4, "cluster": 2}),
]


def full_knobs(tile, N, knobs, shape=(0, 0), density=1.0):
    from sparsec.schedules import tiled_stream as ts

    return {**ts.default_knobs(N, shape[0], shape[1], tile, density), **knobs}


_BUILT = {}


def kernel(tile, N, knobs):
    """The compiled kernel for these knobs (cached)."""
    from sparsec.schedules import tiled_stream as ts

    key = (tuple(tile), N, tuple(sorted(knobs.items())))
    if key not in _BUILT:
        _BUILT[key] = ts.build(tile, N, **knobs).mod["tiled_stream"]
    return _BUILT[key]


def operands(inst, dev):
    """The instance's arrays as the kernel takes them (16-byte aligned device copies)."""
    import tvm

    return [tvm.runtime.tensor(np.ascontiguousarray(a), dev) for a in
            (inst.arrays["bitmap"], inst.arrays["tile_offsets"], inst.data.astype(np.float16))]


def more_weights(rng):
    """Beyond ``check_tiled_tc.weights``: one dense row among empty ones (a tile row of one
    row, the others empty) and a weight narrower than one tile."""
    w = np.zeros((77, 300), np.float32)
    w[40] = rng.standard_normal(300).astype(np.float16)
    thin = np.where(rng.random((33, 9)) < 0.5, rng.standard_normal((33, 9)), 0).astype(np.float16)
    return [("77x300 one dense row", sp.csr_matrix(w)), ("33x9 half", sp.csr_matrix(thin.astype(np.float32)))]


def checks(rng, dev, quick: bool):
    import tvm

    from sparsec.formats import convert
    from sparsec.reference import max_rel_err

    rows, bad = [], 0
    cases = CHECKS[:4] + CHECKS[9:10] if quick else CHECKS
    ws = weights(rng) + more_weights(rng)
    for tile, N, knobs in cases:
        for name, m in ws:
            kn = full_knobs(tile, N, knobs, m.shape)
            try:
                fn = kernel(tile, N, kn)
            except ValueError as e:
                rows.append({"tile": list(tile), "N": N, "knobs": kn, "weight": name, "refused": str(e)})
                print(json.dumps(rows[-1]), flush=True)
                continue
            inst = convert(m, f"tiled:{tile[0]}x{tile[1]}", dtype=np.float16)
            B = rng.standard_normal((m.shape[1], N)).astype(np.float16)
            ref = m.astype(np.float64) @ B.astype(np.float64)
            ops = operands(inst, dev)
            Bt = tvm.runtime.tensor(B, dev)
            errs, finite, error = [], True, None
            try:
                for _ in range(2):  # C poisoned each time: every element must be written
                    C = tvm.runtime.tensor(np.full((m.shape[0], N), np.nan, np.float32), dev)
                    fn(*ops, Bt, C)
                    got = C.numpy()
                    finite &= bool(np.isfinite(got).all())
                    errs.append(float(max_rel_err(got, ref)) if got.size else 0.0)
            except Exception as e:  # noqa: BLE001 - a launch error is a failed check, reported
                error = str(e).splitlines()[0][:200]
                errs.append(float("inf"))
            ok = finite and max(errs) < TOL
            bad += not ok
            rows.append({"tile": list(tile), "N": N, "knobs": kn, "weight": name, "max_rel_err": max(errs), "ok": ok,
                         **({"error": error} if error else {})})
            print(json.dumps(rows[-1]), flush=True)
    # through sparsec.compile: the kernel it builds for float16 SpMM on tiled weights (default
    # knobs, slots sized by the matrix's density), a NaN-poisoned output, two calls
    import sparsec

    for spec in ("tiled:16x64", "tiled", "tiled:32x128"):
        for name, m in ws[:4]:
            inst = convert(m, spec, dtype=np.float16)
            for N in (1, 16, 40):
                B = rng.standard_normal((m.shape[1], N)).astype(np.float16)
                ref = m.astype(np.float64) @ B.astype(np.float64)
                k = sparsec.compile("spmm", inst, target="cuda", feat=N)
                got = [k(inst, B, poison=True) for _ in range(2)]
                err = max(float(max_rel_err(g, ref)) for g in got)
                ok = bool(all(np.isfinite(g).all() for g in got) and err < TOL and "mma_sync" in k.source())
                bad += not ok
                rows.append({"compiled": spec, "N": N, "knobs": k.knobs, "weight": name, "max_rel_err": err,
                             "ok": ok})
                print(json.dumps(rows[-1]), flush=True)
    return rows, bad


def sweep_knobs(tile, rows, cols, tokens, density):
    """The default for the matrix and its neighbours: fewer warps, more stages, other cluster
    sizes, whole-tile slots."""
    from sparsec.schedules import tiled_stream as ts

    base = ts.default_knobs(tokens, rows, cols, tile, density)
    out = [base]
    for change in ({"warps": 4}, {"stages": 6}, {"stages": 8}, {"cluster": 4 if base["cluster"] != 4 else 8},
                   {"cluster": 2 if base["cluster"] != 2 else 8}, {"cap": 1}):
        k = {**base, **change}
        if k not in out:
            out.append(k)
    return out


def speed(args, rng, dev, gbps):
    import torch
    import tvm

    from sparsec.bench.timing import Timer
    from sparsec.formats import tiled
    from sparsec.kernel import on_torch_stream
    from sparsec.measure import device_l2_bytes, free_device_bytes, rotation_count
    from sparsec.reference import max_rel_err

    timer = Timer("cuda", warmup_ms=10.0, budget_ms=60.0, max_reps=100)
    tiles = [tuple(int(x) for x in t.split("x")) for t in args.tiles]
    out, bad = [], 0
    for shape in args.shapes:
        rows_, cols = (int(x) for x in shape.split("x"))
        w = (rng.standard_normal((rows_, cols)) / np.sqrt(cols)).astype(np.float16)
        for sparsity in args.sparsity:
            t0 = time.perf_counter()
            insts = {}
            for tile in tiles:
                insts[tile], keep = tiled.prune(w, sparsity=sparsity, tile=tile)
            pruned = np.where(keep, w, 0)
            n_copies = rotation_count(2 * rows_ * cols, device_l2_bytes(), free_device_bytes("cuda"), max_copies=8)
            dense = [torch.from_numpy(pruned).cuda() for _ in range(n_copies)]
            prune_s = time.perf_counter() - t0
            for tokens in args.tokens:
                x = rng.standard_normal((cols, tokens)).astype(np.float16)
                ref = pruned.astype(np.float64) @ x.astype(np.float64)
                xt = torch.from_numpy(x).cuda()
                row = {"rows": rows_, "cols": cols, "sparsity": sparsity, "tokens": tokens, "prune_s": prune_s,
                       "results": {}}
                act = 2 * cols * tokens + 4 * rows_ * tokens
                ms = timer.measure([lambda W=W: torch.mm(W, xt) for W in dense]).median_ms
                row["results"]["dense_cublas"] = {"ms": ms, "bytes": 2 * rows_ * cols + act}
                for tile in tiles:
                    inst = insts[tile]
                    wbytes = tiled.stream_bytes(inst)["total"]
                    copies = max(1, min(8, rotation_count(wbytes, device_l2_bytes(), free_device_bytes("cuda"),
                                                          max_copies=8)))
                    ops = [operands(inst, dev) for _ in range(copies)]
                    Bt = tvm.runtime.tensor(x, dev)
                    for kn in sweep_knobs(tile, rows_, cols, tokens, inst.nnz / (rows_ * cols))[:args.variants]:
                        try:
                            fn = kernel(tile, tokens, kn)
                        except ValueError:
                            continue
                        C = tvm.runtime.tensor(np.full((rows_, tokens), np.nan, np.float32), dev)
                        fn(*ops[0], Bt, C)
                        err = float(max_rel_err(C.numpy(), ref))

                        def call(o, fn=fn, C=C):
                            with on_torch_stream(True):
                                fn(*o, Bt, C)
                        ms = timer.measure([lambda o=o: call(o) for o in ops]).median_ms
                        name = (f"stream_{tile[0]}x{tile[1]}_nb{kn['nb']}_w{kn['warps']}_s{kn['stages']}"
                                f"_c{kn['cluster']}_cap{kn['cap']}_bk{kn['bk']}")
                        moved = wbytes + act
                        row["results"][name] = {"ms": ms, "max_rel_err": err, "ok": err < TOL, "knobs": kn,
                                                "bytes": moved, "gbps": moved / ms / 1e6,
                                                "of_copy_bw": moved / ms / 1e6 / gbps}
                        bad += err >= TOL
                    del ops
                d = row["results"]["dense_cublas"]["ms"]
                for r in row["results"].values():
                    r["vs_dense"] = d / r["ms"]
                out.append(row)
                best = max((r for n, r in row["results"].items() if n != "dense_cublas" and r.get("ok")),
                           key=lambda r: r["vs_dense"], default=None)
                print(json.dumps({k: v for k, v in row.items() if k != "results"}),
                      f"dense {d:.4f} ms; best {best['vs_dense'] if best else 0:.2f}x "
                      f"{best['knobs'] if best else ''} ({best['of_copy_bw'] if best else 0:.0%} of copy bw)",
                      flush=True)
            del dense
    return out, bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip-checks", action="store_true")
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--shapes", nargs="*", default=["4096x4096", "11008x4096", "4096x11008"])
    ap.add_argument("--sparsity", nargs="*", type=float, default=[0.5, 0.7, 0.8, 0.9])
    ap.add_argument("--tokens", nargs="*", type=int, default=[1, 8, 16, 32])
    ap.add_argument("--tiles", nargs="*", default=["16x64"])
    ap.add_argument("--variants", type=int, default=7, help="knob settings timed per case, the default first")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    import torch
    import tvm

    from sparsec.bench.report import geomean
    sys.path.insert(0, os.path.dirname(__file__))
    from unstructured import copy_gbps

    dev = tvm.cuda(0)
    rng = np.random.default_rng(0)
    gbps = copy_gbps("cuda")
    rows, bad = ([], 0) if args.skip_checks else checks(rng, dev, args.quick)
    speed_rows, bad_speed = ([], 0) if args.skip_speed else speed(args, rng, dev, gbps)
    gpu = torch.cuda.get_device_name()
    path = os.path.join(args.out, "check_tiled_stream.json")
    with open(path, "w") as f:
        json.dump({"device": gpu, "copy_gbps": gbps, "checks": rows, "speed": speed_rows}, f, indent=1)
    ok = sum(r.get("ok", False) for r in rows)
    print(f"\n{ok}/{sum('ok' in r for r in rows)} checks ok, {sum('refused' in r for r in rows)} refused")
    if speed_rows:
        print(f"{'shape':>11} {'sp':>4} {'tok':>4} {'dense ms':>9} {'best ms':>8} {'x dense':>7} {'bw':>5}  knobs")
        per_sp = {}
        for r in speed_rows:
            best_n, best = max(((n, x) for n, x in r["results"].items() if n != "dense_cublas" and x.get("ok")),
                               key=lambda t: t[1]["vs_dense"], default=(None, None))
            if best is None:
                continue
            per_sp.setdefault(r["sparsity"], []).append(best["vs_dense"])
            print(f"{r['rows']:>5}x{r['cols']:<5} {r['sparsity']:4.2f} {r['tokens']:4d} "
                  f"{r['results']['dense_cublas']['ms']:9.4f} {best['ms']:8.4f} {best['vs_dense']:6.2f}x "
                  f"{best['of_copy_bw']:5.0%}  {best_n}")
        for s, v in sorted(per_sp.items()):
            print(f"sparsity {s:.2f}: geomean {geomean(v):.3f}x dense (best knobs per case)")
    print(f"copy bandwidth {gbps:.0f} GB/s; written {path} ({gpu})")
    return 1 if bad or bad_speed else 0


if __name__ == "__main__":
    sys.exit(main())
