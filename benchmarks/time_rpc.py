#!/usr/bin/env python3
"""Distributed measuring on one multi-GPU host: a TVM RPC tracker with one server per GPU
(``CUDA_VISIBLE_DEVICES``), tuning candidates built here and measured through the tracker
(``sparsec.tune.rpc``), once with every GPU and once with one, to show the measurements
spread over the GPUs.

    python benchmarks/time_rpc.py [--gpus 2] [--matrix cond-mat-2005] [--out rpc.json]

Needs the TVM compiler (builds) and tornado/cloudpickle for the tracker. Prints a table last.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import _preamble  # noqa: F401,E402  (the one preamble: checkout root and benchmarks/data on sys.path)

from sparsec.bench.suites import default_cache_dir  # noqa: E402


def candidates(n: int):
    """``n`` SpMM candidates over csr and hyb schedules at two widths (a tuning round's mix)."""
    out = []
    for feat in (32, 128):
        for rpb in (1, 2, 4, 8, 16, "auto"):
            out.append({"op": "spmm", "format": "csr", "schedule_knobs": {"rows_per_block": rpb}, "feat": feat})
            out.append({"op": "spmm", "format": "hyb", "schedule_knobs": {"rows_per_block": rpb}, "feat": feat})
    return out[:n]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--matrix", default="cond-mat-2005", help="a graph in benchmarks/data/cache")
    ap.add_argument("--candidates", type=int, default=16)
    ap.add_argument("--out")
    args = ap.parse_args()

    import torch

    from sparsec.datasets import default_matrix, load_npz
    from sparsec.tune.rpc import LocalCluster, RPCRunner

    path = default_cache_dir() / f"{args.matrix}.npz"
    m = load_npz(path) if path.exists() else default_matrix()
    cands = candidates(args.candidates)
    runs = []
    for n_gpus in (args.gpus, 1):
        envs = [{"CUDA_VISIBLE_DEVICES": str(i)} for i in range(n_gpus)]
        with LocalCluster(f"gpu{n_gpus}", env_per_server=envs, port=9190 + 400 * n_gpus) as cluster:
            with RPCRunner(cluster.address, f"gpu{n_gpus}", "cuda:sm_90a", timeout_s=120) as runner:
                runner.measure(cands[:2], m)  # warm the build pool (imports) outside the timed run
                t0 = time.perf_counter()
                res = runner.measure(cands, m)
                wall = time.perf_counter() - t0
        runs.append({"gpus": n_gpus, "wall_s": wall, "servers": n_gpus,
                     "per_session": {s: sum(1 for r in res if r.get("session") == s) for s in range(n_gpus)},
                     "ok": sum(r["status"] == "ok" for r in res), "results": res})
        print(json.dumps({k: v for k, v in runs[-1].items() if k != "results"}), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "gpus": torch.cuda.device_count(),
                                              "matrix": args.matrix, "candidates": cands, "runs": runs}, indent=1))
    print(f"device: {torch.cuda.get_device_name()} x {torch.cuda.device_count()}, matrix {args.matrix}, "
          f"{len(cands)} candidates")
    print("| GPUs (servers) | wall s | candidates per session | ok |")
    print("|---:|---:|---|---:|")
    for r in runs:
        print(f"| {r['gpus']} | {r['wall_s']:.1f} | {r['per_session']} | {r['ok']}/{len(cands)} |")
    print(f"speedup with {args.gpus} GPUs: {runs[1]['wall_s'] / runs[0]['wall_s']:.2f}x")


if __name__ == "__main__":
    main()
