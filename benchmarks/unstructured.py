#!/usr/bin/env python3
"""Unstructured pruned weights against dense cuBLAS where LLM inference is memory-bound
(issue 25's benchmark): ``C = W @ X`` with W an (out, in) float16 weight pruned by
magnitude, X (in, tokens) float16 activations feature-major.

    python3 benchmarks/unstructured.py [--shapes 4096x4096 11008x4096 4096x11008]
        [--sparsity 0.5 0.7 0.8 0.9] [--tokens 1 8 16 32 64 128 1024] [--quick]

Per case, side by side in one process: dense cuBLAS fp16 (``torch.mm``) on the pruned
weight, cuSPARSE CSR fp16 (``torch.sparse.mm``), and sparsec on the formats it can run the
weight in (CUDA-core csr and hyb; ``tiled``, the bitmap layout in 64 x 64 tiles, through the
generic CUDA template; ``tiled_tc``, the weight in 16 x 64 tiles through ``sparsec.compile``,
which builds its Tensor Core kernel: ``schedules/tiled_stream.py`` up to 64 tokens,
``schedules/tiled_tensorcore.py`` beyond; default knobs). Each result is checked against float64
on the same pruned weight. Times: CUDA-graph medians (``sparsec.bench.timing.Timer``) over
enough weight copies to leave L2 cold. Bytes: what each reads of the weight (dense: 2 per
element; csr: values, indices, row pointers; tiled: values, bitmap, tile offsets) plus X and
C, and the fraction of the device's copy bandwidth (a ``torch`` copy measured in the same
run) that reaches. ``--target llvm`` is a CPU dry run (small shapes, no cuBLAS peers).
Writes ``$OUT/unstructured_<gpu>.json``; prints a table last.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

import _preamble  # noqa: F401,E402

from sparsec.bench.report import geomean  # noqa: E402
from sparsec.reference import max_rel_err  # noqa: E402

SHAPES = ("4096x4096", "11008x4096", "4096x11008")
SPARSITY = (0.5, 0.7, 0.8, 0.9)
TOKENS = (1, 8, 16, 32, 64, 128, 1024)
FORMATS = ("csr", "hyb", "tiled", "tiled_tc")  # tiled_tc: the tiled Tensor Core kernel (CUDA only)
STREAM_TILE = (16, 64)  # the tile shape tiled_tc runs on
TOL = 2e-2  # float16 values and products, float32 sums


def weight_bytes(inst) -> int:
    """What a kernel reads of the weight in ``inst``'s format."""
    from sparsec.formats import tiled

    if inst.format.name == "tiled":
        return tiled.stream_bytes(inst)["total"]
    parts = getattr(inst, "parts", None) or [inst]
    return int(inst.data.nbytes) + sum(int(a.nbytes) for p in parts for a in p.kernel_arrays().values())


def copy_gbps(device: str) -> float:
    """The device's copy bandwidth (read + write) in GB/s: a 1 GiB ``torch`` copy."""
    import torch

    if device != "cuda":
        return 0.0
    a = torch.empty(2**29, dtype=torch.float16, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        b.copy_(a)
    end.record()
    torch.cuda.synchronize()
    return 2 * a.nbytes * 10 / (start.elapsed_time(end) * 1e-3) / 1e9


def cases(args):
    for shape in args.shapes:
        rows, cols = (int(x) for x in shape.lower().split("x"))
        for sparsity in args.sparsity:
            yield rows, cols, sparsity


def run_case(rows, cols, sparsity, tokens_list, args, timer, gbps):
    import torch

    import sparsec
    from sparsec.formats import convert, tiled
    from sparsec.measure import device_l2_bytes, free_device_bytes, rotation_count

    dev = "cuda" if args.target == "cuda" else "cpu"
    rng = np.random.default_rng(rows * 7 + cols)
    w = (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float16)
    t_inst, keep = tiled.prune(w, sparsity=sparsity)
    s_inst = tiled.from_matrix(t_inst.to_scipy(), tile=STREAM_TILE, dtype=np.float16)
    pruned = np.where(keep, w, 0).astype(np.float16)
    out = []
    for tokens in tokens_list:
        x = rng.standard_normal((cols, tokens)).astype(np.float16)
        ref = pruned.astype(np.float64) @ x.astype(np.float64)
        row = {"rows": rows, "cols": cols, "sparsity": sparsity, "tokens": tokens, "nnz": int(keep.sum()),
               "results": {}}
        act_bytes = 2 * (cols * tokens + rows * tokens)

        def record(name, fn, bytes_w, copies, extra=None):
            y = fn(copies[0])
            y = y.numpy() if hasattr(y, "numpy") and not hasattr(y, "cpu") else y
            y = y.float().cpu().numpy() if hasattr(y, "cpu") else np.asarray(y, dtype=np.float32)
            err = float(max_rel_err(y, ref))
            ms = timer.measure([lambda c=c: fn(c) for c in copies]).median_ms
            moved = bytes_w + act_bytes
            row["results"][name] = {"ms": ms, "max_rel_err": err, "ok": err < TOL, "weight_bytes": int(bytes_w),
                                    "bytes": int(moved), "gbps": moved / (ms * 1e-3) / 1e9,
                                    "of_copy_bw": (moved / (ms * 1e-3) / 1e9) / gbps if gbps else None,
                                    **(extra or {})}

        n_copies = rotation_count(2 * rows * cols, device_l2_bytes(), free_device_bytes(dev), max_copies=8)
        xt = torch.from_numpy(x).to(dev)
        if dev == "cuda":  # the peers users would pick: cuBLAS on the dense weight, cuSPARSE CSR
            dense = [torch.from_numpy(pruned).to(dev) for _ in range(n_copies)]
            record("dense_cublas", lambda W: torch.mm(W, xt), 2 * rows * cols, dense)
            del dense
            sp_t = torch.from_numpy(pruned).to(dev).to_sparse_csr()
            sparse = [sp_t] + [sp_t.clone() for _ in range(n_copies - 1)]
            csr_bytes = int(sp_t.values().nbytes + sp_t.col_indices().nbytes + sp_t.crow_indices().nbytes)
            record("cusparse_csr", lambda S: torch.sparse.mm(S, xt), csr_bytes, sparse)
            del sparse, sp_t
        for fmt in args.formats:
            # tiled_tc: the Tensor Core kernel sparsec.compile builds for the weight in 16-row
            # tiles (the streaming kernel up to 64 tokens), default knobs
            inst = {"tiled": t_inst, "tiled_tc": s_inst}.get(fmt) or convert(t_inst.to_scipy(), fmt, dtype=np.float16)
            if fmt == "tiled_tc" and dev != "cuda":
                continue
            try:
                k = sparsec.compile("spmm", inst, target=args.target, feat=tokens)
            except (ValueError, TypeError) as e:
                row["results"][f"sparsec_{fmt}"] = {"error": str(e)[:300]}
                continue
            copies = [inst] + [inst.with_data(inst.data.copy()) for _ in range(n_copies - 1)]
            record(f"sparsec_{fmt}", lambda A, k=k: k(A, xt), weight_bytes(inst), copies, {"knobs": k.knobs})
        dense_ms = row["results"].get("dense_cublas", {}).get("ms")
        for r in row["results"].values():
            if "ms" in r and dense_ms:
                r["vs_dense"] = dense_ms / r["ms"]
        out.append(row)
        print(json.dumps(row), flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES), metavar="OUTxIN")
    ap.add_argument("--sparsity", nargs="*", type=float, default=list(SPARSITY))
    ap.add_argument("--tokens", nargs="*", type=int, default=list(TOKENS))
    ap.add_argument("--formats", nargs="*", default=list(FORMATS))
    ap.add_argument("--target", default="cuda", help="cuda (default) or llvm (a CPU dry run)")
    ap.add_argument("--quick", action="store_true", help="tokens 1, 16, 1024 and sparsity 0.5, 0.9 only")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    if args.quick:
        args.tokens, args.sparsity = [1, 16, 1024], [0.5, 0.9]
    import torch

    from sparsec.bench.timing import Timer

    dev = "cuda" if args.target == "cuda" else "cpu"
    timer = Timer(dev, warmup_ms=10.0, budget_ms=60.0, max_reps=100)
    gbps = copy_gbps(dev)
    gpu = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    rows = []
    for r, c, s in cases(args):
        rows += run_case(r, c, s, args.tokens, args, timer, gbps)
    tag = gpu.split()[-1] if dev == "cuda" else "cpu"
    path = os.path.join(args.out, f"unstructured_{tag}.json")
    with open(path, "w") as f:
        json.dump({"device": gpu, "copy_gbps": gbps, "rows": rows}, f, indent=1)
    names = sorted({n for r in rows for n, x in r["results"].items() if "ms" in x})
    print(f"\n{'shape':>11} {'sparsity':>8} {'tokens':>6} " + " ".join(f"{n:>14}" for n in names) + "   (ms, x dense)")
    for r in rows:
        cells = []
        for n in names:
            x = r["results"].get(n, {})
            ratio = f"{x['vs_dense']:4.2f}x" if "vs_dense" in x else "    -"
            cells.append(f"{x['ms']:7.4f} {ratio}" + ("" if x.get("ok", True) else "!") if "ms" in x else "-")
        print(f"{r['rows']:>5}x{r['cols']:<5} {r['sparsity']:8.2f} {r['tokens']:6d} " + " ".join(f"{c:>14}" for c in cells))
    for n in names:
        g = geomean(r["results"][n]["vs_dense"] for r in rows if "vs_dense" in r["results"].get(n, {}))
        if g:
            print(f"geomean vs dense, {n}: {g:.3f}x")
    bad = [(r["rows"], r["cols"], r["sparsity"], r["tokens"], n) for r in rows for n, x in r["results"].items()
           if "ms" in x and not x["ok"]]
    if bad:
        print("WRONG RESULTS:", bad)
    print(f"written {path} ({gpu})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
