#!/usr/bin/env python3
"""Issue 4's benchmark, every result file from one command (on the GPU host):

    bash .gpu/stage2/install.sh && source .gpu/stage2/env.sh && python3 benchmarks/run_suite.py
    python3 benchmarks/run_suite.py --quick                 # a few cases of each part (~1 min)
    python3 benchmarks/run_suite.py --only bsr --max-rmat 4M
    python3 benchmarks/run_suite.py --only spmm sddmm --auto   # graphs in the format sparsec picks

Parts (``--only`` picks some; the default runs all three in one process):

    spmm   SpMM, float32, on the graphs suite (real graphs + R-MAT; N = 32..512)
    sddmm  SDDMM, float32, on the graphs suite
    bsr    SpMM, float16, BSR (bsr:BxB) on the blocks suite (blocks 16/32/64 at 70/90/95 %
           block sparsity; dense widths 512..8192)

Each case is checked against float64 and timed against its peers (cuSPARSE through torch
and CuPy, torch BSR, dense cuBLAS); see ``sparsec bench``. Writes ``<out>/<gpu>.json`` (the
records), ``<gpu>.md`` (summary tables) and ``<gpu>_speedup.png`` (speedup per case over
the main peer), where <gpu> is the short device name (H200, H100). With ``--only`` the
records of the other parts already in ``<gpu>.json`` are kept, so the parts can be run by
separate commands and still give one file. ``--max-rmat 4M`` leaves out the 30M-entry
R-MAT graph, which is generated on first use when not cached (22 s, 1.6 GB). Suite data:
``python benchmarks/data/fetch.py`` first. Exits 1 when any case failed.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
import _preamble  # noqa: F401,E402  (the one preamble: checkout root and benchmarks/data on sys.path)


from sparsec.bench import report  # noqa: E402
from sparsec.bench.cases import MatrixCases, build_cases, parse_count  # noqa: E402
from sparsec.bench.command import write_outputs  # noqa: E402
from sparsec.bench.run import Bench  # noqa: E402
from sparsec.bench.timing import Timer  # noqa: E402

PARTS = {
    "spmm": {"op": "spmm", "suite": "graphs", "dtype": "float32"},
    "sddmm": {"op": "sddmm", "suite": "graphs", "dtype": "float32"},
    "bsr": {"op": "spmm", "suite": "blocks", "dtype": "float16"},
}
# per contestant: ~10 ms of warm-up and ~100 ms of timed calls keep the full run near 8 minutes
WARMUP_MS, BUDGET_MS = 10.0, 100.0


def gpu_short_name(name: str) -> str:
    """'NVIDIA H200' -> 'H200', 'NVIDIA H100 80GB HBM3' -> 'H100'; otherwise the name with
    its spaces and odd characters as underscores."""
    m = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Za-z]?)\b", name)
    if m:
        return m.group(1)
    return re.sub(r"[^A-Za-z0-9.-]+", "_", name).strip("_") or "gpu"


def part_of(rec: dict) -> str:
    return "bsr" if rec.get("suite") == "blocks" else rec["op"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a few cases of each part (smoke run)")
    ap.add_argument("--only", nargs="+", choices=tuple(PARTS), help="run these parts (default: all)")
    ap.add_argument("--max-rmat", type=parse_count, metavar="NNZ",
                    help="leave out R-MAT graphs with more non-zeros than this (e.g. 4M; 0: none)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"), help="result folder (default: %(default)s)")
    ap.add_argument("--repeat", type=int, default=50, metavar="N", help="most timed calls per contestant")
    ap.add_argument("--auto", action="store_true",
                    help="graphs parts: the format convert(m, 'auto') picks (the tuning logs' pick for the "
                         "matrix, width and target; else the rule) instead of the rule's")
    ap.add_argument("--target", default="cuda", help=argparse.SUPPRESS)  # llvm: a CPU dry run of this script
    args = ap.parse_args(argv)
    parts = args.only or list(PARTS)
    t0 = time.perf_counter()
    device = "cuda" if args.target.startswith("cuda") else "cpu"
    bench = Bench(args.target, timer=Timer(device, warmup_ms=WARMUP_MS, budget_ms=BUDGET_MS, max_reps=args.repeat))
    graphs = None  # the graphs suite is loaded once for spmm and sddmm
    for part in parts:
        p = PARTS[part]
        print(f"== {part}: {p['op']} {p['dtype']} on the {p['suite']} suite", file=sys.stderr, flush=True)
        auto = args.auto and p["suite"] == "graphs"
        if p["suite"] == "graphs" and graphs is not None and not auto:  # the rule's formats serve both
            groups = [MatrixCases(g.name, g.matrix, [dataclasses.replace(c, op=p["op"]) for c in g.cases])
                      for g in graphs]
        else:  # with --auto each operator picks its own formats
            groups = build_cases(p["op"], suite=p["suite"], dtype=p["dtype"], quick=args.quick, max_rmat=args.max_rmat,
                                 spec="auto" if auto else None, target=args.target)
        if p["suite"] == "graphs":
            graphs = groups
        bench.run(groups)
        for r in bench.records:
            r.setdefault("part", part)
    name = gpu_short_name(bench.device_name()) if device == "cuda" else "cpu"
    os.makedirs(args.out, exist_ok=True)
    paths = {k: os.path.join(args.out, f"{name}{suffix}")
             for k, suffix in (("json", ".json"), ("md", ".md"), ("png", "_speedup.png"))}
    if args.only:
        keep_other_parts(bench, paths["json"], parts)
    status = write_outputs(bench, json_path=paths["json"], markdown_path=paths["md"], plot_path=paths["png"],
                           echo=False)
    print(report.markdown(bench.result()).split("\n## ")[0], file=sys.stderr)
    print(f"wrote {paths['json']}, {paths['md']}, {paths['png']} ({len(bench.records)} cases, "
          f"{time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return status


def keep_other_parts(bench: Bench, json_path: str, parts) -> None:
    """Add the records of the parts not run now from an earlier ``json_path``."""
    if not os.path.isfile(json_path):
        return
    with open(json_path) as f:
        earlier = json.load(f).get("records", [])
    kept = [r for r in earlier if part_of(r) not in parts]
    bench.records[:0] = kept
    if kept:
        print(f"kept {len(kept)} records of other parts from {json_path}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
