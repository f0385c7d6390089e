#!/usr/bin/env python3
"""Probe (issue 26's CSR line): does a CSR SpMM that splits the stored entries evenly over
warps, not rows over thread groups, keep a power-law graph's long rows from setting the
time? Today's CSR schedule gives each row one thread group, so a hub row of 10^4 entries is
walked by one group while the rest of the GPU idles (10-20x slower than hyb there).

``csr_split``: warp w owns the entries [w E, (w + 1) E) of the matrix (``E`` a knob), finds
the row holding its first entry by a 32-ary search of ``indptr`` (each lane tests one
candidate a step: ~4 dependent loads for 10^6 rows), then walks its entries in batches of
32 (columns and values loaded by all lanes at once and shuffled; the rows' ends likewise,
32 at a time), each lane accumulating ``F / 32`` features of the current row in registers,
its loads of B issued ``U`` entries ahead. Where a row ends inside the warp's range the warp
stores it (the row's *end owner*: a plain store, whatever earlier warps hold of it); a row
that goes on past the range leaves its partial sum in ``carry[w]``. A second launch adds
every carry into C (``atomicAdd``: a row may span many warps) and zeroes the empty rows, which
no warp owns. No C zeroed first, no atomics on the main path, every row written once before
the carries land.

CUDA C++ compiled by CuPy; each variant is checked against float64 on a NaN-poisoned output
(cases include empty rows, a hub row of a third of the entries, rows longer than many
ranges), then timed with sparsec's CUDA-graph timer beside cuSPARSE (``torch.sparse.mm`` on
the CSR tensor) and, with ``--sparsec`` (the TVM bundle installed), sparsec's CSR and hyb
defaults.

    python3 benchmarks/probe_csr_split.py [--graphs NAME ..] [--feats 32 128] [--sparsec] [--compiled] [--group]
                                          [--knob-sets JSON] [--out FILE]

``--group`` adds ``csr_group``: the same walk with a warp's lanes in groups of F / 4 (a
float4 of B's row each), 32 / (F / 4) entries a step side by side, a row ending inside a
step summed over the groups by xor-shuffles (fewer instructions an entry at F = 32).

``--compiled`` (the TVM bundle) also checks sparsec's compiled kernel of the same design
(``schedules/csr_split.py``, reached by ``knobs={"entries_per_warp": E}``) on every case and
times it beside the CUDA original with the original's best knobs.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np
import scipy.sparse as sp

import _preamble  # noqa: F401,E402

from _helpers import write_probe_rows  # noqa: E402

SOURCE = r"""
// NFEAT features (32, 64 or 128: VEC = NFEAT / 32 floats a lane), EPW entries a warp, UNR loads of B in flight
constexpr int VEC = NFEAT / 32;
constexpr unsigned FULL = 0xffffffffu;

template <int N> struct Vec;
template <> struct Vec<1> { float v[1]; };
template <> struct Vec<2> { float v[2]; };
template <> struct Vec<4> { float v[4]; };

__device__ __forceinline__ Vec<VEC> load_row(const float* __restrict__ p) {
  Vec<VEC> r;
  if constexpr (VEC == 4) {
    const float4 t = __ldg(reinterpret_cast<const float4*>(p));
    r.v[0] = t.x; r.v[1] = t.y; r.v[2] = t.z; r.v[3] = t.w;
  } else if constexpr (VEC == 2) {
    const float2 t = __ldg(reinterpret_cast<const float2*>(p));
    r.v[0] = t.x; r.v[1] = t.y;
  } else {
    r.v[0] = __ldg(p);
  }
  return r;
}

__device__ __forceinline__ void store_row(float* p, const float (&a)[VEC]) {
  if constexpr (VEC == 4) *reinterpret_cast<float4*>(p) = make_float4(a[0], a[1], a[2], a[3]);
  else if constexpr (VEC == 2) *reinterpret_cast<float2*>(p) = make_float2(a[0], a[1]);
  else *p = a[0];
}

// the row holding entry p (largest r with indptr[r] <= p; p < indptr[M]), by a 32-ary search
__device__ __forceinline__ int row_of(const int* __restrict__ indptr, int M, int p, int lane) {
  int lo = 0, hi = M;  // the row is in [lo, hi)
  while (hi - lo > 32) {
    const int step = (hi - lo + 31) / 32;
    const int idx = lo + lane * step;
    const bool le = idx < hi && __ldg(indptr + idx) <= p;
    const unsigned m = __ballot_sync(FULL, le);
    const int last = 31 - __clz(m);  // lane 0 always tests indptr[lo] <= p
    lo = lo + last * step;
    hi = min(lo + step, hi);
  }
  const int idx = lo + lane;
  const bool le = idx < hi && __ldg(indptr + idx) <= p;
  return lo + 31 - __clz(__ballot_sync(FULL, le));
}

extern "C" __global__ void __launch_bounds__(WPB * 32)
csr_split(const int* __restrict__ indptr, const int* __restrict__ indices, const float* __restrict__ vals,
          const float* __restrict__ B, float* __restrict__ C, float* __restrict__ carry, int* __restrict__ carry_row,
          int M, int nnz, int warps) {
  const int lane = threadIdx.x % 32;
  const int w = blockIdx.x * WPB + threadIdx.x / 32;
  if (w >= warps) return;
  const int p0 = w * EPW, p1 = min(p0 + EPW, nnz);
  if (p0 >= p1) { if (lane == 0) carry_row[w] = -1; return; }
  int r = row_of(indptr, M, p0, lane);
  int rbase = r;                                       // lane l holds the end of row rbase + l
  int ends = (rbase + lane < M) ? __ldg(indptr + rbase + lane + 1) : nnz;
  int row_end = __shfl_sync(FULL, ends, 0);
  float acc[VEC];
#pragma unroll
  for (int v = 0; v < VEC; ++v) acc[v] = 0.f;
  for (int base = p0; base < p1; base += 32) {
    const int n = min(32, p1 - base);
    const int my_col = lane < n ? __ldg(indices + base + lane) : 0;
    const float my_val = lane < n ? __ldg(vals + base + lane) : 0.f;
    for (int j0 = 0; j0 < n; j0 += UNR) {
      Vec<VEC> b[UNR];
      float a[UNR];
#pragma unroll
      for (int u = 0; u < UNR; ++u) {  // UNR gathers of B in flight before the first is used
        const int c = __shfl_sync(FULL, my_col, (j0 + u) & 31);
        a[u] = __shfl_sync(FULL, my_val, (j0 + u) & 31);
        if (j0 + u < n) b[u] = load_row(B + (size_t)c * NFEAT + lane * VEC);
      }
#pragma unroll
      for (int u = 0; u < UNR; ++u) {
        if (j0 + u < n) {
          const int p = base + j0 + u;
          while (p >= row_end) {  // row r ended before entry p: this warp holds its end
            store_row(C + (size_t)r * NFEAT + lane * VEC, acc);
#pragma unroll
            for (int v = 0; v < VEC; ++v) acc[v] = 0.f;
            do {  // on to the row holding p, past empty rows (the fix-up launch zeroes them)
              ++r;
              if (r - rbase >= 32) { rbase = r; ends = (rbase + lane < M) ? __ldg(indptr + rbase + lane + 1) : nnz; }
              row_end = __shfl_sync(FULL, ends, r - rbase);
            } while (row_end <= p);
          }
#pragma unroll
          for (int v = 0; v < VEC; ++v) acc[v] = fmaf(a[u], b[u].v[v], acc[v]);
        }
      }
    }
  }
  if (row_end <= p1) {  // the last row ends here: its end owner stores it
    store_row(C + (size_t)r * NFEAT + lane * VEC, acc);
    if (lane == 0) carry_row[w] = -1;
  } else {  // it goes on past the range: a partial sum for the fix-up
    store_row(carry + (size_t)w * NFEAT + lane * VEC, acc);
    if (lane == 0) carry_row[w] = r;
  }
}

// csr_group (--group): the same walk with lanes grouped, GL lanes an entry (a float4 of B's row each)
// and SPW entries a step side by side, so one load instruction gathers SPW rows of B at F = 32;
// where a row ends inside a step its groups' sums are added by xor-shuffles and group 0 stores it
constexpr int GL = NFEAT / 4 < 32 ? NFEAT / 4 : 32;  // lanes an entry
constexpr int SPW = 32 / GL;                          // entries a step

__device__ __forceinline__ float4 sum_groups(float4 t) {
#pragma unroll
  for (int o = GL; o < 32; o <<= 1) {
    t.x += __shfl_xor_sync(FULL, t.x, o); t.y += __shfl_xor_sync(FULL, t.y, o);
    t.z += __shfl_xor_sync(FULL, t.z, o); t.w += __shfl_xor_sync(FULL, t.w, o);
  }
  return t;
}

extern "C" __global__ void __launch_bounds__(WPB * 32)
csr_group(const int* __restrict__ indptr, const int* __restrict__ indices, const float* __restrict__ vals,
          const float* __restrict__ B, float* __restrict__ C, float* __restrict__ carry, int* __restrict__ carry_row,
          int M, int nnz, int warps) {
  const int lane = threadIdx.x % 32, grp = lane / GL, gl = lane % GL;
  const int w = blockIdx.x * WPB + threadIdx.x / 32;
  if (w >= warps) return;
  const int p0 = w * EPW, p1 = min(p0 + EPW, nnz);
  if (p0 >= p1) { if (lane == 0) carry_row[w] = -1; return; }
  int r = row_of(indptr, M, p0, lane);
  int rbase = r;
  int ends = (rbase + lane < M) ? __ldg(indptr + rbase + lane + 1) : nnz;
  int row_end = __shfl_sync(FULL, ends, 0);
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int base = p0; base < p1; base += 32) {
    const int n = min(32, p1 - base);
    const int my_col = lane < n ? __ldg(indices + base + lane) : 0;
    const float my_val = lane < n ? __ldg(vals + base + lane) : 0.f;
    for (int j0 = 0; j0 < n; j0 += SPW * UNR) {
      float4 b[UNR];
      float a[UNR];
#pragma unroll
      for (int u = 0; u < UNR; ++u) {  // UNR steps of SPW entries in flight
        const int j = j0 + u * SPW + grp;
        const int c = __shfl_sync(FULL, my_col, j & 31);
        const float v = __shfl_sync(FULL, my_val, j & 31);
        a[u] = j < n ? v : 0.f;
        b[u] = j < n ? __ldg(reinterpret_cast<const float4*>(B + (size_t)c * NFEAT) + gl)
                     : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int u = 0; u < UNR; ++u) {
        if (j0 + u * SPW >= n) break;
        const int s0 = base + j0 + u * SPW;            // the step's first entry (the warp's alike)
        const int last = min(s0 + SPW, p1) - 1;        // and its last
        const int p = s0 + grp;                        // this group's entry
        bool added = false;
        while (row_end <= last) {  // row r ends inside the step: its entries here added, then stored
          if (!added && p < row_end) {
            acc.x = fmaf(a[u], b[u].x, acc.x); acc.y = fmaf(a[u], b[u].y, acc.y);
            acc.z = fmaf(a[u], b[u].z, acc.z); acc.w = fmaf(a[u], b[u].w, acc.w);
            added = true;
          }
          const float4 t = sum_groups(acc);
          if (grp == 0) *reinterpret_cast<float4*>(C + (size_t)r * NFEAT + gl * 4) = t;
          acc = make_float4(0.f, 0.f, 0.f, 0.f);
          const int prev = row_end;
          do {  // on to the next row holding an entry (the fix-up launch zeroes empty ones)
            ++r;
            if (r - rbase >= 32) { rbase = r; ends = (rbase + lane < M) ? __ldg(indptr + rbase + lane + 1) : nnz; }
            row_end = __shfl_sync(FULL, ends, r - rbase);
          } while (row_end <= prev);
        }
        if (!added) {
          acc.x = fmaf(a[u], b[u].x, acc.x); acc.y = fmaf(a[u], b[u].y, acc.y);
          acc.z = fmaf(a[u], b[u].z, acc.z); acc.w = fmaf(a[u], b[u].w, acc.w);
        }
      }
    }
  }
  const float4 t = sum_groups(acc);
  if (row_end <= p1) {  // the last row ends here: its end owner stores it
    if (grp == 0) *reinterpret_cast<float4*>(C + (size_t)r * NFEAT + gl * 4) = t;
    if (lane == 0) carry_row[w] = -1;
  } else {  // it goes on past the range: a partial sum for the fix-up
    if (grp == 0) *reinterpret_cast<float4*>(carry + (size_t)w * NFEAT + gl * 4) = t;
    if (lane == 0) carry_row[w] = r;
  }
}

// threads [0, warps * NFEAT): carry w's feature f added into its row; then one thread a row: a row
// with no entry zeroed
extern "C" __global__ void csr_split_fixup(const int* __restrict__ indptr, const float* __restrict__ carry,
                                          const int* __restrict__ carry_row, float* __restrict__ C, int M,
                                          int warps) {
  const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long n_carry = (long long)warps * NFEAT;
  if (t < n_carry) {
    const int w = (int)(t / NFEAT), f = (int)(t % NFEAT);
    const int r = carry_row[w];
    if (r >= 0) atomicAdd(C + (size_t)r * NFEAT + f, carry[(size_t)w * NFEAT + f]);
    return;
  }
  const long long r = t - n_carry;
  if (r >= M) return;
  if (__ldg(indptr + r) == __ldg(indptr + r + 1))
    for (int f = 0; f < NFEAT; ++f) C[r * NFEAT + f] = 0.f;
}
"""


MACROS = {"e": "EPW", "wpb": "WPB", "u": "UNR"}  # knob -> the macro SOURCE reads


def edge_cases(rng):
    """[(name, CSR float32, timed=False)]: empty rows (leading, inner, trailing), a hub row
    of a third of the entries, rows longer than many warps' ranges, a matrix with no entry."""
    out = []
    m = sp.random(3000, 2000, density=0.003, format="lil", random_state=1, dtype=np.float32)
    m[5, :] = 0
    m[1000:1010, :] = 0
    m[2990:, :] = 0
    m[77, :1900] = rng.standard_normal(1900)  # a hub row
    m[78, 100:1500] = rng.standard_normal(1400)
    out.append(("edge-3000x2000-hub", m.tocsr(), False))
    out.append(("empty-500x300", sp.csr_matrix((500, 300), dtype=np.float32), False))
    one = sp.csr_matrix(rng.standard_normal((1, 40000)).astype(np.float32))  # one row of 40000 entries
    out.append(("one-row-1x40000", one, False))
    return out


def graph_cases(names, rmat):
    """[(name, CSR float32, timed=True)]: the named graphs of the cache (``load_graph``) and
    R-MAT graphs of ``rmat`` = [(scale, edges)]."""
    from _helpers import load_graph
    from sparsec.bench.rmat import rmat as make_rmat

    out = []
    for name in names:
        m = load_graph(name)
        if m is None:
            print(f"skip {name}: not in the cache", flush=True)
            continue
        out.append((name, m, True))
    for scale, edges in rmat:
        m = make_rmat(scale, edges, seed=0).tocsr().astype(np.float32)
        m.sum_duplicates()
        m.data = np.random.default_rng(4).standard_normal(m.nnz).astype(np.float32)
        out.append((f"rmat-s{scale}-{edges // 1000}k", m, True))
    return out


def variants(quick, group=False):
    """[knob dicts]: csr_split's grid, and with ``group`` csr_group's (``k`` names the kernel)."""
    out = [dict(k="csr_split", e=e, wpb=w, u=u) for e in ((128, 256) if quick else (64, 128, 256, 512))
           for w in (4, 8) for u in ((4,) if quick else (2, 4))]
    if group:
        out += [dict(k="csr_group", e=e, wpb=w, u=u) for e in (64, 128, 256) for w in (4, 8)
                for u in ((2, 4) if quick else (2, 4, 8))]
    return out


def compiled_kernel(m, feat, bs, refs, scale, best, timer) -> dict:
    """sparsec.compile's csr_split on ``m`` (knobs by ``entries_per_warp``): each setting
    called twice per B on a NaN-poisoned output and checked against float64; the probe's
    best setting (``best``, None on a checked-only case) timed."""
    import torch

    import sparsec
    from sparsec import formats
    from sparsec.schedules import csr_split

    inst = formats.convert(m, "csr")
    out = {"checks": []}
    for e in csr_split.KNOBS["entries_per_warp"]:
        knobs = {"entries_per_warp": e} if best is None else {"entries_per_warp": e, "warps_per_block": best["wpb"],
                                                                  "loads_ahead": best["u"]}
        k = sparsec.compile("spmm", inst, target="cuda:sm_90a", feat=feat, knobs=knobs)
        errs = []
        for b, r, s in zip(bs, refs, scale):
            for _ in range(2):  # the workspace and carries again: nothing left over from the call before
                got = k(inst, b, poison=True)
                torch.cuda.synchronize()
                finite = bool(torch.isfinite(got).all())
                errs.append(float((got.double() - r).abs().max()) / s if r.numel() and finite else
                            (0.0 if finite else float("inf")))
        ok = max(errs) < 1e-4
        out["checks"].append({"knobs": k.knobs, "ok": ok, "err": max(errs)})
        if best is not None and e == best["e"]:
            prep = [k.prepare(inst, b)[0] for b in bs]
            f = k.executable[k.op_name]
            out["knobs"], out["ms"] = k.knobs, timer.measure([lambda a=a: f(*a) for a in prep]).median_ms
    out["ok"] = all(c["ok"] for c in out["checks"])
    return out


def compiled_sets(m, feat, bs, refs, scale, sets, timer, built) -> list:
    """sparsec's csr_split on ``m`` with each knob set of ``sets`` (compiled once per width
    and set into ``built``: the kernel takes any matrix): each called twice per B on a
    NaN-poisoned output, checked against float64, and timed where correct."""
    import torch

    import sparsec
    from sparsec import formats

    inst = formats.convert(m, "csr")
    out = []
    for knobs in sets:
        key = (feat, tuple(sorted(knobs.items())))
        if key not in built:
            try:
                built[key] = sparsec.compile("spmm", inst, target="cuda:sm_90a", feat=feat, knobs=knobs)
            except ValueError as e:  # knobs this width refuses (named by plan): a result, not a crash
                built[key] = str(e)
        k = built[key]
        if isinstance(k, str):
            out.append({"knobs": knobs, "ok": None, "refused": k, "ms": None})
            continue
        errs = []
        for b, r, s in zip(bs, refs, scale):
            for _ in range(2):
                got = k(inst, b, poison=True)
                torch.cuda.synchronize()
                finite = bool(torch.isfinite(got).all())
                errs.append(float((got.double() - r).abs().max()) / s if r.numel() and finite else
                            (0.0 if finite else float("inf")))
        rec = {"knobs": k.knobs, "ok": max(errs) < 1e-4, "err": max(errs), "ms": None}
        if rec["ok"]:
            prep = [k.prepare(inst, b)[0] for b in bs]
            f = k.executable[k.op_name]
            rec["ms"] = timer.measure([lambda a=a: f(*a) for a in prep]).median_ms
        out.append(rec)
    return out


def print_sets(rows, sets) -> None:
    """Each knob set's ratio to cuSPARSE per timed case, and its geomean and minimum."""
    print(f"{'case':<22} {'F':>3} " + " ".join(f"{'set' + str(i):>6}" for i in range(len(sets))))
    per = [[] for _ in sets]
    for r in rows:
        if "cusparse_ms" not in r or "sets" not in r:
            continue
        cells = []
        for i, c in enumerate(r["sets"]):
            ratio = r["cusparse_ms"] / c["ms"] if c["ms"] else None
            if ratio:
                per[i].append(ratio)
            cells.append(f"{ratio:6.2f}" if ratio else "   n/a" if c.get("refused") else "  FAIL")
        print(f"{r['case']:<22} {r['feat']:>3} " + " ".join(cells))
    for i, (knobs, ratios) in enumerate(zip(sets, per)):
        if ratios:
            print(f"set{i} {knobs}: geomean x{math.exp(np.mean(np.log(ratios))):.2f} cuSPARSE, min x{min(ratios):.2f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", nargs="+", default=["as-22july06", "email-Enron", "cond-mat-2005", "astro-ph",
                                                    "copter2", "mdual"])
    ap.add_argument("--rmat", nargs="*", default=["16:1000000", "18:4000000"], help="scale:edges R-MAT graphs")
    ap.add_argument("--feats", type=int, nargs="+", default=[32, 128], choices=(32, 64, 128))
    ap.add_argument("--sparsec", action="store_true", help="also time sparsec's csr and hyb defaults (TVM bundle)")
    ap.add_argument("--compiled", action="store_true",
                    help="also sparsec's compiled csr_split (schedules/csr_split.py, TVM bundle): checked on every "
                         "case with every entries_per_warp, timed with the CUDA probe's best knobs")
    ap.add_argument("--knob-sets", type=json.loads, default=None,
                    help="a JSON list of csr_split knob sets: sparsec's compiled kernel with each, checked and timed "
                         "beside cuSPARSE on every case (the CUDA variants are left out)")
    ap.add_argument("--group", action="store_true",
                    help="also csr_group: lanes grouped a float4 of B's row each, several entries a step")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "probe_csr_split.json"))
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
    kernels = {}

    def kernel(name, feat, **p):
        key = (name, feat) + tuple(sorted(p.items()))
        if key not in kernels:
            opts = ("-std=c++17", "-arch=sm_90a", f"-DNFEAT={feat}") + tuple(
                f"-D{MACROS[k]}={v}" for k, v in p.items() if k in MACROS)
            kernels[key] = cp.RawModule(code=SOURCE, options=opts).get_function(name)
        return kernels[key]

    probe_variants = [] if args.knob_sets else variants(args.quick, args.group)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda a: kernel(a[1]["k"], a[0], **a[1]),
                      [(f, v) for f in args.feats for v in probe_variants]))
    built = {}

    def stream():
        return cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)

    rmat = [tuple(int(x) for x in s.split(":")) for s in args.rmat]
    cases = edge_cases(rng) + graph_cases(args.graphs, rmat)
    rows_out = []
    for name, m, timed in cases:
        M, K = m.shape
        nnz = int(m.nnz)
        lens = np.diff(m.indptr)
        indptr, indices = cp.asarray(m.indptr.astype(np.int32)), cp.asarray(m.indices.astype(np.int32))
        vals = cp.asarray(m.data.astype(np.float32))
        A_t = torch.sparse_csr_tensor(torch.from_numpy(m.indptr.astype(np.int64)),
                                      torch.from_numpy(m.indices.astype(np.int64)),
                                      torch.from_numpy(m.data.astype(np.float32)), size=(M, K)).to(dev)
        A64 = m.astype(np.float64)
        for feat in args.feats:
            sets = 4 if timed else 1
            bs = [torch.randn(K, feat, device=dev, dtype=torch.float32) for _ in range(sets)]
            refs = [torch.from_numpy(A64 @ b.double().cpu().numpy()).to(dev) for b in bs]
            scale = [max(float(r.abs().max()), 1e-30) if r.numel() else 1.0 for r in refs]
            row = {"case": name, "shape": [M, K], "nnz": nnz, "max_row": int(lens.max(initial=0)),
                   "empty_rows": int((lens == 0).sum()), "feat": feat, "variants": []}
            if timed:
                row["cusparse_ms"] = timer.measure([lambda b=b: torch.sparse.mm(A_t, b) for b in bs]).median_ms
            for v in probe_variants:
                warps = max(-(-nnz // v["e"]), 1)
                carry = cp.empty((warps, feat), dtype=cp.float32)
                carry_row = cp.empty((warps,), dtype=cp.int32)
                main_k, fix_k = kernel(v["k"], feat, **v), kernel("csr_split_fixup", feat, **v)
                grid = (-(-warps // v["wpb"]),)
                fix_threads = warps * feat + M
                outs = [torch.full((M, feat), float("nan"), device=dev, dtype=torch.float32) for _ in bs]
                outs_cp = [cp.asarray(o) for o in outs]

                def call(i, main_k=main_k, fix_k=fix_k, grid=grid, v=v, warps=warps, carry=carry,
                         carry_row=carry_row, outs_cp=outs_cp, fix_threads=fix_threads):
                    with stream():
                        main_k(grid, (v["wpb"] * 32,), (indptr, indices, vals, cp.asarray(bs[i]), outs_cp[i], carry,
                                                       carry_row, np.int32(M), np.int32(nnz), np.int32(warps)))
                        fix_k((-(-fix_threads // 256),), (256,), (indptr, carry, carry_row, outs_cp[i], np.int32(M),
                                                               np.int32(warps)))
                for i in range(sets):
                    call(i)
                torch.cuda.synchronize()
                err = max((float((o.double() - r).abs().max()) / s if r.numel() else 0.0)
                          for o, r, s in zip(outs, refs, scale))
                ok = bool(err < 1e-4) and all(bool(torch.isfinite(o).all()) for o in outs)
                tm = timer.measure([lambda i=i: call(i) for i in range(sets)]) if ok and timed else None
                row["variants"].append({**v, "ok": ok, "err": err, "ms": tm.median_ms if tm else None})
            if timed and args.sparsec:
                import sparsec
                from sparsec import formats

                for fmt in ("csr", "hyb"):
                    inst = formats.convert(m, fmt)
                    k = sparsec.compile("spmm", inst, target="cuda:sm_90a", feat=feat)
                    out = k(inst, bs[0], poison=True)
                    torch.cuda.synchronize()
                    e = float((out.double() - refs[0]).abs().max()) / scale[0]
                    prep = [k.prepare(inst, b)[0] for b in bs]
                    f = k.executable[k.op_name]
                    row[f"sparsec_{fmt}_ms"] = timer.measure([lambda a=a: f(*a) for a in prep]).median_ms
                    row[f"sparsec_{fmt}_ok"] = bool(e < 1e-4)
            good = [x for x in row["variants"] if x["ms"] and x["k"] == "csr_split"]
            row["best"] = min(good, key=lambda x: x["ms"]) if good else None
            grouped = [x for x in row["variants"] if x["ms"] and x["k"] == "csr_group"]
            row["best_group"] = min(grouped, key=lambda x: x["ms"]) if grouped else None
            if args.compiled:
                row["compiled"] = compiled_kernel(m, feat, bs, refs, scale, row["best"], timer)
            if args.knob_sets:
                row["sets"] = compiled_sets(m, feat, bs, refs, scale, args.knob_sets, timer, built)
            rows_out.append(row)
            wrong = sum(not x["ok"] for x in row["variants"])
            b = row["best"]
            print(f"{name:<22} F={feat:<3} max row {row['max_row']:>6}  split "
                  f"{b['ms'] * 1e3 if b else float('nan'):8.2f} us  cuSPARSE "
                  f"{row.get('cusparse_ms', float('nan')) * 1e3:8.2f} us  wrong {wrong}/{len(row['variants'])}",
                  flush=True)
    wrong = write_probe_rows(args.out, rows_out,
                             sum(not c["ok"] for r in rows_out for c in r.get("compiled", {}).get("checks", []))
                             + sum(c["ok"] is False for r in rows_out for c in r.get("sets", [])))
    if args.knob_sets:
        print_sets(rows_out, args.knob_sets)
    print(f"\n{torch.cuda.get_device_name()}: {wrong} wrong variants; ratios = cuSPARSE / ours")
    print(f"{'case':<22} {'F':>3} {'max row':>7} {'split':>6} {'E':>4} {'wpb':>3} {'U':>2} {'csr':>6} {'hyb':>6} "
          f"{'compiled':>8} {'group':>6}")
    grouped = []
    ratios = []
    for r in rows_out:
        b = r["best"]
        if "cusparse_ms" not in r:
            print(f"{r['case']:<22} {r['feat']:>3}  checked only, wrong {sum(not x['ok'] for x in r['variants'])}")
            continue
        if not b:
            print(f"{r['case']:<22} {r['feat']:>3}  NONE OK")
            continue
        ratios.append(r["cusparse_ms"] / b["ms"])
        cs = r.get("sparsec_csr_ms")
        hy = r.get("sparsec_hyb_ms")
        co = r.get("compiled", {}).get("ms")
        gr = r.get("best_group")
        print(f"{r['case']:<22} {r['feat']:>3} {r['max_row']:>7} {ratios[-1]:6.2f} {b['e']:>4} {b['wpb']:>3} "
              f"{b['u']:>2} {'%.2f' % (r['cusparse_ms'] / cs) if cs else '-':>6} "
              f"{'%.2f' % (r['cusparse_ms'] / hy) if hy else '-':>6} "
              f"{'%.2f' % (r['cusparse_ms'] / co) if co else '-':>8} "
              f"{'%.2f' % (r['cusparse_ms'] / gr['ms']) if gr else '-':>6}")
        if gr:
            grouped.append(r["cusparse_ms"] / gr["ms"])
    if ratios:
        print(f"csr_split geomean x{math.exp(np.mean(np.log(ratios))):.2f} cuSPARSE, min x{min(ratios):.2f}")
    if grouped:
        print(f"csr_group geomean x{math.exp(np.mean(np.log(grouped))):.2f} cuSPARSE, min x{min(grouped):.2f}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
