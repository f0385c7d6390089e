#!/usr/bin/env python3
"""Dense iterations on the GPU: every construct x every format family against float64 numpy.

    python3 benchmarks/check_dense_iterations.py [--target cuda|llvm] [--out DIR] [--feat 32]

The operators of tests/dense_ops.py -- SpMM + bias + ReLU (two iterations), transform then
aggregate (H = X @ W over the columns, then SpMM of H), a row-normalised SpMM, an in-place
ReLU, an iteration over dense axes only, an L2 row norm -- run on each format family
(csr, bsr, ell, rell, nm, srbcrs, hyb with split rows / with disjoint rows / with column
ranges, bsr+csr) on NaN-poisoned outputs, for two matrices (37 x 53 with empty rows, a long
row and explicit zeros; 1000 x 777 with a hub row). Each result is compared with the numpy
float64 formula of the operator on the matrix's logical pattern.

For SpMM + bias + ReLU it also counts the kernel launches of the CUDA module (``__global__``
definitions; each runs once per call) and says whether the bias + ReLU runs inside the
SpMM's kernel: one launch on single formats, the epilogue inside the parts' launch on a
composite whose parts own disjoint rows, and a launch of its own after the parts where
parts share rows.

Prints a families x constructs table of the worst relative error (and the launches), writes
every row to DIR/check_dense_iterations.json, exits 1 on any mismatch.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

import numpy as np
import scipy.sparse as sp

import _preamble  # noqa: F401  (the one preamble: checkout root and benchmarks/data on sys.path)
import sparsec  # noqa: E402
from sparsec import formats  # noqa: E402
from sparsec.formats import nm  # noqa: E402
from sparsec.reference import TOLERANCE, max_rel_err  # noqa: E402
from tests.dense_ops import FORMULAS  # noqa: E402

FAMILIES = ("csr", "bsr:4x4", "bsr:2x8", "ell", "rell", "nm:2:4", "srbcrs:v4,float16", "hyb:1:1/2/4",
            "hyb:1:1/2/4/8/16/32/64/128/256/512/1024", "hyb:2:1/2/4", "bsr+csr:4x4,0.3")


def matrices():
    """(name, float32 CSR): odd sizes, empty rows, a long row, explicit zeros."""
    out = []
    for name, rows, cols, density, seed in (("edge_37x53", 37, 53, 0.1, 3), ("hub_1000x777", 1000, 777, 0.01, 4)):
        rng = np.random.default_rng(seed)
        m = sp.random(rows, cols, density=density, format="lil", random_state=seed)
        m[3, :] = 0
        m[4, :] = 0
        m[7, ::2] = rng.uniform(0.1, 1.0, len(range(0, cols, 2)))
        c = m.tocoo()
        # positive weights, as mean aggregation has: a row normalised by a signed sum near 0 is
        # ill-conditioned (float32 rounding of the sum decides between a finite value and inf)
        data = np.where(np.arange(c.nnz) % 6 == 0, 0.0, c.data + 0.1)
        r, k = np.concatenate([c.row, [0, 0]]), np.concatenate([c.col, [1, 5]])
        m = sp.csr_matrix((np.concatenate([data, [0.0, 0.0]]).astype(np.float32), (r, k)), shape=(rows, cols))
        m.sort_indices()
        out.append((name, m))
    return out


def instance(m, spec):
    if spec.startswith("nm:"):
        return formats.convert(nm.prune_stored(m, n=2, m=4), spec)
    return formats.convert(m, spec)


def launches(src: str):
    """(kernel count, whether the bias + ReLU runs in a kernel that also reads B (the SpMM's
    gather), kernel names). Each __global__ of the module is launched once per call."""
    heads = list(re.finditer(r"__global__ void __launch_bounds__\(\d+\) (\w+)\([^)]*\)\s*\{", src))
    bodies = [src[h.end():heads[n + 1].start() if n + 1 < len(heads) else len(src)] for n, h in enumerate(heads)]
    fused = any("bias_ptr" in b and "max(" in b and "B_ptr" in b for b in bodies)
    return len(heads), fused, [h.group(1) for h in heads]


def run_one(construct, spec, target, feat, mats, torch):
    make, params, shapes, formula = FORMULAS[construct]
    params = {k: (feat if v is None else v) for k, v in params.items()}
    row = {"construct": construct, "family": spec, "target": target}
    worst = 0.0
    t0 = time.perf_counter()
    for name, m in mats:
        A = instance(m, spec)
        kernel = sparsec.compile(make(), A, target=target, **params)  # per matrix: ell's width is the matrix's
        dtype = np.float16 if A.value_dtype == "float16" else np.float32
        rng = np.random.default_rng(len(name))
        dense = [rng.standard_normal(s).astype(dtype) for s in shapes(*A.shape, feat)]
        args = dense
        if target.startswith("cuda"):
            args = [torch.as_tensor(x, device="cuda") for x in dense]
        outs = kernel(A, *args, poison=True)
        outs = outs if isinstance(outs, tuple) else (outs,)
        want = formula(A.to_scipy().astype(np.float64), *(x.astype(np.float64) for x in dense))
        want = want if isinstance(want, tuple) else (want,)
        for o, w in zip(outs, want):
            o = o.cpu().numpy() if hasattr(o, "cpu") else np.asarray(o)
            worst = max(worst, max_rel_err(o, w))
    row["max_rel_err"] = worst
    row["ok"] = bool(worst <= TOLERANCE.get(kernel.dtype, 1e-5))
    row["compile_and_run_s"] = round(time.perf_counter() - t0, 2)
    if target.startswith("cuda") and construct == "spmm_bias_relu":
        n, fused, names = launches(kernel.source())
        row.update(kernels=n, epilogue_fused=fused, kernel_names=names)
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="cuda", help="cuda (default: cuda:sm_90a on this GPU) or llvm")
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for check_dense_iterations.json")
    p.add_argument("--feat", type=int, default=32)
    p.add_argument("--families", default=";".join(FAMILIES), help="format specs separated by ';'")
    args = p.parse_args(argv)
    torch = None
    target = args.target
    if target == "cuda":
        import torch

        major, minor = torch.cuda.get_device_capability()
        target = f"cuda:sm_{major}{minor}" + ("a" if major >= 9 else "")
    mats = matrices()
    rows, failed = [], 0
    families = [f for f in args.families.split(";") if f]
    for spec in families:
        for construct in FORMULAS:
            try:
                row = run_one(construct, spec, target, args.feat, mats, torch)
            except Exception as e:  # noqa: BLE001  (reported in the table; the run goes on)
                row = {"construct": construct, "family": spec, "target": target, "ok": False,
                       "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
            failed += not row["ok"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    print()
    names = list(FORMULAS)
    print(f"{'family':42s} " + " ".join(f"{n[:14]:>14s}" for n in names) + "  launches(spmm+bias+relu)")
    for spec in families:
        cells, launch = [], ""
        for n in names:
            r = next(r for r in rows if r["family"] == spec and r["construct"] == n)
            cells.append(f"{'ERR' if 'error' in r else format(r['max_rel_err'], '.1e'):>13s}{'' if r['ok'] else '!'}")
            if "kernels" in r:
                launch = f"{r['kernels']} (epilogue {'in the SpMM kernel' if r['epilogue_fused'] else 'own launch'})"
        print(f"{spec:42s} " + " ".join(f"{c:>14s}" for c in cells) + f"  {launch}")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "check_dense_iterations.json")
    with open(path, "w") as f:
        json.dump({"target": target, "feat": args.feat, "rows": rows}, f, indent=1)
    print(f"\n{len(rows) - failed}/{len(rows)} ok; wrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
