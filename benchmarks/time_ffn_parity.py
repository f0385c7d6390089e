#!/usr/bin/env python3
"""The pruned FFN's two Tensor Core kernels through ``sparsec.compile`` (what
``tc_linear`` runs) against the hand-written path they replaced, side by side in one run
(GPU host, needs the TVM compiler: stage1).

    python3 benchmarks/time_ffn_parity.py [--tokens 1024 4096 8192] [--patterns nm_tc:1,10 mma_sp:2,4]

For each layer of ``time_ffn_tc``'s FFN and token count, on the same operands:

* ``compiled``: the layer's kernel as ``TensorCoreLinear.forward_feature_major`` launches it;
* ``static``: ``tc_pipeline.build`` for the layer's exact size with the compiled kernel's
  knobs and packing (the same device code: a gap here is the call, not the kernel);
* ``hand``: the replaced path (``tc_linear`` at a07c196, whose kernels made
  ``results/ffn_tc_H200.json``): gathered rows zero-padded to whole 32-deep stages and its
  knob rule, :func:`hand_knobs`;
* ``compiled+K``: the compiled kernel with knob overrides ``--variants`` (e.g. stages=4).

Timing: ``sparsec.bench.timing.Timer`` (CUDA-graph replay, median). Prints a table last and
writes ``$OUT/ffn_parity.json``.
"""
from __future__ import annotations

import argparse
import json
import os

import _preamble  # noqa: F401,E402

from time_ffn_tc import HIDDEN, INNER, ffn_weights  # noqa: E402

HAND_KC_ALIGN = 32


def hand_knobs(mode: str, tokens: int, kc: int) -> dict:
    """The replaced ``tc_linear.knobs_for`` (a07c196), quoted: narrow tiles and deep stages
    below 512 tokens; 128 x 64 blocks above, 4 k-steps a stage where the row is long."""
    long_k = mode == "sp24" or (kc % 64 == 0 and kc > 128)
    if tokens < 512:
        return dict(warps_m=4, warps_n=1, warp_m_tiles=1, warp_n_tiles=2, k_steps=4 if long_k else 2, stages=4)
    base = dict(warps_m=2, warps_n=2, warp_m_tiles=4, warp_n_tiles=4, group_m=8)
    return {**base, "k_steps": 4, "stages": 3} if long_k else {**base, "k_steps": 2, "stages": 4}


def parse_variants(texts):
    out = []
    for t in texts:
        kv = dict(p.split("=") for p in t.split(","))
        out.append({k: int(v) for k, v in kv.items()})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096, 8192])
    ap.add_argument("--patterns", nargs="+", default=["nm_tc:1,10", "mma_sp:2,4"])
    ap.add_argument("--variants", nargs="*", default=["stages=4"], help="knob overrides, k=v[,k=v]")
    args = ap.parse_args()

    import torch

    import sparsec
    from sparsec.bench.report import finish
    from sparsec.bench.timing import Timer
    from sparsec.kernel import on_torch_stream
    from sparsec.schedules import tc_pipeline
    from sparsec.tc_linear import VEC, TensorCoreLinear, linear_operator

    timer = Timer("cuda", warmup_ms=20, budget_ms=300)
    rows = []
    for pattern in args.patterns:
        w1, b1, w2, b2 = ffn_weights(pattern)
        layers = {"up": (TensorCoreLinear.from_dense(w1, b1, pattern, activation="gelu").cuda(), False),
                  "down": (TensorCoreLinear.from_dense(w2, b2, pattern).cuda(), True)}
        for tokens in args.tokens:
            x = {"up": torch.randn(HIDDEN, tokens, device="cuda").half(),
                 "down": torch.randn(INNER, tokens, device="cuda").half() * 0.1}
            for name, (layer, token_major) in layers.items():
                xt = x[name]
                mode = layer.mode
                kc = int(layer.values.shape[1]) if layer.kind == "nm_tc" else 0
                k = layer.kernel(tokens, token_major)
                shape = (tokens, layer.out_features) if token_major else (layer.out_features, tokens)
                out = torch.empty(shape, dtype=torch.float16, device="cuda")
                ref = layer.forward_feature_major(xt, token_major).float()
                common = dict(arch="sm_90a", dtype="float16", out_dtype="float16", bias=True,
                              activation=layer.activation, transpose_c=token_major)

                def launch(fn, a, e):
                    with on_torch_stream(True):
                        fn(a, e, xt, layer.bias, out)

                def static(knobs, values, index, kc_):
                    extra = {"vec": VEC, "kc": kc_} if mode == "gather" else {}
                    ex = tc_pipeline.build(mode, layer.out_features, layer.in_features, tokens, **common,
                                           **extra, **knobs)
                    return lambda: launch(ex["tc_spmm"], values, index)

                variants = {"compiled": lambda: layer.forward_feature_major(xt, token_major),
                            "static": static(dict(k.knobs), layer.values, layer.index, kc)}
                if mode == "gather":
                    pad = -kc % HAND_KC_ALIGN
                    hv = torch.nn.functional.pad(layer.values, (0, pad)).contiguous()
                    hi = torch.nn.functional.pad(layer.index, (0, pad)).contiguous()
                    variants["hand"] = static(hand_knobs(mode, tokens, kc + pad), hv, hi, kc + pad)
                else:
                    variants["hand"] = static(hand_knobs(mode, tokens, 0), layer.values, layer.index, 0)
                op = linear_operator(True, layer.activation, token_major, "float16")
                for over in parse_variants(args.variants):
                    knobs = {**k.knobs, **over}
                    if knobs == k.knobs:
                        continue
                    kv = sparsec.compile(op, layer.instance, target="cuda:sm_90a", dtype="float16", tokens=tokens,
                                         knobs=knobs)
                    params = kv.params

                    def run_variant(kv=kv, params=params):
                        packed = iter((layer.values, layer.index))
                        by_role = {"input": {"X": xt, "bias": layer.bias}, "output": {"C": out}}
                        argv = [next(packed) if p.role == "index" else by_role[p.role][p.name] for p in params]
                        with on_torch_stream(True):
                            kv.executable[kv.op_name](*argv)
                    variants["compiled+" + ",".join(f"{a}={b}" for a, b in over.items())] = run_variant
                times, errs = {}, {}
                for vname, fn in variants.items():
                    out.fill_(float("nan"))
                    fn()
                    got = (layer.forward_feature_major(xt, token_major) if vname == "compiled" else out).float()
                    errs[vname] = float(torch.nan_to_num((got - ref).abs(), nan=float("inf")).max())
                    times[vname] = timer.measure([fn]).median_ms
                row = {"pattern": pattern, "layer": name, "tokens": tokens, "kc": kc, "knobs": k.knobs,
                       "hand_knobs": hand_knobs(mode, tokens, kc + (-kc % HAND_KC_ALIGN) if kc else 0),
                       "ms": times, "max_abs_diff_vs_compiled": errs,
                       "hand_over_compiled": times["hand"] / times["compiled"],
                       "static_over_compiled": times["static"] / times["compiled"]}
                rows.append(row)
                print(json.dumps(row), flush=True)
    names = sorted({v for r in rows for v in r["ms"]}, key=lambda v: (v != "compiled", v))
    columns = [("pattern", lambda r: r["pattern"]), ("layer", lambda r: r["layer"]), ("tokens:", lambda r: r["tokens"])]
    finish(rows, columns + [(f"{v} us:", lambda r, v=v: f"{1e3 * r['ms'][v]:.2f}" if v in r["ms"] else "-") for v in names]
           + [("hand/compiled:", lambda r: f"{r['hand_over_compiled']:.3f}")],
           "cuda", out=os.environ.get("OUT") and os.path.join(os.environ["OUT"], "ffn_parity.json"))


if __name__ == "__main__":
    main()
