#!/usr/bin/env python3
"""GPU check and timing of the 2:4 Sparse Tensor Core SpMM (schedules.sparse_tensorcore):
C = A @ B, A a 2:4-pruned weight (out x in, fp16), B activations (in x N tokens, fp16).

    python benchmarks/nm24_check.py [--quick] [--out nm24.json]

Every kernel runs first on poisoned outputs (NaN) and is compared with the float64
product (relative to the largest reference value); only correct kernels are timed. Peers
in the same process, on the same operands: dense cuBLAS (``torch.mm`` on the pruned weight
in fp16) and cuSPARSELt (``torch._cslt_sparse_mm`` on ``torch._cslt_compress``). Timing:
``sparsec.bench.timing.Timer`` (CUDA-graph replay, median). Shapes: BERT-base layers
(3072x768, 768x3072, 768x768), a 4096x4096 layer, odd sizes, N = 16 ... 8192. Prints a table
last; needs the TVM compiler on the GPU host (stage1).
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WEIGHTS = ((3072, 768), (768, 3072), (768, 768), (4096, 4096))
ODD = ((37, 70, 13), (1000, 515, 77), (16, 32, 8))
TOKENS = (16, 128, 512, 1024, 2048, 4096, 8192)
KNOB_SETS = [{"warp_n_tiles": nt, "warps": w} for nt, w in itertools.product((1, 2, 4, 8), (1, 2, 4, 8))]


def prune_24(w: np.ndarray) -> np.ndarray:
    """Keep the 2 largest magnitudes of every 4 along each row."""
    rows, cols = w.shape
    g = w.reshape(rows, cols // 4, 4)
    keep = np.argsort(-np.abs(g.astype(np.float32)), -1)[..., :2]
    mask = np.zeros(g.shape, bool)
    np.put_along_axis(mask, keep, True, -1)
    return np.where(mask, g, 0).reshape(rows, cols).astype(np.float16)


def main():
    import torch

    from formats import mma_sp
    from schedules import sparse_tensorcore as stc
    from sparsec.bench.timing import Timer

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="default knobs only, fewer token counts")
    ap.add_argument("--out")
    args = ap.parse_args()
    timer = Timer("cuda", warmup_ms=10.0, budget_ms=80.0)
    rng = np.random.default_rng(24)
    cases = [(m, k, n) for m, k in WEIGHTS for n in (TOKENS[::2] if args.quick else TOKENS)]
    cases += [c for c in ODD]
    knob_sets = [stc.default_knobs()] if args.quick else KNOB_SETS
    rows = []
    for m, k, n in cases:
        a = prune_24(rng.standard_normal((m, -(-k // 4) * 4)).astype(np.float16))[:, :k]
        b = rng.standard_normal((k, n)).astype(np.float16)
        ref = a.astype(np.float64) @ b.astype(np.float64)
        scale = float(np.abs(ref).max()) or 1.0
        values, meta = mma_sp.pack(a)
        dv = torch.from_numpy(values).cuda()
        dm = torch.from_numpy(meta.view(np.int32)).cuda().view(torch.uint32)  # the kernel reads uint32 words
        db = torch.from_numpy(b).cuda()
        ta = torch.from_numpy(a).cuda()
        row = {"M": m, "K": k, "N": n, "kernels": []}
        for knobs in knob_sets:
            try:
                ex = stc.build(m, k, n, arch="sm_90a", **knobs)
                f = ex["spmm24"]
                c = torch.full((m, n), float("nan"), device="cuda")
                f(dv, dm, db, c)
                torch.cuda.synchronize()
                err = float(np.nan_to_num(np.abs(c.cpu().numpy() - ref), nan=np.inf).max()) / scale
                entry = {"knobs": knobs, "max_rel_err": err, "ok": err <= 1e-2}
                if entry["ok"]:
                    entry["ms"] = timer.measure([lambda f=f, c=c: f(dv, dm, db, c)]).median_ms
            except Exception as e:  # noqa: BLE001 - a failing knob set is reported, the rest go on
                entry = {"knobs": knobs, "ok": False, "error": f"{type(e).__name__}: {e}"[:300]}
            row["kernels"].append(entry)
        row["cublas_ms"] = timer.measure([lambda: torch.mm(ta, db)]).median_ms
        try:
            comp = torch._cslt_compress(ta)
            got = torch._cslt_sparse_mm(comp, db).float().cpu().numpy()
            row["cusparselt_err"] = float(np.abs(got - ref).max()) / scale
            row["cusparselt_ms"] = timer.measure([lambda: torch._cslt_sparse_mm(comp, db)]).median_ms
        except Exception as e:  # noqa: BLE001 - cuSPARSELt refuses some shapes (e.g. not multiples of 16)
            row["cusparselt_error"] = f"{type(e).__name__}: {e}"[:200]
        good = [x for x in row["kernels"] if x.get("ms")]
        row["best"] = min(good, key=lambda x: x["ms"]) if good else None
        rows.append(row)
        best = row["best"]
        print(f"{m}x{k} N={n}: best {best['ms'] if best else float('nan'):.4g} ms {best['knobs'] if best else ''} | "
              f"cuBLAS {row['cublas_ms']:.4g} | cuSPARSELt {row.get('cusparselt_ms', float('nan')):.4g} | "
              f"{sum(x['ok'] for x in row['kernels'])}/{len(row['kernels'])} correct", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "cases": rows}, indent=1))
    print("| M x K | N | sparsec ms | cuBLAS fp16 ms | cuSPARSELt ms | vs cuBLAS | vs cuSPARSELt | all correct |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    ratios = {"cublas": [], "cslt": []}
    for r in rows:
        b = r["best"]
        ms = b["ms"] if b else None
        vs_b = r["cublas_ms"] / ms if ms else None
        vs_c = r["cusparselt_ms"] / ms if ms and r.get("cusparselt_ms") else None
        if r["M"] >= 1024 and vs_b:
            ratios["cublas"].append(vs_b)
        if r["M"] >= 1024 and vs_c:
            ratios["cslt"].append(vs_c)
        print(f"| {r['M']}x{r['K']} | {r['N']} | {_f(ms)} | {_f(r['cublas_ms'])} | {_f(r.get('cusparselt_ms'))} | "
              f"{_f(vs_b, 'x')} | {_f(vs_c, 'x')} | {all(x['ok'] for x in r['kernels'])} |")
    for k, v in ratios.items():
        if v:
            print(f"geomean vs {k} (M >= 1024): {math.exp(sum(map(math.log, v)) / len(v)):.3f}x over {len(v)} cases")


def _f(x, unit=""):
    return f"{x:.4g}{unit}" if x else "-"


if __name__ == "__main__":
    main()
