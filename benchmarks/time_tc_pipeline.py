#!/usr/bin/env python3
"""GPU check and timing of the pipelined Tensor Core SpMM (schedules.tc_pipeline) on the
``nm`` suite: 2:4 weights through ``mma.sp`` (mode sp24) and vector-wise 1:8 weights through
gathered dense ``mma`` (mode gather), C = A @ B with A the weight (out x in, fp16) and B the
activations (in x N tokens, fp16), C fp16.

    python benchmarks/time_tc_pipeline.py [--mode sp24|gather|both] [--quick] [--out tc.json]
        [--only SUBSTRING ...] [--tokens N ...] [--sets '[{knobs}, ...]'] [--no-odd]

``--only``/``--tokens``/``--sets`` narrow a run to some layers, widths and knob sets (for
sweeps and profiling); the default is the whole suite with the knob sets below.

Every kernel runs first on poisoned outputs (NaN) and is compared with the float64 product
(relative to the largest reference value); only correct kernels are timed. Peers in the
same process on the same operands: dense cuBLAS fp16 (``torch.mm`` on the pruned weight)
and, for 2:4, cuSPARSELt (``torch._cslt_sparse_mm``). Timing: ``sparsec.bench.timing.Timer``
(CUDA-graph replay, median). Prints a table last; needs the TVM compiler (stage1).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import _preamble  # noqa: F401,E402  (the one preamble: checkout root and benchmarks/data on sys.path)

from _helpers import fmt  # noqa: E402
from sparsec.reference import max_rel_err  # noqa: E402
from sparsec.bench.report import geomean  # noqa: E402

TOKENS = (16, 128, 512, 1024, 2048, 4096, 8192)
QUICK_TOKENS = (16, 512, 2048, 8192)
GATHER = {"n": 1, "m": 8, "vec": 128}
LARGE_N_SETS = [  # N >= 512: the best four of the H200 sweep (benchmarks/results/nm_tc_sweep_H200.json)
    dict(warps_m=2, warps_n=2, warp_m_tiles=4, warp_n_tiles=4, k_steps=4, stages=3, group_m=8),
    dict(warps_m=2, warps_n=2, warp_m_tiles=4, warp_n_tiles=4, k_steps=2, stages=4, group_m=8),
    dict(warps_m=2, warps_n=2, warp_m_tiles=4, warp_n_tiles=8, k_steps=2, stages=4, frag_sets=1, group_m=16),
    dict(warps_m=2, warps_n=2, warp_m_tiles=4, warp_n_tiles=4, k_steps=2, stages=3, group_m=8)]
SMALL_N_SETS = [  # N < 512: narrow column tiles, deep K stages
    dict(warps_m=4, warps_n=1, warp_m_tiles=2, warp_n_tiles=2, k_steps=2, stages=4),
    dict(warps_m=4, warps_n=1, warp_m_tiles=1, warp_n_tiles=2, k_steps=4, stages=4),
    dict(warps_m=2, warps_n=2, warp_m_tiles=4, warp_n_tiles=4, k_steps=2, stages=3)]


def knob_sets(n: int, quick: bool):
    sets = LARGE_N_SETS if n >= 512 else SMALL_N_SETS
    return sets[:2] if quick else sets


ODD = ((37, 70, 13), (1000, 515, 77), (16, 32, 8), (130, 200, 24),
       (1300, 260, 40))  # 11 row tiles of 128: the last group of the grouped order is short


def weights(mode: str):
    """``[(name, pruned float16 weight)]``: the nm suite's layers (2:4, or vector-wise 1:8)
    and a 4096 x 4096 layer."""
    from sparsec.formats import nm, nm_tc
    from lowprec import weights as suite_weights

    rng = np.random.default_rng(24)
    layers = suite_weights() + [("random-4096x4096", (0.02 * rng.standard_normal((4096, 4096))).astype(np.float32))]
    out = []
    for name, w in layers:
        if mode == "sp24":
            out.append((f"{name}-2of4", np.where(nm.prune(w, n=2, m=4)[1], w, 0).astype(np.float16)))
        else:
            out.append((f"{name}-1of8-v{GATHER['vec']}", nm_tc.prune(w, **GATHER).astype(np.float16)))
    return out


def operands(mode, a):
    """(A, E) device arrays of the weight for ``mode`` and the gathered row length kc."""
    import torch

    from sparsec.formats import mma_sp, nm_tc

    if mode == "sp24":
        values, meta = mma_sp.pack(a)
        return (torch.from_numpy(values).cuda(), torch.from_numpy(meta.view(np.int32)).cuda().view(torch.uint32)), 0
    values, cols = nm_tc.pack(a, **GATHER)
    nm_tc.check(values, cols, a.shape, GATHER["vec"])
    return (torch.from_numpy(values).cuda(), torch.from_numpy(cols).cuda()), values.shape[1]


def run_mode(mode, quick, timer, rng, only=(), tokens=(), sets=None, odd=True):
    import torch

    from sparsec.schedules import tc_pipeline as tp

    cases = [(name, w, n) for name, w in weights(mode) for n in (tokens or (QUICK_TOKENS if quick else TOKENS))
             if not only or any(o in name for o in only)]
    for m, k, n in ODD if odd else ():
        w = rng.standard_normal((m, k)).astype(np.float32)
        if mode == "sp24":
            from sparsec.formats import nm
            cases.append((f"odd-{m}x{k}", np.where(nm.prune(w, n=2, m=4)[1], w, 0).astype(np.float16), n))
        else:
            from sparsec.formats import nm_tc
            cases.append((f"odd-{m}x{k}", nm_tc.prune(w, **GATHER).astype(np.float16), n))
    rows = []
    for name, a, n in cases:
        m, k = a.shape
        b = rng.standard_normal((k, n)).astype(np.float16)
        ref = a.astype(np.float64) @ b.astype(np.float64)
        (da, de), kc = operands(mode, a)
        db = torch.from_numpy(b).cuda()
        ta = torch.from_numpy(a).cuda()
        row = {"mode": mode, "case": name, "M": m, "K": k, "N": n, "kernels": []}
        for knobs in sets or knob_sets(n, quick):
            entry = {"knobs": knobs}
            try:
                t0 = time.perf_counter()
                f = tp.build(mode, m, k, n, arch="sm_90a", out_dtype="float16", vec=GATHER["vec"], kc=kc,
                             **knobs)["tc_spmm"]
                c = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
                f(da, de, db, c)
                torch.cuda.synchronize()
                entry["build_s"] = round(time.perf_counter() - t0, 2)
                err = max_rel_err(c, ref)
                entry.update(max_rel_err=err, ok=err <= 1e-2)
                if entry["ok"]:
                    entry["ms"] = timer.measure([lambda f=f, c=c: f(da, de, db, c)]).median_ms
            except ValueError as e:  # knobs this shape cannot take (e.g. vector height)
                entry.update(ok=None, skipped=str(e)[:200])
            except Exception as e:  # noqa: BLE001 - a failing knob set is reported, the rest go on
                entry.update(ok=False, error=f"{type(e).__name__}: {e}"[:300])
            row["kernels"].append(entry)
        row["cublas_err"] = max_rel_err(torch.mm(ta, db), ref)
        row["cublas_ms"] = timer.measure([lambda: torch.mm(ta, db)]).median_ms
        if mode == "sp24":
            try:
                comp = torch._cslt_compress(ta)
                row["cusparselt_err"] = max_rel_err(torch._cslt_sparse_mm(comp, db), ref)
                if row["cusparselt_err"] <= 1e-2:  # a peer is timed only when its answer is right too
                    row["cusparselt_ms"] = timer.measure([lambda: torch._cslt_sparse_mm(comp, db)]).median_ms
            except Exception as e:  # noqa: BLE001 - cuSPARSELt refuses some shapes (not multiples of 16)
                row["cusparselt_error"] = f"{type(e).__name__}: {e}"[:200]
        good = [x for x in row["kernels"] if x.get("ms")]
        row["best"] = min(good, key=lambda x: x["ms"]) if good else None
        row["all_correct"] = all(x["ok"] is not False for x in row["kernels"])
        rows.append(row)
        best = row["best"]
        print(f"{mode} {name} {m}x{k} N={n}: best {best['ms'] if best else float('nan'):.4g} ms "
              f"{best['knobs'] if best else ''} | cuBLAS {row['cublas_ms']:.4g} | "
              f"cuSPARSELt {row.get('cusparselt_ms', float('nan')):.4g} | "
              f"{sum(x['ok'] is True for x in row['kernels'])}/{len(row['kernels'])} correct "
              f"{[x.get('error', '')[:120] for x in row['kernels'] if x['ok'] is False]}", flush=True)
    return rows


def per_knob_set(rows):
    """Each knob set's geomean ratio over cuBLAS (N >= 512, suite layers) and how often it won."""
    by = {}
    for r in rows:
        if r["N"] < 512 or r["case"].startswith("odd") or not r["best"]:
            continue
        for k in r["kernels"]:
            if k.get("ms"):
                key = (r["mode"], json.dumps(k["knobs"], sort_keys=True))
                by.setdefault(key, []).append((r["cublas_ms"] / k["ms"], k == r["best"]))
    for (mode, knobs), v in sorted(by.items()):
        print(f"{mode} {knobs}: geomean vs cuBLAS {geomean([x for x, _ in v]):.3f}x over {len(v)}, "
              f"best in {sum(b for _, b in v)}")


def summary(rows):
    per_knob_set(rows)
    print("| mode | case | M x K | N | sparsec ms | cuBLAS fp16 ms | cuSPARSELt ms | vs cuBLAS | vs cuSPARSELt | correct |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        ms = r["best"]["ms"] if r["best"] else None
        vs_b = r["cublas_ms"] / ms if ms else None
        vs_c = r["cusparselt_ms"] / ms if ms and r.get("cusparselt_ms") else None
        print(f"| {r['mode']} | {r['case']} | {r['M']}x{r['K']} | {r['N']} | {fmt(ms)} | {fmt(r['cublas_ms'])} | "
              f"{fmt(r.get('cusparselt_ms'))} | {fmt(vs_b, 'x')} | {fmt(vs_c, 'x')} | {r['all_correct']} |")
    for mode in ("sp24", "gather"):
        mine = [r for r in rows if r["mode"] == mode and r["best"] and not r["case"].startswith("odd")]
        if not mine:
            continue
        big = [r for r in mine if r["N"] >= 1024]
        if big:
            print(f"{mode}: geomean vs cuBLAS (N >= 1024) {geomean([r['cublas_ms'] / r['best']['ms'] for r in big]):.3f}x"
                  f" over {len(big)}")
            cs = [r["cusparselt_ms"] / r["best"]["ms"] for r in big if r.get("cusparselt_ms")]
            if cs:
                print(f"{mode}: geomean vs cuSPARSELt (N >= 1024) {geomean(cs):.3f}x over {len(cs)}")
        mid = [r for r in mine if r["N"] >= 512]
        if mid:
            print(f"{mode}: geomean vs cuBLAS (N >= 512) {geomean([r['cublas_ms'] / r['best']['ms'] for r in mid]):.3f}x")
        small = [r["cublas_ms"] / r["best"]["ms"] for r in mine if r["N"] == 16]
        if small:
            print(f"{mode}: N = 16 lowest vs cuBLAS {min(small):.3f}x over {len(small)}")


def main():
    import torch

    from sparsec.bench.timing import Timer

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("sp24", "gather", "both"), default="both")
    ap.add_argument("--quick", action="store_true", help=f"N in {QUICK_TOKENS}, two knob sets only")
    ap.add_argument("--out")
    ap.add_argument("--only", nargs="*", default=(), help="layers whose name holds one of these")
    ap.add_argument("--tokens", nargs="*", type=int, default=(), help="dense widths N to run")
    ap.add_argument("--sets", type=json.loads, help="JSON list of knob dicts to run instead of the defaults")
    ap.add_argument("--no-odd", action="store_true", help="skip the odd-shape correctness cases")
    args = ap.parse_args()
    timer = Timer("cuda", warmup_ms=10.0, budget_ms=60.0)
    rng = np.random.default_rng(24)
    rows = []
    for mode in (("sp24", "gather") if args.mode == "both" else (args.mode,)):
        rows += run_mode(mode, args.quick, timer, rng, args.only, args.tokens, args.sets, not args.no_odd)
        if args.out:
            Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "cases": rows}, indent=1))
    summary(rows)


if __name__ == "__main__":
    main()
