#!/usr/bin/env python3
"""The pruned BERT-base-sized FFN (768 -> 3072 -> GELU -> 768, with biases) on the Tensor
Cores (``sparsec.tc_linear.SparseFFN``) against the same FFN dense in PyTorch fp16, over
token counts (GPU host, needs the TVM compiler: stage1).

    python3 benchmarks/time_ffn_tc.py [--tokens 128 1024 4096 8192] [--patterns nm_tc:1,10 mma_sp:2,4]

Weights: normal(0, 0.02) (BERT's initialiser), pruned by magnitude to each pattern
(``nm_tc:1,10``: vector-wise 1 of every 10 columns per 128-row vector, 90 % sparse;
``mma_sp:2,4``: 2:4), rounded to fp16; the dense peer multiplies the same pruned weights
(``torch.nn.Linear`` fp16, GELU, ``Linear``: cuBLAS with its bias epilogue). Both are
checked against the float64 FFN of those weights on the same fp16 input (the output's
largest error over its largest value; the dense fp16 error is the yardstick), on outputs
poisoned with NaN first. Timing: ``sparsec.bench.timing.Timer`` (CUDA-graph replay,
median), each call on one of several input copies that together exceed the L2 cache.
The per-kernel times of the two sparse kernels are reported too. Prints a table last and
writes ``$OUT/ffn_tc.json``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import numpy as np

import _preamble  # noqa: F401,E402  (the one preamble: checkout root and benchmarks/data on sys.path)

HIDDEN, INNER = 768, 3072


def ffn_weights(pattern: str, seed: int = 0):
    """(w1, b1, w2, b2) float32, the weights pruned to ``pattern`` and rounded to fp16."""
    from sparsec.tc_linear import prune

    rng = np.random.default_rng(seed)
    w1 = prune((0.02 * rng.standard_normal((INNER, HIDDEN))).astype(np.float32), pattern)
    w2 = prune((0.02 * rng.standard_normal((HIDDEN, INNER))).astype(np.float32), pattern)
    b1 = (0.02 * rng.standard_normal(INNER)).astype(np.float32)
    b2 = (0.02 * rng.standard_normal(HIDDEN)).astype(np.float32)
    return tuple(a.astype(np.float16).astype(np.float32) for a in (w1, b1, w2, b2))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, nargs="+", default=[128, 1024, 4096, 8192])
    ap.add_argument("--patterns", nargs="+", default=["nm_tc:1,10", "mma_sp:2,4"])
    args = ap.parse_args()

    import torch

    from sparsec.bench.report import table
    from sparsec.bench.timing import Timer, device_l2_bytes, rotation_count
    from sparsec.tc_linear import SparseFFN, TensorCoreLinear, feature_major

    timer = Timer("cuda", warmup_ms=20, budget_ms=200)
    rows = []
    for pattern in args.patterns:
        w1, b1, w2, b2 = ffn_weights(pattern)
        density = (np.count_nonzero(w1) + np.count_nonzero(w2)) / (w1.size + w2.size)
        sparse = SparseFFN(TensorCoreLinear.from_dense(w1, b1, pattern, activation="gelu"),
                           TensorCoreLinear.from_dense(w2, b2, pattern))
        dense = torch.nn.Sequential(torch.nn.Linear(HIDDEN, INNER), torch.nn.GELU(), torch.nn.Linear(INNER, HIDDEN))
        with torch.no_grad():
            for lin, w, b in ((dense[0], w1, b1), (dense[2], w2, b2)):
                lin.weight.copy_(torch.from_numpy(w))
                lin.bias.copy_(torch.from_numpy(b))
        dense = dense.half().cuda()
        t64 = [torch.from_numpy(a).cuda().double() for a in (w1, b1, w2, b2)]
        for tokens in args.tokens:
            x = torch.randn(tokens, HIDDEN, device="cuda").half()
            h = x.double() @ t64[0].t() + t64[1]
            ref = (0.5 * h * (1 + torch.erf(h / math.sqrt(2)))) @ t64[2].t() + t64[3]
            scale = float(ref.abs().max())
            with torch.no_grad():
                got = sparse(x)
                want = dense(x)
            err = float(torch.nan_to_num((got.double() - ref).abs(), nan=math.inf).max()) / scale
            dense_err = float((want.double() - ref).abs().max()) / scale
            copies = rotation_count(x.numel() * 2 + tokens * INNER * 2, device_l2_bytes(),
                                    torch.cuda.mem_get_info()[0])
            xs = [x.clone() for _ in range(copies)]
            with torch.no_grad():
                t_sparse = timer.measure([lambda x=x_: sparse(x) for x_ in xs]).median_ms
                t_dense = timer.measure([lambda x=x_: dense(x) for x_ in xs]).median_ms
                xt = feature_major(x)
                assert torch.equal(xt, x.t().contiguous())
                hid = sparse.up.forward_feature_major(xt, token_major_out=False)
                t_up = timer.measure([lambda: sparse.up.forward_feature_major(xt, token_major_out=False)]).median_ms
                t_down = timer.measure([lambda: sparse.down.forward_feature_major(hid)]).median_ms
                t_transpose = timer.measure([lambda x=x_: feature_major(x) for x_ in xs]).median_ms
                t_torch_transpose = timer.measure([lambda x=x_: x.t().contiguous() for x_ in xs]).median_ms
            flops = 2 * tokens * HIDDEN * INNER * 2
            row = {"pattern": pattern, "density": density, "tokens": tokens, "max_rel_err": err,
                   "dense_fp16_max_rel_err": dense_err, "correct": err <= max(2 * dense_err, 1e-3),
                   "sparsec_ms": t_sparse, "dense_fp16_ms": t_dense, "speedup": t_dense / t_sparse,
                   "up_kernel_ms": t_up, "down_kernel_ms": t_down, "input_transpose_ms": t_transpose,
                   "torch_transpose_ms": t_torch_transpose,
                   "dense_fp16_tflops": flops / t_dense / 1e9,
                   "sparsec_useful_tflops": flops * density / t_sparse / 1e9, "input_copies": copies}
            rows.append(row)
            print(json.dumps(row), flush=True)
    gpu = torch.cuda.get_device_name()
    result = {"device": gpu, "command": "python3 benchmarks/time_ffn_tc.py " + " ".join(sys.argv[1:]),
              "rows": rows}
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "ffn_tc.json").write_text(json.dumps(result, separators=(",", ":")))
    print(f"device: {gpu}; BERT-base-sized FFN {HIDDEN}->{INNER}->{HIDDEN}, fp16, biases, GELU")
    print(table([("pattern", lambda r: r["pattern"]), ("tokens:", lambda r: r["tokens"]),
                 ("rel err (dense fp16)", lambda r: f"{r['max_rel_err']:.1e} ({r['dense_fp16_max_rel_err']:.1e})"
                  + ("" if r["correct"] else " WRONG")),
                 ("sparsec ms (up + down + transpose)",
                  lambda r: f"{r['sparsec_ms']:.4f} ({r['up_kernel_ms']:.4f} + {r['down_kernel_ms']:.4f} + "
                            f"{r['input_transpose_ms']:.4f})"),
                 ("dense fp16 ms:", lambda r: f"{r['dense_fp16_ms']:.4f}"),
                 ("speedup:", lambda r: f"{r['speedup']:.2f}x")], rows))

if __name__ == "__main__":
    main()
