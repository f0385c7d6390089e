#!/usr/bin/env python3
"""Design probe of a BSR fp16 SpMM that shares B's rows across a 128-row panel of A.

Target: large pruned weights at 16-64 columns of B, where dense cuBLAS fp16 wins (4096 x 4096,
70 % block sparsity, 64 columns: ~10.5 us against 12-14.6 us for sparsec's per-block kernels,
which re-read a block's 16-64 rows of B from L2 for every stored block, ~40 MB of B traffic).

``bsr_panel``: a CTA owns a panel of 128 rows of A (one warp a 16-row tile, 8 warps) and walks
its K-range in chunks of KCH rows of B through a STAGES-deep ``cp.async`` ring. A stage holds
the chunk of B (copied once, shared by all 128 rows) and, for every warp, its 16-row slices of
its block row's stored blocks whose column falls in the chunk (slot j = block column j of the
chunk, a bit mask saying which slots are filled; a warp's cursor walks its row's sorted
``indices``). The warps multiply from shared memory (``ldmatrix`` + ``mma.m16n8k16``, f32
accumulators). K is split over the CS CTAs of a thread-block cluster, so 4096-row weights
(32 panels) still fill the SMs: each CTA leaves its partial 128 x N tile in shared memory and
CTA q sums rows [q 128 / CS, (q + 1) 128 / CS) of all CS tiles through distributed shared
memory and writes them to C: no atomics, no zeroed workspace, C written once.

Measured (H200, ``results/probe_bsr_panel_H200.json``, every variant correct): it does not
pay. At 64 columns its best variant per case reached 0.54-0.80x dense on the nine random
weights, below probe_bsr_lean's per-block ``bsr_gather`` in the same run (0.64-1.00x where
it applies); at 16 columns 0.78-1.20x. A CTA sits on one chunk at a time (a barrier a
chunk, most A slots of a stage empty at 70 %), so it keeps too few bytes in flight: on the
4096 x 4096 weight with 16 x 16 blocks, 64-row chunks and clusters of 4 or 8, 4 stages took
27 us where 3 (two CTAs to an SM) took 18-21, and one CTA a panel (32 CTAs) 44 us. Fewer
bytes moved did not make up for that; a deeper ring of compacted stages is what the design
would need.

    python3 benchmarks/probe_bsr_panel.py [--feats 16 32 64] [--shapes 4096x4096 edge] \
        [--cs 1 2 4 8] [--quick] [--out FILE]

CUDA C++ compiled by CuPy (no TVM needed), on random weights (normal * 0.02) of 4096 x 4096,
1024 x 4096 and 4096 x 1024, pruned to 70 % block sparsity by ``sparsec.bench.suites.
prune_blocks`` (blocks 16, 32, 64), plus a 256 x 512 edge case (an empty block row and a
dense one; checked, not timed). Every variant is checked against float64 on a NaN-poisoned
output, then timed with sparsec's timer beside ``torch.matmul`` (fp16 dense) and probe_bsr_lean's
``bsr_gather`` (per-block design), B rotated over copies as probe_bsr_lean does.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

import _preamble  # noqa: F401,E402

from _helpers import write_probe_rows  # noqa: E402

from probe_bsr_bulk import MMA_HELPERS  # noqa: E402

PANEL = 128  # rows of A a CTA
THREADS = 256  # one warp a 16-row tile of the panel
SHAPES = {"4096x4096": (4096, 4096), "1024x4096": (1024, 4096), "4096x1024": (4096, 1024)}
MAX_SMEM = 227 * 1024

SOURCE = r"""
#include <cuda_fp16.h>
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
// BR x BC blocks, F columns of B, CS CTAs of a cluster splitting K, a STAGES-deep ring of
// KCH-row chunks of B (and the panel's blocks in them)
constexpr int PR = 128;               // rows of A a CTA (its panel)
constexpr int WARPS = PR / 16;        // one warp a 16-row tile
constexpr int THREADS = WARPS * 32;
constexpr int MT = BR / 16;           // row tiles a block row
constexpr int NB = KCH / BC;          // block columns a chunk: a warp's slots a stage
constexpr int KS = BC / 16;           // k-steps a block
constexpr int NT = F / 8;             // 8-column MMA tiles
constexpr int BP = F + 8;             // halves a row of B in a stage (ldmatrix rows in distinct banks)
constexpr int AP = BC + 8;            // halves a row of a block slice
constexpr int SLOT = 16 * AP;         // halves of a warp's 16-row slice of one block
constexpr int B_HALVES = KCH * BP;
constexpr int STAGE_HALVES = B_HALVES + WARPS * NB * SLOT;
constexpr unsigned FULL = 0xffffffffu;
static_assert(PR % BR == 0 && BR % 16 == 0 && BC % 16 == 0 && KCH % BC == 0 && NB <= 32, "block shape");
static_assert(F % 16 == 0 && PR % CS == 0 && STAGES >= 2, "F, CS or STAGES");

""" + MMA_HELPERS + r"""

extern "C" __global__ void
#if CS > 1
__cluster_dims__(CS, 1, 1)
#endif
__launch_bounds__(THREADS, 1)
bsr_panel(const int* __restrict__ indptr, const int* __restrict__ indices, const half* __restrict__ values,
          const half* __restrict__ B, float* __restrict__ C, int K) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ unsigned masks[STAGES][WARPS];  // a warp's filled slots in a stage (bit j: block column j of the chunk)
  half* ring = reinterpret_cast<half*>(smem);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, mi = warp % MT;
#if CS > 1
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
#else
  const int rank = 0;
#endif
  const int panel = blockIdx.x / CS;
  const int nch = K / KCH, ch0 = nch * rank / CS, n = nch * (rank + 1) / CS - ch0;  // this rank's chunks
  const int kq0 = ch0 * KCH;
  // the warp's block row; its cursor: the first stored block at or past column kq0
  const int br = panel * (PR / BR) + warp / MT;
  const int hi = indptr[br + 1];
  int ptr = indptr[br];
  for (int base = ptr; base < hi; base += 32) {
    const unsigned before = __ballot_sync(FULL, base + lane < hi && indices[base + lane] * BC < kq0);
    ptr += __popc(before);
    if (before != FULL) break;  // sorted: the first block not before kq0 ends the walk
  }
  int wbase = ptr - 32, win = 0;  // window: lane l holds indices[wbase + l] (past hi: a huge column)

  // chunk c (of this rank) into stage c % STAGES: its rows of B (all threads), then the warp's
  // blocks with a column in the chunk, each into the slot of its column
  auto issue = [&](int c) {
    const int st = c % STAGES;
    half* bs = ring + st * STAGE_HALVES;
    const int k0 = kq0 + c * KCH;
    for (int e = tid; e < KCH * (F / 8); e += THREADS) {
      const int row = e / (F / 8), c8 = e % (F / 8);
      cp_async16(smem_addr(bs + row * BP + c8 * 8), B + (size_t)(k0 + row) * F + c8 * 8, 16);
    }
    if (ptr + NB > wbase + 32) {
      wbase = ptr;
      win = ptr + lane < hi ? indices[ptr + lane] : 0x7fffffff;
    }
    const int c0 = k0 / BC;
    const int col = __shfl_sync(FULL, win, (ptr - wbase + lane) & 31);  // lane l < NB: block ptr + l
    const bool in = lane < NB && col < c0 + NB;                          // a prefix of the lanes
    const int cnt = __popc(__ballot_sync(FULL, in));
    const unsigned mask = __reduce_or_sync(FULL, in ? 1u << (col - c0) : 0u);
    half* slots = bs + B_HALVES + warp * NB * SLOT;
    for (int i = 0; i < cnt; ++i) {
      const int j = __shfl_sync(FULL, col, i) - c0;
      const half* src = values + (size_t)(ptr + i) * (BR * BC) + mi * 16 * BC;
#pragma unroll
      for (int e = lane; e < 16 * BC / 8; e += 32)
        cp_async16(smem_addr(slots + j * SLOT + (e / (BC / 8)) * AP + (e % (BC / 8)) * 8), src + e * 8, 16);
    }
    ptr += cnt;
    if (lane == 0) masks[st][warp] = mask;
  };

  float acc[NT][4];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
#pragma unroll
  for (int c = 0; c < STAGES - 1; ++c) {
    if (c < n) issue(c);
    asm volatile("cp.async.commit_group;" ::: "memory");
  }
  for (int c = 0; c < n; ++c) {
    asm volatile("cp.async.wait_group %0;" :: "n"(STAGES - 2) : "memory");
    __syncthreads();  // chunk c is in; stage (c - 1) % STAGES is free again
    if (c + STAGES - 1 < n) issue(c + STAGES - 1);
    asm volatile("cp.async.commit_group;" ::: "memory");
    const int st = c % STAGES;
    const unsigned mask = masks[st][warp];
    const unsigned sb = smem_addr(ring + st * STAGE_HALVES);
    const unsigned sa = sb + (B_HALVES + warp * NB * SLOT) * 2;
#pragma unroll
    for (int j = 0; j < NB; ++j) {
      if (!((mask >> j) & 1u)) continue;
#pragma unroll
      for (int kk = 0; kk < KS; ++kk) {
        unsigned a[4];
        ldm_x4(a, sa + (j * SLOT + (lane % 16) * AP + kk * 16 + lane / 16 * 8) * 2);
#pragma unroll
        for (int t = 0; t < NT; t += 2) {
          unsigned b[4];
          ldm_x4_t(b, sb + ((j * BC + kk * 16 + lane % 16) * BP + t * 8 + lane / 16 * 8) * 2);
          mma16816(acc[t], a, b[0], b[1]);
          mma16816(acc[t + 1], a, b[2], b[3]);
        }
      }
    }
  }
  const int gq = lane / 4, t4 = lane % 4;
#if CS == 1
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      *reinterpret_cast<float2*>(C + (size_t)(panel * PR + warp * 16 + gq + h * 8) * F + t * 8 + t4 * 2) =
          make_float2(acc[t][h * 2], acc[t][h * 2 + 1]);
#else
  constexpr int RP = F + 8;    // floats a row of a partial tile (pitch: float2 stores conflict-free)
  constexpr int RQ = PR / CS;  // rows of C a cluster rank sums and writes
  asm volatile("cp.async.wait_all;" ::: "memory");
  __syncthreads();  // every warp is done with the ring: the partial tile goes over it
  float* red = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      *reinterpret_cast<float2*>(red + (warp * 16 + gq + h * 8) * RP + t * 8 + t4 * 2) =
          make_float2(acc[t][h * 2], acc[t][h * 2 + 1]);
  cluster.sync();  // all CS partial tiles written
  const float* parts[CS];
#pragma unroll
  for (int q = 0; q < CS; ++q) parts[q] = cluster.map_shared_rank(red, q);
  for (int e = tid; e < RQ * (F / 4); e += THREADS) {
    const int row = rank * RQ + e / (F / 4), c4 = e % (F / 4) * 4;
    float4 s = *reinterpret_cast<const float4*>(parts[0] + row * RP + c4);
#pragma unroll
    for (int q = 1; q < CS; ++q) {
      const float4 v = *reinterpret_cast<const float4*>(parts[q] + row * RP + c4);
      s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
    }
    *reinterpret_cast<float4*>(C + (size_t)(panel * PR + row) * F + c4) = s;
  }
  cluster.sync();  // no CTA leaves while another still reads its tile
#endif
}
"""


def smem_bytes(block, feat, cs, stages, kch):
    """Dynamic shared bytes of ``bsr_panel``: the ring (a stage: KCH rows of B at pitch F + 8,
    and 8 warps x KCH / BC slots of 16 x (BC + 8) halves), or the partial tile laid over it."""
    stage = kch * (feat + 8) + (THREADS // 32) * (kch // block) * 16 * (block + 8)
    return max(stages * stage * 2, PANEL * (feat + 8) * 4 if cs > 1 else 0)


def defines(block, feat, cs, stages, kch):
    """The ``-D`` options that specialise SOURCE (square blocks)."""
    p = dict(br=block, bc=block, f=feat, cs=cs, stages=stages, kch=kch)
    return tuple(f"-D{k.upper()}={v}" for k, v in p.items())


def variants(block, feat, K, cs_choices, quick):
    """[dict(cs, stages, kch, smem)]: the knobs that apply (KCH a multiple of the block and
    dividing K, the ring within 227 KB); ``quick``: CS 4, 3 stages, KCH 64 only."""
    out = []
    for cs in (4,) if quick else cs_choices:
        for stages in (3,) if quick else (3, 4):
            for kch in (64,) if quick else (64, 128):
                sm = smem_bytes(block, feat, cs, stages, kch)
                if kch % block == 0 and K % kch == 0 and sm + 64 * stages <= MAX_SMEM:
                    out.append(dict(cs=cs, stages=stages, kch=kch, smem=sm))
    return out


def to_bsr(dense, block):
    """(indptr, indices, values) of ``dense`` in BSR: a block is stored iff it has a non-zero,
    columns ascending in a row, each block row-major after the one before."""
    M, K = dense.shape
    blocks = dense.reshape(M // block, block, K // block, block).transpose(0, 2, 1, 3)
    keep = blocks.any(axis=(2, 3))
    rows, cols = np.nonzero(keep)  # row-major: columns sorted within a row
    indptr = np.concatenate([[0], np.cumsum(keep.sum(axis=1))]).astype(np.int32)
    values = np.ascontiguousarray(blocks[rows, cols]).astype(np.float16).reshape(-1)
    return indptr, cols.astype(np.int32), values


def cases(shapes, seed):
    """[(name, float16 dense, block, timed)]: the random weights of ``shapes`` pruned to 70 %
    block sparsity, and (if ``"edge"`` is in ``shapes``) the 256 x 512 edge case."""
    from sparsec.bench.suites import prune_blocks

    rng = np.random.default_rng(seed)
    out = []
    for shape in shapes:
        if shape == "edge":
            continue
        w = rng.standard_normal(SHAPES[shape]).astype(np.float32) * 0.02
        for block in (16, 32, 64):
            out.append((f"random-{shape}-b{block}-s70", prune_blocks(w, block, 0.7).astype(np.float16), block, True))
    if "edge" in shapes:  # block row 3 empty, block row 10 dense
        w = prune_blocks(rng.standard_normal((256, 512)).astype(np.float32) * 0.02, 16, 0.7)
        w[48:64] = 0
        w[160:176] = rng.standard_normal((16, 512)).astype(np.float32) * 0.02
        out.append(("edge-256x512-b16", w.astype(np.float16), 16, False))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "probe_bsr_panel.json"))
    ap.add_argument("--feats", type=int, nargs="+", default=[64], choices=(16, 32, 64), help="columns of B")
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES) + ["edge"], choices=list(SHAPES) + ["edge"])
    ap.add_argument("--cs", type=int, nargs="+", default=[1, 2, 4], choices=(1, 2, 4, 8),
                    help="cluster sizes (CTAs splitting K) to try")
    ap.add_argument("--quick", action="store_true", help="only CS 4, 3 stages, KCH 64")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    import cupy as cp
    import torch

    from probe_bsr_lean import SOURCE as LEAN_SOURCE
    from probe_bsr_lean import gather_smem_bytes
    from sparsec.measure import Timer

    def torch_stream():  # torch's current stream: the capture's while the timer captures a graph
        return cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)

    timer = Timer("cuda", warmup_ms=10.0, budget_ms=60.0, max_reps=150)
    dev = torch.device("cuda")
    kernels = {}

    def kernel(name, source, opts):
        key = (name, opts)
        if key not in kernels:
            kernels[key] = cp.RawModule(code=source, options=("-std=c++17", "-arch=sm_90a") + opts).get_function(name)
        return kernels[key]

    def contestants(block, feat, M, K, nbr):
        """[(record, kernel, grid, threads, smem, scalar args)]: bsr_panel's variants, then
        probe_bsr_lean's bsr_gather (8 warps, 2 or 4 blocks a warp) where it applies."""
        out = []
        for v in variants(block, feat, K, args.cs, args.quick):
            kern = kernel("bsr_panel", SOURCE, defines(block, feat, v["cs"], v["stages"], v["kch"]))
            out.append(({"kernel": "bsr_panel", **v}, kern, (M // PANEL * v["cs"],), (THREADS,), v["smem"],
                        (np.int32(K),)))
        if (block // 16) * feat // 8 <= 16 and not args.quick:
            for g in (2, 4):
                p = dict(br=block, bc=block, f=feat, w=8, g=g, kp=block)
                sm = gather_smem_bytes(block, block, feat, 8, g)
                if sm <= MAX_SMEM:
                    kern = kernel("bsr_gather", LEAN_SOURCE, tuple(f"-D{k.upper()}={x}" for k, x in p.items()))
                    out.append(({"kernel": "bsr_gather", "w": 8, "g": g, "smem": sm}, kern, (nbr,), (256,), sm,
                                (np.int32(M), np.int32(K))))
        return out

    rows_out = []
    for name, dense16, block, timed in cases(args.shapes, args.seed):
        M, K = dense16.shape
        if M % PANEL or K % 64:
            raise ValueError(f"{name}: M should be a multiple of {PANEL} and K of 64, got {M} x {K}")
        h_indptr, h_indices, h_values = to_bsr(dense16, block)
        indptr, indices, vals = cp.asarray(h_indptr), cp.asarray(h_indices), cp.asarray(h_values)
        w_dense = torch.from_numpy(dense16).to(dev)
        w64 = w_dense.double()
        for feat in args.feats if timed else (16, 64):
            bs = [torch.randn(K, feat, device=dev, dtype=torch.float16) for _ in range(8 if timed else 2)]
            bs_cp = [cp.asarray(b) for b in bs]
            refs = [w64 @ b.double() for b in bs]
            dense_ms = timer.measure([lambda b=b: torch.matmul(w_dense, b) for b in bs]).median_ms if timed else None
            row = {"case": name, "shape": [M, K], "block": block, "feat": feat, "nnzb": int(h_indices.size),
                   "empty_block_rows": int((np.diff(h_indptr) == 0).sum()), "dense_ms": dense_ms, "variants": []}
            for rec, kern, grid, threads, sm, tail in contestants(block, feat, M, K, h_indptr.size - 1):
                kern.max_dynamic_shared_size_bytes = sm
                outs = [torch.full((M, feat), float("nan"), device=dev, dtype=torch.float32) for _ in bs]
                outs_cp = [cp.asarray(o) for o in outs]

                def call(i, kern=kern, grid=grid, threads=threads, sm=sm, tail=tail, outs_cp=outs_cp):
                    with torch_stream():
                        kern(grid, threads, (indptr, indices, vals, bs_cp[i], outs_cp[i]) + tail, shared_mem=sm)
                for i in range(len(bs)):
                    call(i)
                torch.cuda.synchronize()
                err = max(float((o.double() - r).abs().max() / r.abs().max()) for o, r in zip(outs, refs))
                ok = bool(err < 2e-3) and all(bool(torch.isfinite(o).all()) for o in outs)
                tm = timer.measure([lambda i=i: call(i) for i in range(len(bs))]) if ok and timed else None
                ms = tm.median_ms if tm else None
                row["variants"].append({**rec, "ok": ok, "err": err, "ms": ms, "method": tm.method if tm else None,
                                        "ratio": dense_ms / ms if ms else None})
            for kname in ("bsr_panel", "bsr_gather"):
                good = [x for x in row["variants"] if x["kernel"] == kname and x["ms"]]
                row[f"best_{kname}"] = min(good, key=lambda x: x["ms"]) if good else None
            rows_out.append(row)
            best, gather = row["best_bsr_panel"], row["best_bsr_gather"]
            wrong = sum(not x["ok"] for x in row["variants"])
            print(f"{name:<26} N={feat:2d} dense {dense_ms * 1e3 if timed else float('nan'):6.2f} us  panel "
                  f"{best['ms'] * 1e3 if best else float('nan'):6.2f} us x{best['ratio'] if best else 0:.2f}  gather "
                  f"x{gather['ratio'] if gather else 0:.2f}  wrong {wrong}/{len(row['variants'])}", flush=True)
    wrong = write_probe_rows(args.out, rows_out)
    print(f"\n{torch.cuda.get_device_name()}: {wrong} wrong variants; best bsr_panel per case (ratio = dense / ours)")
    print(f"{'case':<26} {'N':>3} {'cs':>3} {'st':>3} {'kch':>4} {'panel us':>9} {'dense us':>9} {'ratio':>6} "
          f"{'gather':>7}")
    for r in rows_out:
        b, g = r["best_bsr_panel"], r["best_bsr_gather"]
        if not b:
            print(f"{r['case']:<26} {r['feat']:>3}  {'checked only' if r['dense_ms'] is None else 'NONE OK'}")
            continue
        print(f"{r['case']:<26} {r['feat']:>3} {b['cs']:>3} {b['stages']:>3} {b['kch']:>4} {b['ms'] * 1e3:9.2f} "
              f"{r['dense_ms'] * 1e3:9.2f} {b['ratio']:6.2f} {'x%.2f' % g['ratio'] if g else '-':>7}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
