#!/usr/bin/env python3
"""The int8 SR-BCRS Tensor Core kernel's knobs (B's load width ``n_bytes`` x warps a block)
swept over the committed cases of ``results/lowprec_int8_H200.json`` (GPU host, needs the
TVM compiler: stage1), to choose ``tensorcore_packed.srbcrs_default_knobs`` from more than
the two settings that run timed.

    python3 benchmarks/sweep_int8_knobs.py [--widths 16 512 2048 8192] [--budget-s 420]

One kernel per (V, columns, knobs), compiled for the format spec (any matrix size), times
every case of that V and width (``Kernel.time``: TVM's time evaluator, median of 5 x 20).
Per case it reports the best setting, and how the best of all settings compares with the
best of the two the committed run timed (16 bytes / 4 warps, 8 / 8). Prints a table last
and writes ``$OUT/int8_knobs.json``.
"""
from __future__ import annotations

import argparse
import collections
import itertools
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

import _preamble  # noqa: F401,E402

RESULTS = Path(__file__).resolve().parent / "results"
N_BYTES, WARPS = (4, 8, 16), (2, 4, 8)
PAIR = ({"n_bytes": 16, "warps": 4}, {"n_bytes": 8, "warps": 8})


def key(knobs):
    return f"{knobs['n_bytes']}/{knobs['warps']}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--widths", type=int, nargs="+", default=[16, 512, 2048, 8192])
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting new cases after this long")
    args = ap.parse_args()

    import torch

    import sparsec
    from lowprec import SPARSITIES, VECS, lowprec
    from sparsec.bench.report import table

    t0 = time.time()
    cases = [c for c in json.load(open(RESULTS / "lowprec_int8_H200.json"))["cases"] if c["N"] in args.widths]
    layers = {name: (w, vec) for name, w, vec, _ in lowprec(vecs=VECS, sparsities=SPARSITIES)}
    kernels = {}
    rng = np.random.default_rng(0)
    rows = []
    for c in cases:
        if time.time() - t0 > args.budget_s:
            print(f"budget reached after {len(rows)} cases", flush=True)
            break
        if c["case"] not in layers:
            continue
        w, vec = layers[c["case"]]
        scale = float(np.abs(w).max()) / 127 or 1.0
        A = sparsec.formats.convert(np.clip(np.round(w / scale), -127, 127), f"srbcrs:v{vec},int8")
        B = torch.from_numpy(rng.integers(-127, 127, (c["K"], c["N"])).astype(np.int8)).cuda()
        ms = {}
        for nb, wp in itertools.product(N_BYTES, WARPS):
            knobs = {"n_bytes": nb, "warps": wp}
            kk = (vec, c["N"], nb, wp)
            if kk not in kernels:
                try:
                    kernels[kk] = sparsec.compile("spmm", f"srbcrs:v{vec},int8", target="cuda:sm_90a", dtype="int8",
                                                  feat=int(c["N"]), knobs=knobs)
                except ValueError as e:
                    kernels[kk] = None
                    print(f"skip V={vec} N={c['N']} {key(knobs)}: {e}", flush=True)
            if kernels[kk] is not None:
                ms[key(knobs)] = kernels[kk].time(A, B, number=20, repeat=5)["median_ms"]
        best = min(ms, key=ms.get)
        pair = min(ms[key(p)] for p in PAIR)
        rows.append({"case": c["case"], "V": vec, "M": c["M"], "K": c["K"], "N": c["N"], "sparsity": c["sparsity"],
                     "vector_rows": -(-c["M"] // vec), "nnz_slots": int(A.arrays["indices"].size),
                     "ms": ms, "best": best, "best_over_pair": pair / ms[best]})
        print(json.dumps(rows[-1]), flush=True)
    gpu = torch.cuda.get_device_name()
    result = {"device": gpu, "command": "python3 benchmarks/sweep_int8_knobs.py " + " ".join(sys.argv[1:]),
              "rows": rows}
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "int8_knobs.json").write_text(json.dumps(result, indent=1))
    groups = collections.defaultdict(list)
    for r in rows:
        groups[(r["V"], r["N"])].append(r)
    summary = []
    for (v, n), rs in sorted(groups.items()):
        wins = collections.Counter(r["best"] for r in rs)
        summary.append({"V": v, "N": n, "cases": len(rs), "wins": dict(wins.most_common()),
                        "gain": math.exp(sum(math.log(r["best_over_pair"]) for r in rs) / len(rs))})
    print(f"device: {gpu}; any-size kernels, best of {len(N_BYTES) * len(WARPS)} settings vs best of 16/4, 8/8")
    print(table([("V", lambda s: s["V"]), ("N:", lambda s: s["N"]), ("cases:", lambda s: s["cases"]),
                 ("gain:", lambda s: f"{s['gain']:.3f}"),
                 ("wins", lambda s: " ".join(f"{k}:{v}" for k, v in s["wins"].items()))], summary))


if __name__ == "__main__":
    main()
