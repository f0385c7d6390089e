#!/usr/bin/env python3
"""BSR fp16 on Tensor Cores for every SpMM-shaped operator: checks against float64, and timings vs dense.

    python3 benchmarks/check_tensorcore_bsr.py [--target cuda|llvm] [--out DIR] [--no-timing]

Check: the library SpMM (8, 16, 24, 64 and 96 feature columns: 16 x 8 fragments, a guarded
last N tile), the user operator ``C[i, k] = relu(sum_j A[i, j] * B[j, k] + bias[i])``
(tests/dense_ops.py), a bias per column, and a per-row scale + constant + ReLU stored as
float16, on bsr:32x32 and bsr:16x16 matrices with empty block rows, one full (long) block
row and odd edges, each into a NaN-poisoned output, against ``reference.evaluate`` (float64
on the logical pattern). On CUDA every kernel must be the Tensor Core template (``n_tile``
among its knobs) and one launch.

Timing: a 768 x 3072 weight of 32 x 32 blocks at 90 % block sparsity (one empty block row),
fp16, B of 16 and 64 columns: sparsec (library SpMM and the bias + ReLU operator) vs dense
``torch.matmul`` (fp16, cuBLAS), median ms by ``sparsec.bench``'s timer.

Prints a table, writes DIR/check_tensorcore_bsr.json, exits 1 on any wrong result.
``--target llvm`` is a CPU dry run of the same checks (the generic template).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

import _preamble  # noqa: F401  (the one preamble: checkout root and benchmarks/data on sys.path)
import sparsec  # noqa: E402
from sparsec import formats  # noqa: E402
from sparsec.reference import TOLERANCE, evaluate, max_rel_err  # noqa: E402
from tests.dense_ops import spmm_bias_relu, spmm_row_bias_relu, spmm_scaled_half  # noqa: E402

from _helpers import make_timed  # noqa: E402

OPERATORS = {"spmm": lambda: sparsec.ops.get("spmm"), "row_bias_relu": spmm_row_bias_relu,
             "col_bias_relu": spmm_bias_relu, "scaled_half": spmm_scaled_half}
CHECKS = [("spmm", f) for f in (8, 16, 24, 64, 96)] + [("row_bias_relu", f) for f in (16, 24, 64)] + \
    [("col_bias_relu", 16), ("scaled_half", 24)]
BLOCKS = (32, 16)


def block_matrix(rows, cols, bs, sparsity, seed):
    """fp16 dense array of bs x bs blocks at ``sparsity``: block row 1 empty, the last block
    row full (a long row), explicit zeros inside stored blocks, edges not multiples of bs."""
    rng = np.random.default_rng(seed)
    mb, kb = -(-rows // bs), -(-cols // bs)
    mask = rng.random((mb, kb)) >= sparsity
    mask[1] = False
    mask[-1] = True
    vals = rng.standard_normal((mb * bs, kb * bs))
    vals[rng.random(vals.shape) < 0.05] = 0.0
    return (np.kron(mask, np.ones((bs, bs))) * vals)[:rows, :cols].astype(np.float16)


def to_device(x, target, torch):
    return torch.as_tensor(x, device="cuda") if target.startswith("cuda") else x


def check_one(name, feat, bs, target, torch):
    op = OPERATORS[name]()
    dense = block_matrix(8 * bs - 5, 6 * bs - 3, bs, 0.6, seed=feat + bs)
    A = formats.convert(dense, f"bsr:{bs}x{bs}")
    k = sparsec.compile(op, A, feat=feat, target=target)
    rng = np.random.default_rng(feat)
    dims = {"rows": A.shape[0], "cols": A.shape[1]}
    ins = [rng.standard_normal(tuple(dims.get(d, d) for d in p.shape)).astype(p.dtype) for p in k.inputs]
    out = k(A, *(to_device(x, target, torch) for x in ins), poison=True)
    out = out.cpu().numpy() if hasattr(out, "cpu") else np.asarray(out)
    want = evaluate(op, A, *ins, params={"feat": feat})
    err = max_rel_err(out, want)
    tol = TOLERANCE.get("float16", 1e-2)
    row = {"op": name, "feat": feat, "block": bs, "shape": list(A.shape), "knobs": k.knobs, "max_rel_err": err,
           "nan": bool(np.isnan(out).any()), "tensorcore": "n_tile" in k.knobs}
    ok = err <= tol and not row["nan"]
    if target.startswith("cuda"):
        src = k.source()
        row["launches"] = src.count("__global__") // 2  # each kernel is declared, then defined
        row["mma"] = "mma.sync" in src and "ldmatrix" in src
        ok = ok and row["tensorcore"] and row["mma"] and row["launches"] == 1
    row["ok"] = bool(ok)
    return row


def time_one(name, feat, target, torch, timed):
    """sparsec vs dense torch.matmul on the 768 x 3072 weight (32 x 32 blocks, 90 % sparse)."""
    dense = block_matrix(768, 3072, 32, 0.9, seed=7)
    A = formats.convert(dense, "bsr:32x32")
    op = OPERATORS[name]()
    k = sparsec.compile(op, A, feat=feat, target=target)
    rng = np.random.default_rng(1)
    dims = {"rows": A.shape[0], "cols": A.shape[1]}
    ins = [to_device(rng.standard_normal(tuple(dims.get(d, d) for d in p.shape)).astype(p.dtype), target, torch)
           for p in k.inputs]
    out = k(A, *ins, poison=True)
    args, _, _ = k.prepare(A, *ins, out=out)
    f = k.executable[k.op_name]
    row = {"op": name, "feat": feat, "shape": [768, 3072], "block": 32, "block_sparsity": 0.9,
           "stored_blocks": int(A.arrays["indices"].size), "knobs": k.knobs, "tensorcore": "n_tile" in k.knobs}
    row["sparsec_ms"] = timed(lambda _: f(*args), [None])
    At, Bt = to_device(dense, target, torch), ins[0]
    if target.startswith("cuda"):
        row["dense_ms"] = timed(lambda _: torch.matmul(At, Bt), [None])
    else:
        row["dense_ms"] = timed(lambda _: At.astype(np.float32) @ Bt.astype(np.float32), [None])
    row["speedup_vs_dense"] = row["dense_ms"] / row["sparsec_ms"]
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="cuda", help="cuda (default: cuda:sm_XY of this GPU) or llvm (a dry run)")
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for check_tensorcore_bsr.json")
    p.add_argument("--no-timing", action="store_true")
    args = p.parse_args(argv)
    torch, target, device = None, args.target, "cpu"
    if target == "cuda":
        import torch

        major, minor = torch.cuda.get_device_capability()
        target, device = f"cuda:sm_{major}{minor}" + ("a" if major >= 9 else ""), "cuda"
    t0 = time.perf_counter()
    checks = []
    for bs in BLOCKS:
        for name, feat in CHECKS:
            try:
                row = check_one(name, feat, bs, target, torch)
            except Exception as e:  # noqa: BLE001  (reported in the table; the run goes on)
                row = {"op": name, "feat": feat, "block": bs, "ok": False,
                       "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
            checks.append(row)
            print(json.dumps(row), flush=True)
    timings = []
    if not args.no_timing:
        timed = make_timed(device)
        for name in ("spmm", "row_bias_relu"):
            for feat in (16, 64):
                row = time_one(name, feat, target, torch, timed)
                timings.append(row)
                print(json.dumps(row), flush=True)
    print(f"\n{'op':>14} {'feat':>5} {'block':>5} {'n_tile':>6} {'warp_n':>6} {'max_rel_err':>11} {'tc':>3} ok")
    for r in checks:
        kn = r.get("knobs", {})
        err = "ERR" if "error" in r else f"{r['max_rel_err']:.1e}"
        print(f"{r['op']:>14} {r['feat']:>5} {r['block']:>5} {kn.get('n_tile', '-'):>6} {kn.get('warp_n', '-'):>6} "
              f"{err:>11} {'y' if r.get('tensorcore') else 'n':>3} {'ok' if r['ok'] else 'WRONG'}")
    if timings:
        print(f"\n{'op':>14} {'feat':>5} {'n_tile':>6} {'sparsec ms':>10} {'dense ms':>9} {'x dense':>8}")
        for r in timings:
            print(f"{r['op']:>14} {r['feat']:>5} {r['knobs'].get('n_tile', '-'):>6} {r['sparsec_ms']:>10.4f} "
                  f"{r['dense_ms']:>9.4f} {r['speedup_vs_dense']:>8.2f}")
    failed = sum(not r["ok"] for r in checks)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "check_tensorcore_bsr.json")
    with open(path, "w") as f:
        json.dump({"target": target, "device": torch.cuda.get_device_name() if torch else "cpu",
                   "checks": checks, "timings": timings, "wall_s": round(time.perf_counter() - t0, 1)}, f, indent=1)
    print(f"\n{len(checks) - failed}/{len(checks)} ok; wrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
