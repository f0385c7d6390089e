#!/usr/bin/env python3
"""GPU check and timing of int8 SR-BCRS SpMM on Tensor Cores (schedules.srbcrs_tensorcore)
over the ``lowprec`` suite (benchmarks/data/lowprec.py: MiniLM layers when cached, BERT-base
shapes; V = 2/4/8 at 70/80/90/95 % sparsity) at dense dimensions N.

    python benchmarks/time_srbcrs_tc.py [--quick] [--out srbcrs_tc.json] [--only SUBSTRING ...]
        [--dims N ...] [--sparsities S ...] [--sets '[{knobs}, ...]']

Kernels do not depend on the sparsity pattern, so one build per (shape, V, N, knobs) serves
every sparsity; the float32 epilogue (default knobs) is built once and checked on every case.

Weights are quantized per tensor to int8 (``formats.srbcrs.quantize``) and B drawn in
int8. Every kernel runs first on poisoned outputs and must match the int64 product
exactly; the float32 epilogue (row scales x B's scale) must match the dequantised float64
product to 1e-5. Peers in the same process: dense cuBLAS fp16 (``torch.mm`` on the pruned
weight) and int8 (``torch._int_mm``). Prints a table last; needs the TVM compiler on the
GPU host (stage1).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

import _preamble  # noqa: F401,E402  (the one preamble: checkout root and benchmarks/data on sys.path)

from _helpers import fmt  # noqa: E402
from sparsec.bench.report import geomean  # noqa: E402

DIMS = (16, 128, 512, 1024, 2048, 4096, 8192)


def main():
    import torch

    from lowprec import SPARSITIES, VECS, lowprec
    from sparsec.schedules import srbcrs_tensorcore as stc
    from sparsec.bench.timing import Timer
    from sparsec.formats import convert

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="BERT FFN-in only, 90 % sparsity, three dims")
    ap.add_argument("--out")
    ap.add_argument("--only", nargs="*", default=(), help="layers whose name holds one of these")
    ap.add_argument("--dims", nargs="*", type=int, default=(), help="dense widths N to run")
    ap.add_argument("--sparsities", nargs="*", type=float, default=())
    ap.add_argument("--sets", type=json.loads, default=[{}], help="JSON list of knob dicts (default: the defaults)")
    args = ap.parse_args()
    timer = Timer("cuda", warmup_ms=10.0, budget_ms=80.0)
    rng = np.random.default_rng(8)
    cases = lowprec(vecs=VECS, sparsities=args.sparsities or ((0.9,) if args.quick else SPARSITIES))
    if args.quick:
        cases = [c for c in cases if c[0].startswith("bert-ffn-in")]
    cases = [c for c in cases if not args.only or any(o in c[0] for o in args.only)]
    dims = args.dims or ((512, 2048, 8192) if args.quick else DIMS)
    built = {}

    def kernel(M, K, n, vec, **knobs):
        key = (M, K, n, vec, json.dumps(knobs, sort_keys=True))
        if key not in built:
            built[key] = stc.build(M, K, n, vec, arch="sm_90a", **knobs)["srbcrs_spmm"]
        return built[key]

    rows = []
    for name, w, vec, sparsity in cases:
        M, K = w.shape
        scale = float(np.abs(w).max()) / 127 or 1.0
        q = np.clip(np.round(w / scale), -127, 127)
        inst = convert(q, f"srbcrs:v{vec},int8")
        ip, ix = (torch.from_numpy(inst.arrays[k].astype(np.int32)).cuda() for k in ("indptr", "indices"))
        dv = torch.from_numpy(inst.data.view(np.int32)).cuda().view(torch.uint32)  # the kernel reads words
        a16 = torch.from_numpy((q * scale).astype(np.float16)).cuda()
        a8 = torch.from_numpy(q.astype(np.int8)).cuda()
        for n in dims:
            b = rng.integers(-127, 128, (K, n)).astype(np.int8)
            db = torch.from_numpy(b).cuda()
            # exact in float64: |sum| <= 127 * 128 * K < 2**53 (numpy's int64 matmul has no BLAS
            # and takes minutes at these sizes)
            ref = (a8.double() @ db.double()).cpu().numpy().astype(np.int64)
            deq = ref * scale
            row = {"case": name, "V": vec, "sparsity": sparsity, "M": M, "K": K, "N": n, "kernels": []}
            for knobs in args.sets:
                entry = {"knobs": knobs}
                try:
                    f = kernel(M, K, n, vec, **knobs)
                    c = torch.full((M, n), -(2 ** 31), dtype=torch.int32, device="cuda")  # poison
                    f(ip, ix, dv, db, c)
                    entry["exact"] = bool(np.array_equal(c.cpu().numpy().astype(np.int64), ref))
                    if entry["exact"]:
                        entry["ms"] = timer.measure([lambda f=f, c=c: f(ip, ix, dv, db, c)]).median_ms
                except Exception as e:  # noqa: BLE001 - reported, the rest go on
                    entry["error"] = f"{type(e).__name__}: {e}"[:300]
                row["kernels"].append(entry)
            row["exact"] = all(e.get("exact") for e in row["kernels"])
            good = [e for e in row["kernels"] if e.get("ms")]
            if good:
                row["ms"] = min(e["ms"] for e in good)
            try:
                fs = kernel(M, K, n, vec, out_dtype="float32")
                rs = torch.full((M,), scale, dtype=torch.float32, device="cuda")
                cf = torch.full((M, n), float("nan"), device="cuda")
                fs(ip, ix, dv, db, cf, rs, 1.0)
                row["float_rel_err"] = float(np.nan_to_num(np.abs(cf.cpu().numpy() - deq), nan=np.inf).max()
                                             / max(np.abs(deq).max(), 1e-30))
            except Exception as e:  # noqa: BLE001
                row["float_error"] = f"{type(e).__name__}: {e}"[:300]
            if row.get("float_rel_err", np.inf) > 1e-5:
                row["exact"] = False
            b16 = db.to(torch.float16)
            got16 = torch.mm(a16, b16).double().cpu().numpy()
            row["cublas_fp16_rel_err"] = float(np.abs(got16 - deq).max() / max(np.abs(deq).max(), 1e-30))
            row["cublas_fp16_ms"] = timer.measure([lambda: torch.mm(a16, b16)]).median_ms
            try:
                bt = db.t().contiguous().t()  # _int_mm wants the second operand column-major
                row["int_mm_exact"] = bool(np.array_equal(torch._int_mm(a8, bt).cpu().numpy(), ref))
                if row["int_mm_exact"]:  # a peer is timed only when its answer is right too
                    row["int_mm_ms"] = timer.measure([lambda: torch._int_mm(a8, bt)]).median_ms
            except Exception as e:  # noqa: BLE001 - _int_mm refuses some shapes (M <= 16)
                row["int_mm_error"] = f"{type(e).__name__}: {e}"[:200]
            rows.append(row)
            errors = [e["error"][:120] for e in row["kernels"] if e.get("error")]
            print(f"{name} N={n}: {row.get('ms', float('nan')):.4g} ms, exact {row.get('exact')}, "
                  f"cuBLAS fp16 {row['cublas_fp16_ms']:.4g} ms {errors or ''}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "cases": rows}, indent=1))
    print("| case | N | sparsec ms | cuBLAS fp16 ms | _int_mm ms | vs fp16 | exact | float err |")
    print("|---|---:|---:|---:|---:|---:|---|---:|")
    by = {}
    for r in rows:
        vs = r["cublas_fp16_ms"] / r["ms"] if r.get("ms") else None
        if vs and r["N"] >= 512:
            by.setdefault((r["V"], r["sparsity"]), []).append(vs)
        print(f"| {r['case']} | {r['N']} | {fmt(r.get('ms'))} | {fmt(r['cublas_fp16_ms'])} | "
              f"{fmt(r.get('int_mm_ms'))} | {fmt(vs, 'x')} | {r.get('exact')} | {fmt(r.get('float_rel_err'))} |")
    for (v, s), xs in sorted(by.items()):
        print(f"V={v} sparsity {s:.0%}: geomean vs dense fp16 (N >= 512) {geomean(xs):.2f}x over {len(xs)} cases")
    for s in sorted({s for _, s in by}):
        xs = [x for (_, s2), v in by.items() if s2 == s for x in v]
        print(f"sparsity {s:.0%}, all V: geomean vs dense fp16 (N >= 512) {geomean(xs):.2f}x over {len(xs)} cases")
    im = [r["cublas_fp16_ms"] / r["int_mm_ms"] for r in rows if r.get("int_mm_ms") and r["N"] >= 512]
    if im:
        print(f"dense int8 (_int_mm) vs dense fp16 (N >= 512): geomean {geomean(im):.2f}x over {len(im)} cases")
    sets = {}
    for r in rows:
        for e in r["kernels"]:
            if e.get("ms") and r["N"] >= 512:
                sets.setdefault(json.dumps(e["knobs"], sort_keys=True), []).append(r["cublas_fp16_ms"] / e["ms"])
    for knobs, xs in sets.items():
        print(f"knobs {knobs}: geomean vs dense fp16 (N >= 512) {geomean(xs):.2f}x over {len(xs)} cases")


if __name__ == "__main__":
    main()
