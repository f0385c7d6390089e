#!/usr/bin/env python3
"""hyb SpMM with its fill over the rows no storing bucket writes (``lower.fill_rows``, the
default) against the fill over all rows (GPU host; ``--target llvm`` for a CPU dry run).

    python3 benchmarks/time_fill_rows.py [--matrix cond-mat rmat-s18 ...] [--feat 32 128 512] [--max-rmat 4M]

Per graphs-suite matrix and width: the matrix in the format the rule picks when that is hyb
(else ``hyb``), both builds checked against float64 on NaN-poisoned outputs, then timed in
alternated rounds (CUDA events, median of 50 back-to-back launches a round; the minimum
round is kept). Writes $OUT/time_fill_rows.json (or --out) and prints a table last.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import _preamble  # noqa: F401,E402

import numpy as np  # noqa: E402

VARIANTS = ("all_rows", "listed_rows")


def compile_both(inst, feat: int, target: str) -> dict:
    import sparsec
    from sparsec.lower import fill_rows

    kernels = {}
    saved = fill_rows.ENABLED
    try:
        for name in VARIANTS:
            fill_rows.ENABLED = name == "listed_rows"
            kernels[name] = sparsec.compile("spmm", inst, target=target, feat=feat, knobs="default")
    finally:
        fill_rows.ENABLED = saved
    return kernels


def timer(target: str):
    if target.startswith("cuda"):
        from check_segment_split import time_ms

        return time_ms

    def cpu_ms(k, inst, B, reps=5):
        k(inst, B)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            k(inst, B)
            times.append((time.perf_counter() - t0) * 1e3)
        return float(np.median(times))

    return cpu_ms


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--matrix", nargs="*", help="graphs-suite names (default: all)")
    ap.add_argument("--feat", type=int, nargs="+", default=[32, 128, 512])
    ap.add_argument("--max-rmat", default="4M")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--target", default="cuda")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "time_fill_rows.json"))
    args = ap.parse_args(argv)
    from sparsec.bench.cases import parse_count
    from sparsec.bench.suites import RMAT_SPECS, graphs
    from sparsec.formats import convert
    from sparsec.formats.choose import default_format, row_stats
    from sparsec.ir_attrs import fill_rows_parts
    from sparsec.reference import max_rel_err

    limit = parse_count(args.max_rmat)
    specs = [s for s in RMAT_SPECS if s.nnz <= limit]
    time_of = timer(args.target)
    rng = np.random.default_rng(0)
    rows = []
    for name, m in graphs(rmat_specs=specs):
        if args.matrix and name not in args.matrix:
            continue
        for feat in args.feat:
            spec = default_format("spmm", row_stats(m), feat)
            spec = spec if spec.startswith("hyb") else "hyb"
            inst = convert(m, spec)
            kernels = compile_both(inst, feat, args.target)
            listed = [p.name for p in kernels["listed_rows"].params if fill_rows_parts(p.name) is not None]
            B = rng.standard_normal((m.shape[1], feat)).astype(np.float32)
            ref = m.astype(np.float64) @ B.astype(np.float64)
            row = {"matrix": name, "rows": m.shape[0], "nnz": int(m.nnz), "feat": feat, "format": inst.format.spec,
                   "list": listed[0] if listed else None}
            if listed:
                from sparsec.tc_operands import fill_rows as rows_of

                row["listed_rows"] = int(rows_of(inst, fill_rows_parts(listed[0]))[listed[0]].size)
            for v, k in kernels.items():
                row[f"{v}_max_rel_err"] = float(max_rel_err(k(inst, B, poison=True), ref))
            rounds = {v: [] for v in kernels}
            for _ in range(args.rounds):
                for v, k in kernels.items():
                    rounds[v].append(time_of(k, inst, B))
            for v in kernels:
                row[f"{v}_ms"] = min(rounds[v])
            row["speedup"] = row["all_rows_ms"] / row["listed_rows_ms"]
            rows.append(row)
            print(f"{name} F={feat}: all rows {row['all_rows_ms']:.4f} ms, listed {row['listed_rows_ms']:.4f} ms "
                  f"({row['speedup']:.3f}x), errors {row['all_rows_max_rel_err']:.1e} / "
                  f"{row['listed_rows_max_rel_err']:.1e}", flush=True)
    device = args.target
    if args.target.startswith("cuda"):
        import torch

        device = torch.cuda.get_device_name()
    geo = math.exp(np.mean([math.log(r["speedup"]) for r in rows])) if rows else float("nan")
    Path(args.out).write_text(json.dumps({"device": device, "target": args.target, "geomean_speedup": geo,
                                          "cases": rows}, indent=1))
    print(f"\n{device}: hyb SpMM, fill over listed rows vs all rows")
    print("| matrix | F | rows | listed | all rows ms | listed ms | speedup |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['matrix']} | {r['feat']} | {r['rows']} | {r.get('listed_rows', '-')} | {r['all_rows_ms']:.4f} | "
              f"{r['listed_rows_ms']:.4f} | {r['speedup']:.3f} |")
    print(f"geomean {geo:.3f}x over {len(rows)} cases")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
