#!/usr/bin/env python3
"""What a few-microsecond kernel's time is made of on the GPU host, in sparsec's timer
(CUDA-graph replays over rotated copies, so loads come from memory): an empty kernel's
floor, the cost of each dependent global load a CTA waits on (a chain of 0-4 loads, as
``indptr`` -> ``indices`` -> B's rows), and whether the grid size or the shared memory a
CTA asks for moves the floor; ``torch.matmul`` on MiniLM's 384-column shapes beside it.

    python3 benchmarks/probe_launch_floor.py [--out FILE]

The BSR kernels at few columns of B (issue 23's last line) lose to dense cuBLAS by tenths
of a microsecond on these shapes; this says how many dependent trips to memory a kernel
can afford there. CUDA C++ compiled by CuPy: needs no TVM bundle.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

import _preamble  # noqa: F401,E402

SOURCE = r"""
extern "C" __global__ void chain(const int* __restrict__ p, float* __restrict__ out, int n, int stride) {
  extern __shared__ int dyn[];
  int idx = blockIdx.x * stride + threadIdx.x;
  for (int i = 0; i < n; ++i) idx = __ldg(p + idx);   // n loads, each waiting on the one before
  if (n < 0) dyn[threadIdx.x] = idx;                  // never: keeps the dynamic buffer declared
  out[blockIdx.x * blockDim.x + threadIdx.x] = (float)idx;
}
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "probe_launch_floor.json"))
    ap.add_argument("--profile", action="store_true",
                    help="no timing: each chain (grid 96) and dense call twice between cudaProfilerStart / Stop, "
                         "for ncu --profile-from-start off")
    args = ap.parse_args(argv)
    import cupy as cp
    import torch

    from sparsec.measure import Timer

    def torch_stream():  # torch's current stream: the capture's while the timer captures a graph
        return cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)

    timer = Timer("cuda", warmup_ms=10.0, budget_ms=80.0, max_reps=200)
    kern = cp.RawModule(code=SOURCE, options=("-std=c++17", "-arch=sm_90a")).get_function("chain")
    kern.max_dynamic_shared_size_bytes = 200 * 1024
    size = 1 << 22  # 16 MB of int32 a copy; 8 copies hold several L2 caches
    rng = np.random.default_rng(0)
    copies = []
    for _ in range(8):
        nxt = rng.permutation(size).astype(np.int32)  # a random walk: every hop a new line
        copies.append((cp.asarray(nxt), cp.zeros(384 * 256, dtype=cp.float32)))

    def launch(grid, n, smem, block=256):
        def call(c):
            with torch_stream():
                kern((grid,), (block,), (c[0], c[1], np.int32(n), np.int32(size // max(grid, 1) - block)),
                     shared_mem=smem)
        return [lambda c=c: call(c) for c in copies]

    if args.profile:
        dev = torch.device("cuda")
        w, b = torch.randn(384, 384, device=dev, dtype=torch.float16), torch.randn(384, 64, device=dev,
                                                                                    dtype=torch.float16)
        calls = [launch(96, n, 40 * 1024)[0] for n in range(5)] + [lambda: torch.matmul(w, b)]
        for c in calls:
            c()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        for c in calls:
            c()
            c()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        return 0
    rows = []
    for grid in (24, 96, 384):
        for smem in (0, 40 * 1024, 100 * 1024):
            for n in (0, 1, 2, 3, 4):
                t = timer.measure(launch(grid, n, smem))
                rows.append({"kind": "chain", "grid": grid, "smem": smem, "loads": n, "us": t.median_ms * 1e3,
                             "method": t.method})
                print(f"chain grid {grid:4d} smem {smem // 1024:4d}K loads {n}: {t.median_ms * 1e3:6.2f} us",
                      flush=True)
    dev = torch.device("cuda")
    for m, k in ((384, 384), (1536, 384), (384, 1536)):
        for feat in (16, 64):
            ws = [torch.randn(m, k, device=dev, dtype=torch.float16) for _ in range(8)]
            bs = [torch.randn(k, feat, device=dev, dtype=torch.float16) for _ in range(8)]
            t = timer.measure([lambda w=w, b=b: torch.matmul(w, b) for w, b in zip(ws, bs)])
            rows.append({"kind": "dense", "shape": [m, k], "feat": feat, "us": t.median_ms * 1e3})
            print(f"dense {m}x{k} @ {k}x{feat}: {t.median_ms * 1e3:6.2f} us", flush=True)
    with open(args.out, "w") as fh:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, fh, indent=1)
    print(f"\n{torch.cuda.get_device_name()}: us by dependent loads (rows: grid, dynamic smem)")
    print(f"{'grid':>5} {'smem':>6} " + " ".join(f"{n:>6}" for n in range(5)))
    for grid in (24, 96, 384):
        for smem in (0, 40 * 1024, 100 * 1024):
            us = [r["us"] for r in rows if r["kind"] == "chain" and r["grid"] == grid and r["smem"] == smem]
            print(f"{grid:>5} {smem // 1024:>5}K " + " ".join(f"{u:6.2f}" for u in us))
    return 0


if __name__ == "__main__":
    sys.exit(main())
