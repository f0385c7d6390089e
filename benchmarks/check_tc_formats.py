"""GPU check: the packed Tensor Core SpMM reached through ``sparsec.compile`` (mma_sp, nm 2:4,
nm_tc, int8 srbcrs), against float64 and against the hand-written kernels it replaces.

1. Correctness: the library SpMM, a user's DSL operator with an epilogue
   (``C[i, k] = relu(sum_j A[i, j] * B[j, k] + bias[i])``) and ``sparsec.tc_linear``'s
   operators (float16 output written token-major ``C[k, i]``, float32 bias per row, GELU;
   and feature-major with ReLU) compiled for each format on CUDA,
   on odd sizes with an empty row and an explicit zero, NaN-poisoned outputs, checked against
   the float64 reference on the logical pattern (integer kernels exactly); each kernel must
   be the Tensor Core one (its packed operands among its parameters).
2. Speed: the committed cases of ``results/nm_tc_H200.json`` (tc_pipeline built by hand per
   shape) and ``results/lowprec_int8_H200.json`` (srbcrs_tensorcore), same weights
   (``time_tc_pipeline.weights``, ``lowprec.lowprec``) and widths; the hand-written kernel
   with the knob set that was best in the committed run and the compiled one with the
   compiler's default knobs, timed side by side in this run; ratio = hand-written ms /
   compiled ms (> 1: the compiler is faster). The fp16 cases compile the SpMM with its
   output declared float16 (what the hand-written kernels wrote), so both store the same bytes.

    python3 benchmarks/check_tc_formats.py [--quick] [--out FILE]   (JSON also to $OUT)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

import _preamble  # noqa: F401,E402  (the one preamble: checkout root and benchmarks/data on sys.path)

from sparsec.bench.report import geomean  # noqa: E402
from tests.dense_ops import spmm_row_bias_relu  # noqa: E402  (the user operator the CI tests check too)

RESULTS = Path(__file__).parent / "results"
PACKED = {"sp24_values", "gather_values", "indptr"}
FLOAT_SPECS = ("mma_sp", "nm:2:4", "nm_tc:1:8:v16", "nm_tc:2:8:v128")
INT_SPECS = ("srbcrs:v2,int8", "srbcrs:v8,int8")
SHAPES = ((37, 70, 16), (1000, 515, 64), (130, 200, 32), (300, 768, 128))


def spmm_half_out():
    """The library SpMM with its output declared float16 (the sum still in float32)."""
    from sparsec import dsl

    op = dsl.Operator("spmm_half_out", "C = A @ B, C stored in float16")
    i = op.dense_fixed("i")
    j = op.sparse_variable("j", parent=i)
    k = op.dense_fixed("k", extent="feat")
    A, B = op.sparse_input("A", (i, j)), op.dense_input("B", (j, k))
    C = op.dense_output("C", (i, k), dtype="float16")
    with op.iterate([i, j, k], "SRS") as (ii, jj, kk):
        C[ii, kk] += A[ii, jj] * B[jj, kk]
    return op


def linear_ops():
    """tc_linear's operators: token-major fp16 output with bias and GELU; feature-major ReLU."""
    from sparsec.tc_linear import linear_operator

    return [linear_operator(True, "gelu", True, "float16"), linear_operator(True, "relu", False, "float16")]


def matrix(spec, rows, cols, rng):
    """A matrix in ``spec``'s pattern with an empty row and an explicit zero (float16 or int8)."""
    import scipy.sparse as sp

    from sparsec import formats
    from sparsec.formats import nm_tc

    w = rng.standard_normal((rows, cols)).astype(np.float32)
    w[min(3, rows - 1)] = 0
    if spec.startswith("srbcrs"):
        w = np.where(rng.random(w.shape) < 0.2, np.round(np.clip(w * 40, -127, 127)), 0)
        m = sp.csr_matrix(w)
        m.data[:1] = 0
        return formats.convert(m, spec)
    if spec.startswith("nm_tc"):
        fmt = formats.make_format(spec)
        n, mm, vec = (fmt.param(k) for k in ("n", "m", "vec"))
        m = sp.csr_matrix(nm_tc.prune(w, n=n, m=mm, vec=vec))
    else:
        m = sp.csr_matrix(formats.nm.prune(w, n=2, m=4)[0].to_dense())
    m.data[:1] = 0
    return formats.convert(m, spec, dtype=np.float16)


def reference(A, B, bias=None):
    c = A.to_scipy().astype(np.float64) @ np.asarray(B, np.float64)
    if bias is not None:
        c = np.maximum(c + np.asarray(bias, np.float64)[:, None], 0)
    return c


def check_linear_layers(rng, rows_out):
    """``tc_linear.TensorCoreLinear`` layers against float64 on NaN-poisoned outputs, where
    the compiled-operator checks do not reach: bfloat16 (its matrix a float32 instance,
    packed to bfloat16 by the layer; the kernel still carries the body sized for it) and
    token counts the kernel does not take (not a multiple of 16 in gather mode: the layer
    pads the input), with a pruned-away row, odd sizes, a bias and GELU, token-major and
    feature-major outputs."""
    import math

    import torch

    from sparsec.tc_linear import TensorCoreLinear, prune

    ok_all = True
    for pattern, dtype, (rows, cols), tokens in (
            ("nm_tc:1,10", torch.bfloat16, (300, 770), 16), ("nm_tc:2,8", torch.bfloat16, (768, 3072), 200),
            ("nm_tc:1,4", torch.bfloat16, (1000, 515), 64), ("nm_tc:1,10", torch.float16, (768, 3072), 200),
            ("nm_tc:1,8", torch.float16, (256, 768), 1), ("mma_sp:2,4", torch.float16, (300, 768), 37)):
        w = prune(rng.standard_normal((rows, cols)).astype(np.float32), pattern)
        w[min(3, rows - 1)] = 0
        w = torch.from_numpy(w).to(dtype).float()  # the weight the layer holds, exactly
        bias = torch.from_numpy(rng.standard_normal(rows).astype(np.float32))
        layer = TensorCoreLinear.from_dense(w, bias, pattern, activation="gelu", dtype=dtype)
        x = torch.randn(cols, tokens, device="cuda").to(dtype)
        h = w.double().cuda() @ x.double() + bias.double().cuda()[:, None]
        ref = 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))
        name = f"{pattern} {str(dtype)[6:]}"
        for token_major in (True, False):
            got = layer.forward_feature_major(x, token_major).double()
            got = got.t() if token_major else got
            err = float(torch.nan_to_num((got - ref).abs() / (ref.abs() + 1), nan=math.inf).max())
            sized = layer.kernel(tokens, token_major).source().count("__global__") == 4
            ok = err <= (2e-2 if dtype == torch.bfloat16 else 1e-2) and sized and got.shape == ref.shape
            ok_all &= ok
            rows_out.append({"spec": name + " layer", "op": "token-major" if token_major else "feature-major",
                             "rows": rows, "cols": cols, "feat": tokens, "tensor_core": True,
                             "kernel_tokens": layer.kernel_tokens(tokens), "sized_body": sized, "err": err, "ok": ok})
            print(f"{'ok ' if ok else 'BAD'} {name:<20} {'layer, gelu':<18} {rows}x{cols} tokens={tokens:<4} "
                  f"(kernel {layer.kernel_tokens(tokens)}) sized={sized} err={err:.2e}", flush=True)
    return ok_all


def check_correctness(rng, rows_out, suites=("nm", "int8")):
    import torch

    import sparsec

    from sparsec.reference import evaluate

    ok_all = True
    user = spmm_row_bias_relu()
    linear = linear_ops()
    specs = (FLOAT_SPECS if "nm" in suites else ()) + (INT_SPECS if "int8" in suites else ())
    for spec in specs:
        for rows, cols, feat in SHAPES:
            A = matrix(spec, rows, cols, rng)
            integer = spec.startswith("srbcrs")
            for op in linear if not integer else ():
                k = sparsec.compile(op, A, target="cuda", tokens=feat)
                tc = bool(PACKED & {p.name for p in k.params})
                B = torch.from_numpy(rng.standard_normal((cols, feat)).astype(np.float16)).cuda()
                bias = torch.from_numpy(rng.standard_normal(rows).astype(np.float32)).cuda()
                out = k(A, B, bias, poison=True).cpu().numpy().astype(np.float64)
                ref = evaluate(op, A, B.cpu().numpy(), bias.cpu().numpy(), params={"tokens": feat})
                err = float(np.nanmax(np.abs(out - ref) / (np.abs(ref) + 1.0))) if out.size else 0.0
                ok = bool(np.isfinite(out).all()) and err <= 1e-2 and tc and out.shape == ref.shape
                ok_all &= ok
                rows_out.append({"spec": spec, "op": op.name, "rows": rows, "cols": cols, "feat": feat,
                                 "tensor_core": tc, "err": err, "ok": ok})
                print(f"{'ok ' if ok else 'BAD'} {spec:<16} {op.name:<22} {rows}x{cols} feat={feat:<4} "
                      f"tc={tc} err={err:.2e}", flush=True)
            for op in ("spmm",) if integer else ("spmm", user):
                k = sparsec.compile(op, A, target="cuda", feat=feat)
                tc = bool(PACKED & {p.name for p in k.params})
                if integer:
                    B = torch.from_numpy(rng.integers(-20, 20, (cols, feat)).astype(np.int8)).cuda()
                    dense = (B,)
                else:
                    B = torch.from_numpy(rng.standard_normal((cols, feat)).astype(np.float16)).cuda()
                    dense = (B,) if op == "spmm" else (B, torch.from_numpy(
                        rng.standard_normal(rows).astype(np.float16)).cuda())
                out = k(A, *dense, poison=True).cpu().numpy().astype(np.float64)
                ref = reference(A, dense[0].cpu().numpy(), None if len(dense) == 1 else dense[1].cpu().numpy())
                if integer:
                    err = float(np.abs(out - ref).max()) if out.size else 0.0
                    ok = err == 0.0
                else:
                    err = float(np.nanmax(np.abs(out - ref) / (np.abs(ref) + 1.0))) if out.size else 0.0
                    ok = bool(np.isfinite(out).all()) and err <= 1e-2
                ok = ok and tc
                ok_all &= ok
                name = op if isinstance(op, str) else op.name
                rows_out.append({"spec": spec, "op": name, "rows": rows, "cols": cols, "feat": feat,
                                 "tensor_core": tc, "err": err, "ok": ok})
                print(f"{'ok ' if ok else 'BAD'} {spec:<16} {name:<22} {rows}x{cols} feat={feat:<4} "
                      f"tc={tc} err={err:.2e}", flush=True)
    for spec in specs:  # a kernel compiled for one matrix, run on another (any-size body)
        (r1, c1, feat), (r2, c2, _) = SHAPES[1], SHAPES[3]
        k = sparsec.compile("spmm", matrix(spec, r1, c1, rng), target="cuda", feat=feat)
        A = matrix(spec, r2, c2, rng)
        if spec.startswith("srbcrs"):
            B = torch.from_numpy(rng.integers(-20, 20, (c2, feat)).astype(np.int8)).cuda()
        else:
            B = torch.from_numpy(rng.standard_normal((c2, feat)).astype(np.float16)).cuda()
        out = k(A, B, poison=True).cpu().numpy().astype(np.float64)
        ref = reference(A, B.cpu().numpy())
        if spec.startswith("srbcrs"):
            err = float(np.abs(out - ref).max())
            ok = err == 0.0
        else:
            err = float(np.nanmax(np.abs(out - ref) / (np.abs(ref) + 1.0)))
            ok = bool(np.isfinite(out).all()) and err <= 1e-2
        ok_all &= ok
        rows_out.append({"spec": spec, "op": "spmm (compiled for another matrix)", "rows": r2, "cols": c2,
                         "feat": feat, "tensor_core": True, "err": err, "ok": ok})
        print(f"{'ok ' if ok else 'BAD'} {spec:<16} {'spmm, other matrix':<22} {r2}x{c2} feat={feat:<4} "
              f"err={err:.2e}", flush=True)
    return ok_all


def timed(k, A, dense):
    return k.time(A, *dense, number=50, repeat=5)["median_ms"]


def side_by_side(compiled, hand):
    """(compiled ms, hand ms): each timed twice, in the order compiled, hand, compiled, hand,
    the lower median of each kept -- on 4-5 us kernels, which one runs first otherwise shows
    in the ratio."""
    c1, h1, c2, h2 = compiled(), hand(), compiled(), hand()
    return min(c1, c2), min(h1, h2)


def timed_hand(ex, name, args):
    """The hand-written kernel timed the way ``Kernel.time`` times the compiled one (TVM's time
    evaluator, 5 x 50 runs after a warm-up), in the same process."""
    import tvm

    ev = ex.mod.time_evaluator(name, tvm.cuda(0), number=50, repeat=5)
    return float(np.median([float(r) for r in ev(*args).results])) * 1e3


def speed_nm(rng, quick, rows_out, widths=None):
    import torch

    import sparsec
    from sparsec.schedules import tc_pipeline as tp
    from time_tc_pipeline import GATHER, operands, weights

    cases = json.load(open(RESULTS / "nm_tc_H200.json"))["cases"]
    spec_of = {"sp24": "mma_sp", "gather": "nm_tc:1:8:v128"}
    half = spmm_half_out()
    for mode in ("sp24", "gather"):
        layers = dict(weights(mode))
        for c in (c for c in cases if c["mode"] == mode and c["case"] in layers and c.get("best")):
            if (quick and c["N"] not in (16, 512, 4096)) or (widths and c["N"] not in widths):
                continue
            A = sparsec.formats.convert(layers[c["case"]], spec_of[mode], dtype=np.float16)
            k = sparsec.compile(half, A, target="cuda", feat=int(c["N"]))
            B = torch.from_numpy(rng.standard_normal((c["K"], c["N"])).astype(np.float16)).cuda()
            (da, de), kc = operands(mode, layers[c["case"]])
            ex = tp.build(mode, c["M"], c["K"], c["N"], arch="sm_90a", out_dtype="float16", vec=GATHER["vec"], kc=kc,
                          **c["best"]["knobs"])
            out = torch.empty((c["M"], c["N"]), dtype=torch.float16, device="cuda")
            ms, hand = side_by_side(lambda: timed(k, A, (B,)), lambda: timed_hand(ex, "tc_spmm", (da, de, B, out)))
            rows_out.append({"suite": "nm_tc_H200", "mode": mode, "case": c["case"], "M": c["M"], "K": c["K"],
                             "N": c["N"], "compiled_ms": ms, "hand_ms": hand, "ratio": hand / ms, "knobs": k.knobs})
            print(f"{mode:<7} {c['case']:<32} N={c['N']:<5} compiled {ms:.4f} ms  hand {hand:.4f} ms  "
                  f"ratio {hand / ms:.2f}", flush=True)


def speed_int8(rng, quick, rows_out, widths=None):
    import torch

    import sparsec
    from lowprec import SPARSITIES, VECS, lowprec
    from sparsec.schedules import srbcrs_tensorcore as stc

    cases = json.load(open(RESULTS / "lowprec_int8_H200.json"))["cases"]
    layers = {name: (w, vec) for name, w, vec, _ in lowprec(vecs=VECS, sparsities=SPARSITIES)}
    for c in cases:
        if c["case"] not in layers or (quick and (c["N"] not in (16, 2048) or c["sparsity"] != 0.9)) or (
                widths and c["N"] not in widths):
            continue
        w, vec = layers[c["case"]]
        scale = float(np.abs(w).max()) / 127 or 1.0
        q = np.clip(np.round(w / scale), -127, 127)
        A = sparsec.formats.convert(q, f"srbcrs:v{vec},int8")
        k = sparsec.compile("spmm", A, target="cuda", feat=int(c["N"]))
        B = torch.from_numpy(rng.integers(-127, 127, (c["K"], c["N"])).astype(np.int8)).cuda()
        best = min((e for e in c["kernels"] if e.get("ms")), key=lambda e: e["ms"])
        ip, ix = (torch.from_numpy(A.arrays[n].astype(np.int32)).cuda() for n in ("indptr", "indices"))
        dv = torch.from_numpy(A.data.view(np.int32)).cuda().view(torch.uint32)
        ex = stc.build(c["M"], c["K"], int(c["N"]), vec, arch="sm_90a", **best["knobs"])
        out = torch.empty((c["M"], c["N"]), dtype=torch.int32, device="cuda")
        ms, hand = side_by_side(lambda: timed(k, A, (B,)),
                                lambda: timed_hand(ex, "srbcrs_spmm", (ip, ix, dv, B, out)))
        rows_out.append({"suite": "lowprec_int8_H200", "case": c["case"], "M": c["M"], "K": c["K"], "N": c["N"],
                         "compiled_ms": ms, "hand_ms": hand, "ratio": hand / ms, "knobs": k.knobs})
        print(f"int8    {c['case']:<32} N={c['N']:<5} compiled {ms:.4f} ms  hand {hand:.4f} ms  "
              f"ratio {hand / ms:.2f}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="three widths per layer, 90 %% sparsity for int8")
    ap.add_argument("--out")
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--widths", nargs="+", type=int, help="time only these columns of B (default: every committed width)")
    ap.add_argument("--skip-checks", action="store_true", help="the speed part alone")
    ap.add_argument("--suites", nargs="+", choices=("nm", "int8"), default=["nm", "int8"],
                    help="which formats the checks cover (nm: the float ones, int8: srbcrs) and which "
                         "committed suites the speed part times")
    args = ap.parse_args()
    rng = np.random.default_rng(23)
    checks, speed = [], []
    ok = True if args.skip_checks else check_correctness(rng, checks, args.suites)
    if not args.skip_checks and "nm" in args.suites:
        ok = check_linear_layers(rng, checks) and ok
    if not args.skip_speed:
        if "nm" in args.suites:
            speed_nm(rng, args.quick, speed, args.widths)
        if "int8" in args.suites:
            speed_int8(rng, args.quick, speed, args.widths)
    summary = {}
    for suite in sorted({r["suite"] for r in speed}):
        ratios = [r["ratio"] for r in speed if r["suite"] == suite]
        summary[suite] = {"geomean_ratio": geomean(ratios), "min_ratio": min(ratios), "cases": len(ratios)}
        print(f"{suite}: geomean hand/compiled {geomean(ratios):.3f}, min {min(ratios):.3f} over {len(ratios)}")
    result = {"checks_ok": ok, "checks": checks, "speed": speed, "summary": summary}
    for path in filter(None, (args.out, os.environ.get("OUT") and os.path.join(os.environ["OUT"],
                                                                                "check_tc_formats.json"))):
        Path(path).write_text(json.dumps(result, indent=1))
    print("all checks ok" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
