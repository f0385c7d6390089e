#!/usr/bin/env python3
"""Where a tuning candidate's build time goes: TVM lowering and codegen, export, nvcc.

    python benchmarks/time_build.py [--matrix email-Enron] [--unroll explicit|pragma|both] [--out FILE.json]

Builds a fixed list of SpMM candidates (the slowest builds of a 64-trial H200 run: hyb with
many buckets and interleaved row groups; plus a plain CSR) one at a time, in this process,
the way the tuner's build workers do (``sparsec.tune.runner``: convert, ``sparsec.compile``,
export ahead of time), and prints the seconds of each stage (the export's nvcc share is
timed on its own with ``sparsec.export.nvcc_fatbin``). ``--unroll``
picks how unrolled loops are built (``SPARSEC_CUDA_UNROLL``): ``pragma``, the default,
leaves them to nvcc (``#pragma unroll``); ``explicit`` has TVM copy their bodies.
benchmarks/time_unroll.py times the kernels of both on a GPU. CPU only; no GPU needed.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import _preamble  # noqa: F401,E402  (the one preamble: checkout root and benchmarks/data on sys.path)

CANDIDATES = [  # (format knobs, schedule knobs, feat)
    ({"buckets": "1/2/4/8/16/32", "col_parts": 1},
     {"feat_tiles": 2, "interleave": 1, "rows_per_block": 4, "slots_per_block": 128, "vec": 4}, 128),
    ({"buckets": "1/2/4/8/16/32/64", "col_parts": 1},
     {"interleave": 1, "rows_per_block": 4, "slots_per_block": 64, "vec": 4}, 128),
    ({"buckets": "1/2/4/8", "col_parts": 1},
     {"interleave": 1, "rows_per_block": 1, "slots_per_block": 128, "vec": 1}, 32),
    (None, {"rows_per_block": 4, "unroll": 2, "vec": 4}, 128),
]
def time_builds(matrix_name: str, unroll: str):
    import scipy.sparse as sp

    import sparsec
    from sparsec.bench.suites import default_cache_dir
    from sparsec.export import nvcc_fatbin
    from sparsec.tune import runner as RN

    cache = default_cache_dir()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        mpath = str(Path(tmp) / "m.npz")
        sp.save_npz(mpath, sp.load_npz(cache / f"{matrix_name}.npz").tocsr())
        previous = os.environ.get("SPARSEC_CUDA_UNROLL")
        os.environ["SPARSEC_CUDA_UNROLL"] = unroll
        try:
            for i, (fk, sk, feat) in enumerate(CANDIDATES):
                cand = RN.normalize_candidate({"op": "spmm", "format": "hyb" if fk else "csr", "format_knobs": fk or {},
                                               "schedule_knobs": sk, "feat": feat, "dtype": "float32"}, i)
                t0 = time.perf_counter()
                inst = RN._convert(cand, mpath)
                t1 = time.perf_counter()
                k = sparsec.compile("spmm", inst, feat=feat, target="cuda:sm_90a", knobs=sk)
                t2 = time.perf_counter()
                k.export(str(Path(tmp) / f"c{i}.so"))
                t3 = time.perf_counter()
                nvcc_fatbin(k.source(), [k.target.arch])
                t4 = time.perf_counter()
                rows.append({"unroll": unroll, "format": cand["format"], "format_knobs": fk, "schedule_knobs": sk,
                             "feat": feat, "convert_s": t1 - t0, "tvm_s": t2 - t1, "export_s": t3 - t2,
                             "nvcc_s": t4 - t3, "source_kb": len(k.source()) / 1e3})
                print(json.dumps(rows[-1]), flush=True)
        finally:
            if previous is None:
                os.environ.pop("SPARSEC_CUDA_UNROLL")
            else:
                os.environ["SPARSEC_CUDA_UNROLL"] = previous
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--matrix", default="email-Enron", help="a graph in the suite cache")
    ap.add_argument("--unroll", choices=("explicit", "pragma", "both"), default="both")
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = []
    for mode in (("explicit", "pragma") if args.unroll == "both" else (args.unroll,)):
        rows += time_builds(args.matrix, mode)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    print("| unroll | candidate | F | convert s | TVM s | export s | nvcc s | source kB |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        what = f"{r['format']} {r['format_knobs']['buckets'] if r['format_knobs'] else ''} {r['schedule_knobs']}"
        print(f"| {r['unroll']} | {what} | {r['feat']} | {r['convert_s']:.2f} | {r['tvm_s']:.2f} | {r['export_s']:.2f} | "
              f"{r['nvcc_s']:.2f} | {r['source_kb']:.0f} |")


if __name__ == "__main__":
    main()
