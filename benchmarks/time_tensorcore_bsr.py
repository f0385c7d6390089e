"""Tensor Core BSR SpMM check and timing: sparsec vs torch BSR (Triton) vs dense cuBLAS, fp16.

Run on the GPU host:

    bash .gpu/stage2/install.sh >/dev/null && source .gpu/stage2/env.sh && python3 benchmarks/time_tensorcore_bsr.py

C = A @ B with A (M x K) block-sparse (random block masks at 70/90/95 % block sparsity,
square blocks of 16/32/64, fp16 values) and B dense K x N (fp16); sparsec's output is fp32
(fp32 accumulation). Each result is computed into a NaN-poisoned output and compared with
torch's float64 product on the GPU; then sparsec's kernel, ``A.to_sparse_bsr((b, b)) @ B``
and the dense ``torch.matmul`` (both fp16) are timed with CUDA events (median of
``--repeat`` batches of ``--number`` launches, after a warm-up). A small knob sweep of the
Tensor Core template runs on one shape. Writes $OUT/tensorcore_check.json and prints a
table last. ``--target llvm --small`` is a CPU dry run at tiny sizes (generic template).
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import torch

import _preamble  # noqa: F401,E402  (the one preamble: checkout root and benchmarks/data on sys.path)
import sparsec  # noqa: E402
from sparsec.formats import convert  # noqa: E402

TOL = 2e-3  # relative to max |ref|: fp16 inputs are exact in float64, sums are fp32
SPARSITY = (0.70, 0.90, 0.95)
BLOCKS = (16, 32, 64)


def cases(small: bool):
    """(M, K, N, block, sparsity): every combination on 4096 x 4096, a subset on 1024 x 4096."""
    if small:
        return [(96, 64, n, b, s) for b in (16, 32) for s in (0.7, 0.9) for n in (64, 128)]
    out = [(4096, 4096, n, b, s) for b in BLOCKS for s in SPARSITY for n in (512, 2048, 4096, 8192)]
    out += [(1024, 4096, n, b, s) for b in BLOCKS for s in SPARSITY for n in (512, 4096)]
    return out


def sweep(small: bool):
    """Knob combinations of the Tensor Core template on one shape."""
    if small:
        return (96, 64, 128, 32, 0.9), [{}]
    knobs = [{"stages": s} for s in (1, 2, 3, 4)]
    knobs += [{"n_tile": 64, "warp_m": 32, "warp_n": 32}, {"n_tile": 256, "warp_m": 32, "warp_n": 64},
              {"n_tile": 128, "warp_m": 16, "warp_n": 64}, {"n_tile": 128, "warp_m": 32, "warp_n": 64},
              {"n_tile": 256, "warp_m": 32, "warp_n": 32}, {"n_tile": 128, "warp_m": 16, "warp_n": 32}]
    return (4096, 4096, 4096, 32, 0.9), knobs


def block_mask_matrix(M, K, b, sparsity, seed):
    rng = np.random.default_rng(seed)
    mb, kb = -(-M // b), -(-K // b)
    mask = rng.random((mb, kb)) >= sparsity
    mask[rng.integers(mb)] = False  # one empty block row: its outputs must be written as zeros
    vals = rng.standard_normal((mb * b, kb * b)).astype(np.float16)
    return (np.kron(mask, np.ones((b, b), np.float16)) * vals)[:M, :K], float(mask.mean())


class Timer:
    """Median ms per launch of fn(), CUDA events around batches (perf_counter on the CPU)."""

    def __init__(self, on_gpu: bool, number: int, repeat: int):
        self.on_gpu, self.number, self.repeat = on_gpu, number, repeat

    def __call__(self, fn) -> float:
        for _ in range(3):
            fn()
        if not self.on_gpu:
            ts = []
            for _ in range(self.repeat):
                t0 = time.perf_counter()
                for _ in range(self.number):
                    fn()
                ts.append((time.perf_counter() - t0) * 1e3 / self.number)
            return float(np.median(ts))
        torch.cuda.synchronize()
        ts = []
        for _ in range(self.repeat):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(self.number):
                fn()
            end.record()
            end.synchronize()
            ts.append(start.elapsed_time(end) / self.number)
        return float(np.median(ts))


def run_case(M, K, N, b, s, knobs, target, dev, timer, kernels, seed=0, time_baselines=True):
    dense, fill = block_mask_matrix(M, K, b, s, seed)
    A = convert(dense, f"bsr:{b}x{b}")
    key = (b, N, target, tuple(sorted(knobs.items())))
    if key not in kernels:
        t0 = time.perf_counter()
        kernels[key] = sparsec.compile("spmm", f"bsr:{b}x{b}", feat=N, dtype="float16", knobs=knobs, target=target)
        kernels[key].extra["wall_compile_s"] = time.perf_counter() - t0
    k = kernels[key]
    Bt = torch.randn(K, N, dtype=torch.float16, device=dev)
    At = torch.from_numpy(dense).to(dev)
    out = k(A, Bt, poison=True)
    ref = At.double() @ Bt.double()
    err = float((out.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
    args, _, _ = k.prepare(A, Bt, out=out)
    f = k.executable[k.op_name]
    row = {"M": M, "K": K, "N": N, "block": b, "sparsity": s, "block_fill": fill, "nnz_blocks": int(A.arrays["indices"].size),
           "knobs": k.knobs, "tensorcore": "n_tile" in k.knobs, "max_rel_err": err, "ok": bool(err <= TOL),
           "compile_s": round(k.extra.get("wall_compile_s", 0.0), 2)}
    row["sparsec_ms"] = timer(lambda: f(*args))
    flops = 2.0 * row["nnz_blocks"] * b * b * N
    row["sparsec_tflops"] = flops / row["sparsec_ms"] / 1e9
    if time_baselines:
        try:
            Absr = At.to_sparse_bsr((b, b))
            row["torch_bsr_ms"] = timer(lambda: Absr @ Bt)
        except Exception as e:  # torch BSR fp16 is GPU-only
            row["torch_bsr_ms"], row["torch_bsr_error"] = None, f"{type(e).__name__}: {str(e)[:120]}"
        try:
            row["dense_ms"] = timer(lambda: torch.matmul(At, Bt))
        except Exception as e:
            row["dense_ms"], row["dense_error"] = None, f"{type(e).__name__}: {str(e)[:120]}"
        for name in ("torch_bsr", "dense"):
            t = row.get(f"{name}_ms")
            row[f"speedup_vs_{name}"] = t / row["sparsec_ms"] if t else None
    return row


def fmt(x, spec):
    return format(x, spec) if isinstance(x, (int, float)) else "-"


def main():
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="cuda", help="cuda (default) or llvm: a CPU dry run")
    ap.add_argument("--small", action="store_true", help="tiny shapes (for --target llvm)")
    ap.add_argument("--number", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--no-sweep", action="store_true")
    args = ap.parse_args()
    on_gpu = args.target.startswith("cuda")
    if on_gpu and not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --target llvm --small for a CPU dry run")
    dev = "cuda" if on_gpu else "cpu"
    timer = Timer(on_gpu, args.number if on_gpu else 2, args.repeat if on_gpu else 3)
    out_dir = os.environ.get("OUT", ".")
    kernels, rows, t_start = {}, [], time.perf_counter()
    for M, K, N, b, s in cases(args.small):
        row = run_case(M, K, N, b, s, {}, args.target, dev, timer, kernels)
        rows.append(row)
        print(f"{M}x{K} N={N} b={b} sp={s:.2f}: err {row['max_rel_err']:.1e} sparsec {row['sparsec_ms']:.4f} ms "
              f"({row['sparsec_tflops']:.1f} TF/s) bsr {fmt(row.get('torch_bsr_ms'), '.4f')} "
              f"dense {fmt(row.get('dense_ms'), '.4f')} tc={row['tensorcore']}", flush=True)
    sweep_rows = []
    if not args.no_sweep:
        (M, K, N, b, s), knob_list = sweep(args.small)
        for knobs in knob_list:
            row = run_case(M, K, N, b, s, knobs, args.target, dev, timer, kernels, time_baselines=False)
            sweep_rows.append(row)
            print(f"sweep {knobs}: {row['knobs']} err {row['max_rel_err']:.1e} {row['sparsec_ms']:.4f} ms "
                  f"({row['sparsec_tflops']:.1f} TF/s)", flush=True)
    result = {"target": args.target, "device": torch.cuda.get_device_name() if on_gpu else "cpu",
              "torch": torch.__version__, "tol": TOL, "rows": rows, "sweep": sweep_rows,
              "all_ok": all(r["ok"] for r in rows + sweep_rows), "wall_s": time.perf_counter() - t_start}
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tensorcore_check.json"), "w") as f:
        json.dump(result, f, indent=1)

    print(f"\n{'shape':>10} {'N':>5} {'b':>3} {'sparse':>6} {'err':>8} {'sparsec ms':>10} {'TF/s':>6} "
          f"{'bsr ms':>8} {'dense ms':>8} {'x bsr':>6} {'x dense':>7}")
    for r in rows:
        print(f"{r['M']}x{r['K']:<5} {r['N']:>5} {r['block']:>3} {r['sparsity']:>6.2f} {r['max_rel_err']:>8.1e} "
              f"{r['sparsec_ms']:>10.4f} {r['sparsec_tflops']:>6.1f} {fmt(r.get('torch_bsr_ms'), '8.4f'):>8} "
              f"{fmt(r.get('dense_ms'), '8.4f'):>8} {fmt(r.get('speedup_vs_torch_bsr'), '6.2f'):>6} "
              f"{fmt(r.get('speedup_vs_dense'), '7.2f'):>7}")
    for r in sweep_rows:
        print(f"sweep {r['knobs']}: {r['sparsec_ms']:.4f} ms {r['sparsec_tflops']:.1f} TF/s err {r['max_rel_err']:.1e}")
    print(f"all within {TOL}: {result['all_ok']}  ({result['wall_s']:.0f} s)")
    return 0 if result["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
