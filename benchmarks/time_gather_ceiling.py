#!/usr/bin/env python3
"""How fast can any SpMM that reads one row of B per stored entry be? (GPU host.)

A CSR SpMM C = A @ B reads, for every stored entry p, the row B[col[p], :]. On graphs with
average degree d every row of B is read d times; the roofline in the benchmark counts it
once (compulsory bytes), so the rest must come from the caches. This script times the
gathers alone, with nothing else in the kernel: each warp walks a contiguous range of
stored entries (in CSR order, the order an SpMM visits them), loads B[col[p], :] with
128-bit loads and sums them in registers; no values of A, no writes of C. Its time is a
floor for every kernel of that kind on that matrix, whatever its schedule. It also times
an empty kernel (the floor of one launch inside a CUDA graph) and reports the gathers'
throughput, bytes gathered / time, next to the device-copy bandwidth.

    python3 benchmarks/time_gather_ceiling.py [--matrix rmat-1M-30M] [--feat 32 128] [--out DIR]

Needs CuPy and torch (events, graphs); prints a table and writes gather_ceiling_<gpu>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
import _preamble  # noqa: F401,E402  (the one preamble: checkout root and benchmarks/data on sys.path)

GATHER_SRC = r"""
extern "C" __global__ void gather_rows(const float4* __restrict__ B, const int* __restrict__ col,
                                       long long nnz, int lanes_per_row, int chunk, float* __restrict__ sink) {
    long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    int per_iter = 32 / lanes_per_row;
    int sub = lane / lanes_per_row, l = lane % lanes_per_row;
    long long start = warp * chunk;
    long long end = start + chunk < nnz ? start + chunk : nnz;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    #pragma unroll 4
    for (long long p = start + sub; p < end; p += per_iter) {
        float4 v = B[(long long)__ldg(col + p) * lanes_per_row + l];
        acc.x += v.x; acc.y += v.y; acc.z += v.z; acc.w += v.w;
    }
    float s = acc.x + acc.y + acc.z + acc.w;
    if (s == 1234.5f) sink[0] = s;  // keeps the loads; never true for the random B used here
}
extern "C" __global__ void empty_kernel() {}
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--matrix", nargs="+", default=["rmat-1M-30M"])
    ap.add_argument("--feat", nargs="+", type=int, default=[32, 128])
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args(argv)
    import cupy
    import torch

    from sparsec.bench import suites
    from sparsec.bench.timing import Timer

    mod = cupy.RawModule(code=GATHER_SRC)
    gather, empty = mod.get_function("gather_rows"), mod.get_function("empty_kernel")
    timer = Timer("cuda")  # CUDA-graph replays; CuPy launches on the capture stream

    def time_graph(fn) -> float:
        return timer.measure([fn]).median_ms

    empty_ms = time_graph(lambda: empty((1,), (32,), ()))
    copy_gbps = _copy_bandwidth(timer)
    specs = {s.name: s for s in suites.RMAT_SPECS}
    rows = []
    for name in args.matrix:
        mat = suites.rmat_graph(suites.default_cache_dir(), specs[name]) if name in specs else \
            dict(suites.real_graphs(suites.default_cache_dir()))[name]
        col = cupy.asarray(mat.indices.astype(np.int32))
        sink = cupy.zeros(1, dtype=cupy.float32)
        for feat in args.feat:
            if feat % 4 or feat > 128:
                raise ValueError(f"--feat takes multiples of 4 up to 128, got {feat}")
            lanes = feat // 4
            b = cupy.random.standard_normal((mat.shape[1], feat), dtype=cupy.float32)
            chunk = 256
            warps = -(-mat.nnz // chunk)
            threads = 256
            grid = (-(-warps * 32 // threads),)
            ms = time_graph(lambda: gather(grid, (threads,), (b, col, np.int64(mat.nnz), np.int32(lanes),
                                                              np.int32(chunk), sink)))
            gathered = mat.nnz * feat * 4
            compulsory = mat.nnz * 8 + 2 * mat.shape[0] * feat * 4
            roof_ms = compulsory / (copy_gbps * 1e9) * 1e3
            rows.append({"matrix": name, "rows": mat.shape[0], "nnz": int(mat.nnz), "feat": feat,
                         "gather_ms": ms, "gathered_GB": gathered / 1e9, "gather_TBps": gathered / (ms * 1e-3) / 1e12,
                         "spmm_roofline_ms": roof_ms, "best_roofline_fraction": roof_ms / ms})
    result = {"device": torch.cuda.get_device_name(0), "copy_GBps": copy_gbps, "empty_kernel_ms": empty_ms,
              "rows": rows}
    os.makedirs(args.out, exist_ok=True)
    short = result["device"].split()[-1]
    with open(os.path.join(args.out, f"gather_ceiling_{short}.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"{result['device']}: device copy {copy_gbps:.0f} GB/s; one empty kernel in a graph {empty_ms * 1e3:.2f} us")
    print("| matrix | nnz | F | gathers alone ms | gathered GB | gather TB/s | SpMM roofline ms | roofline fraction at best |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['matrix']} | {r['nnz']:,} | {r['feat']} | {r['gather_ms']:.4f} | {r['gathered_GB']:.2f} | "
              f"{r['gather_TBps']:.2f} | {r['spmm_roofline_ms']:.4f} | {r['best_roofline_fraction']:.0%} |")
    return 0


def _copy_bandwidth(timer) -> float:
    from sparsec.bench.roofline import measure_copy_bandwidth

    return measure_copy_bandwidth(timer, "cuda", 1 << 30) / 1e9


if __name__ == "__main__":
    sys.exit(main())
