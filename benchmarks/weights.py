#!/usr/bin/env python3
"""Structured sparse weights against dense cuBLAS fp16 and the vendor peers (issue 24, one
command): a layer ``y = x @ W.T`` with ``x`` token-major (tokens, in), as ``nn.Linear`` runs it.

    python3 benchmarks/weights.py [--layers NAME ..] [--patterns bsr32 bsr64 2:4 nm1:10 nm1:8 nm1:4 int8]
                                  [--sparsity 50 70 90 95] [--tokens 16 128 1024 4096 8192]
                                  [--kernel-knobs JSON] [--resume] [--list] [--out FILE]

Layers: MiniLM's real attention-Q and FFN weights (when ``benchmarks/data/fetch.py
--minilm`` has cached them), BERT-base-sized (768 x 768, 3072 x 768, 768 x 3072), 4096 x
4096, and the LLM MLP's 11008 x 4096 and 4096 x 11008, random weights pruned by magnitude:

* ``bsr32`` / ``bsr64``: blocks of 32 / 64 by their norms to each ``--sparsity``
  (``sparsec.bench.suites.prune_blocks``);
* ``2:4`` and ``nm1:M`` (vector-wise, 128-row vectors): ``sparsec.tc_linear.prune``;
* ``int8``: SR-BCRS with 8-row vectors at 90 %, values int8 (``lowprec.prune_vectors``).

Per case, all in one process on the same inputs: sparsec's ``SparseLinear`` forward on the
token-major input (what a user calls: any layout change it makes is in its time), and for
BSR its SpMM kernel alone on the feature-major input; dense ``F.linear`` fp16 on the pruned
weight; torch BSR (``to_sparse_bsr``, its Triton kernel) for the BSR patterns;
cuSPARSELt's best algorithm and split-K for 2:4 (``time_cslt_peer.best_config``); dense
int8 ``torch._int_mm`` for int8. Every sparsec result is checked against the float64
product of the pruned weight (max error relative to the output's largest entry), the
kernel's on a NaN-poisoned output. Times: CUDA-graph replay medians
(``sparsec.measure.Timer``). Each case is written to FILE as it finishes (``--resume``
skips the cases FILE holds), one record per case: ``layer, rows, cols, pattern, sparsity,
tokens, sparsec_ms, sparsec_kernel_ms, dense_ms, peers, max_rel_err, ok``, with the bytes
the sparse layer reads and writes and the dense-equivalent TFLOP/s. Prints a short table
last: per pattern and sparsity, the geomean ratio to dense over the layers of at least 768 x
3072 at 1024 tokens or more, and the lowest ratio at 16-128 tokens on every layer.
"""
from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

import numpy as np

import _preamble  # noqa: F401,E402  (the one preamble: checkout root and benchmarks/data on sys.path)

LLM_SHAPES = {"square-4096": (4096, 4096), "llm-up": (11008, 4096), "llm-down": (4096, 11008)}
PATTERNS = ("bsr32", "bsr64", "2:4", "nm1:10", "nm1:8", "nm1:4", "int8")
SPARSITIES = (50, 70, 90, 95)
TOKENS = (16, 128, 1024, 4096, 8192)
BIG = 768 * 3072  # the ratios are geomeans over layers of at least this many weights
TOL = {"float16": 2e-2, "int8": 6e-2}  # relative to the output's largest entry (int8: quantized activations)


def layers(names=None):
    """[(name, float32 weight (out, in))]: MiniLM's and BERT-base-sized (``lowprec.weights``),
    then 4096 x 4096 and the LLM MLP's shapes, random (0.02 scale, seeded by shape)."""
    from lowprec import weights

    out = list(weights())
    for name, (rows, cols) in LLM_SHAPES.items():
        g = np.random.Generator(np.random.PCG64([24, rows, cols]))
        out.append((name, (0.02 * g.standard_normal((rows, cols))).astype(np.float32)))
    return [(n, w) for n, w in out if not names or any(s in n for s in names)]


def cases(args):
    """[(layer, weight, pattern, sparsity %, tokens)] in the order they run: a layer's
    weight is pruned once per pattern and sparsity, every token count after it."""
    out = []
    for name, w in layers(args.layers):
        for pattern in args.patterns:
            levels = args.sparsity if pattern.startswith("bsr") else [pattern_sparsity(pattern)]
            for s in levels:
                out.extend((name, w, pattern, s, t) for t in args.tokens)
    return out


def pattern_sparsity(pattern: str) -> int:
    """The share of zeros a fixed pattern keeps (2:4: 50 %, 1:M: 100 - 100 / M, int8: 90 %)."""
    if pattern == "2:4":
        return 50
    if pattern.startswith("nm1:"):
        return int(round(100 - 100 / int(pattern[4:])))
    return 90


def pruned(w, pattern: str, sparsity: int):
    """``w`` pruned to the pattern (float32, zeros elsewhere) and the SparseLinear format."""
    from sparsec import tc_linear
    from sparsec.bench.suites import prune_blocks

    if pattern.startswith("bsr"):
        b = int(pattern[3:])
        return prune_blocks(w, b, sparsity / 100), f"bsr:{b}x{b}"
    if pattern == "2:4":
        return tc_linear.prune(w, "mma_sp:2,4").astype(np.float32), "mma_sp:2,4"
    if pattern.startswith("nm1:"):
        spec = f"nm_tc:1,{pattern[4:]}"
        return tc_linear.prune(w, spec).astype(np.float32), spec
    from lowprec import prune_vectors

    return prune_vectors(w, 8, sparsity / 100), "srbcrs:v8,int8"


def peer(rec, name, fn) -> None:
    """``rec["peers"]`` gets what ``fn()`` returns (a dict), or why it failed: a peer that
    cannot run a case does not lose sparsec's record of it."""
    try:
        rec["peers"].update(fn())
    except Exception as e:  # noqa: BLE001 - the peer's own refusal, recorded
        rec["peers"][f"{name}_error"] = f"{type(e).__name__}: {str(e)[:200]}"


def run_case(name, w, pattern, sparsity, tokens, timer, built, kernel_knobs=None, layer_only=False) -> dict:
    """One record: sparsec's layer (and for BSR its kernel), dense and the peers, checked."""
    import torch

    import sparsec
    from sparsec import formats
    from sparsec.reference import max_rel_err
    from sparsec.torch import SparseLinear

    key = (name, pattern, sparsity)
    if key not in built:  # the weight pruned and the layer built once for every token count
        wp, fmt = pruned(w, pattern, sparsity)
        built.clear()
        built[key] = (wp, fmt, SparseLinear.from_dense(torch.from_numpy(wp).half().cuda(), fmt=fmt),
                      torch.from_numpy(wp).half().cuda())
    wp, fmt, layer, w16 = built[key]
    rows, cols = wp.shape
    g = torch.Generator(device="cuda").manual_seed(tokens)
    xs = [torch.randn(tokens, cols, device="cuda", dtype=torch.float16, generator=g) for _ in range(2)]
    ref = xs[0].double() @ torch.from_numpy(wp).cuda().half().double().t()
    nnz = int(np.count_nonzero(wp))
    rec = {"layer": name, "rows": rows, "cols": cols, "pattern": pattern, "sparsity": sparsity, "tokens": tokens,
           "nnz": nnz, "format": fmt, "peers": {}}
    with torch.no_grad():
        stores_half = getattr(layer, "_stores_half", None)  # SparseLinear's BSR path past the few-column kernels
        rec["layer_stores_half"] = bool(stores_half and stores_half(xs[0]))
        token_major = getattr(layer, "_token_major", None)  # x as it is, schedules.bsr_tokens
        rec["layer_token_major"] = bool(token_major and token_major(xs[0]))
        rec["max_rel_err"] = max_rel_err(layer(xs[0]), ref)
        rec["sparsec_ms"] = timer.measure([lambda x=x: layer(x) for x in xs]).median_ms
        rec["dense_ms"] = timer.measure([lambda x=x: torch.nn.functional.linear(x, w16) for x in xs]).median_ms
        if pattern.startswith("bsr") and not layer_only:
            inst = formats.convert(wp.astype(np.float16), fmt, dtype="float16")
            k = sparsec.compile("spmm", inst, target="cuda", feat=tokens)
            bts = [x.t().contiguous() for x in xs]
            rec["kernel_err"] = max_rel_err(k(inst, bts[0], poison=True).t(), ref)
            f = k.executable[k.op_name]
            prep = [k.prepare(inst, bt)[0] for bt in bts]
            rec["sparsec_kernel_ms"] = timer.measure([lambda a=a: f(*a) for a in prep]).median_ms
            rec["knobs"] = k.knobs
            for knobs in kernel_knobs or []:  # --kernel-knobs: the same kernel with other knobs, checked and timed
                rec.setdefault("kernel_sets", []).append(kernel_with(inst, tokens, knobs, bts, ref, timer))
        if pattern.startswith("bsr"):
            bts = [x.t().contiguous() for x in xs]

            def torch_bsr(b=int(pattern[3:])):
                w_bsr = w16.to_sparse_bsr((b, b))
                return {"torch_bsr_ms": timer.measure([lambda bt=bt: w_bsr @ bt for bt in bts]).median_ms}

            peer(rec, "torch_bsr", torch_bsr)
        elif pattern == "2:4":
            def cusparselt():
                from time_cslt_peer import best_config

                best, searched, _ = best_config(torch._cslt_compress(w16), xs[0].t().contiguous(), ref.t(), timer)
                return {} if best is None else {"cusparselt_ms": best[0], "cusparselt_alg": best[1],
                                                "cusparselt_split_k": best[2], "cusparselt_split_k_mode": best[3],
                                                "cusparselt_searched": searched}

            peer(rec, "cusparselt", cusparselt)
        elif pattern == "int8" and tokens > 16:  # _int_mm takes more than 16 rows
            def int_mm():
                w8 = torch.randint(-127, 128, (cols, rows), device="cuda", dtype=torch.int8)
                x8 = [torch.randint(-127, 128, (tokens, cols), device="cuda", dtype=torch.int8) for _ in xs]
                return {"int_mm_ms": timer.measure([lambda x=x: torch._int_mm(x, w8) for x in x8]).median_ms}

            peer(rec, "int_mm", int_mm)
    errs = [rec["max_rel_err"]] + ([rec["kernel_err"]] if "kernel_err" in rec else [])
    rec["ok"] = all(e <= TOL["int8" if pattern == "int8" else "float16"] for e in errs)
    value_bytes = 1 if pattern == "int8" else 2
    rec["bytes"] = nnz * value_bytes + (rows + cols) * tokens * 2  # values read, x read, y written (fp16)
    rec["dense_equiv_tflops"] = 2.0 * rows * cols * tokens / rec["sparsec_ms"] / 1e9
    rec["speedup_vs_dense"] = rec["dense_ms"] / rec["sparsec_ms"]
    return rec


def kernel_with(inst, tokens, knobs, bts, ref, timer) -> dict:
    """sparsec's BSR kernel with ``knobs``: checked on a NaN-poisoned output and timed, or
    why it cannot be built."""
    import sparsec
    from sparsec.reference import max_rel_err

    out = {"knobs": knobs}
    try:
        k = sparsec.compile("spmm", inst, target="cuda", feat=tokens, knobs=knobs)
        out["err"] = max_rel_err(k(inst, bts[0], poison=True).t(), ref)
        f = k.executable[k.op_name]
        prep = [k.prepare(inst, bt)[0] for bt in bts]
        out["ms"] = timer.measure([lambda a=a: f(*a) for a in prep]).median_ms
        out["ok"] = out["err"] <= TOL["float16"]
    except Exception as e:  # noqa: BLE001 - knobs the kernel refuses are a result, said why
        out["error"] = f"{type(e).__name__}: {str(e)[:200]}"
    return out


def summary(records) -> list:
    """Per (pattern, sparsity): the geomean ratio to dense over the big layers at 1024+
    tokens (the issue's figure) and the lowest ratio at 16-128 tokens on any layer."""
    out = []
    for key in sorted({(r["pattern"], r["sparsity"]) for r in records}):
        mine = [r for r in records if (r["pattern"], r["sparsity"]) == key and r.get("ok")]
        big = [r["speedup_vs_dense"] for r in mine if r["rows"] * r["cols"] >= BIG and r["tokens"] >= 1024]
        few = [r["speedup_vs_dense"] for r in mine if r["tokens"] <= 128]
        out.append({"pattern": key[0], "sparsity": key[1], "cases": len(mine),
                    "big_geomean": math.exp(np.mean(np.log(big))) if big else None,
                    "few_tokens_min": min(few) if few else None})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", nargs="+", help="only the layers whose name contains one of these")
    ap.add_argument("--patterns", nargs="+", default=list(PATTERNS), choices=PATTERNS)
    ap.add_argument("--sparsity", nargs="+", type=int, default=list(SPARSITIES), help="BSR block sparsity, %%")
    ap.add_argument("--tokens", nargs="+", type=int, default=list(TOKENS))
    ap.add_argument("--kernel-knobs", type=json.loads, default=None,
                    help="a JSON list of knob dicts: BSR cases also time their kernel with each (a sweep)")
    ap.add_argument("--resume", action="store_true", help="skip the cases the output file holds")
    ap.add_argument("--layer-only", action="store_true",
                    help="BSR: time SparseLinear and the peers, not the feature-major SpMM kernel beside them")
    ap.add_argument("--list", action="store_true", help="print the cases and stop (no GPU)")
    ap.add_argument("--out", default=None, help="default $OUT/weights_<gpu>.json")
    args = ap.parse_args(argv)
    todo = cases(args)
    if args.list:
        for name, w, pattern, s, t in todo:
            print(f"{name:<22} {w.shape[0]:>6} x {w.shape[1]:<6} {pattern:<7} {s:>3} % {t:>5} tokens")
        print(f"{len(todo)} cases")
        return 0
    import torch

    from sparsec.measure import Timer

    gpu = torch.cuda.get_device_name().split()[-1]
    path = Path(args.out or os.path.join(os.environ.get("OUT", "."), f"weights_{gpu}.json"))
    doc = json.loads(path.read_text()) if args.resume and path.exists() else {"device": torch.cuda.get_device_name(),
                                                                               "records": []}
    done = {(r["layer"], r["pattern"], r["sparsity"], r["tokens"]) for r in doc["records"]}
    timer = Timer("cuda", warmup_ms=10.0, budget_ms=60.0, max_reps=100)
    built = {}
    for name, w, pattern, s, t in todo:
        if (name, pattern, s, t) in done:
            continue
        try:
            rec = run_case(name, w, pattern, s, t, timer, built, args.kernel_knobs, args.layer_only)
        except Exception as e:  # noqa: BLE001 - a case that cannot run is a result, said why
            rec = {"layer": name, "rows": w.shape[0], "cols": w.shape[1], "pattern": pattern, "sparsity": s,
                   "tokens": t, "ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        doc["records"].append(rec)
        doc["summary"] = summary(doc["records"])
        path.write_text(json.dumps(doc, indent=1))
        for ks in rec.get("kernel_sets", []):
            print(f"    kernel {json.dumps(ks['knobs'])}: " + (f"{ks['ms'] * 1e3:.1f} us{'' if ks['ok'] else ' WRONG'}"
                                                         if "ms" in ks else ks["error"]), flush=True)
        print(f"{'ok ' if rec.get('ok') else 'BAD'} {name:<20} {pattern:<7} {s:>3}% {t:>5} tok: "
              + (f"x{rec['speedup_vs_dense']:.2f} dense ({rec['sparsec_ms'] * 1e3:.1f} / {rec['dense_ms'] * 1e3:.1f} us)"
                 if "sparsec_ms" in rec else rec.get("error", "")), flush=True)
    bad = sum(not r.get("ok") for r in doc["records"])
    print(f"\n{doc['device']}: {len(doc['records'])} cases, {bad} not ok; ratio = dense / sparsec")
    print(f"{'pattern':<8} {'sparsity':>8} {'cases':>5} {'>=768x3072, >=1024 tok':>24} {'min at 16-128 tok':>18}")
    for s in doc["summary"]:
        big = f"x{s['big_geomean']:.2f}" if s["big_geomean"] else "-"
        few = f"x{s['few_tokens_min']:.2f}" if s["few_tokens_min"] else "-"
        print(f"{s['pattern']:<8} {s['sparsity']:>7}% {s['cases']:>5} {big:>24} {few:>18}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
