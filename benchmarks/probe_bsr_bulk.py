"""Probe (issue 23's BSR few-column line): can a BSR fp16 SpMM at 16-64 columns of B that
moves each stored block and B's rows for it by bulk copies (``cp.async.bulk`` completing on
``mbarrier``s, a producer warp several blocks ahead of the consumer warps) beat dense cuBLAS
fp16 at 70 % block sparsity, where the committed kernels (cp.async 16-byte copies, B
resident or gathered per block) read weight bytes at a quarter of cuBLAS's rate?

Written as CUDA C++ compiled by CuPy (NVRTC) so that designs can be tried without the TVM
bundle; the design that wins becomes a schedule of the pipeline. Each variant is checked
against float64 on a NaN-poisoned output, then timed with sparsec's CUDA-graph timer beside
``torch.matmul`` on the dense fp16 weight, both over rotating input sets.

    python3 benchmarks/probe_bsr_bulk.py [--quick] [--out FILE]

Round 1 moved B's rows by one bulk copy each (slow: the copy engine's cost is per copy);
round 2 moved them by 16-byte cp.async into padded rows (a stage's completion tracked by
``cp.async.mbarrier.arrive.noinc``), blocks bulk-copied in MMA-fragment order or by
cp.async (as fast, and no second layout). Round 3 (this file): cp.async for both, ``g``
blocks a stage, ``ns`` CTAs splitting B's columns; ``cw`` consumer warps, ``d`` stages,
``s`` CTAs of a cluster splitting a block row's stored blocks (partials summed through
distributed shared memory).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np

import _preamble  # noqa: F401,E402

MMA_HELPERS = r"""
// shared addresses, 16-byte cp.async, ldmatrix (x4, x4.trans, x2.trans), mma.m16n8k16 f16 -> f32
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void ldm_x4(unsigned* r, unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldm_x4_t(unsigned* r, unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldm_x2_t(unsigned* r, unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];"
               : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
__device__ __forceinline__ void mma16816(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
"""

MBAR_HELPERS = r"""
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}
"""

# the ring's barriers initialised (FULL_ARRIVALS arrivals fill a stage: the producer's 32 lanes
# for cp.async, its one lane arming the byte count for tensor copies) and the CTA's share of
# its block row's stored blocks (probe_bsr_tma.py shares it)
RING_PROLOGUE = r"""
  if (threadIdx.x == 0) {
    for (int s = 0; s < D; ++s) { mbar_init(full0 + 8 * s, FULL_ARRIVALS); mbar_init(empty0 + 8 * s, CW); }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const int lo = indptr[br], hi = indptr[br + 1];
  const int n = hi - lo;
  const int q0 = lo + (int)((long long)n * rank / S), q1 = lo + (int)((long long)n * (rank + 1) / S);
  const int cnt = q1 - q0;
  const int nst = (cnt + G - 1) / G;  // stages to fill
"""

# the consumer warps' start: their 16-row tile and columns, zeroed accumulators, and the walk over
# the stages, each waited on (probe_bsr_tma.py shares it)
CONSUMER_HEAD = r"""
  } else {
    const int mi = warp % MT, grp = warp / MT;
    const int n0 = grp * NTW * 8;
    float acc[NTW][4];
#pragma unroll
    for (int j = 0; j < NTW; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    for (int j = 0; j < nst; ++j) {
      const int s = j % D;
      mbar_wait(full0 + 8 * s, (j / D) & 1);
"""

# the consumers' partial tiles to C: stored directly, or (a cluster of S) summed through distributed
# shared memory, each CTA adding an S-th of the elements (probe_bsr_tma.py shares it)
WRITE_BACK = r"""
    const int gq = lane / 4, t4 = lane % 4;
    if (S == 1) {
#pragma unroll
      for (int t = 0; t < NTW; ++t)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = br * BR + mi * 16 + gq + h * 8;
          if (row < M)
            *reinterpret_cast<float2*>(C + (size_t)row * F + f0 + n0 + t * 8 + t4 * 2) =
                make_float2(acc[t][h * 2], acc[t][h * 2 + 1]);
        }
    } else {
      float* red = reinterpret_cast<float*>(smem);
      asm volatile("bar.sync 1, %0;" :: "n"(CW * 32));
#pragma unroll
      for (int t = 0; t < NTW; ++t)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          *reinterpret_cast<float2*>(red + (mi * 16 + gq + h * 8) * FC + n0 + t * 8 + t4 * 2) =
              make_float2(acc[t][h * 2], acc[t][h * 2 + 1]);
    }
  }
  if (S > 1) {
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();
    float* red = reinterpret_cast<float*>(smem);
    constexpr int ELEMS = BR * FC;
    constexpr int SHARE = (ELEMS + S - 1) / S;
    for (int e = threadIdx.x; e < SHARE; e += THREADS) {
      const int idx = rank * SHARE + e;
      if (idx < ELEMS) {
        float sum = 0.f;
#pragma unroll
        for (int q = 0; q < S; ++q) sum += cluster.map_shared_rank(red, q)[idx];
        const int row = br * BR + idx / FC;
        if (row < M) C[(size_t)row * F + f0 + idx % FC] = sum;
      }
    }
    cluster.sync();
  }
}
"""

SOURCE = r"""
#include <cuda_fp16.h>
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

#ifndef BR
#error params
#endif
// BR x BC blocks, F columns of B (FC of them a CTA: F / NS), CW consumer warps, D stages of
// G blocks each, S cluster split of a block row's stored blocks
constexpr int FC = F / NS;            // columns of B a CTA takes
constexpr int KS = BC / 16;           // k-steps a block
constexpr int MT = BR / 16;           // 16-row tiles a block
constexpr int GROUPS = CW / MT;       // column groups of consumer warps
constexpr int NTW = FC / 8 / GROUPS;  // 8-column MMA tiles a warp
constexpr int BP = FC + 8;            // B stage pitch (halves): ldmatrix rows in distinct banks
constexpr int AP = BC + 8;
constexpr int A_HALVES = BR * AP;
constexpr int B_HALVES = BC * BP;
constexpr int BLOCK_HALVES = A_HALVES + B_HALVES;
constexpr int STAGE_HALVES = G * BLOCK_HALVES;
constexpr int THREADS = (CW + 1) * 32;
constexpr int FULL_ARRIVALS = 32;  // the producer's lanes, each arriving when its copies land

""" + MMA_HELPERS + r"""
""" + MBAR_HELPERS + r"""
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  asm volatile(
      "{\n .reg .pred p;\n"
      "WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra WAIT_%=;\n}" :: "r"(bar), "r"(parity) : "memory");
}
__device__ __forceinline__ void bulk_copy(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

extern "C" __global__ void
#if S > 1
__cluster_dims__(S, 1, 1)
#endif
__launch_bounds__(THREADS, 1)
bsr_bulk(const int* __restrict__ indptr, const int* __restrict__ indices, const half* __restrict__ values,
         const half* __restrict__ B, float* __restrict__ C, int M, int K) {
  extern __shared__ __align__(128) unsigned char smem[];
  half* stages = reinterpret_cast<half*>(smem);
  unsigned long long* bars = reinterpret_cast<unsigned long long*>(smem + D * STAGE_HALVES * 2);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rank = blockIdx.x % S, ns = (blockIdx.x / S) % NS, br = blockIdx.x / S / NS;
  const int f0 = ns * FC;
  const unsigned full0 = smem_addr(bars), empty0 = smem_addr(bars + D);
""" + RING_PROLOGUE + r"""  if (warp == CW) {  // producer
    int window = 0;
    for (int j = 0; j < nst; ++j) {
      const int s = j % D;
      if (j >= D) mbar_wait(empty0 + 8 * s, ((j / D) - 1) & 1);
      const unsigned bar = full0 + 8 * s;
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const int i = j * G + g;
        if (i % 32 == 0) window = (q0 + i + lane < q1) ? indices[q0 + i + lane] : 0;
        const int col = __shfl_sync(0xffffffffu, window, i % 32);
        if (i < cnt) {
          half* st = stages + s * STAGE_HALVES + g * BLOCK_HALVES;
          const int k0 = col * BC;
          const int rows_in = min(BC, K - k0);
          const half* arow = values + (size_t)(q0 + i) * BR * BC;
#pragma unroll
          for (int e = lane; e < BR * BC / 8; e += 32)
            cp_async16(smem_addr(st + (e / (BC / 8)) * AP + (e % (BC / 8)) * 8), arow + e * 8, 16);
#pragma unroll
          for (int e = lane; e < BC * FC / 8; e += 32) {  // B's rows for the block, rows past K zero
            const int r = e / (FC / 8), c8 = e % (FC / 8);
            cp_async16(smem_addr(st + A_HALVES + r * BP + c8 * 8),
                       B + (size_t)(k0 + min(r, rows_in - 1)) * F + f0 + c8 * 8, r < rows_in ? 16 : 0);
          }
        }
      }
      asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" :: "r"(bar) : "memory");
    }
""" + CONSUMER_HEAD + r"""#pragma unroll
      for (int g = 0; g < G; ++g) {
        if (j * G + g < cnt) {
          const half* st = stages + s * STAGE_HALVES + g * BLOCK_HALVES;
          const unsigned sa = smem_addr(st), sbb = smem_addr(st + A_HALVES);
#pragma unroll
          for (int kk = 0; kk < KS; ++kk) {
            unsigned a[4];
            ldm_x4(a, sa + ((mi * 16 + lane % 16) * AP + kk * 16 + lane / 16 * 8) * 2);
#pragma unroll
            for (int t = 0; t + 1 < NTW; t += 2) {
              unsigned b[4];
              ldm_x4_t(b, sbb + ((kk * 16 + lane % 16) * BP + n0 + t * 8 + lane / 16 * 8) * 2);
              mma16816(acc[t], a, b[0], b[1]);
              mma16816(acc[t + 1], a, b[2], b[3]);
            }
            if (NTW % 2) {
              unsigned b[2];
              ldm_x2_t(b, sbb + ((kk * 16 + lane % 16) * BP + n0 + (NTW - 1) * 8) * 2);
              mma16816(acc[NTW - 1], a, b[0], b[1]);
            }
          }
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(empty0 + 8 * s);
    }
""" + WRITE_BACK


def random_bsr(rows, cols, block, sparsity, rng):
    """A float16 BSR matrix (scipy) with ``sparsity`` of its blocks zero, exactly, random values."""
    import scipy.sparse as sp

    nbr, nbc = -(-rows // block), -(-cols // block)
    keep = int(round(nbr * nbc * (1 - sparsity)))
    mask = np.zeros(nbr * nbc, bool)
    mask[rng.choice(nbr * nbc, keep, replace=False)] = True
    mask = mask.reshape(nbr, nbc)
    dense = rng.standard_normal((nbr * block, nbc * block)).astype(np.float32)
    dense *= np.kron(mask, np.ones((block, block), np.float32))
    dense[rows:] = 0
    dense[:, cols:] = 0
    full = sp.bsr_matrix(dense, blocksize=(block, block))
    full.sort_indices()
    return dense[:rows, :cols].astype(np.float16), full


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "probe_bsr_bulk.json"))
    args = ap.parse_args(argv)
    import cupy as cp
    import torch

    from sparsec.measure import Timer

    timer = Timer("cuda", warmup_ms=10.0, budget_ms=60.0, max_reps=150)
    dev = torch.device("cuda")
    rng = np.random.default_rng(0)
    shapes = [("random-4096x4096", 4096, 4096), ("random-1024x4096", 1024, 4096), ("bert-ffn-out", 768, 3072),
              ("minilm-ffn-out", 384, 1536), ("minilm-ffn-in", 1536, 384), ("minilm-attn", 384, 384)]
    if args.quick:
        shapes = shapes[:1]
    kernels = {}

    def kernel(**p):
        key = tuple(sorted(p.items()))
        if key not in kernels:
            opts = ("-std=c++17", "-arch=sm_90a") + tuple(f"-D{k.upper()}={v}" for k, v in p.items())
            mod = cp.RawModule(code=SOURCE, options=opts)
            kern = mod.get_function("bsr_bulk")
            kernels[key] = kern
        return kernels[key]

    import warnings

    warnings.simplefilter("ignore", DeprecationWarning)

    def smem_bytes(p):
        bc, br, fc = p["bc"], p["br"], p["f"] // p["ns"]
        st = p["d"] * p["g"] * (br * (bc + 8) + bc * (fc + 8)) * 2
        return max(st, br * fc * 4 if p["s"] > 1 else 0) + 16 * p["d"]

    def candidates(block, feat, sparsity):
        mts = block // 16
        out = []
        for ns in ((1, 2) if feat >= 32 else (1,)):
            fc = feat // ns
            for cw in sorted({mts, 2 * mts, 4 * mts} & {1, 2, 4, 8}):
                if (fc // 8) % (cw // mts) or fc // 8 < cw // mts:
                    continue
                for g, d in ((1, 4), (1, 8), (2, 4), (4, 4)):
                    for s in (1, 2, 4):
                        out.append(dict(br=block, bc=block, f=feat, cw=cw, d=d, s=s, g=g, ns=ns))
        return [c for c in out if smem_bytes(c) <= 227 * 1024]

    work = [(b, f, sp) for b in (16, 32, 64) for f in (16, 64) for sp in (0.7, 0.9)]
    uniq = {tuple(sorted(c.items())): c for w in work for c in candidates(*w)}
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda c: kernel(**c), uniq.values()))
    print(f"{len(uniq)} kernels compiled", flush=True)

    rows_out = []
    for name, M, K in shapes:
        for block in (16, 32, 64):
            for sparsity in (0.7, 0.9):
                dense16, bsr = random_bsr(M, K, block, sparsity, rng)
                nbr = bsr.indptr.size - 1
                blocks = bsr.data.astype(np.float16)
                w_dense = torch.from_numpy(dense16).to(dev)
                indptr = cp.asarray(bsr.indptr.astype(np.int32))
                indices = cp.asarray(bsr.indices.astype(np.int32))
                vals = cp.asarray(blocks.reshape(-1))
                for feat in (16, 64):
                    sets = 4
                    bs = [torch.randn(K, feat, device=dev, dtype=torch.float16) for _ in range(sets)]
                    ref = [(torch.from_numpy(dense16.astype(np.float64)).to(dev) @ b.double()) for b in bs]
                    dense_t = timer.measure([lambda b=b: torch.matmul(w_dense, b) for b in bs]).median_ms
                    row = {"case": f"{name}-b{block}-s{int(sparsity * 100)}", "shape": [M, K], "block": block,
                           "feat": feat, "dense_ms": dense_t, "variants": []}
                    if sparsity > 0.8 and feat == 16:
                        continue  # won already by the first two probes (x1.14-x2.30)
                    for p in candidates(block, feat, sparsity):
                        sm = smem_bytes(p)
                        kern = kernel(**p)
                        kern.max_dynamic_shared_size_bytes = sm
                        grid = (nbr * p["s"] * p["ns"],)
                        threads = ((p["cw"] + 1) * 32,)
                        v = vals
                        outs = [torch.full((M, feat), float("nan"), device=dev, dtype=torch.float32) for _ in bs]

                        def call(i, kern=kern, grid=grid, threads=threads, v=v, sm=sm, outs=outs):
                            stream = cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
                            with stream:
                                kern(grid, threads, (indptr, indices, v, cp.asarray(bs[i]), cp.asarray(outs[i]),
                                                     np.int32(M), np.int32(K)), shared_mem=sm)
                        for i in range(sets):
                            call(i)
                        torch.cuda.synchronize()
                        err = max(float((o.double() - r).norm() / r.norm()) for o, r in zip(outs, ref))
                        ok = bool(err < 1e-3) and not any(bool(torch.isnan(o).any()) for o in outs)
                        tm = timer.measure([lambda i=i: call(i) for i in range(sets)]) if ok else None
                        row["variants"].append({**p, "ok": ok, "err": err, "ms": tm.median_ms if tm else None,
                                                "method": tm.method if tm else None})
                    good = [x for x in row["variants"] if x["ok"]]
                    best = min(good, key=lambda x: x["ms"]) if good else None
                    if best:  # the winner again on 10 fresh inputs: a race shows as a moving error
                        p = {k: best[k] for k in ("br", "bc", "f", "cw", "d", "s", "g", "ns")}
                        kern = kernel(**p)
                        errs = []
                        for _ in range(10):
                            b = torch.randn(K, feat, device=dev, dtype=torch.float16)
                            o = torch.full((M, feat), float("nan"), device=dev, dtype=torch.float32)
                            kern((nbr * p["s"] * p["ns"],), ((p["cw"] + 1) * 32,),
                                 (indptr, indices, vals, cp.asarray(b), cp.asarray(o), np.int32(M), np.int32(K)),
                                 shared_mem=smem_bytes(p))
                            r = torch.from_numpy(dense16.astype(np.float64)).to(dev) @ b.double()
                            errs.append(float((o.double() - r).norm() / r.norm()))
                        torch.cuda.synchronize()
                        best["recheck_max_err"] = max(errs)
                        if not max(errs) < 1e-3:
                            best["ok"] = False
                            row["variants"].append({**best, "recheck": "failed"})
                    row["best"] = best
                    row["speedup"] = dense_t / best["ms"] if best else None
                    rows_out.append(row)
                    print(f"{row['case']:28s} F={feat:2d} dense {dense_t * 1e3:6.2f} us  best "
                          f"{best['ms'] * 1e3 if best else float('nan'):6.2f} us  x{row['speedup'] or 0:.2f}  "
                          f"{ {k: best[k] for k in ('cw', 'd', 's', 'g', 'ns')} if best else 'NONE OK'}", flush=True)
    wrong = [(r["case"], r["feat"], x) for r in rows_out for x in r["variants"] if not x["ok"]]
    with open(args.out, "w") as fh:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows_out, "wrong": len(wrong)}, fh, indent=1)
    sp = [r["speedup"] for r in rows_out if r["speedup"]]
    print(f"\n{len(rows_out)} cases, {len(wrong)} wrong variants; geomean x{math.exp(np.mean(np.log(sp))):.3f} "
          f"min x{min(sp):.3f}; below 1.0x: {sum(s < 1 for s in sp)}")
    for r in rows_out:
        if r["speedup"] and r["speedup"] < 1:
            print(f"  slower: {r['case']} F={r['feat']} x{r['speedup']:.2f}")
    if wrong:
        print("WRONG:", wrong[:5])
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
