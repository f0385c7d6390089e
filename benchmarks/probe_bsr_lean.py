#!/usr/bin/env python3
"""Design probes for BSR fp16 SpMM at few columns of B on small layers (MiniLM's 384-column
weights, where dense cuBLAS takes ~3 us and every kernel sparsec builds lost at 64 columns):

* ``bsr_lean`` (``--lean``): every CTA copies all of B into shared memory at launch, in
  flight with its block row's ``indptr`` entries, so a block needs only its own copy and
  column (two dependent trips instead of three). Measured: it loses at 64 columns (B's
  48 KB copied by every CTA costs more than the trip saved; ``results/probe_bsr_lean_r1``).
* ``bsr_gather``: a CTA owns a block row and its warps split the row's stored blocks
  (warp w: blocks w, w + W, ...), every block of the row in flight at once (the block and
  B's rows for it, 16-byte ``cp.async``), then multiplied (``ldmatrix`` + ``mma.m16n8k16``),
  the warps' partial tiles added in shared memory.
* ``bsr_split``: ``bsr_gather`` with a long row's columns of B split across ``split`` CTAs
  (rows of ``heavy`` or more stored blocks; shorter rows stay whole in one CTA): a real
  pruned weight's dense rows then spread over several SMs while light rows read A once.
* ``bsr_ksplit`` (``--ksplit``, ``--only-ksplit``): a row of more than T stored blocks cut
  into chunks of T over CTAs, the partial tiles through an fp32 workspace, added by the CTA
  that counts last on the row's counter (no CTA waits on another). Measured: 0.9-1.9 us slower
  than ``bsr_gather`` on MiniLM's layers at 64 columns (``results/probe_bsr_ksplit_H200``).

    SPARSEC_DATA_DIR=.data python3 benchmarks/probe_bsr_lean.py [--lean] [--ksplit | --only-ksplit]
                                                               [--feats 16 64] [--out FILE]

CUDA C++ compiled by CuPy (no TVM needed), on MiniLM's FFN-in and attention-Q weights
(block-pruned as ``sparsec.bench.suites.blocks`` prunes them) and random 384 x 384 weights;
every variant checked against float64 on a NaN-poisoned output, then timed with sparsec's
timer beside ``torch.matmul`` (B rotated over copies).
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np

import _preamble  # noqa: F401,E402

from _helpers import write_probe_rows  # noqa: E402

from probe_bsr_bulk import MMA_HELPERS  # noqa: E402

MMA_BLOCK = r"""
// one stored block's product into a warp's accumulators: the block (BR x BC, rows AP halves
// apart) at shared address sa, B's BC rows for it (NTW 8-column tiles, rows PW halves apart)
// at sb; every 16-row tile of the block, ldmatrix + mma.m16n8k16
template <int NTW, int PW>
__device__ __forceinline__ void mma_block(float (&acc)[MT][NTW][4], unsigned sa, unsigned sb, int lane) {
#pragma unroll
  for (int kk = 0; kk < KS; ++kk)
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      unsigned a[4];
      ldm_x4(a, sa + ((m * 16 + lane % 16) * AP + kk * 16 + lane / 16 * 8) * 2);
#pragma unroll
      for (int t = 0; t + 1 < NTW; t += 2) {
        unsigned b[4];
        ldm_x4_t(b, sb + ((kk * 16 + lane % 16) * PW + t * 8 + lane / 16 * 8) * 2);
        mma16816(acc[m][t], a, b[0], b[1]);
        mma16816(acc[m][t + 1], a, b[2], b[3]);
      }
      if (NTW % 2) {
        unsigned b[2];
        ldm_x2_t(b, sb + ((kk * 16 + lane % 16) * PW + (NTW - 1) * 8) * 2);
        mma16816(acc[m][NTW - 1], a, b[0], b[1]);
      }
    }
}
// a warp's accumulators (every 16-row tile, NTW 8-column tiles) into its partial tile at red:
// row r at red + r * RP, its columns from col0
template <int NTW>
__device__ __forceinline__ void store_partial(float* red, const float (&acc)[MT][NTW][4], int RP, int col0,
                                              int lane) {
  const int gq = lane / 4, t4 = lane % 4;
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int t = 0; t < NTW; ++t)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        *reinterpret_cast<float2*>(red + (m * 16 + gq + h * 8) * RP + col0 + t * 8 + t4 * 2) =
            make_float2(acc[m][t][h * 2], acc[m][t][h * 2 + 1]);
}

// elements [e, e + 4) (one row) of the sum of the first ``parts`` (at most MAXP) partial
// BR x FW tiles laid one after another at red, rows RP floats apart
template <int FW, int RP, int MAXP>
__device__ __forceinline__ float4 sum_partial(const float* red, int parts, int e) {
  const int rr = e / FW, cc = e % FW;
  float4 s = *reinterpret_cast<const float4*>(red + rr * RP + cc);
#pragma unroll
  for (int q = 1; q < MAXP; ++q) {
    if (q < parts) {
      const float4 v = *reinterpret_cast<const float4*>(red + (q * BR + rr) * RP + cc);
      s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
    }
  }
  return s;
}
"""

SOURCE = r"""
#include <cuda_fp16.h>
#ifndef SPLIT
#define SPLIT 1
#endif
#ifndef G
#define G 1   // blocks a warp copies per round (bsr_cols copies CH blocks a CTA instead)
#endif
// BR x BC blocks, F columns of B, W warps (MT = BR / 16 row tiles x WB block groups), G blocks
// a warp copies per round, KP rows of B resident (K rounded up to BC)
constexpr int MT = BR / 16;
constexpr int WB = W / MT;            // warps sharing a 16-row tile: they split the row's blocks
constexpr int KS = BC / 16;
constexpr int NT = F / 8;             // 8-column MMA tiles
constexpr int BPITCH = F + 8;         // halves a resident row of B (ldmatrix rows in distinct banks)
constexpr int AP = BC + 8;
constexpr int SLOT = 16 * AP;         // halves of a warp's slice of one block
constexpr int THREADS = W * 32;
constexpr int B_HALVES = KP * BPITCH;
#ifndef RPAD
#define RPAD 0   // floats of padding a row of a warp's partial tile (row_part): off the banks
#endif
#ifndef LIVE
#define LIVE 0   // 1: only the warps that took blocks store and add partial tiles (row_part)
#endif

""" + MMA_HELPERS + MMA_BLOCK + r"""

// C's rows of block row br, columns [f0, f0 + FW): the sum of PARTS partial BR x FW tiles
// laid one after another at red (shared memory), four floats a thread at a time
template <int FW, int PARTS>
__device__ __forceinline__ void sum_partials(const float* red, float* __restrict__ C, int M, int br, int f0) {
  for (int e = threadIdx.x * 4; e < BR * FW; e += THREADS * 4) {
    float4 s = *reinterpret_cast<const float4*>(red + e);
#pragma unroll
    for (int q = 1; q < PARTS; ++q) {
      const float4 v = *reinterpret_cast<const float4*>(red + q * BR * FW + e);
      s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
    }
    const int row = br * BR + e / FW;
    if (row < M) *reinterpret_cast<float4*>(C + (size_t)row * F + f0 + e % FW) = s;
  }
}

extern "C" __global__ void __launch_bounds__(THREADS) bsr_lean(
    const int* __restrict__ indptr, const int* __restrict__ indices, const half* __restrict__ values,
    const half* __restrict__ B, float* __restrict__ C, int M, int K) {
  extern __shared__ __align__(128) unsigned char smem[];
  half* bs = reinterpret_cast<half*>(smem);
  half* as = bs + B_HALVES;
  const int br = blockIdx.x, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int mi = warp % MT, wb = warp / MT;
  // trip 1: B whole, and the row's extent
  for (int e = tid; e < KP * (F / 8); e += THREADS) {
    const int row = e / (F / 8), c8 = e % (F / 8);
    cp_async16(smem_addr(bs + row * BPITCH + c8 * 8), B + (size_t)min(row, K - 1) * F + c8 * 8, row < K ? 16 : 0);
  }
  const int q0 = indptr[br];
  const int cnt = indptr[br + 1] - q0;
  half* mine = as + warp * G * SLOT;
  float acc[NT][4];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
  const int rounds = (cnt + WB * G - 1) / (WB * G);
  for (int r = 0; r < max(rounds, 1); ++r) {
    int col[G];
    // trip 2: this warp's blocks (their 16-row slices) and their columns
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const int i = wb + (r * G + g) * WB;
      col[g] = 0;
      if (i < cnt) {
        const half* src = values + (size_t)(q0 + i) * (BR * BC) + mi * 16 * BC;
#pragma unroll
        for (int e = lane; e < 16 * BC / 8; e += 32)
          cp_async16(smem_addr(mine + g * SLOT + (e / (BC / 8)) * AP + (e % (BC / 8)) * 8), src + e * 8, 16);
        col[g] = indices[q0 + i];
      }
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    if (r == 0) __syncthreads();  // B, copied by every thread, is in
    else __syncwarp();
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const int i = wb + (r * G + g) * WB;
      if (i < cnt) {
        const unsigned sa = smem_addr(mine + g * SLOT);
        const unsigned sb = smem_addr(bs + col[g] * BC * BPITCH);
#pragma unroll
        for (int kk = 0; kk < KS; ++kk) {
          unsigned a[4];
          ldm_x4(a, sa + ((lane % 16) * AP + kk * 16 + lane / 16 * 8) * 2);
#pragma unroll
          for (int t = 0; t + 1 < NT; t += 2) {
            unsigned b[4];
            ldm_x4_t(b, sb + ((kk * 16 + lane % 16) * BPITCH + t * 8 + lane / 16 * 8) * 2);
            mma16816(acc[t], a, b[0], b[1]);
            mma16816(acc[t + 1], a, b[2], b[3]);
          }
          if (NT % 2) {
            unsigned b[2];
            ldm_x2_t(b, sb + ((kk * 16 + lane % 16) * BPITCH + (NT - 1) * 8) * 2);
            mma16816(acc[NT - 1], a, b[0], b[1]);
          }
        }
      }
    }
    __syncwarp();
  }
  const int gq = lane / 4, t4 = lane % 4;
  if (WB == 1) {
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = br * BR + mi * 16 + gq + h * 8;
        if (row < M)
          *reinterpret_cast<float2*>(C + (size_t)row * F + t * 8 + t4 * 2) =
              make_float2(acc[t][h * 2], acc[t][h * 2 + 1]);
      }
    return;
  }
  float* red = reinterpret_cast<float*>(smem);  // WB partial tiles of BR x F, over B and the slots
  __syncthreads();
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      *reinterpret_cast<float2*>(red + (wb * BR + mi * 16 + gq + h * 8) * F + t * 8 + t4 * 2) =
          make_float2(acc[t][h * 2], acc[t][h * 2 + 1]);
  __syncthreads();
  sum_partials<F, WB>(red, C, M, br, 0);
}

// the sum of PARTS partial BR x FW tiles at red into the BR x FW fp32 tile ``part`` (a workspace slot)
template <int FW, int PARTS>
__device__ __forceinline__ void sum_partials_to(const float* red, float* __restrict__ part) {
  for (int e = threadIdx.x * 4; e < BR * FW; e += THREADS * 4) {
    float4 s = *reinterpret_cast<const float4*>(red + e);
#pragma unroll
    for (int q = 1; q < PARTS; ++q) {
      const float4 v = *reinterpret_cast<const float4*>(red + q * BR * FW + e);
      s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
    }
    __stcg(reinterpret_cast<float4*>(part + e), s);
  }
}

// A CTA owns a block row and its warps split the row's stored blocks (warp w: blocks w, w + W,
// ...): trips indptr -> (blocks, columns) -> B's rows, every block of a round in flight at once;
// a warp takes all MT row tiles of its blocks (A read once, B's rows once per block), the warps'
// partial tiles added in shared memory. bsr_gather: all F columns a CTA; bsr_split: a long row's
// columns of B split across SPLIT CTAs: CTA (row, s)
// takes columns [s F / SPLIT, (s + 1) F / SPLIT) of a row of ``heavy`` or more stored blocks,
// and all F of a shorter row (s = 0; the others exit): a dense row's bytes over SPLIT SMs,
// a light row's A read once.
template <int FW>
__device__ __forceinline__ void row_part(const half* __restrict__ values, const int* __restrict__ indices,
                                         const half* __restrict__ B, float* __restrict__ C, int M, int K,
                                         int br, int q0, int cnt, int f0, unsigned char* smem,
                                         float* __restrict__ part = nullptr) {
  constexpr int NTW = FW / 8, PW = FW + 8, SLOTW = BR * AP + BC * PW;
  half* slots = reinterpret_cast<half*>(smem);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  half* mine = slots + warp * G * SLOTW;
  float acc[MT][NTW][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int t = 0; t < NTW; ++t) acc[m][t][0] = acc[m][t][1] = acc[m][t][2] = acc[m][t][3] = 0.f;
  const int rounds = (cnt + W * G - 1) / (W * G);
  for (int r = 0; r < rounds; ++r) {
    int col[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const int i = warp + (r * G + g) * W;
      col[g] = 0;
      if (i < cnt) {
        const half* src = values + (size_t)(q0 + i) * (BR * BC);
#pragma unroll
        for (int e = lane; e < BR * BC / 8; e += 32)
          cp_async16(smem_addr(mine + g * SLOTW + (e / (BC / 8)) * AP + (e % (BC / 8)) * 8), src + e * 8, 16);
        col[g] = indices[q0 + i];
      }
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const int i = warp + (r * G + g) * W;
      if (i < cnt) {
#pragma unroll
        for (int e = lane; e < BC * FW / 8; e += 32) {
          const int k = col[g] * BC + e / (FW / 8);
          cp_async16(smem_addr(mine + g * SLOTW + BR * AP + (e / (FW / 8)) * PW + (e % (FW / 8)) * 8),
                     B + (size_t)min(k, K - 1) * F + f0 + (e % (FW / 8)) * 8, k < K ? 16 : 0);
        }
      }
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncwarp();
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const int i = warp + (r * G + g) * W;
      if (i < cnt) {
        mma_block<NTW, PW>(acc, smem_addr(mine + g * SLOTW), smem_addr(mine + g * SLOTW + BR * AP), lane);
      }
    }
    __syncwarp();
  }
  float* red = reinterpret_cast<float*>(smem);
  constexpr int RP = FW + RPAD;
  const int parts = LIVE ? max(1, min(W, cnt)) : W;  // warp w took blocks iff w < cnt
  __syncthreads();
  if (warp < parts) store_partial<NTW>(red + warp * BR * RP, acc, RP, 0, lane);
  __syncthreads();
  if (RPAD == 0 && !LIVE) {
    if (part == nullptr) sum_partials<FW, W>(red, C, M, br, f0);
    else sum_partials_to<FW, W>(red, part);
    return;
  }
  for (int e = threadIdx.x * 4; e < BR * FW; e += THREADS * 4) {
    const float4 sum = sum_partial<FW, RP, W>(red, parts, e);
    if (part != nullptr) { __stcg(reinterpret_cast<float4*>(part + e), sum); continue; }
    const int row = br * BR + e / FW;
    if (row < M) *reinterpret_cast<float4*>(C + (size_t)row * F + f0 + e % FW) = sum;
  }
}

extern "C" __global__ void __launch_bounds__(THREADS) bsr_gather(
    const int* __restrict__ indptr, const int* __restrict__ indices, const half* __restrict__ values,
    const half* __restrict__ B, float* __restrict__ C, int M, int K) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int q0 = indptr[blockIdx.x];
  row_part<F>(values, indices, B, C, M, K, blockIdx.x, q0, indptr[blockIdx.x + 1] - q0, 0, smem);
}

// a kernel whose CTA (row, s) runs PART on columns [s F / SPLIT, (s + 1) F / SPLIT) of a row of
// ``heavy`` or more stored blocks, and on all F of a shorter row (s = 0; the others exit)
#define SPLIT_KERNEL(NAME, PART)                                                                              \
  extern "C" __global__ void __launch_bounds__(THREADS) NAME(                                                 \
      const int* __restrict__ indptr, const int* __restrict__ indices, const half* __restrict__ values,       \
      const half* __restrict__ B, float* __restrict__ C, int M, int K, int heavy) {                           \
    extern __shared__ __align__(128) unsigned char smem[];                                                    \
    const int br = blockIdx.x, s = blockIdx.y;                                                                \
    const int q0 = indptr[br];                                                                                \
    const int cnt = indptr[br + 1] - q0;                                                                      \
    if (SPLIT > 1 && cnt >= heavy) PART<F / SPLIT>(values, indices, B, C, M, K, br, q0, cnt, s * (F / SPLIT), smem); \
    else if (s == 0) PART<F>(values, indices, B, C, M, K, br, q0, cnt, 0, smem);                              \
  }
SPLIT_KERNEL(bsr_split, row_part)

// bsr_cols: warps own columns, not blocks. A CTA takes a block row (a row of ``heavy`` or more
// blocks: FW = F / SPLIT of its columns, CTA (row, s)); all threads copy up to CH of its blocks
// and B's rows for them at once; warp (cg, kg) multiplies columns [16 cg, 16 cg + 16) of the
// CTA's FW for the blocks kg, kg + KG, ... (KG = W / (FW / 16) warps a column group); the KG
// warps of a group add their tiles in shared memory (KG = 1: none, C stored from registers).
// Fewer partial tiles than bsr_gather's W (its reduction: ~500 + ~450 cycles of a 16 x 64
// tile's CTA, probe_bsr_baked --timeline).
#ifndef CH
#define CH 32
#endif
template <int FW>
__device__ __forceinline__ void cols_part(const half* __restrict__ values, const int* __restrict__ indices,
                                          const half* __restrict__ B, float* __restrict__ C, int M, int K,
                                          int br, int q0, int cnt, int f0, unsigned char* smem) {
  constexpr int CG = FW / 16, KG = W / CG, PW = FW + 8, SLOTW = BR * AP + BC * PW, RP = FW + 8;
  static_assert(KG >= 1 && KG * CG == W, "W a multiple of the CTA's 16-column groups");
  half* slots = reinterpret_cast<half*>(smem);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int cg = warp % CG, kg = warp / CG;
  float acc[MT][2][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int t = 0; t < 2; ++t) acc[m][t][0] = acc[m][t][1] = acc[m][t][2] = acc[m][t][3] = 0.f;
  for (int c0 = 0; c0 < cnt; c0 += CH) {
    const int n = min(CH, cnt - c0);
    if (c0 > 0) __syncthreads();  // the chunk before is multiplied: its slots may be overwritten
    for (int e = tid; e < n * (BR * BC / 8); e += THREADS) {  // the blocks
      const int i = e / (BR * BC / 8), x = e % (BR * BC / 8);
      cp_async16(smem_addr(slots + i * SLOTW + (x / (BC / 8)) * AP + (x % (BC / 8)) * 8),
                 values + (size_t)(q0 + c0 + i) * (BR * BC) + x * 8, 16);
    }
    for (int e = tid; e < n * (BC * FW / 8); e += THREADS) {  // B's rows for them
      const int i = e / (BC * FW / 8), x = e % (BC * FW / 8);
      const int k = __ldg(indices + q0 + c0 + i) * BC + x / (FW / 8);
      cp_async16(smem_addr(slots + i * SLOTW + BR * AP + (x / (FW / 8)) * PW + (x % (FW / 8)) * 8),
                 B + (size_t)min(k, K - 1) * F + f0 + (x % (FW / 8)) * 8, k < K ? 16 : 0);
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();
    for (int i = kg; i < n; i += KG)
      mma_block<2, PW>(acc, smem_addr(slots + i * SLOTW), smem_addr(slots + i * SLOTW + BR * AP + cg * 16), lane);
  }
  const int gq = lane / 4, t4 = lane % 4;
  if (KG == 1) {
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = br * BR + m * 16 + gq + h * 8;
          if (row < M)
            *reinterpret_cast<float2*>(C + (size_t)row * F + f0 + cg * 16 + t * 8 + t4 * 2) =
                make_float2(acc[m][t][h * 2], acc[m][t][h * 2 + 1]);
        }
    return;
  }
  float* red = reinterpret_cast<float*>(smem);
  __syncthreads();
  store_partial<2>(red + kg * BR * RP, acc, RP, cg * 16, lane);
  __syncthreads();
  for (int e = tid * 4; e < BR * FW; e += THREADS * 4) {
    const int row = br * BR + e / FW;
    if (row < M) *reinterpret_cast<float4*>(C + (size_t)row * F + f0 + e % FW) = sum_partial<FW, RP, KG>(red, KG, e);
  }
}

SPLIT_KERNEL(bsr_cols, cols_part)

// bsr_ksplit: a row of more than T stored blocks is cut into chunks of T blocks, CTA (row, s)
// taking chunk s (CTAs past the row's chunks exit); a row of at most T blocks is one CTA's,
// stored directly. A chunk's partial tile goes to ws[row * S + s] (fp32, through L2); the
// CTA that counts last on the row's counter adds all chunks and stores C, then re-arms the
// counter (0) for the next call. No CTA waits on another: no deadlock whatever the launch order.
extern "C" __global__ void __launch_bounds__(THREADS) bsr_ksplit(
    const int* __restrict__ indptr, const int* __restrict__ indices, const half* __restrict__ values,
    const half* __restrict__ B, float* __restrict__ C, int M, int K, int T, int S,
    float* __restrict__ ws, int* __restrict__ counters) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ int last;
  const int br = blockIdx.x, s = blockIdx.y;
  const int q0 = indptr[br];
  const int cnt = indptr[br + 1] - q0;
  const int chunks = max(1, (cnt + T - 1) / T);
  if (s >= chunks) return;
  if (chunks == 1) {
    row_part<F>(values, indices, B, C, M, K, br, q0, cnt, 0, smem);
    return;
  }
  float* mine = ws + (size_t)(br * S + s) * BR * F;
  row_part<F>(values, indices, B, C, M, K, br, q0 + s * T, min(T, cnt - s * T), 0, smem, mine);
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(counters + br, 1) == chunks - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  const float* base = ws + (size_t)br * S * BR * F;
  for (int e = threadIdx.x * 4; e < BR * F; e += THREADS * 4) {
    float4 a = __ldcg(reinterpret_cast<const float4*>(base + e));
    for (int q = 1; q < chunks; ++q) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(base + (size_t)q * BR * F + e));
      a.x += v.x; a.y += v.y; a.z += v.z; a.w += v.w;
    }
    const int row = br * BR + e / F;
    if (row < M) *reinterpret_cast<float4*>(C + (size_t)row * F + e % F) = a;
  }
  if (threadIdx.x == 0) counters[br] = 0;
}
"""


def gather_smem_bytes(br, bc, f, w, g):
    ring = w * g * (br * (bc + 8) + bc * (f + 8)) * 2
    return max(ring, w * br * (f + 8) * 4)  # the slots, then the warps' partial tiles over them (padded)


LEAN = False  # time bsr_lean too (--lean)
KSPLIT = False  # time bsr_ksplit too (--ksplit)
COLS = False  # time bsr_cols too (--cols)
RPAD_, LIVE_ = 0, 0  # --rpad, --live: row_part's partial tiles padded, and summed over the warps that took blocks
ONLY_KSPLIT = False


def smem_bytes(br, bc, f, w, g, kp):
    ring = kp * (f + 8) * 2 + w * g * 16 * (bc + 8) * 2
    red = (w // (br // 16)) * br * f * 4 if w // (br // 16) > 1 else 0
    return max(ring, red)


def cases():
    """[(name, float16 dense, block)]: MiniLM's 384-column layers pruned by block magnitude,
    and random weights of their shapes and of 1024 x 1536."""
    from sparsec.bench.suites import blocks

    out = []
    for name, w, b, s in blocks(minilm_layers={"minilm-L0-ffn-in": "encoder.layer.0.intermediate.dense.weight",
                                               "minilm-L0-attn-q": "encoder.layer.0.attention.self.query.weight"},
                                random_shapes=((384, 384),), sparsities=(0.7, 0.9)):
        out.append((name, w.astype(np.float16), b))
    return out


def check_then_time(call, outs, refs, tol: float, timer):
    """Every ``call(i)`` on its NaN-poisoned output ``outs[i]``, the worst relative error against
    the float64 ``refs``; then, where all are right, the calls timed: (ok, error, timing or None)."""
    import torch

    for i in range(len(outs)):
        call(i)
    torch.cuda.synchronize()
    err = max(float((o.double() - r).norm() / r.norm()) for o, r in zip(outs, refs))
    ok = bool(err < tol) and not any(bool(torch.isnan(o).any()) for o in outs)
    return ok, err, (timer.measure([lambda i=i: call(i) for i in range(len(outs))]) if ok else None)


def write_summary(rows_out, path: str) -> int:
    """Write the rows (and the count of wrong variants) to ``path``, print the geomean, min and
    cases below dense of the best ratios; 1 when a variant was wrong (the exit code)."""
    import torch

    wrong = write_probe_rows(path, rows_out)
    sp_ = [r["speedup"] for r in rows_out if r["speedup"]]
    if sp_:
        print(f"\n{torch.cuda.get_device_name()}: {len(rows_out)} cases, {wrong} wrong variants; geomean "
              f"x{math.exp(np.mean(np.log(sp_))):.3f} min x{min(sp_):.3f}; below 1.0x: {sum(s < 1 for s in sp_)}")
    return 1 if wrong else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "probe_bsr_lean.json"))
    ap.add_argument("--lean", action="store_true", help="also B resident (bsr_lean; r1 and r2 timed it)")
    ap.add_argument("--feats", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--rpad", type=int, default=0, help="floats of padding a row of the warps' partial tiles")
    ap.add_argument("--cols", action="store_true", help="also warps owning columns (bsr_cols)")
    ap.add_argument("--live", action="store_true", help="sum only the partial tiles of warps that took blocks")
    ap.add_argument("--cases", nargs="+", help="only the cases whose name contains one of these")
    ap.add_argument("--ksplit", action="store_true", help="also long rows split over K (bsr_ksplit)")
    ap.add_argument("--only-ksplit", action="store_true", help="bsr_gather and bsr_ksplit only (no bsr_split)")
    args = ap.parse_args(argv)
    global LEAN, KSPLIT, ONLY_KSPLIT, RPAD_, LIVE_, COLS
    COLS = args.cols
    RPAD_, LIVE_ = args.rpad, int(args.live)
    ONLY_KSPLIT = args.only_ksplit
    LEAN = args.lean
    KSPLIT = args.ksplit or args.only_ksplit
    import cupy as cp
    import scipy.sparse as sp
    import torch

    from sparsec.measure import Timer

    def torch_stream():  # torch's current stream: the capture's while the timer captures a graph
        return cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)

    timer = Timer("cuda", warmup_ms=10.0, budget_ms=60.0, max_reps=150)
    dev = torch.device("cuda")
    kernels = {}

    def kernel(name, **p):
        key = (name,) + tuple(sorted(p.items()))
        if key not in kernels:
            opts = ("-std=c++17", "-arch=sm_90a", f"-DRPAD={RPAD_}", f"-DLIVE={LIVE_}") + tuple(
                f"-D{k.upper()}={v}" for k, v in p.items())
            kernels[key] = cp.RawModule(code=SOURCE, options=opts).get_function(name)
        return kernels[key]

    def variants(block, feat, kp):
        """[(kernel name, its -D parameters, shared bytes)]: B resident (``bsr_lean``), and B's
        rows gathered (``bsr_gather``, a warp holding all of a block's row tiles: up to 16
        accumulator tiles)."""
        out, mt = [], block // 16
        for w in (min(8 * mt, 16),) if LEAN else ():  # r1's winner on 33 of 36 cases (probe_bsr_lean_r1)
            for g in (1, 2, 4):
                out.append(("bsr_lean", dict(br=block, bc=block, f=feat, w=w, g=g, kp=kp),
                            smem_bytes(block, block, feat, w, g, kp)))
        if mt * feat // 8 <= 16:
            for w in (4, 8):
                for g in (2, 4):
                    out.append(("bsr_gather", dict(br=block, bc=block, f=feat, w=w, g=g, kp=block),
                                gather_smem_bytes(block, block, feat, w, g)))
        if mt * feat // 8 <= 16 and feat >= 32 and not ONLY_KSPLIT:
            for w in (4, 8):
                for g in (2, 4):
                    for split in (2, 4):
                        out.append(("bsr_split", dict(br=block, bc=block, f=feat, w=w, g=g, kp=block, split=split),
                                    gather_smem_bytes(block, block, feat, w, g)))
        if COLS and feat % 16 == 0:
            for w in (4, 8, 16):
                for split in (1, 2, 4):
                    if w % (feat // 16) or w % max(feat // split // 16, 1) or feat // split < 16:
                        continue
                    ch = {16: 32, 32: 16}.get(block, 8)  # blocks copied at once: up to ~150 KB
                    out.append(("bsr_cols", dict(br=block, bc=block, f=feat, w=w, kp=block, split=split, ch=ch),
                                max(ch * (block * (block + 8) + block * (feat + 8)) * 2,
                                    (w // max(feat // split // 16, 1)) * block * (feat + 8) * 4)))
        if mt * feat // 8 <= 16 and KSPLIT:
            for w in (4, 8):
                for g in (1, 2):
                    out.append(("bsr_ksplit", dict(br=block, bc=block, f=feat, w=w, g=g, kp=block),
                                gather_smem_bytes(block, block, feat, w, g)))
        return [v for v in out if v[2] <= 227 * 1024]

    rows_out = []
    for name, dense16, block in cases():
        if args.cases and not any(c in name for c in args.cases):
            continue
        M, K = dense16.shape
        bsr = sp.bsr_matrix(dense16.astype(np.float32), blocksize=(block, block))
        bsr.sort_indices()
        indptr = cp.asarray(bsr.indptr.astype(np.int32))
        indices = cp.asarray(bsr.indices.astype(np.int32))
        vals = cp.asarray(bsr.data.astype(np.float16).reshape(-1))
        kp = -(-K // block) * block
        w_dense = torch.from_numpy(dense16).to(dev)
        for feat in args.feats:
            bs = [torch.randn(K, feat, device=dev, dtype=torch.float16) for _ in range(8)]
            ref = [(torch.from_numpy(dense16.astype(np.float64)).to(dev) @ b.double()) for b in bs]
            dense_t = timer.measure([lambda b=b: torch.matmul(w_dense, b) for b in bs]).median_ms
            row = {"case": name, "shape": [M, K], "block": block, "feat": feat, "dense_us": dense_t * 1e3,
                   "nnzb": int(bsr.indices.size), "longest_row": int(np.diff(bsr.indptr).max()), "variants": []}
            lengths = np.diff(bsr.indptr)
            heavies = sorted({int(np.percentile(lengths, q)) for q in (75, 90)} - {0}) or [1]
            for kname, p, sm in variants(block, feat, kp):
                kern = kernel(kname, **p)
                kern.max_dynamic_shared_size_bytes = sm
                nbr = bsr.indptr.size - 1
                mean = max(1, -(-int(lengths.sum()) // nbr))
                chunk_sizes = sorted({mean, 2 * mean, max(1, int(lengths.max()) // 4), max(1, int(lengths.max()) // 2)})
                hv = heavies if kname == "bsr_split" or (kname == "bsr_cols" and p["split"] > 1) else (
                    heavies[:1] if kname == "bsr_cols" else [None])  # bsr_cols takes heavy even unsplit
                for heavy in hv:
                  for T in (chunk_sizes if kname == "bsr_ksplit" else [None]):
                    if T:
                        S = -(-int(lengths.max()) // T)
                        grid = (nbr, S)
                        ws = cp.zeros(nbr * S * block * feat, dtype=cp.float32)
                        counters = cp.zeros(nbr, dtype=cp.int32)
                        extra = (np.int32(T), np.int32(S), ws, counters)
                    else:
                        grid = (nbr, p["split"]) if heavy else (nbr,)
                        extra = (np.int32(heavy),) if heavy else ()
                    outs = [torch.full((M, feat), float("nan"), device=dev, dtype=torch.float32) for _ in bs]

                    def call(i, kern=kern, grid=grid, threads=(p["w"] * 32,), sm=sm, outs=outs, extra=extra):
                        with torch_stream():
                            kern(grid, threads, (indptr, indices, vals, cp.asarray(bs[i]), cp.asarray(outs[i]),
                                                 np.int32(M), np.int32(K)) + extra, shared_mem=sm)
                    ok, err, tm = check_then_time(call, outs, ref, 1e-3, timer)
                    row["variants"].append({"kernel": kname, **{k: v for k, v in p.items() if k in ("w", "g", "split")},
                                            "heavy": heavy, "chunk": T, "smem": sm, "ok": ok, "err": err,
                                            "us": tm.median_ms * 1e3 if tm else None,
                                            "method": tm.method if tm else None})
            good = [x for x in row["variants"] if x["ok"]]
            best = min(good, key=lambda x: x["us"]) if good else None
            row["best"] = best
            row["speedup"] = row["dense_us"] / best["us"] if best else None
            for kname in ("bsr_lean", "bsr_gather", "bsr_split", "bsr_ksplit", "bsr_cols"):
                mine = [x for x in good if x["kernel"] == kname]
                if mine:
                    row[f"{kname}_speedup"] = row["dense_us"] / min(x["us"] for x in mine)
            rows_out.append(row)
            print(f"{name:<28} F={feat:2d} dense {row['dense_us']:5.2f} us best "
                  f"{best['us'] if best else float('nan'):5.2f} us x{row['speedup'] or 0:.2f} "
                  f"{ {k: best.get(k) for k in ('kernel', 'w', 'g', 'split', 'heavy', 'chunk')} if best else 'NONE OK'} lean "
                  f"x{row.get('bsr_lean_speedup', 0):.2f} gather x{row.get('bsr_gather_speedup', 0):.2f} "
                  f"split x{row.get('bsr_split_speedup', 0):.2f} ksplit x{row.get('bsr_ksplit_speedup', 0):.2f} "
                  f"cols x{row.get('bsr_cols_speedup', 0):.2f} "
                  f"wrong {sum(not x['ok'] for x in row['variants'])}", flush=True)
    return write_summary(rows_out, args.out)


if __name__ == "__main__":
    sys.exit(main())
