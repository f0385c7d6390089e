#!/usr/bin/env python3
"""BSR fp16 on Tensor Cores for every SpMM-shaped operator: checks against float64, and timings vs dense.

    python3 benchmarks/check_tensorcore_bsr.py [--target cuda|llvm] [--out DIR] [--no-timing]
                                               [--cases all|single|multihead]

Check: the library SpMM (8, 16, 24, 64 and 96 feature columns: 16 x 8 fragments, a guarded
last N tile), the user operator ``C[i, k] = relu(sum_j A[i, j] * B[j, k] + bias[i])``
(tests/dense_ops.py), a bias per column, and a per-row scale + constant + ReLU stored as
float16, on bsr:32x32 and bsr:16x16 matrices with empty block rows, one full (long) block
row and odd edges, each into a NaN-poisoned output, against ``reference.evaluate`` (float64
on the logical pattern). On CUDA every kernel must be the Tensor Core template (``n_tile``
among its knobs) and one launch.

Multi-head checks (``--cases multihead``): ``multihead_spmm`` (``C[i, h, f] = sum_j P[i, j, h] *
B[j, h, f]``, P per entry per head) with 1, 4 and 8 heads, 16 and 64 features, and the same
structure under a user's names with a scale + bias per (head, feature) + ReLU or a bias per
(row, head) (tests/multihead_ops.py), fp16, on bsr:16x16 and bsr:32x32 matrices
of an odd row count with an empty block row and padding inside stored blocks, into a
NaN-poisoned output, against ``reference.evaluate`` and (multihead_spmm) a float64 per-head
scipy product on the logical pattern.

Timing: a 768 x 3072 weight of 32 x 32 blocks at 90 % block sparsity (one empty block row),
fp16, B of 16 and 64 columns: sparsec (library SpMM and the bias + ReLU operator) vs dense
``torch.matmul`` (fp16, cuBLAS), median ms by ``sparsec.bench``'s timer. Multi-head: a
4096 x 4096 matrix of 32 x 32 blocks at 95 % block sparsity, 8 heads of 64 features: the
Tensor Core kernel vs the CUDA-core template on the same program vs ``torch.bmm`` of the
dense per-head matrices (fp16, cuBLAS).

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
from tests.multihead_ops import heads_row_bias, heads_scaled_relu  # noqa: E402

from _helpers import make_timed  # noqa: E402

OPERATORS = {"spmm": lambda: sparsec.ops.get("spmm"), "row_bias_relu": spmm_row_bias_relu,
             "col_bias_relu": spmm_bias_relu, "scaled_half": spmm_scaled_half}
CHECKS = [("spmm", f) for f in (8, 16, 24, 64, 96)] + [("row_bias_relu", f) for f in (16, 24, 64)] + \
    [("col_bias_relu", 16), ("scaled_half", 24)]
BLOCKS = (32, 16)
MULTIHEAD_OPERATORS = {"multihead_spmm": lambda: sparsec.ops.get("multihead_spmm"),
                       "heads_scaled_relu": heads_scaled_relu, "heads_row_bias": heads_row_bias}
MULTIHEAD_CHECKS = [  # (operator, heads, feat, dtype), on every block size
    ("multihead_spmm", 1, 16, "float16"), ("multihead_spmm", 1, 64, "float16"), ("multihead_spmm", 4, 16, "float16"),
    ("multihead_spmm", 4, 64, "float16"), ("multihead_spmm", 8, 16, "float16"), ("multihead_spmm", 8, 64, "float16"),
    ("heads_scaled_relu", 4, 64, "float16"), ("heads_row_bias", 8, 16, "float16")]
# bf16: the PTX is checked in tests/test_tensorcore_multihead.py; a bf16 matrix cannot be converted from numpy yet


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


def check_one(name, feat, bs, target, torch, knobs=None):
    op = OPERATORS[name]()
    dense = block_matrix(8 * bs - 5, 6 * bs - 3, bs, 0.6, seed=feat + bs)
    A = formats.convert(dense, f"bsr:{bs}x{bs}")
    k = sparsec.compile(op, A, feat=feat, target=target, knobs=knobs)
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


def multihead_reference(A, P, B):
    """float64 ``C[i, h, f] = sum_j P[i, j, h] * B[j, h, f]`` on ``A``'s logical pattern: per head,
    the scipy matrix of A's entries (canonical CSR order) carrying that head's values of P."""
    import scipy.sparse as sp

    m = A.to_scipy()
    out = np.zeros((A.shape[0], B.shape[1], B.shape[2]))
    for h in range(B.shape[1]):
        s = sp.csr_matrix((np.asarray(P[:, h], np.float64), m.indices, m.indptr), shape=A.shape)
        out[:, h, :] = s @ np.asarray(B[:, h, :], np.float64)
    return out


def multihead_inputs(k, A, heads, seed):
    """P (nnz, heads: one value per entry per head, some explicit zeros), then the dense inputs."""
    rng = np.random.default_rng(seed)
    dims = {"rows": A.shape[0], "cols": A.shape[1]}
    out = []
    for p in k.inputs:
        x = rng.standard_normal((A.nnz, heads) if p.sparse else tuple(dims.get(d, d) for d in p.shape))
        if p.sparse:
            x[rng.random(x.shape) < 0.05] = 0.0
        out.append(x.astype(p.dtype))
    return out


def to_numpy(x):
    return x.cpu().numpy() if hasattr(x, "cpu") else np.asarray(x)


def check_multihead(name, heads, feat, bs, dtype, target, torch, knobs=None):
    """One multi-head case (module docstring) into a NaN-poisoned output; on CUDA the kernel must
    be the Tensor Core template, one launch, with mma and ldmatrix."""
    op = MULTIHEAD_OPERATORS[name]()
    dense = block_matrix(8 * bs - 5, 6 * bs - 3, bs, 0.6, seed=heads * feat + bs)
    A = formats.convert(dense, f"bsr:{bs}x{bs}", dtype=dtype)
    params = {"heads": heads, "feat": feat}
    k = sparsec.compile(op, A, target=target, knobs=knobs, **params)
    ins = multihead_inputs(k, A, heads, seed=heads + feat)
    out = to_numpy(k(A, *(to_device(x, target, torch) for x in ins), poison=True))
    want = evaluate(op, A, *ins, params=params)
    err = max_rel_err(out, want)
    if name == "multihead_spmm":  # an independent float64 reference too
        err = max(err, max_rel_err(out, multihead_reference(A, ins[0], ins[1])))
    tol = TOLERANCE.get(dtype, 1e-2)
    row = {"op": name, "heads": heads, "feat": feat, "block": bs, "dtype": dtype, "shape": list(A.shape),
           "knobs": k.knobs, "max_rel_err": err, "nan": bool(np.isnan(out).any()), "tensorcore": "n_tile" in k.knobs}
    ok = err <= tol and not row["nan"]
    if name == "multihead_spmm":  # block row 1 is empty: zeros over the poison
        ok = ok and bool(np.all(out[bs:2 * bs] == 0))
    if target.startswith("cuda"):
        src = k.source()
        row["launches"] = src.count("__global__") // 2
        row["mma"] = "mma.sync" in src and "ldmatrix" in src
        ok = ok and row["tensorcore"] and row["mma"] and row["launches"] == 1
    row["ok"] = bool(ok)
    return row


def generic_kernel(op, A, params, target):
    """The kernel of ``op`` for ``A`` by the generic template (CUDA cores), skipping the Tensor
    Core dispatch: the same steps as ``sparsec.build.compile``'s generic branch."""
    import tvm
    from tvm import s_tir

    from sparsec.build import _param_specs, cuda_unroll_config
    from sparsec.kernel import Kernel
    from sparsec.lower import lower_program
    from sparsec.schedules import default_cpu, default_cuda, finalize_cuda
    from sparsec.targets import parse_target

    spec = parse_target(target)
    cuda = spec.kind == "cuda"
    func, program = lower_program(op, A.format, params, A.value_dtype, atomics=cuda)
    sch = s_tir.Schedule(func, enable_check=False)
    used = (default_cuda if cuda else default_cpu)(sch, program)
    mod = finalize_cuda(sch.mod, program) if cuda else sch.mod
    with spec.tvm_target(), tvm.transform.PassContext(opt_level=2, config=cuda_unroll_config() if cuda else {}):
        ex = tvm.compile(mod, target=spec.tvm_target())
    return Kernel(op.name, A.format.spec, spec, A.value_dtype, _param_specs(program), used, ex)


def time_multihead(target, torch, timed, heads=8, feat=64):
    """multihead_spmm: Tensor Cores vs the CUDA-core template vs torch.bmm of the dense per-head
    matrices (module docstring; 512 x 512 on llvm)."""
    n = 4096 if target.startswith("cuda") else 512
    dense = block_matrix(n, n, 32, 0.95, seed=11)
    A = formats.convert(dense, "bsr:32x32", dtype="float16")
    op = sparsec.ops.get("multihead_spmm")
    params = {"heads": heads, "feat": feat}
    k_tc = sparsec.compile(op, A, target=target, **params)
    k_cc = generic_kernel(op, A, params, target)
    rng = np.random.default_rng(5)
    P = rng.standard_normal((A.nnz, heads)).astype(np.float16)
    B = rng.standard_normal((A.shape[1], heads, feat)).astype(np.float16)
    Pe, Bd = A.edge_values(to_device(P, target, torch)), to_device(B, target, torch)  # laid out once
    want = multihead_reference(A, P, B)
    row = {"op": "multihead_spmm", "heads": heads, "feat": feat, "shape": [n, n], "block": 32, "block_sparsity": 0.95,
           "stored_blocks": int(A.arrays["indices"].size), "knobs": k_tc.knobs, "tensorcore": "n_tile" in k_tc.knobs}
    for key, k in (("tensorcore", k_tc), ("cuda_core", k_cc)):
        out = k(A, Pe, Bd, poison=True)
        row[f"{key}_err"] = max_rel_err(to_numpy(out), want)
        args, _, _ = k.prepare(A, Pe, Bd, out=out)
        f = k.executable[k.op_name]
        row[f"{key}_ms"] = timed(lambda _, f=f, args=args: f(*args), [None])
    m = A.to_scipy()
    per_head = np.zeros((heads,) + A.shape, np.float16)  # the dense per-head matrices on the logical pattern
    rows_of = np.repeat(np.arange(A.shape[0]), np.diff(m.indptr))
    for h in range(heads):
        per_head[h, rows_of, m.indices] = P[:, h]
    Ad, Bh = to_device(per_head, target, torch), to_device(np.ascontiguousarray(B.transpose(1, 0, 2)), target, torch)
    if target.startswith("cuda"):
        row["torch_bmm_ms"] = timed(lambda _: torch.bmm(Ad, Bh), [None])
    else:
        row["torch_bmm_ms"] = timed(lambda _: np.matmul(Ad.astype(np.float32), Bh.astype(np.float32)), [None])
    row["vs_cuda_core"] = row["cuda_core_ms"] / row["tensorcore_ms"]
    row["vs_torch_bmm"] = row["torch_bmm_ms"] / row["tensorcore_ms"]
    row["ok"] = bool(max(row["tensorcore_err"], row["cuda_core_err"]) <= TOLERANCE.get("float16", 1e-2))
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
    p.add_argument("--cases", choices=("all", "single", "multihead"), default="all",
                   help="the single-head operators, the multi-head ones, or both (default)")
    p.add_argument("--k-split", type=int, default=None,
                   help="every check with this many warp groups per block row (knob k_split; default: the "
                        "template's choice); a case whose other default knobs cannot take it is skipped")
    args = p.parse_args(argv)
    torch, target, device = None, args.target, "cpu"
    if target == "cuda":
        import torch

        major, minor = torch.cuda.get_device_capability()
        target, device = f"cuda:sm_{major}{minor}" + ("a" if major >= 9 else ""), "cuda"
    t0 = time.perf_counter()
    checks = []
    single, multi = args.cases in ("all", "single"), args.cases in ("all", "multihead")
    runs = [(check_one, (name, feat, bs), {"op": name, "feat": feat, "block": bs})
            for bs in BLOCKS for name, feat in (CHECKS if single else [])]
    runs += [(check_multihead, (name, heads, feat, bs, dtype),
              {"op": name, "heads": heads, "feat": feat, "block": bs, "dtype": dtype})
             for bs in BLOCKS for name, heads, feat, dtype in (MULTIHEAD_CHECKS if multi else [])]
    knobs = None if args.k_split is None or not target.startswith("cuda") else {"k_split": args.k_split}
    for fn, case, ident in runs:
        try:
            row = fn(*case, target, torch, knobs)
        except ValueError as e:
            if knobs is None or "bsr_tensorcore" not in str(e):
                raise
            row = {**ident, "ok": True, "skipped": str(e)[:200]}  # k_split does not fit this case's other knobs
        except Exception as e:  # noqa: BLE001  (reported in the table; the run goes on)
            row = {**ident, "ok": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
        checks.append(row)
        print(json.dumps(row), flush=True)
    timings, multihead_timings = [], []
    if not args.no_timing:
        timed = make_timed(device)
        for name in ("spmm", "row_bias_relu") if single else ():
            for feat in (16, 64):
                row = time_one(name, feat, target, torch, timed)
                timings.append(row)
                print(json.dumps(row), flush=True)
        if multi:
            row = time_multihead(target, torch, timed)
            multihead_timings.append(row)
            print(json.dumps(row), flush=True)
    print(f"\n{'op':>17} {'heads':>5} {'feat':>5} {'block':>5} {'dtype':>8} {'n_tile':>6} {'warp_n':>6} "
          f"{'max_rel_err':>11} {'tc':>3} ok")
    for r in checks:
        kn = r.get("knobs", {})
        err = "ERR" if "error" in r else "skip" if "skipped" in r else f"{r['max_rel_err']:.1e}"
        print(f"{r['op']:>17} {r.get('heads', '-'):>5} {r['feat']:>5} {r['block']:>5} {r.get('dtype', 'float16'):>8} "
              f"{kn.get('n_tile', '-'):>6} {kn.get('warp_n', '-'):>6} {err:>11} {'y' if r.get('tensorcore') else 'n':>3} "
              f"{'ok' if r['ok'] else 'WRONG'}")
    if timings:
        print(f"\n{'op':>14} {'feat':>5} {'n_tile':>6} {'sparsec ms':>10} {'dense ms':>9} {'x dense':>8}")
        for r in timings:
            print(f"{r['op']:>14} {r['feat']:>5} {r['knobs'].get('n_tile', '-'):>6} {r['sparsec_ms']:>10.4f} "
                  f"{r['dense_ms']:>9.4f} {r['speedup_vs_dense']:>8.2f}")
    if multihead_timings:
        print(f"\n{'op':>14} {'heads':>5} {'feat':>5} {'tc ms':>8} {'cuda-core ms':>12} {'bmm ms':>8} "
              f"{'x cuda-core':>11} {'x bmm':>6}")
        for r in multihead_timings:
            print(f"{r['op']:>14} {r['heads']:>5} {r['feat']:>5} {r['tensorcore_ms']:>8.4f} {r['cuda_core_ms']:>12.4f} "
                  f"{r['torch_bmm_ms']:>8.4f} {r['vs_cuda_core']:>11.2f} {r['vs_torch_bmm']:>6.2f}")
    failed = sum(not r["ok"] for r in checks + multihead_timings)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "check_tensorcore_bsr.json")
    with open(path, "w") as f:
        json.dump({"target": target, "device": torch.cuda.get_device_name() if torch else "cpu",
                   "checks": checks, "timings": timings, "multihead_timings": multihead_timings,
                   "wall_s": round(time.perf_counter() - t0, 1)}, f, indent=1)
    total = len(checks) + len(multihead_timings)
    print(f"\n{total - failed}/{total} ok; wrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
