#!/usr/bin/env python3
"""Tensor Core block SDDMM check and timing: sparsec's Tensor Core template vs its CUDA-core
template vs dense torch fp16 ``Q @ K.T`` then a gather (the peer a user would write).

Run on the GPU host:

    bash .gpu/stage2/install.sh >/dev/null && source .gpu/stage2/env.sh && python3 benchmarks/check_tensorcore_sddmm.py

Block-sparse attention scores ``S = A * (Q @ K.T)`` on A's stored bs x bs blocks (the library
``sddmm``: sampled by A) over random block patterns of N x N with one empty and one full
block row, square blocks of 16/32/64, fp16 operands, K (feat) in {32, 64, 24}; sparsec's
scores are fp32. Every kernel runs on a NaN-poisoned output and is compared slot by slot with
the float64 reference on the logical pattern (``sparsec.reference.evaluate``), and so is a
user-written scaled form (``S[i, j] += 0.125 * Q[i, k] * Kt[j, k]``, no A factor). Then the
Tensor Core kernel, the CUDA-core kernel (compiled with a CUDA-core knob) and the torch peer
are timed with CUDA events (median of ``--repeat`` batches of ``--number`` launches after a
warm-up). Prints a table, writes $OUT/tensorcore_sddmm_check.json, exits 1 on a wrong result.
``--target llvm --small`` is a CPU dry run of the script (generic template, no timing claims).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import scipy.sparse as sp

import _preamble  # noqa: F401,E402  (the one preamble: checkout root and benchmarks/data on sys.path)
import sparsec  # noqa: E402
from sparsec import dsl, ops  # noqa: E402
from sparsec.reference import TOLERANCE, evaluate, max_rel_err  # noqa: E402

BLOCKS = (16, 32, 64)
FEATS = (32, 64, 24)
CUDA_CORE = {"lanes": 0}  # a knob of the CUDA-core template (0: its default): keeps the kernel off Tensor Cores


def scaled_scores():
    """The user-written form: a constant scale in the dot, no A factor (padding guarded by the slot mask)."""
    op = dsl.Operator("scaled_scores", "S[i, j] = 0.125 * sum_k Q[i, k] * Kt[j, k] on A's pattern")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    K = op.dense_fixed("k", extent="feat")
    op.sparse_input("A", (I, J))
    Q, Kt = op.dense_input("Q", (I, K)), op.dense_input("Kt", (J, K))
    S = op.sparse_output("S", (I, J))
    with op.iterate([I, J, K], "SSR") as (i, j, k):
        S[i, j] += 0.125 * Q[i, k] * Kt[j, k]
    return op


def cases(small: bool):
    """(N, block, block density, feat): N not a multiple of the block in the small and 1000 cases."""
    if small:
        return [(100, b, 0.4, f) for b in (16, 32) for f in (32, 24)]
    out = [(4096, b, d, f) for b in BLOCKS for d in (0.1, 0.3) for f in FEATS]
    out += [(1000, b, 0.3, f) for b in BLOCKS for f in (64, 24)]
    return out


def block_pattern(n, b, density, seed):
    """n x n fp16 matrix of b x b blocks: block row 1 empty, block row 0 full, random elsewhere."""
    rng = np.random.default_rng(seed)
    nb = -(-n // b)
    mask = rng.random((nb, nb)) < density
    mask[min(1, nb - 1)], mask[0] = False, True
    dense = np.kron(mask, np.ones((b, b), np.float32))[:n, :n] * rng.standard_normal((n, n)).astype(np.float32)
    return sparsec.formats.convert(sp.csr_matrix(dense), f"bsr:{b}x{b}", dtype="float16"), float(mask.mean())


def slot_coordinates(A):
    """(row, col) of every stored slot of a BSR instance, clipped into the matrix (padding)."""
    b = A.format.param("block")[0]
    indptr, indices = A.arrays["indptr"], A.arrays["indices"]
    brow = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    ii, jj = np.meshgrid(np.arange(b), np.arange(b), indexing="ij")
    rows = (brow[:, None, None] * b + ii[None]).reshape(-1)
    cols = (indices[:, None, None] * b + jj[None]).reshape(-1)
    return np.minimum(rows, A.shape[0] - 1), np.minimum(cols, A.shape[1] - 1)


class Timer:
    """Median ms per launch of fn(), CUDA events around batches (perf_counter on the CPU)."""

    def __init__(self, on_gpu: bool, number: int, repeat: int):
        self.on_gpu, self.number, self.repeat = on_gpu, number, repeat

    def __call__(self, fn) -> float:
        import torch

        for _ in range(5):
            fn()
        ts = []
        for _ in range(self.repeat):
            if self.on_gpu:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                for _ in range(self.number):
                    fn()
                end.record()
                torch.cuda.synchronize()
                ts.append(start.elapsed_time(end) / self.number)
            else:
                t0 = time.perf_counter()
                for _ in range(self.number):
                    fn()
                ts.append((time.perf_counter() - t0) * 1e3 / self.number)
        return float(np.median(ts))


def run_case(n, b, density, feat, target, timer, device):
    import torch

    A, fill = block_pattern(n, b, density, seed=n + b + feat)
    rng = np.random.default_rng(feat)
    Q = rng.standard_normal((n, feat)).astype(np.float16)
    Kt = rng.standard_normal((n, feat)).astype(np.float16)
    row = {"n": n, "block": b, "block_density": round(fill, 4), "feat": feat, "stored_blocks": int(A.arrays["indices"].size)}
    Qd, Kd = torch.from_numpy(Q).to(device), torch.from_numpy(Kt).to(device)
    tol = TOLERANCE["float16"]
    results = {}
    on_gpu = target != "llvm"
    for name, op, knobs in (("tensor_core", ops.sddmm(), None), ("cuda_core", ops.sddmm(), CUDA_CORE if on_gpu else None),
                            ("tensor_core_scaled", scaled_scores(), None)):
        k = sparsec.compile(op, A, feat=feat, knobs=knobs, target=target)
        inputs = (Qd, Kd) if op.call_inputs()[0].name in ("X", "Q") else (Kd, Qd)
        out = k(A, *inputs, poison=True)
        ref = evaluate(op, A, *[t.cpu().numpy() for t in inputs], params={"feat": feat}, dtype="float16")
        err = max_rel_err(out.cpu().numpy(), ref)
        results[name] = {"knobs": k.knobs, "tensor_cores": on_gpu and "mma.sync" in k.source(),
                         "err": err, "ok": bool(err <= tol)}
        if name != "tensor_core_scaled":
            results[name]["ms"] = timer(lambda: k(A, *inputs))
    rows_i, cols_i = slot_coordinates(A)
    flat = torch.from_numpy(rows_i * n + cols_i).to(device)
    vals = torch.from_numpy(A.data).to(device)
    results["torch_dense_gather"] = {"ms": timer(lambda: (Qd @ Kd.T).reshape(-1)[flat] * vals)}
    row["results"] = results
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="cuda")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--number", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    on_gpu = args.target.startswith("cuda")
    device = "cuda" if on_gpu else "cpu"
    timer = Timer(on_gpu, args.number if not args.small else 2, args.repeat if not args.small else 3)
    rows = []
    for n, b, d, f in cases(args.small):
        rows.append(run_case(n, b, d, f, args.target, timer, device))
        r = rows[-1]["results"]
        print(f"N={n:5d} bs={b:2d} density={rows[-1]['block_density']:.2f} K={f:3d}  "
              f"tc {r['tensor_core'].get('ms', 0):.4f} ms  cuda-core {r['cuda_core']['ms']:.4f} ms  "
              f"torch {r['torch_dense_gather']['ms']:.4f} ms  "
              f"tc/cuda-core {r['cuda_core']['ms'] / r['tensor_core']['ms']:.2f}x  "
              f"tc/torch {r['torch_dense_gather']['ms'] / r['tensor_core']['ms']:.2f}x  "
              f"err {max(r[x]['err'] for x in ('tensor_core', 'cuda_core', 'tensor_core_scaled')):.1e}", flush=True)
    speed = {peer: float(np.exp(np.mean([np.log(r["results"][peer]["ms"] / r["results"]["tensor_core"]["ms"])
                                          for r in rows]))) for peer in ("cuda_core", "torch_dense_gather")}
    bad = [(r["n"], r["block"], r["feat"], name, x["err"]) for r in rows for name, x in r["results"].items()
           if "ok" in x and not x["ok"]]
    not_tc = [(r["n"], r["block"], r["feat"]) for r in rows if on_gpu and not r["results"]["tensor_core"]["tensor_cores"]]
    summary = {"target": args.target, "device": _device_name(on_gpu), "geomean_speedup_vs": speed,
               "wrong": bad, "not_on_tensor_cores": not_tc, "rows": rows}
    out_dir = os.environ.get("OUT", ".")
    with open(os.path.join(out_dir, "tensorcore_sddmm_check.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)
    print(f"geomean speedup of the Tensor Core kernel: x{speed['cuda_core']:.2f} vs CUDA cores, "
          f"x{speed['torch_dense_gather']:.2f} vs torch dense fp16 + gather")
    print("correct" if not bad else f"WRONG RESULTS: {bad}")
    if not_tc:
        print(f"not on Tensor Cores: {not_tc}")
    return 1 if bad or not_tc else 0


def _device_name(on_gpu: bool) -> str:
    import torch

    return torch.cuda.get_device_name() if on_gpu else "cpu"


if __name__ == "__main__":
    sys.exit(main())
