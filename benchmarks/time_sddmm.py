"""SDDMM: sparsec (one-kernel lane-group template, schedules/cuda_sddmm.py) vs cuSPARSE, checked first.

    bash .gpu/stage2/install.sh >/dev/null && source .gpu/stage2/env.sh && python3 benchmarks/time_sddmm.py
    python3 benchmarks/time_sddmm.py --target llvm --small      # CPU dry run (torch CPU sampled_addmm)

Carry ``benchmarks/data/cache``; graphs that are not there are skipped. For each graph and
feature width F, sparsec's SDDMM ``C = A .* (X @ Y.T)`` (X rows x F, Y cols x F) runs at a
few knob settings on CSR (one compiled kernel per F and setting, shared by every matrix)
and at the default on hyb (rows cut into fixed-width buckets: load balance on power-law
graphs), each checked against torch float64 on a poisoned output, then timed with
sparsec.bench's timer (CUDA-graph replays, median after warm-up, dense inputs rotating over
copies larger than L2). The peer is ``torch.sparse.sampled_addmm(A, X, Y.T)`` (cuSPARSE) on a contiguous
F x cols copy of Y made outside timing, without the scale by A (it computes X @ Y.T at A's
entries only). Prints a table and geomeans; writes $OUT/sddmm_check.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

import _preamble  # noqa: F401,E402  (the one preamble: checkout root and benchmarks/data on sys.path)
import sparsec  # noqa: E402
from _helpers import load_graph, make_timed, report_wrong  # noqa: E402
from sparsec.reference import max_rel_err  # noqa: E402
from sparsec.bench.report import geomean  # noqa: E402
from sparsec.formats import convert  # noqa: E402
from sparsec.schedules.cuda_sddmm import default_lanes, default_vec  # noqa: E402

GRAPHS = ("email-Enron", "pgp-strong-2009", "as-22july06", "cond-mat-2005", "astro-ph", "mdual", "rmat-s18")
FEATS = (32, 64, 128, 256, 512)
L2_BYTES = 64 << 20


def csr_settings(F):
    """The default and a small sweep around it (at most 5 CSR settings)."""
    lanes = default_lanes(F, default_vec(F))
    g = 32 // lanes
    out = [{}, {"rows_per_block": 1}, {"rows_per_block": 8}]
    if g * 2 <= 32:
        out.append({"groups": g * 2})  # two warps per row
    if lanes >= 2:
        out.append({"lanes": lanes // 2, "groups": g * 2})  # more entries per warp, more features per lane
    return out


def reference(inst, X, Y):
    """float64 A .* (X @ Y.T) at every stored slot of ``inst`` (0 in padding slots)."""
    rows, cols = inst.stored_coords()
    ok = torch.from_numpy(rows >= 0).to(X.device)
    r = torch.from_numpy(np.maximum(rows, 0).astype(np.int64)).to(X.device)
    c = torch.from_numpy(np.maximum(cols, 0).astype(np.int64)).to(X.device)
    vals = torch.from_numpy(inst.slot_values().astype(np.float64)).to(X.device)
    X64, Y64 = X.double(), Y.double()
    out = torch.empty(inst.stored, dtype=torch.float64, device=X.device)
    step = max(1, (1 << 24) // X.shape[1])
    for s in range(0, inst.stored, step):
        out[s:s + step] = (X64[r[s:s + step]] * Y64[c[s:s + step]]).sum(1)
    return torch.where(ok, out * vals, torch.zeros_like(out))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="cuda")
    ap.add_argument("--small", action="store_true", help="2000-row slices of two graphs, F in {32, 17}")
    ap.add_argument("--feats", default=None)
    ap.add_argument("--graphs", default=",".join(GRAPHS))
    ap.add_argument("--no-hyb", action="store_true")
    args = ap.parse_args()
    graphs = args.graphs.split(",")[:2] if args.small else args.graphs.split(",")
    feats = [int(f) for f in args.feats.split(",")] if args.feats else ([32, 17] if args.small else list(FEATS))
    on_gpu = args.target.startswith("cuda")
    dev = torch.device("cuda" if on_gpu else "cpu")
    timed = make_timed(dev.type)
    gpu = torch.cuda.get_device_name(0) if on_gpu else "cpu"
    out_dir = os.environ.get("OUT", ".")
    rows, cache, t_compile, t_start = [], {}, 0.0, time.perf_counter()
    for name in graphs:
        m = load_graph(name, args.small)
        if m is None:
            print(f"skip {name}: not in benchmarks/data/cache", flush=True)
            continue
        At = torch.sparse_csr_tensor(torch.from_numpy(m.indptr.astype(np.int64)),
                                     torch.from_numpy(m.indices.astype(np.int64)),
                                     torch.from_numpy(m.data), size=m.shape, device=dev)
        insts = {"csr": convert(m, "csr")}
        if not args.no_hyb:
            insts["hyb"] = convert(m, "hyb")
        for F in feats:
            copies = max(1, min(4, L2_BYTES // (m.shape[1] * F * 4) + 1)) if on_gpu else 1
            gen = torch.Generator(device=dev).manual_seed(F)
            Xs = [torch.randn(m.shape[0], F, device=dev, generator=gen) for _ in range(copies)]
            Ys = [torch.randn(m.shape[1], F, device=dev, generator=gen) for _ in range(copies)]
            Yts = [Y.t().contiguous() for Y in Ys]  # the peer's layout: F x cols
            peer = timed(lambda xy: torch.sparse.sampled_addmm(At, xy[0], xy[1], beta=0.0), list(zip(Xs, Yts)))
            rec = dict(matrix=name, rows=m.shape[0], nnz=int(m.nnz), max_row=int(np.diff(m.indptr).max()), feat=F,
                       cusparse_ms=peer, results=[])
            for fname, inst in insts.items():
                ref = reference(inst, Xs[0], Ys[0])
                settings = csr_settings(F) if fname == "csr" and on_gpu else [{}]
                for knobs in settings:
                    key = (fname, F, tuple(sorted(knobs.items()))) if fname == "csr" else (name, fname, F)
                    t0 = time.perf_counter()
                    if key not in cache:
                        cache[key] = sparsec.compile("sddmm", inst, feat=F, target=args.target, knobs=knobs)
                    t_compile += time.perf_counter() - t0
                    k = cache[key]
                    err = max_rel_err(torch.as_tensor(k(inst, Xs[0], Ys[0], poison=True)), ref, norm="fro")
                    ok = err < 1e-5
                    fn = k.executable[k.op_name]
                    prepared = [k.prepare(inst, X, Y)[0] for X, Y in zip(Xs, Ys)]
                    ms = timed(lambda a: fn(*a), prepared) if ok else float("nan")
                    rec["results"].append(dict(format=fname, knobs=knobs, used=k.knobs, ms=ms, err=err, ok=ok,
                                               vs_cusparse=peer / ms, kernels=k.source().count("__global__") // 2
                                               if on_gpu else None))
                    print(f"{name:16s} F={F:3d} {fname} {knobs} err {err:.1e} {ms:.4f} ms  cuSPARSE {peer:.4f}  "
                          f"{peer / ms:.2f}x", flush=True)
            rows.append(rec)
            with open(os.path.join(out_dir, "sddmm_check.json"), "w") as f:
                json.dump({"device": gpu, "torch": torch.__version__, "rows": rows, "compile_s": t_compile}, f, indent=1)
    print(f"\n{gpu}: x = cuSPARSE ms / sparsec ms; compile {t_compile:.0f} s, total {time.perf_counter() - t_start:.0f} s")
    print(f"{'matrix':16s} {'F':>4s} {'cuSP ms':>9s} {'default x':>9s} {'best x':>7s}  best")
    geo = {"default": [], "best": [], "csr best": []}
    for r in rows:
        good = [x for x in r["results"] if x["ok"]]
        d = next((x for x in r["results"] if x["format"] == "csr" and not x["knobs"]), None)
        b = max(good, key=lambda x: x["vs_cusparse"]) if good else None
        cb = max((x for x in good if x["format"] == "csr"), key=lambda x: x["vs_cusparse"], default=None)
        geo["default"].append(d["vs_cusparse"] if d and d["ok"] else float("nan"))
        geo["best"].append(b["vs_cusparse"] if b else float("nan"))
        geo["csr best"].append(cb["vs_cusparse"] if cb else float("nan"))
        dx = d["vs_cusparse"] if d and d["ok"] else float("nan")
        bx = b["vs_cusparse"] if b else float("nan")
        what = f"{b['format']} {b['knobs']}" if b else "-"
        print(f"{r['matrix']:16s} {r['feat']:4d} {r['cusparse_ms']:9.4f} {dx:9.2f} {bx:7.2f}  {what}")
    print("geomean: " + ", ".join(f"{k} {geomean(v) or float('nan'):.2f}x" for k, v in geo.items()))
    return report_wrong(rows)


if __name__ == "__main__":
    sys.exit(main())
