#!/usr/bin/env python3
"""Explicit unroll (TVM copies loop bodies) vs pragma unroll (nvcc unrolls): kernel time and
build time of the same candidates, side by side on one GPU.

    python benchmarks/time_unroll.py --log tuning_logs/spmm_cuda_sm_90a.jsonl [--matrix ...] [--feat 32 128 512]
        [--out unroll.json]

For each case (graph x F) the candidates are the log's 3 fastest, the default, and the 2
slowest to build. Every candidate is built and measured twice, once per mode
(``SPARSEC_CUDA_UNROLL`` in the build workers; the measuring side is the same), and the
explicit pass is run again on each case's fastest candidate to show the drift between
passes. Prints a table last: per case, the best time in each mode, the geometric mean of
pragma/explicit over the case's candidates, and the median / largest build seconds.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import _preamble  # noqa: F401,E402  (the one preamble: checkout root and benchmarks/data on sys.path)

from _helpers import fmt  # noqa: E402
from sparsec.bench.report import geomean  # noqa: E402

MATRICES = ("email-Enron", "as-22july06", "pgp-strong-2009", "mdual", "cond-mat-2005", "astro-ph", "copter2")


def case_candidates(recs, name, feat):
    """The log's 3 fastest, the default and the 2 slowest builds of one case."""
    from sparsec.tune.space import candidate_id

    mine = [r for r in recs if r.matrix == name and r.feat == feat]
    ok = sorted((r for r in mine if r.status == "ok"), key=lambda r: r.time_ms)
    chosen = ok[:3] + [r for r in mine if r.extra.get("default")]
    chosen += sorted((r for r in mine if r.extra.get("compile_s")), key=lambda r: -r.extra["compile_s"])[:2]
    out, seen = [], set()
    for r in chosen:
        c = {"op": "spmm", "format": r.format, "format_knobs": r.format_knobs, "schedule_knobs": r.schedule_knobs,
             "feat": feat, "dtype": r.dtype}
        if candidate_id(c) not in seen:
            seen.add(candidate_id(c))
            out.append(c)
    return out


def run_pass(mode, cases, mats, target, build_timeout):
    from sparsec.tune.runner import Runner

    res = {}
    with Runner(target, timeout_s=30.0, build_timeout_s=build_timeout, build_env={"SPARSEC_CUDA_UNROLL": mode}) as rn:
        for name in sorted({n for n, _ in cases}):
            batch = [c for (n, f), cs in cases.items() if n == name for c in cs]
            for c, r in zip(batch, rn.measure(batch, mats[name])):
                res[(name, c["feat"], json.dumps(c, sort_keys=True))] = r
            print(f"{mode}: {name} {len(batch)} candidates", flush=True)
    return res


def main():
    from sparsec.tune import records as R

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log", default="tuning_logs/spmm_cuda_sm_90a.jsonl")
    ap.add_argument("--matrix", nargs="+", default=list(MATRICES))
    ap.add_argument("--feat", nargs="+", type=int, default=[32, 128, 512])
    ap.add_argument("--target", default="cuda:sm_90a")
    ap.add_argument("--build-timeout", type=float, default=120.0)
    ap.add_argument("--out")
    args = ap.parse_args()

    from tune_eval import graphs

    recs = [r for r in R.load(args.log) if r.op == "spmm" and r.dtype == "float32"]
    mats = graphs()
    cases = {(n, f): case_candidates(recs, n, f) for n in args.matrix for f in args.feat}
    cases = {k: v for k, v in cases.items() if v}
    passes = {m: run_pass(m, cases, mats, args.target, args.build_timeout) for m in ("explicit", "pragma")}
    fastest = {k: v[:1] for k, v in cases.items()}
    drift = run_pass("explicit", fastest, mats, args.target, args.build_timeout)

    rows = []
    for (name, feat), cands in sorted(cases.items()):
        per = []
        for c in cands:
            key = (name, feat, json.dumps(c, sort_keys=True))
            e, p = passes["explicit"][key], passes["pragma"][key]
            per.append({"candidate": c, "explicit": e, "pragma": p, "explicit_again": drift.get(key)})
        both = [x for x in per if x["explicit"]["status"] == "ok" and x["pragma"]["status"] == "ok"]
        ratio = geomean(x["pragma"]["time_ms"] / x["explicit"]["time_ms"] for x in both)
        best = {m: min((x[m]["time_ms"] for x in per if x[m]["status"] == "ok"), default=None)
                for m in ("explicit", "pragma")}
        again = per[0]["explicit_again"]
        rows.append({"matrix": name, "feat": feat, "candidates": per, "pragma_over_explicit": ratio,
                     "best_explicit_ms": best["explicit"], "best_pragma_ms": best["pragma"],
                     "fastest_explicit_again_ms": again["time_ms"] if again and again["status"] == "ok" else None,
                     "build_s": {m: [x[m]["compile_s"] for x in per if x[m].get("compile_s")] for m in passes}})
    if args.out:
        Path(args.out).write_text(json.dumps({"target": args.target, "cases": rows}, indent=1))
    print("| matrix | F | n | best explicit ms | best pragma ms | again ms | pragma/explicit (geomean) | "
          "build s explicit (med/max) | build s pragma (med/max) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    ratios = []
    for r in rows:
        b = {m: r["build_s"][m] or [0.0] for m in r["build_s"]}
        if r["pragma_over_explicit"]:
            ratios.append(r["pragma_over_explicit"])
        print(f"| {r['matrix']} | {r['feat']} | {len(r['candidates'])} | {fmt(r['best_explicit_ms'])} | "
              f"{fmt(r['best_pragma_ms'])} | {fmt(r['fastest_explicit_again_ms'])} | {fmt(r['pragma_over_explicit'])} | "
              f"{statistics.median(b['explicit']):.1f} / {max(b['explicit']):.1f} | "
              f"{statistics.median(b['pragma']):.1f} / {max(b['pragma']):.1f} |")
    if ratios:
        print(f"pragma/explicit kernel time, geomean over {len(ratios)} cases: {geomean(ratios):.3f}")


if __name__ == "__main__":
    main()
