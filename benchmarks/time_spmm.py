"""SpMM on CUDA: csr and hyb (fused parts) at a few schedule settings vs cuSPARSE, checked first.

    bash .gpu/stage1/install.sh   # then, within 30 s:
    bash .gpu/stage2/install.sh >/dev/null && source .gpu/stage2/env.sh && python3 benchmarks/time_spmm.py

Carry ``benchmarks/data/cache`` (without the 1M-row R-MAT, which ``--rmat-1m`` generates).
For each graph and feature width, every setting is checked against torch float64 on a
poisoned output, then timed (sparsec.bench's timer: CUDA-graph replays, median after
warm-up; the dense input rotates over copies larger than L2). Prints the best setting per format and writes
$OUT/spmm_check.json: the data for choosing the templates' defaults and the default format.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
import _preamble  # noqa: F401,E402  (the one preamble: checkout root and benchmarks/data on sys.path)
import sparsec  # noqa: E402
from _helpers import load_graph, make_timed, report_wrong  # noqa: E402
from sparsec.reference import max_rel_err  # noqa: E402
from sparsec.bench.report import geomean  # noqa: E402
from sparsec.formats import convert  # noqa: E402

GRAPHS = ("cond-mat", "as-22july06", "cond-mat-2003", "astro-ph", "pgp-strong-2009", "cond-mat-2005", "email-Enron",
          "copter2", "mdual", "rmat-s16", "rmat-s18")
SETTINGS = {
    "csr": ({"vec": 4, "unroll": 2}, {"vec": 4, "unroll": 4}, {"vec": 4, "unroll": 8},
            {"vec": 2, "unroll": 8}, {"rows_per_block": 2, "vec": 4, "unroll": 8},
            {"vec": 4, "unroll": 2, "feat_tiles": 2}, {"vec": 4, "unroll": 2, "feat_tiles": 4}),
    "hyb": ({"vec": 4, "slots_per_block": 64}, {"vec": 4, "slots_per_block": 256}, {"vec": 4, "slots_per_block": 32},
            {"rows_per_block": 2, "vec": 4, "slots_per_block": 1024}, {"vec": 2, "slots_per_block": 64},
            {"vec": 4, "slots_per_block": 64, "feat_tiles": 2}, {"vec": 4, "slots_per_block": 64, "feat_tiles": 4},
            {"vec": 4, "slots_per_block": 64, "feat_tiles": 8}),
}
L2_BYTES = 64 << 20


def rmat_1m():
    from sparsec.bench.suites import RMAT_SPECS, rmat_graph

    return rmat_graph(os.path.join(HERE, "data", "cache"), RMAT_SPECS[-1])


def torch_csr(m, dev, dtype):
    return torch.sparse_csr_tensor(torch.from_numpy(m.indptr.astype(np.int64)), torch.from_numpy(m.indices.astype(np.int64)),
                                   torch.from_numpy(m.data).to(dtype), size=m.shape, device=dev)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--feats", default="32,128,512")
    ap.add_argument("--formats", default="csr,hyb")
    ap.add_argument("--rmat-1m", action="store_true")
    ap.add_argument("--graphs", default=",".join(GRAPHS))
    args = ap.parse_args()
    feats = [int(f) for f in args.feats.split(",")]
    dev = torch.device("cuda")
    gpu = torch.cuda.get_device_name(0)
    out_dir = os.environ.get("OUT", ".")
    timed = make_timed("cuda")
    mats = [(g, load_graph(g)) for g in args.graphs.split(",")]
    if args.rmat_1m:
        mats.append(("rmat-1M-30M", rmat_1m()))
    rows, cache, t_compile = [], {}, 0.0
    for name, m in mats:
        if m is None:
            print(f"skip {name}: not in the cache", flush=True)
            continue
        At = torch_csr(m, dev, torch.float32)
        At64 = torch_csr(m, dev, torch.float64)
        insts = {f: convert(m, f) for f in args.formats.split(",")}
        for F in feats:
            copies = max(1, min(8, L2_BYTES // (m.shape[1] * F * 4) + 1))
            Bs = [torch.randn(m.shape[1], F, device=dev) for _ in range(copies)]
            ref = torch.sparse.mm(At64, Bs[0].double())
            peer = timed(lambda B: torch.sparse.mm(At, B), Bs)
            rec = dict(matrix=name, rows=m.shape[0], nnz=int(m.nnz), max_row=int(np.diff(m.indptr).max()), feat=F,
                       cusparse_ms=peer, results=[])
            for fname, inst in insts.items():
                for knobs in SETTINGS[fname]:
                    key = (inst.format.spec, F, tuple(sorted(knobs.items())))
                    t0 = time.perf_counter()
                    if key not in cache:
                        cache[key] = sparsec.compile("spmm", inst, feat=F, target="cuda", knobs=knobs)
                    t_compile += time.perf_counter() - t0
                    k = cache[key]
                    err = max_rel_err(k(inst, Bs[0], poison=True), ref, norm="fro")
                    ok = err < 1e-5
                    fn = k.executable[k.op_name]
                    prepared = [k.prepare(inst, B)[0] for B in Bs]
                    ms = timed(lambda a: fn(*a), prepared) if ok else float("nan")
                    rec["results"].append(dict(format=fname, knobs=knobs, ms=ms, err=err, ok=ok, vs_cusparse=peer / ms,
                                               kernels=k.source().count("__global__") // 2))
                    print(f"{name:16s} F={F:3d} {fname} {knobs} err {err:.1e} {ms:.4f} ms  cuSPARSE {peer:.4f}  "
                          f"{peer / ms:.2f}x", flush=True)
            rows.append(rec)
            with open(os.path.join(out_dir, "spmm_check.json"), "w") as f:
                json.dump({"device": gpu, "rows": rows, "compile_s": t_compile}, f, indent=1)
    print(f"\n{gpu}: ratio = cuSPARSE ms / sparsec ms; compile {t_compile:.0f} s")
    print(f"{'matrix':16s} {'F':>4s} {'cuSP ms':>8s} " + " ".join(f"{f + ' best':>9s}" for f in args.formats.split(",")))
    geo = {f: [] for f in args.formats.split(",")}
    for r in rows:
        line = f"{r['matrix']:16s} {r['feat']:4d} {r['cusparse_ms']:8.4f} "
        for f in geo:
            rs = [x for x in r["results"] if x["format"] == f and x["ok"]]
            b = max(rs, key=lambda x: x["vs_cusparse"]) if rs else None
            geo[f].append(b["vs_cusparse"] if b else float("nan"))
            line += f"{(b['vs_cusparse'] if b else float('nan')):9.2f} "
        print(line)
    for f, v in geo.items():
        print(f"{f}: geomean best {geomean(v) or float('nan'):.2f}x")
    return report_wrong(rows)


if __name__ == "__main__":
    sys.exit(main())
