#!/usr/bin/env python3
"""Probe (issue 23's 64-column BSR line): does feeding the few-column BSR ring by TMA tensor
copies -- one instruction a stage for the weight's blocks, one a block for B's rows -- lift it
above dense cuBLAS fp16 where the 16-byte ``cp.async`` ring stays below?

The committed ``bsr_ring`` (and ``probe_bsr_bulk.py``'s round 3, its CUDA original) moves each
block and B's rows for it by 16-byte ``cp.async`` issued by one producer warp: at 32 x 32
blocks and 64 columns that is 12 copies a lane a block plus their address arithmetic, and on
the 4096 x 4096 weight at 70 % block sparsity a CTA walks ~38 blocks, so the producer's
instruction stream, not memory, may set the pace (H200: ~12 us against dense's ~10.4 for
9.6 MB of weight, a quarter of the bandwidth dense reaches). Here one elected lane issues

* for a stage of ``g`` consecutive stored blocks (consecutive in ``values``): one 2-D tensor
  copy of a box of ``g * br`` rows x ``bc`` columns of ``values`` seen as a
  ``(nnzb * br, bc)`` matrix;
* for each block: one 2-D tensor copy of B's ``bc`` rows at the block's column (a box of
  ``bc`` x ``F / ns``); rows past K are zero-filled by the copy engine;

both into shared memory swizzled by the copy engine (32/64/128-byte patterns, so
``ldmatrix`` reads hit distinct banks without padding), completing on the stage's
``mbarrier`` with its byte count. Consumers are ``probe_bsr_bulk``'s (``ldmatrix`` +
``mma.m16n8k16``, f32 accumulators, a cluster of ``s`` CTAs splitting a block row's stored
blocks and summing through distributed shared memory).

CUDA C++ compiled by CuPy, tensor maps encoded by the driver (``cuTensorMapEncodeTiled``
through ctypes) and kept in device memory. Every variant is checked against float64 on a
NaN-poisoned output (cases include an empty block row, a full one, and M, K not multiples of
the block), then timed with sparsec's CUDA-graph timer beside ``torch.matmul`` on the dense
fp16 weight and beside ``probe_bsr_bulk``'s cp.async ring with the same knobs.

    python3 benchmarks/probe_bsr_tma.py [--quick] [--feats 64 16] [--out FILE]
"""
from __future__ import annotations

import argparse
import ctypes
import math
import os
import sys

import numpy as np

import _preamble  # noqa: F401,E402

from _helpers import write_probe_rows  # noqa: E402

from probe_bsr_bulk import (CONSUMER_HEAD, MBAR_HELPERS, MMA_HELPERS, RING_PROLOGUE, WRITE_BACK,  # noqa: E402
                            random_bsr)
from probe_bsr_bulk import SOURCE as BULK_SOURCE  # noqa: E402

SOURCE = r"""
#include <cuda_fp16.h>
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

// BR x BC blocks, F columns of B (FC of them a CTA), CW consumer warps, D stages of G blocks,
// S CTAs of a cluster splitting a block row's stored blocks; ASW / BSW: swizzle masks (bits
// 4-6 of a byte offset XORed with bits 7-9) of the A and B tiles
constexpr int FC = F / NS;
constexpr int KS = BC / 16;
constexpr int MT = BR / 16;
constexpr int GROUPS = CW / MT;
constexpr int NTW = FC / 8 / GROUPS;
constexpr int A_BYTES = G * BR * BC * 2;               // a stage's blocks
constexpr int A_REGION = (A_BYTES + 1023) / 1024 * 1024;
constexpr int B_BYTES = BC * FC * 2;                   // B's rows for one block
constexpr int B_REGION = (B_BYTES + 1023) / 1024 * 1024;
constexpr int STAGE_BYTES = A_REGION + G * B_REGION;
constexpr int THREADS = (CW + 1) * 32;
constexpr int FULL_ARRIVALS = 1;  // lane 0 of the producer, arming the stage's byte count

""" + MMA_HELPERS + r"""
__device__ __forceinline__ unsigned swz(unsigned off, unsigned mask) { return off ^ ((off >> 3) & mask); }
""" + MBAR_HELPERS + r"""
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  // a probe's watchdog: a barrier that never completes (a wrong byte count) traps after ~2 s
  // instead of hanging the device call
  const long long t0 = clock64();
  unsigned done = 0;
  while (true) {
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 " selp.u32 %0, 1, 0, p;\n}" : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    if (done) break;
    if (clock64() - t0 > 4000000000LL) __trap();
  }
}
__device__ __forceinline__ void tma2d(unsigned dst, unsigned long long map, int c0, int c1, unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
      :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(bar) : "memory");
}

extern "C" __global__ void
#if S > 1
__cluster_dims__(S, 1, 1)
#endif
__launch_bounds__(THREADS, 1)
bsr_tma(const int* __restrict__ indptr, const int* __restrict__ indices, unsigned long long map_a,
        unsigned long long map_b, float* __restrict__ C, int M, int K) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const unsigned raw = smem_addr(smem_raw);
  const unsigned base = (raw + 1023u) & ~1023u;  // the swizzle patterns follow address bits
  unsigned char* smem = smem_raw + (base - raw);
  const unsigned bars = base + D * STAGE_BYTES;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rank = blockIdx.x % S, ns = (blockIdx.x / S) % NS, br = blockIdx.x / S / NS;
  const int f0 = ns * FC;
  const unsigned full0 = bars, empty0 = bars + 8 * D;
""" + RING_PROLOGUE + r"""  if (warp == CW) {  // producer: lane 0 issues, the warp holds a window of 32 block columns
    int window = 0;
    for (int j = 0; j < nst; ++j) {
      const int s = j % D;
      const int first = j * G;
      const int here = min(G, cnt - first);
      // a new window of 32 columns (G divides 32: a stage never straddles two)
      if (first % 32 == 0) window = (q0 + first + lane < q1) ? indices[q0 + first + lane] : 0;
      int cols[G];
#pragma unroll
      for (int g = 0; g < G; ++g) cols[g] = __shfl_sync(0xffffffffu, window, (first + g) % 32);
      if (lane == 0) {
        if (j >= D) mbar_wait(empty0 + 8 * s, ((j / D) - 1) & 1);
        const unsigned bar = full0 + 8 * s;
        const unsigned st = base + s * STAGE_BYTES;
        mbar_expect(bar, A_BYTES + here * B_BYTES);
        tma2d(st, map_a, 0, (q0 + first) * BR, bar);
#pragma unroll
        for (int g = 0; g < G; ++g)
          if (g < here) tma2d(st + A_REGION + g * B_REGION, map_b, f0, cols[g] * BC, bar);
      }
      __syncwarp();
    }
""" + CONSUMER_HEAD + r"""      const unsigned st = base + s * STAGE_BYTES;
#pragma unroll
      for (int g = 0; g < G; ++g) {
        if (j * G + g < cnt) {
          const unsigned sb = st + A_REGION + g * B_REGION;
#pragma unroll
          for (int kk = 0; kk < KS; ++kk) {
            unsigned a[4];
            ldm_x4(a, st + swz((g * BR + mi * 16 + lane % 16) * (BC * 2) + (kk * 2 + lane / 16) * 16, ASW));
#pragma unroll
            for (int t = 0; t + 1 < NTW; t += 2) {
              unsigned b[4];
              ldm_x4_t(b, sb + swz((kk * 16 + lane % 16) * (FC * 2) + ((n0 + t * 8) / 8 + lane / 16) * 16, BSW));
              mma16816(acc[t], a, b[0], b[1]);
              mma16816(acc[t + 1], a, b[2], b[3]);
            }
            if (NTW % 2) {
              unsigned b[2];
              ldm_x2_t(b, sb + swz((kk * 16 + lane % 16) * (FC * 2) + ((n0 + (NTW - 1) * 8) / 8) * 16, BSW));
              mma16816(acc[NTW - 1], a, b[0], b[1]);
            }
          }
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(empty0 + 8 * s);
    }
""" + WRITE_BACK

SWIZZLE = {16: (0, 0x00), 32: (1, 0x10), 64: (2, 0x30), 128: (3, 0x70)}  # row bytes: (driver enum, mask)
MAX_SMEM = 227 * 1024


class TensorMaps:
    """2-D fp16 tensor maps (``cuTensorMapEncodeTiled``) copied to device memory, where the
    kernel's TMA instructions read them by address."""

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        f = self.lib.cuTensorMapEncodeTiled
        f.restype = ctypes.c_int
        f.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                      ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
                      ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
                      ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        self.keep = []

    def fp16_2d(self, ptr: int, rows: int, cols: int, box_rows: int, box_cols: int):
        """A device copy of the map of a row-major (rows, cols) fp16 matrix at ``ptr``, boxes of
        box_rows x box_cols, swizzled by the box row's byte width; returns (cupy array, address)."""
        import cupy as cp

        sw, _ = SWIZZLE[box_cols * 2]
        buf = ctypes.create_string_buffer(128 + 64)
        addr = (ctypes.addressof(buf) + 63) // 64 * 64
        dims = (ctypes.c_uint64 * 2)(cols, rows)
        strides = (ctypes.c_uint64 * 1)(cols * 2)
        box = (ctypes.c_uint32 * 2)(box_cols, box_rows)
        ones = (ctypes.c_uint32 * 2)(1, 1)
        rc = self.lib.cuTensorMapEncodeTiled(ctypes.c_void_p(addr), 6, 2, ctypes.c_void_p(ptr), dims, strides, box,
                                             ones, 0, sw, 2, 0)
        if rc != 0:
            raise RuntimeError(f"cuTensorMapEncodeTiled failed ({rc}) for {rows}x{cols} box {box_rows}x{box_cols}")
        host = np.frombuffer(ctypes.string_at(addr, 128), dtype=np.uint8)
        dev = cp.asarray(host)
        self.keep.append(dev)
        return dev, int(dev.data.ptr)


def smem_bytes(p) -> int:
    fc = p["f"] // p["ns"]
    a_region = -(-p["g"] * p["br"] * p["bc"] * 2 // 1024) * 1024
    b_region = -(-p["bc"] * fc * 2 // 1024) * 1024
    ring = p["d"] * (a_region + p["g"] * b_region)
    return max(ring, p["br"] * fc * 4 if p["s"] > 1 else 0) + 16 * p["d"] + 1024


def bulk_smem_bytes(p) -> int:
    bc, br, fc = p["bc"], p["br"], p["f"] // p["ns"]
    st = p["d"] * p["g"] * (br * (bc + 8) + bc * (fc + 8)) * 2
    return max(st, br * fc * 4 if p["s"] > 1 else 0) + 16 * p["d"]


def candidates(block, feat, quick, clusters=(1, 4)):
    """Knob sets (probe_bsr_bulk's names) that fit: TMA boxes of at most 256 rows, swizzle
    spans of at most 128 bytes, shared memory within 227 KB."""
    mts = block // 16
    out = []
    for ns in ((1, 2) if feat >= 32 and not quick else (1,)):
        fc = feat // ns
        if fc * 2 not in SWIZZLE:
            continue
        for cw in sorted({mts, 2 * mts} & {1, 2, 4, 8}):
            if (fc // 8) % (cw // mts) or fc // 8 < cw // mts:
                continue
            for g, d in (((2, 4), (4, 4)) if quick else ((1, 4), (2, 4), (4, 4), (2, 8))):
                for s in clusters:
                    c = dict(br=block, bc=block, f=feat, cw=cw, d=d, s=s, g=g, ns=ns)
                    if g * block <= 256 and block * 2 in SWIZZLE and 32 % g == 0 and smem_bytes(c) <= MAX_SMEM:
                        out.append(c)
    return out


def suite(names):
    """[(name, float16 dense, block, True)]: the cases of ``time_bsr_small_feat.py``'s suite (the
    blocks suite with MiniLM's real pruned weights, and BERT's FFN-out shape) whose name
    contains one of ``names``."""
    from time_bsr_small_feat import suite_cases

    return [(name, dense, b, True) for name, dense, b in suite_cases(False, names)]


def cases(quick, rng):
    """[(name, float16 dense (M, K), scipy BSR, timed)]: random weights at 70 % (and 90 % on the
    large one) block sparsity; an edge case (checked only): M and K not multiples of the block,
    an empty block row and a full one."""
    shapes = [("random-4096x4096", 4096, 4096, (0.7, 0.9)), ("random-1024x4096", 1024, 4096, (0.7,)),
              ("minilm-ffn-in", 1536, 384, (0.7,)), ("minilm-attn", 384, 384, (0.7,))]
    if quick:
        shapes = shapes[:1]
    out = []
    for block in (16, 32, 64):  # first: a wrong kernel shows before the timing starts
        dense, _ = random_bsr(1000, 1000 + block // 2, block, 0.7, rng)
        dense[block:2 * block] = 0  # block row 1 empty
        dense[3 * block:4 * block] = rng.standard_normal((block, dense.shape[1])).astype(np.float16)  # row 3 full
        out.append((f"edge-1000x{1000 + block // 2}-b{block}", dense, block, False))
    for name, M, K, sps in shapes:
        for block in (16, 32, 64):
            for sp in sps:
                dense, bsr = random_bsr(M, K, block, sp, rng)
                out.append((f"{name}-b{block}-s{int(sp * 100)}", dense, block, True))
    return out


def to_bsr(dense, block):
    """(indptr, indices, values (nnzb * block, block)) of ``dense`` zero-padded to whole blocks."""
    M, K = dense.shape
    pm, pk = -(-M // block) * block, -(-K // block) * block
    full = np.zeros((pm, pk), np.float16)
    full[:M, :K] = dense
    blocks = full.reshape(pm // block, block, pk // block, block).transpose(0, 2, 1, 3)
    keep = blocks.any(axis=(2, 3))
    rows, cols = np.nonzero(keep)
    indptr = np.concatenate([[0], np.cumsum(keep.sum(axis=1))]).astype(np.int32)
    return indptr, cols.astype(np.int32), np.ascontiguousarray(blocks[rows, cols]).reshape(-1, block)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--feats", type=int, nargs="+", default=[64], choices=(16, 32, 64))
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "probe_bsr_tma.json"))
    ap.add_argument("--suite", nargs="+", help="instead of the random weights: the suite's cases (time_bsr_small_"
                    "feat.py, MiniLM's real pruned weights among them) whose name contains one of these")
    ap.add_argument("--clusters", type=int, nargs="+", default=[1, 4], choices=(1, 2, 4, 8))
    ap.add_argument("--no-bulk", action="store_true", help="time the TMA kernel only")
    args = ap.parse_args(argv)
    import warnings
    from concurrent.futures import ThreadPoolExecutor

    import cupy as cp
    import torch

    from sparsec.measure import Timer

    warnings.simplefilter("ignore", DeprecationWarning)
    timer = Timer("cuda", warmup_ms=10.0, budget_ms=60.0, max_reps=150)
    dev = torch.device("cuda")
    rng = np.random.default_rng(0)
    maps = TensorMaps()
    kernels = {}

    def kernel(name, **p):
        key = (name,) + tuple(sorted(p.items()))
        if key not in kernels:
            src = SOURCE if name == "bsr_tma" else BULK_SOURCE
            extra = {}
            if name == "bsr_tma":
                extra = {"asw": SWIZZLE[p["bc"] * 2][1], "bsw": SWIZZLE[p["f"] // p["ns"] * 2][1]}
            opts = ("-std=c++17", "-arch=sm_90a") + tuple(f"-D{k.upper()}={v}" for k, v in {**p, **extra}.items())
            kernels[key] = cp.RawModule(code=src, options=opts).get_function(name)
        return kernels[key]

    all_cases = suite(args.suite) if args.suite else cases(args.quick, rng)
    work = {tuple(sorted(c.items())): c for _, d, b, _ in all_cases for f in args.feats
            for c in candidates(b, f, args.quick, args.clusters)}
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda c: kernel("bsr_tma", **c), work.values()))
        if not args.no_bulk:
            list(pool.map(lambda c: kernel("bsr_bulk", **c), [c for c in work.values() if c["d"] <= 4]))
    print(f"{len(work)} knob sets compiled", flush=True)

    def stream():
        return cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)

    rows_out = []
    for name, dense16, block, timed in all_cases:
        M, K = dense16.shape
        h_indptr, h_indices, h_vals = to_bsr(dense16, block)
        nbr, nnzb = h_indptr.size - 1, h_indices.size
        indptr, indices = cp.asarray(h_indptr), cp.asarray(h_indices)
        vals = cp.asarray(h_vals)
        w_dense = torch.from_numpy(dense16).to(dev)
        w64 = w_dense.double()
        for feat in args.feats:
            sets = 4 if timed else 2
            bs = [torch.randn(K, feat, device=dev, dtype=torch.float16) for _ in range(sets)]
            refs = [w64 @ b.double() for b in bs]
            dense_ms = timer.measure([lambda b=b: torch.matmul(w_dense, b) for b in bs]).median_ms if timed else None
            row = {"case": name, "shape": [M, K], "block": block, "feat": feat, "nnzb": int(nnzb),
                   "dense_ms": dense_ms, "variants": []}
            for p in candidates(block, feat, args.quick, args.clusters):
                fc = feat // p["ns"]
                map_a = maps.fp16_2d(int(vals.data.ptr), nnzb * block, block, p["g"] * block, block)[1]
                maps_b = [maps.fp16_2d(int(b.data_ptr()), K, feat, block, fc)[1] for b in bs]
                grid = (nbr * p["s"] * p["ns"],)
                threads = ((p["cw"] + 1) * 32,)
                contenders = [("bsr_tma", smem_bytes(p))]
                if p["d"] <= 4 and bulk_smem_bytes(p) <= MAX_SMEM and timed and not args.no_bulk:
                    contenders.append(("bsr_bulk", bulk_smem_bytes(p)))
                for kname, sm in contenders:
                    kern = kernel(kname, **p)
                    kern.max_dynamic_shared_size_bytes = sm
                    outs = [torch.full((M, feat), float("nan"), device=dev, dtype=torch.float32) for _ in bs]
                    if kname == "bsr_tma":
                        argsets = [(indptr, indices, np.uint64(map_a), np.uint64(maps_b[i]), cp.asarray(outs[i]),
                                    np.int32(M), np.int32(K)) for i in range(sets)]
                    else:  # probe_bsr_bulk's kernel reads B whole rows of F: (K, F) with M, K guards
                        argsets = [(indptr, indices, vals.reshape(-1), cp.asarray(bs[i]), cp.asarray(outs[i]),
                                    np.int32(M), np.int32(K)) for i in range(sets)]

                    def call(i, kern=kern, grid=grid, threads=threads, sm=sm, argsets=argsets):
                        with stream():
                            kern(grid, threads, argsets[i], shared_mem=sm)
                    for i in range(sets):
                        call(i)
                    torch.cuda.synchronize()
                    err = max(float((o.double() - r).abs().max() / r.abs().max()) for o, r in zip(outs, refs))
                    ok = bool(err < 2e-3) and all(bool(torch.isfinite(o).all()) for o in outs)
                    tm = timer.measure([lambda i=i: call(i) for i in range(sets)]) if ok and timed else None
                    ms = tm.median_ms if tm else None
                    row["variants"].append({"kernel": kname, **p, "smem": sm, "ok": ok, "err": err, "ms": ms,
                                            "ratio": dense_ms / ms if ms else None})
            for kname in ("bsr_tma", "bsr_bulk"):
                good = [x for x in row["variants"] if x["kernel"] == kname and x["ms"]]
                row[f"best_{kname}"] = min(good, key=lambda x: x["ms"]) if good else None
            rows_out.append(row)
            wrong = sum(not x["ok"] for x in row["variants"])
            t, b = row["best_bsr_tma"], row["best_bsr_bulk"]
            print(f"{name:<26} N={feat:2d} dense {dense_ms * 1e3 if timed else float('nan'):6.2f} us  tma "
                  f"{t['ms'] * 1e3 if t else float('nan'):6.2f} us x{t['ratio'] if t else 0:.2f}  cp.async "
                  f"{'x%.2f' % b['ratio'] if b else '-'}  wrong {wrong}/{len(row['variants'])}", flush=True)
    wrong = write_probe_rows(args.out, rows_out)
    print(f"\n{torch.cuda.get_device_name()}: {wrong} wrong variants; best per case (ratio = dense / ours)")
    print(f"{'case':<26} {'N':>3} {'tma us':>7} {'ratio':>6} {'knobs':<34} {'cp.async':>8} {'dense us':>8}")
    ratios = []
    for r in rows_out:
        t, b = r["best_bsr_tma"], r["best_bsr_bulk"]
        if r["dense_ms"] is None:
            print(f"{r['case']:<26} {r['feat']:>3}  checked only, wrong "
                  f"{sum(not x['ok'] for x in r['variants'])}/{len(r['variants'])}")
            continue
        if not t:
            print(f"{r['case']:<26} {r['feat']:>3}  NONE OK")
            continue
        ratios.append(t["ratio"])
        kn = " ".join(f"{k}{t[k]}" for k in ("cw", "d", "g", "s", "ns"))
        print(f"{r['case']:<26} {r['feat']:>3} {t['ms'] * 1e3:7.2f} {t['ratio']:6.2f} {kn:<34} "
              f"{'x%.2f' % b['ratio'] if b else '-':>8} {r['dense_ms'] * 1e3:8.2f}")
    if ratios:
        print(f"tma geomean x{math.exp(np.mean(np.log(ratios))):.2f}, min x{min(ratios):.2f}, "
              f"{sum(x < 1 for x in ratios)}/{len(ratios)} below dense")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
