#!/usr/bin/env python3
"""The Tensor Core SpMM kernels for BSR weights at few columns of B (``schedules/bsr_stream.py``,
``--kernel ring``: ``schedules/bsr_ring.py``, ``--kernel gather``: ``schedules/bsr_gather.py``),
reached through ``sparsec.compile``, against float64 on the GPU host.

    python3 benchmarks/check_bsr_stream.py [--kernel stream|ring|gather] [--out FILE]

Each case converts a float16 weight to ``bsr:RxC``, compiles the library ``spmm`` for it
(the kernel ``sparsec.compile`` picks, with the knobs given or its defaults; the check fails
if it is not the kernel asked for), calls it twice on a NaN-poisoned output and compares with the
float64 product of the logical weight. Weights: odd sizes at 70 / 90 % block sparsity, an
empty one, a single block row holding every block column (its walk crosses windows of 32
blocks and, with a small ``bk``, many phases of B) among empty rows, explicit zeros stored
in a block, a dense one, blocks of 16 to 64 rows and 16 to 64 columns, and the MiniLM layers
where cached; N = 1, 5, 8, 16, 20, 33, 64 (the ring kernel: multiples of 8, and its blocks
of 16, 32 or 64 rows); every knob value at least once; matrices of up to and of more than
``bsr_ring.INDEX_CACHE`` stored blocks (their columns in shared memory or read in windows). Writes
``$OUT/check_bsr_<kernel>.json``; prints a table last; exits 1 on any wrong result.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import scipy.sparse as sp

import _preamble  # noqa: F401,E402

TOL = 1e-2  # float16 products summed in float32, against float64, relative to the largest |C|


def block_pruned(rng, shape, block, sparsity):
    """A float16 weight of ``shape`` whose ``block`` tiles are zero with probability ``sparsity``."""
    r, c = block
    grid = (-(-shape[0] // r), -(-shape[1] // c))
    keep = np.kron(rng.random(grid) >= sparsity, np.ones((r, c), bool))[:shape[0], :shape[1]]
    return np.where(keep, rng.standard_normal(shape), 0).astype(np.float16)


def weights(rng):
    """[(name, float16 weight or scipy CSR with explicit zeros, block)]."""
    out = [
        ("odd-200x300-b32-s70", block_pruned(rng, (200, 300), (32, 32), 0.7), (32, 32)),
        ("odd-1000x777-b16-s90", block_pruned(rng, (1000, 777), (16, 16), 0.9), (16, 16)),
        ("odd-333x1111-b64-s70", block_pruned(rng, (333, 1111), (64, 64), 0.7), (64, 64)),
        ("odd-129x500-b48-s50", block_pruned(rng, (129, 500), (48, 48), 0.5), (48, 48)),
        ("odd-300x260-b32x16-s70", block_pruned(rng, (300, 260), (32, 16), 0.7), (32, 16)),
        ("odd-97x515-b16x64-s70", block_pruned(rng, (97, 515), (16, 64), 0.7), (16, 64)),
        ("dense-64x96-b16", rng.standard_normal((64, 96)).astype(np.float16), (16, 16)),
        ("empty-128x256-b16", np.zeros((128, 256), np.float16), (16, 16)),
        # bsr_ring copies a matrix's block columns to shared memory up to INDEX_CACHE blocks:
        # exactly that many, and more (windows of 32 columns read from memory, rows of ~50)
        ("dense-512x512-b16-1024-blocks", rng.standard_normal((512, 512)).astype(np.float16), (16, 16)),
        ("odd-1100x1600-b16-s50", block_pruned(rng, (1100, 1600), (16, 16), 0.5), (16, 16)),
    ]
    one = np.zeros((80, 16 * 300), np.float16)  # block row 1 holds all 300 block columns
    one[16:32] = rng.standard_normal((16, 16 * 300)).astype(np.float16)
    out.append(("one-long-row-80x4800-b16", one, (16, 16)))
    w = block_pruned(rng, (160, 224), (32, 32), 0.6).astype(np.float32)
    csr = sp.csr_matrix(w)
    dense_zero = sp.csr_matrix(([0.0] * 32, ([64 + i for i in range(32)], [192 + i for i in range(32)])),
                               shape=w.shape)  # a stored block of explicit zeros where the weight has none
    csr = sp.csr_matrix((np.concatenate([csr.data, dense_zero.data]),
                         (np.concatenate([csr.tocoo().row, dense_zero.tocoo().row]),
                          np.concatenate([csr.tocoo().col, dense_zero.tocoo().col]))), shape=w.shape)
    out.append(("explicit-zeros-160x224-b32", csr, (32, 32)))
    from sparsec.bench.suites import default_cache_dir, load_minilm

    for name, tensor in (("minilm-L0-ffn-in", "encoder.layer.0.intermediate.dense.weight"),
                         ("minilm-L0-attn-q", "encoder.layer.0.attention.self.query.weight")):
        m = load_minilm(default_cache_dir(), tensor)
        if m is not None:
            from sparsec.bench.suites import prune_blocks

            out.append((f"{name}-b32-s70", prune_blocks(m, 32, 0.7).astype(np.float16), (32, 32)))
    return out


# (N, knobs) run on every weight: each knob value at least once, odd N, non-vector B (N % 8)
STREAM_SETTINGS = [
    (16, {}), (1, {}), (5, {"nb": 8, "cluster": 1}), (8, {"nb": 8, "stages": 2, "warps": 2}),
    (20, {"nb": 32, "cluster": 2, "bk": 4}), (33, {"nb": 64, "warps": 4, "stages": 3, "cluster": 4}),
    (64, {}), (64, {"nb": 16, "cluster": 8, "bk": 8, "stages": 6}), (16, {"bk": 16, "warps": 4, "cluster": 1}),
]
RING_SETTINGS = [
    (16, {}), (64, {}), (8, {"cluster": 1, "per_stage": 1, "stages": 2}), (24, {"cluster": 2, "per_stage": 4}),
    (40, {"cluster": 8, "stages": 8, "per_stage": 2}), (64, {"col_split": 4, "cluster": 4, "per_stage": 1}),
    (64, {"col_split": 2, "warps": 8, "per_stage": 4, "stages": 8}), (32, {"warps": 1, "col_split": 1}),
    (16, {"warps": 2, "cluster": 1, "per_stage": 4}),
    (64, {"teams": 4, "stages": 8, "per_stage": 4, "cluster": 1}), (16, {"teams": 2, "cluster": 1}),
    (40, {"teams": 2, "stages": 8, "cluster": 1, "per_stage": 1}),
    # the producer's two ways to copy (tma=1, the default where its swizzles take the shapes)
    (64, {"tma": 0}), (16, {"tma": 0, "cluster": 2, "per_stage": 4}),
    (32, {"tma": 1, "cluster": 4, "col_split": 2, "per_stage": 2}), (8, {"tma": 1, "per_stage": 4, "stages": 8}),
]
GATHER_SETTINGS = [
    (16, {}), (64, {}), (8, {"warps": 2, "per_warp": 1}), (24, {"warps": 16, "per_warp": 2}),
    (64, {"split": 4, "heavy": 1}), (64, {"split": 2, "heavy": 4, "warps": 4}),
    (32, {"split": 4, "heavy": 2, "per_warp": 1}), (48, {"split": 2, "heavy": 16}), (40, {"heavy": 32, "warps": 8}),
    (16, {"split": 2, "heavy": 8, "per_warp": 4}),
    # every row split (heavy=1): 64-row blocks at 64 columns, 32 or 16 columns a CTA
    (64, {"split": 2, "heavy": 1, "warps": 4, "per_warp": 1}), (64, {"split": 4, "heavy": 1, "warps": 8}),
]
KERNELS = {  # --kernel: (its settings, its module, how its CUDA source and knobs show it)
    "stream": (STREAM_SETTINGS, "bsr_stream", lambda src, knobs: "__ballot_sync" in src and "bk" in knobs),
    "ring": (RING_SETTINGS, "bsr_ring", lambda src, knobs: "mbarrier" in src and "per_stage" in knobs),
    "gather": (GATHER_SETTINGS, "bsr_gather", lambda src, knobs: "mbarrier" not in src and "per_warp" in knobs),
}


def main() -> int:
    import torch

    import sparsec
    from sparsec import formats

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernel", choices=sorted(KERNELS), default="stream")
    ap.add_argument("--out")
    args = ap.parse_args()
    rng = np.random.default_rng(11)
    import importlib

    settings, module, shows = KERNELS[args.kernel]
    kernel_mod = importlib.import_module(f"sparsec.schedules.{module}")

    rows, t0, built = [], time.perf_counter(), {}
    for name, w, block in weights(rng):
        logical = (w.toarray() if sp.issparse(w) else w).astype(np.float16).astype(np.float64)
        A = formats.convert(w.astype(np.float16) if not sp.issparse(w) else w.astype(np.float32),
                            f"bsr:{block[0]}x{block[1]}", dtype="float16")
        for N, knobs in settings:
            if args.kernel == "ring" and not kernel_mod.takes(block, N):  # bsr_gather: its plan() says
                continue
            rec = {"case": name, "block": list(block), "N": N, "knobs": knobs}
            try:
                density = A.nnz / max(A.shape[0] * A.shape[1], 1)
                full = {**kernel_mod.default_knobs(block, N, A.shape[0], A.shape[1], density), **knobs}
                try:
                    kernel_mod.plan(block, N, **full)
                except ValueError as e:  # a setting this block cannot take: its refusal is the result
                    print(f"skip {name} N={N} {full}: {e}", flush=True)
                    continue
                key = (block, N, tuple(sorted(full.items())))  # a kernel runs on every matrix of its format
                if key not in built:
                    built[key] = sparsec.compile("spmm", A, target="cuda", feat=N, knobs=full)
                k = built[key]
                rec["used"] = k.knobs
                rec["kernel"] = module if shows(k.source(), k.knobs) else "other"
                X = torch.from_numpy(rng.standard_normal((A.shape[1], N)).astype(np.float16)).cuda()
                ref = logical @ X.cpu().numpy().astype(np.float64)
                errs = []
                for _ in range(2):
                    out = k(A, X, poison=True)
                    torch.cuda.synchronize()
                    got = out.double().cpu().numpy()
                    scale = max(np.abs(ref).max(), 1.0)
                    errs.append(float(np.abs(got - ref).max() / scale) if got.size else 0.0)
                    if not np.isfinite(got).all():
                        errs[-1] = float("inf")
                rec["err"] = max(errs)
                rec["ok"] = rec["err"] < TOL and rec["kernel"] == module
            except Exception as e:  # noqa: BLE001  (a failure is a result: recorded, not fatal)
                rec.update(ok=False, error=f"{type(e).__name__}: {str(e)[:300]}")
            rows.append(rec)
            print(f"{'ok ' if rec['ok'] else 'BAD'} {name:<30} N={N:<3} {rec.get('used', knobs)} "
                  f"err={rec.get('err', rec.get('error'))}", flush=True)
    bad = [r for r in rows if not r["ok"]]
    result = {"device": torch.cuda.get_device_name(), "checks": len(rows), "wrong": len(bad), "rows": rows,
              "seconds": time.perf_counter() - t0,
              "command": f"python3 benchmarks/check_bsr_stream.py --kernel {args.kernel}"}
    for path in filter(None, (args.out, os.environ.get("OUT") and os.path.join(os.environ["OUT"],
                                                                                f"check_bsr_{args.kernel}.json"))):
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
    print(f"\n{result['device']}: {len(rows) - len(bad)}/{len(rows)} checks ok, max error "
          f"{max((r.get('err', 0) for r in rows if r['ok']), default=0):.2e}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
