#!/usr/bin/env python3
"""GPU check and timing of the 2:4 Sparse Tensor Core SpMM (schedules.sparse_tensorcore):
C = A @ B, A a 2:4-pruned weight (out x in, fp16), B activations (in x N tokens, fp16).

    python benchmarks/nm24_check.py [--quick] [--out nm24.json]

About 6 builds per case (one per knob set, a few seconds each): the full run needs most of
a 10-minute device call; ``--quick`` builds the default knobs only.

Every kernel runs first on poisoned outputs (NaN) and is compared with the float64
product (relative to the largest reference value); only correct kernels are timed. Peers
in the same process, on the same operands: dense cuBLAS (``torch.mm`` on the pruned weight
in fp16) and cuSPARSELt (``torch._cslt_sparse_mm`` on ``torch._cslt_compress``). Timing:
``sparsec.bench.timing.Timer`` (CUDA-graph replay, median). Weights: the ``nm`` suite's 2:4
layers (benchmarks/data/lowprec.py: MiniLM when cached, BERT-base shapes), a 4096x4096
layer and odd sizes, each pruned by ``formats.nm.prune``; N = 16 ... 8192. Prints a table
last; needs the TVM compiler on the GPU host (stage1).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "data"))

from check_common import fmt  # noqa: E402
from sparsec.bench.report import geomean  # noqa: E402

EXTRA = {"random-4096x4096": (4096, 4096)}
ODD = ((37, 70, 13), (1000, 515, 77), (16, 32, 8))
TOKENS = (16, 128, 512, 1024, 2048, 4096, 8192)
KNOB_SETS = [{"warp_n_tiles": nt, "warps": w} for nt, w in ((2, 4), (4, 4), (8, 2), (4, 2), (2, 8), (1, 4))]


def rel_max(out, ref, scale) -> float:
    """Largest |out - ref| over the largest |ref| (a NaN left in ``out`` counts as infinite)."""
    got = out.float().cpu().numpy()
    return float(np.nan_to_num(np.abs(got - ref), nan=np.inf).max()) / scale


def weights():
    """``[(name, 2:4-pruned float16 weight)]``: the nm suite's 2:4 layers and EXTRA."""
    from formats import nm
    from lowprec import nm as nm_suite

    out = [(name, w.astype(np.float16)) for name, w, n, m in nm_suite(patterns=((2, 4),))]
    rng = np.random.default_rng(24)
    for name, shape in EXTRA.items():
        w = (0.02 * rng.standard_normal(shape)).astype(np.float32)
        out.append((name, np.where(nm.prune(w, n=2, m=4)[1], w, 0).astype(np.float16)))
    return out


def main():
    import torch

    from formats import mma_sp, nm
    from schedules import sparse_tensorcore as stc
    from schedules.warp_mma import default_knobs
    from sparsec.bench.timing import Timer

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="default knobs only, fewer token counts")
    ap.add_argument("--out")
    args = ap.parse_args()
    timer = Timer("cuda", warmup_ms=10.0, budget_ms=80.0)
    rng = np.random.default_rng(24)
    cases = [(name, w, n) for name, w in weights() for n in (TOKENS[::2] if args.quick else TOKENS)]
    for m, k, n in ODD:
        w = rng.standard_normal((m, k)).astype(np.float32)
        cases.append((f"odd-{m}x{k}", np.where(nm.prune(w, n=2, m=4)[1], w, 0).astype(np.float16), n))
    knob_sets = [default_knobs(stc.KNOBS)] if args.quick else KNOB_SETS
    rows = []
    for name, a, n in cases:
        m, k = a.shape
        b = rng.standard_normal((k, n)).astype(np.float16)
        ref = a.astype(np.float64) @ b.astype(np.float64)
        scale = float(np.abs(ref).max()) or 1.0
        values, meta = mma_sp.pack(a)
        dv = torch.from_numpy(values).cuda()
        dm = torch.from_numpy(meta.view(np.int32)).cuda().view(torch.uint32)  # the kernel reads uint32 words
        db = torch.from_numpy(b).cuda()
        ta = torch.from_numpy(a).cuda()
        row = {"case": name, "M": m, "K": k, "N": n, "kernels": []}
        for knobs in knob_sets:
            try:
                ex = stc.build(m, k, n, arch="sm_90a", **knobs)
                f = ex["spmm24"]
                c = torch.full((m, n), float("nan"), device="cuda")
                f(dv, dm, db, c)
                err = rel_max(c, ref, scale)
                entry = {"knobs": knobs, "max_rel_err": err, "ok": err <= 1e-2}
                if entry["ok"]:
                    entry["ms"] = timer.measure([lambda f=f, c=c: f(dv, dm, db, c)]).median_ms
            except Exception as e:  # noqa: BLE001 - a failing knob set is reported, the rest go on
                entry = {"knobs": knobs, "ok": False, "error": f"{type(e).__name__}: {e}"[:300]}
            row["kernels"].append(entry)
        row["cublas_err"] = rel_max(torch.mm(ta, db), ref, scale)
        row["cublas_ms"] = timer.measure([lambda: torch.mm(ta, db)]).median_ms
        try:
            comp = torch._cslt_compress(ta)
            row["cusparselt_err"] = rel_max(torch._cslt_sparse_mm(comp, db), ref, scale)
            if row["cusparselt_err"] <= 1e-2:  # a peer is timed only when its answer is right too
                row["cusparselt_ms"] = timer.measure([lambda: torch._cslt_sparse_mm(comp, db)]).median_ms
        except Exception as e:  # noqa: BLE001 - cuSPARSELt refuses some shapes (e.g. not multiples of 16)
            row["cusparselt_error"] = f"{type(e).__name__}: {e}"[:200]
        good = [x for x in row["kernels"] if x.get("ms")]
        row["best"] = min(good, key=lambda x: x["ms"]) if good else None
        rows.append(row)
        best = row["best"]
        print(f"{name} {m}x{k} N={n}: best {best['ms'] if best else float('nan'):.4g} ms {best['knobs'] if best else ''} | "
              f"cuBLAS {row['cublas_ms']:.4g} | cuSPARSELt {row.get('cusparselt_ms', float('nan')):.4g} | "
              f"{sum(x['ok'] for x in row['kernels'])}/{len(row['kernels'])} correct", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "cases": rows}, indent=1))
    print("| case | M x K | N | sparsec ms | cuBLAS fp16 ms | cuSPARSELt ms | vs cuBLAS | vs cuSPARSELt | all correct |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    ratios = {"cublas": [], "cslt": []}  # the "M" is the token count: N here
    small = []
    for r in rows:
        b = r["best"]
        ms = b["ms"] if b else None
        vs_b = r["cublas_ms"] / ms if ms else None
        vs_c = r["cusparselt_ms"] / ms if ms and r.get("cusparselt_ms") else None
        if r["N"] >= 1024 and vs_b:
            ratios["cublas"].append(vs_b)
        if r["N"] >= 1024 and vs_c:
            ratios["cslt"].append(vs_c)
        if r["N"] == 16 and vs_b:
            small.append(vs_b)
        print(f"| {r['case']} | {r['M']}x{r['K']} | {r['N']} | {fmt(ms)} | {fmt(r['cublas_ms'])} | "
              f"{fmt(r.get('cusparselt_ms'))} | {fmt(vs_b, 'x')} | {fmt(vs_c, 'x')} | "
              f"{all(x['ok'] for x in r['kernels'])} |")
    for k, v in ratios.items():
        if v:
            print(f"geomean vs {k} (tokens N >= 1024): {geomean(v):.3f}x over {len(v)} cases")
    if small:
        print(f"tokens N = 16: lowest ratio vs cuBLAS {min(small):.3f}x over {len(small)} cases")


if __name__ == "__main__":
    main()
