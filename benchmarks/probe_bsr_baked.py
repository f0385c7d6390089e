#!/usr/bin/env python3
"""Design probe (issue 23's last line): BSR fp16 SpMM at 64 columns on MiniLM's 384-column
layers, with the weight's block pattern compiled into the kernel.

Every kernel sparsec builds for these layers waits on one or two dependent trips to memory
(``indptr``, then the row's block columns) before it can ask for a block or B's rows;
dense cuBLAS (``nvjet_sm90_hsh_64x16`` / ``64x8``, 96 / 48 CTAs) asks for its tiles at once.
Here a CTA's block row is a template instance whose first block and block columns are
immediates (``row<Q0, C0, C1, ...>``), selected by a ``switch`` on ``blockIdx.x``: every
block and every row of B it needs goes out in the kernel's first trip (16-byte
``cp.async``), the warps split the row's blocks (all in flight), ``ldmatrix`` + ``mma``,
the warps' partial tiles added in shared memory, C stored as fp16. ``split`` cuts a heavy
row's columns over ``split`` CTAs (rows of ``heavy`` or more blocks), as cuBLAS cuts its 64
columns into 16-column tiles.

    SPARSEC_DATA_DIR=.data python3 benchmarks/probe_bsr_baked.py [--feats 64] [--out FILE]

CUDA C++ compiled by CuPy (no TVM), checked against float64 on NaN-poisoned outputs, timed
with sparsec's timer beside ``torch.matmul`` (B rotated over copies).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

import _preamble  # noqa: F401,E402

from probe_bsr_bulk import MMA_HELPERS  # noqa: E402
from probe_bsr_lean import MMA_BLOCK, cases, check_then_time, write_summary  # noqa: E402

KERNEL = r"""
#include <cuda_fp16.h>
constexpr int MT = BR / 16, KS = BC / 16, THREADS = W * 32, AP = BC + 8;
#ifndef RPAD
#define RPAD 0
#endif
// --timeline: thread 0 of each CTA stamps its phases (clock64; globaltimer at entry and exit)
#ifdef TIMELINE
#define MARK(k) if (threadIdx.x == 0) tl[(blockIdx.y * gridDim.x + blockIdx.x) * 10 + (k)] = clock64()
#define GMARK(k) if (threadIdx.x == 0) { unsigned long long g_; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g_)); \
                                          tl[(blockIdx.y * gridDim.x + blockIdx.x) * 10 + (k)] = g_; }
#else
#define MARK(k)
#define GMARK(k)
#endif
""" + MMA_HELPERS + MMA_BLOCK + r"""
// block row br: the blocks Q0, Q0 + 1, ... (columns COLS...), columns [f0, f0 + FW) of B and C
template <int FW, int Q0, int... COLS>
__device__ __forceinline__ void row(const half* __restrict__ values, const half* __restrict__ B,
                                    half* __restrict__ C, int M, int K, int br, int f0, unsigned char* smem,
                                    unsigned long long* __restrict__ tl) {
  MARK(1);
  constexpr int CNT = sizeof...(COLS);
  constexpr int cols[CNT + 1] = {COLS..., 0};
  constexpr int PER = (CNT + W - 1) / W;            // blocks a warp holds, all in flight
  constexpr int NTW = FW / 8, PW = FW + 8, SLOT = BR * AP + BC * PW;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  half* mine = reinterpret_cast<half*>(smem) + warp * (PER > 0 ? PER : 1) * SLOT;
#pragma unroll
  for (int g = 0; g < PER; ++g) {
    const int i = warp + g * W;
    if (i < CNT) {
      const half* src = values + (size_t)(Q0 + i) * (BR * BC);
#pragma unroll
      for (int e = lane; e < BR * BC / 8; e += 32)
        cp_async16(smem_addr(mine + g * SLOT + (e / (BC / 8)) * AP + (e % (BC / 8)) * 8), src + e * 8, 16);
      int c = 0;
#pragma unroll
      for (int j = 0; j < CNT; ++j) c = (j == i) ? cols[j] : c;   // i is warp-uniform, j unrolled
#pragma unroll
      for (int e = lane; e < BC * FW / 8; e += 32) {
        const int k = c * BC + e / (FW / 8);
        cp_async16(smem_addr(mine + g * SLOT + BR * AP + (e / (FW / 8)) * PW + (e % (FW / 8)) * 8),
                   B + (size_t)min(k, K - 1) * F + f0 + (e % (FW / 8)) * 8, k < K ? 16 : 0);
      }
    }
  }
  float acc[MT][NTW][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int t = 0; t < NTW; ++t) acc[m][t][0] = acc[m][t][1] = acc[m][t][2] = acc[m][t][3] = 0.f;
  asm volatile("cp.async.wait_all;" ::: "memory");
  __syncwarp();
  MARK(2);
#pragma unroll
  for (int g = 0; g < PER; ++g) {
    if (warp + g * W < CNT) {
      mma_block<NTW, PW>(acc, smem_addr(mine + g * SLOT), smem_addr(mine + g * SLOT + BR * AP), lane);
    }
  }
  float* red = reinterpret_cast<float*>(smem);
  constexpr int RP = FW + RPAD;                     // floats a row of a partial tile (RPAD: off the banks)
  MARK(3);
  __syncthreads();
  MARK(4);
  store_partial<NTW>(red + warp * BR * RP, acc, RP, 0, lane);
  MARK(5);
  __syncthreads();
  MARK(6);
  for (int e = tid * 4; e < BR * FW; e += THREADS * 4) {
    const float4 s = sum_partial<FW, RP, W>(red, W, e);
    const int r = br * BR + e / FW, cc = e % FW;
    if (r < M) {
      __half2 lo = __floats2half2_rn(s.x, s.y), hi = __floats2half2_rn(s.z, s.w);
      uint2 u = make_uint2(*reinterpret_cast<unsigned*>(&lo), *reinterpret_cast<unsigned*>(&hi));
#ifndef NOSTORE
      *reinterpret_cast<uint2*>(C + (size_t)r * F + f0 + cc) = u;
#else
      if (u.x == 0x7fffffffu) C[0] = __float2half(0.f);  // keeps the sum alive; never true in practice
#endif
    }
  }
  MARK(7);
}
"""


def dispatch(indptr, indices, heavy, split, feat) -> str:
    """The kernel's ``switch`` on the block row: each row's template instance (its first block
    and columns as immediates); a row of ``heavy`` or more blocks split over ``split`` CTAs."""
    lines = ['extern "C" __global__ void __launch_bounds__(THREADS) bsr_baked(',
             "    const half* __restrict__ values, const half* __restrict__ B, half* __restrict__ C, int M, int K,",
             "    unsigned long long* __restrict__ tl) {",
             "  extern __shared__ __align__(128) unsigned char smem[];",
             "  GMARK(0);",
             "  const int s = blockIdx.y;",
             "  switch (blockIdx.x) {"]
    fw = feat // split
    for br in range(len(indptr) - 1):
        q0, q1 = int(indptr[br]), int(indptr[br + 1])
        args = ", ".join(str(int(c)) for c in indices[q0:q1])
        tail = f"{q0}{', ' + args if args else ''}"
        if split > 1 and q1 - q0 >= heavy:
            lines.append(f"    case {br}: row<{fw}, {tail}>(values, B, C, M, K, {br}, s * {fw}, smem, tl); break;")
        else:
            lines.append(f"    case {br}: if (s == 0) row<{feat}, {tail}>(values, B, C, M, K, {br}, 0, smem, tl); break;")
    lines += ["  }", "  GMARK(8);", "}"]
    return "\n".join(lines)


def smem_bytes(block, feat, w, longest) -> int:
    per = max(1, -(-longest // w))
    slots = w * per * (block * (block + 8) + block * (feat + 8)) * 2
    return max(slots, w * block * (feat + 4) * 4)


def timeline(cp, prepared, feat, best, vals, b, M, K, torch_stream, flags=()) -> dict:
    """The best variant rebuilt with -DTIMELINE and run 20 times: per CTA, its start and end
    (globaltimer, ns from the first CTA's start) and its phases in cycles (copies in flight,
    the MMAs, the CTA barrier, the partial tiles' sum and the stores) from the last run."""
    _, _, block, bsr = prepared
    w, split, heavy = best["w"], best["split"], best["heavy"]
    src = KERNEL + dispatch(bsr.indptr, bsr.indices, heavy or 0, split, feat)
    opts = ("-std=c++17", "-arch=sm_90a", f"-DBR={block}", f"-DBC={block}", f"-DF={feat}", f"-DW={w}", "-DTIMELINE") + tuple(flags)
    kern = cp.RawModule(code=src, options=opts).get_function("bsr_baked")
    sm = best["smem"]
    kern.max_dynamic_shared_size_bytes = sm
    nbr = bsr.indptr.size - 1
    tl = cp.zeros(nbr * split * 10, dtype=cp.uint64)
    out = cp.empty((M, feat), dtype=cp.float16)
    for _ in range(20):
        with torch_stream():
            kern((nbr, split), (w * 32,), (vals, cp.asarray(b), out, np.int32(M), np.int32(K), tl), shared_mem=sm)
    cp.cuda.runtime.deviceSynchronize()
    t = cp.asnumpy(tl).reshape(split, nbr, 10).astype(np.int64)
    lengths = np.diff(bsr.indptr)
    live = t[..., 1] > 0  # CTAs that ran a row (the others exit at once)
    g0 = t[..., 0][live]
    start = (t[..., 0] - g0.min())[live]
    end = (t[..., 8] - g0.min())[live]
    phases = {"copies": t[..., 2] - t[..., 1], "mma": t[..., 3] - t[..., 2], "barrier": t[..., 4] - t[..., 3],
              "partials": t[..., 5] - t[..., 4], "barrier2": t[..., 6] - t[..., 5], "sum_store": t[..., 7] - t[..., 6]}
    rows = np.broadcast_to(lengths, (split, nbr))[live]
    last = int(np.argmax(end))
    # the same kernel timed alone as built (RPAD / NOSTORE change it)
    return {"flags": list(flags), "ctas": int(live.sum()), "start_ns": [int(start.min()), int(np.median(start)), int(start.max())],
            "end_ns": [int(end.min()), int(np.median(end)), int(end.max())],
            "last_cta_blocks": int(rows[last]), "last_cta_start_ns": int(start[last]),
            "phases_cycles": {k: {"median": int(np.median(v[live])), "max": int(v[live].max()),
                                  "last_cta": int(v[live][last])} for k, v in phases.items()},
            "blocks_vs_end": [[int(r), int(e)] for r, e in sorted(zip(rows, end))][::max(1, int(live.sum()) // 16)]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--feats", type=int, nargs="+", default=[64])
    ap.add_argument("--rpad", type=int, default=0, help="floats of padding a row of the warps' partial tiles")
    ap.add_argument("--timeline", nargs="*", default=[],
                    help="for the cases whose name contains one of these: each CTA's phases (clock64) of the best variant")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "probe_bsr_baked.json"))
    args = ap.parse_args(argv)
    import cupy as cp
    import scipy.sparse as sp
    import torch

    from sparsec.measure import Timer

    def torch_stream():
        return cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)

    timer = Timer("cuda", warmup_ms=10.0, budget_ms=60.0, max_reps=150)
    dev = torch.device("cuda")
    rows_out = []
    no_timeline = cp.zeros(1, dtype=cp.uint64)
    jobs = []  # (case index, feat, w, split, heavy): compiled in parallel first (NVRTC, one module each)
    prepared = []
    for name, dense16, block in cases():
        bsr = sp.bsr_matrix(dense16.astype(np.float32), blocksize=(block, block))
        bsr.sort_indices()
        prepared.append((name, dense16, block, bsr))
        lengths = np.diff(bsr.indptr)
        heavy = max(1, int(np.percentile(lengths, 90)))
        for feat in args.feats:
            for w, split in ((4, 1), (8, 1), (4, 4), (8, 2)):
                if feat // split < 16 or (block // 16) * (feat // split) // 8 > 16:
                    continue
                if smem_bytes(block, feat, w, int(lengths.max())) > 227 * 1024:
                    continue
                jobs.append((len(prepared) - 1, feat, w, split, heavy if split > 1 else None))

    def build(job):
        ci, feat, w, split, heavy = job
        _, _, block, bsr = prepared[ci]
        src = KERNEL + dispatch(bsr.indptr, bsr.indices, heavy or 0, split, feat)
        opts = ("-std=c++17", "-arch=sm_90a", f"-DBR={block}", f"-DBC={block}", f"-DF={feat}", f"-DW={w}",
                f"-DRPAD={args.rpad}")
        mod = cp.RawModule(code=src, options=opts)
        mod.compile()
        return mod

    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 4)) as pool:
        modules = dict(zip(jobs, pool.map(build, jobs)))
    print(f"compiled {len(modules)} kernels", flush=True)
    for ci, (name, dense16, block, bsr) in enumerate(prepared):
        M, K = dense16.shape
        lengths = np.diff(bsr.indptr)
        vals = cp.asarray(bsr.data.astype(np.float16).reshape(-1))
        w_dense = torch.from_numpy(dense16).to(dev)
        nbr = lengths.size
        for feat in args.feats:
            bs = [torch.randn(K, feat, device=dev, dtype=torch.float16) for _ in range(8)]
            ref = [(torch.from_numpy(dense16.astype(np.float64)).to(dev) @ b.double()) for b in bs]
            dense_us = timer.measure([lambda b=b: torch.matmul(w_dense, b) for b in bs]).median_ms * 1e3
            row = {"case": name, "shape": [M, K], "block": block, "feat": feat, "dense_us": dense_us,
                   "nnzb": int(lengths.sum()), "longest_row": int(lengths.max()), "variants": []}
            for job in [j for j in jobs if j[0] == ci and j[1] == feat]:
                _, _, w, split, heavy = job
                sm = smem_bytes(block, feat, w, int(lengths.max()))
                kern = modules[job].get_function("bsr_baked")
                kern.max_dynamic_shared_size_bytes = sm
                outs = [torch.full((M, feat), float("nan"), device=dev, dtype=torch.float16) for _ in bs]

                def call(i, kern=kern, grid=(nbr, split), threads=(w * 32,), sm=sm, outs=outs):
                    with torch_stream():
                        kern(grid, threads, (vals, cp.asarray(bs[i]), cp.asarray(outs[i]), np.int32(M), np.int32(K),
                                             no_timeline), shared_mem=sm)
                ok, err, tm = check_then_time(call, outs, ref, 2e-3, timer)
                row["variants"].append({"w": w, "split": split, "heavy": heavy, "smem": sm, "ok": ok, "err": err,
                                        "us": tm.median_ms * 1e3 if tm else None})
            good = [x for x in row["variants"] if x["ok"]]
            best = min(good, key=lambda x: x["us"]) if good else None
            row["best"], row["speedup"] = best, (dense_us / best["us"] if best else None)
            if best and args.timeline and any(t in name for t in args.timeline):
                row["timeline"] = {" ".join(fl) or "plain": timeline(cp, prepared[ci], feat, best, vals, bs[0], M, K,
                                                                      torch_stream, fl)
                                   for fl in ((), ("-DRPAD=4",), ("-DNOSTORE",))}
            rows_out.append(row)
            print(f"{name:<28} F={feat:2d} nnzb {row['nnzb']:4d} longest {row['longest_row']:2d} dense "
                  f"{dense_us:5.2f} us baked {best['us'] if best else float('nan'):5.2f} us "
                  f"x{row['speedup'] or 0:.2f} {best and {k: best[k] for k in ('w', 'split', 'heavy')}} "
                  f"wrong {sum(not x['ok'] for x in row['variants'])}", flush=True)
            if "timeline" in row:
                print("   timeline:", json.dumps(row["timeline"]), flush=True)
    return write_summary(rows_out, args.out)


if __name__ == "__main__":
    sys.exit(main())
