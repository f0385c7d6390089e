#!/usr/bin/env python3
"""A pruned transformer encoder layer on sparsec's ``SparseLinear``: the six projections
(query, key, value, output, FFN in, FFN out) pruned to 90 % unstructured, 2:4, or 90 %
int8 SR-BCRS (V = 8) on sparsec's CUDA-core kernels (fp32), and — on a GPU — to 90 %
vector-wise 1:10 and 2:4 on the Tensor Cores (fp16, ``sparsec.tc_linear``: bias and GELU
in the kernels' epilogue, the FFN as one ``SparseFFN``). Each is checked against the same
layer in dense PyTorch with the same pruned weights, and timed beside it (dense fp32 and
fp16). The FFN alone is timed too.

    python examples/pruned_encoder.py                   # MiniLM layer 0 (if cached) and BERT-base sizes
    python examples/pruned_encoder.py --tokens 4096 --out encoder.json

MiniLM's weights come from ``benchmarks/data/cache/minilm`` (``benchmarks/data/fetch.py
--minilm``); BERT-base-sized layers (768 hidden, 3072 FFN, 12 heads) are drawn from
normal(0, 0.02), BERT's initialiser. Without a GPU it runs small on the CPU
(correctness only). Timing: ``sparsec.measure.Timer`` (CUDA-graph replay, median).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "data"))

PROJECTIONS = ("query", "key", "value", "output", "ffn_in", "ffn_out")
CUDA_CORE = ("90% unstructured", "2:4", "90% int8 SR-BCRS")
TENSOR_CORE = ("90% vector-wise 1:10 (Tensor Cores)", "2:4 (Tensor Cores)")


def layers():
    """[(name, {projection: float32 weight (out x in)}, heads)]."""
    from minilm import load_minilm

    out = []
    names = {"query": "attention.self.query", "key": "attention.self.key", "value": "attention.self.value",
             "output": "attention.output.dense", "ffn_in": "intermediate.dense", "ffn_out": "output.dense"}
    cache = ROOT / "benchmarks" / "data" / "cache"
    mini = {p: load_minilm(cache, f"encoder.layer.0.{n}.weight") for p, n in names.items()}
    if all(w is not None for w in mini.values()):
        out.append(("minilm-L0", {p: np.asarray(w, np.float32) for p, w in mini.items()}, 12))
    else:
        print("skip MiniLM (not cached): run benchmarks/data/fetch.py --minilm", file=sys.stderr)
    rng = np.random.default_rng(0)
    shapes = {"query": (768, 768), "key": (768, 768), "value": (768, 768), "output": (768, 768),
              "ffn_in": (3072, 768), "ffn_out": (768, 3072)}
    out.append(("bert-base-sized", {p: (0.02 * rng.standard_normal(s)).astype(np.float32)
                                    for p, s in shapes.items()}, 12))
    return out


def pruned(weights, variant):
    """(the pruned float32 weights, the SparseLinear format) of a variant."""
    from lowprec import prune_vectors

    from sparsec.formats import nm

    if variant == "90% unstructured":
        def prune(w):
            keep = np.abs(w) >= np.quantile(np.abs(w), 0.9)
            return np.where(keep, w, 0).astype(np.float32)
        return {p: prune(w) for p, w in weights.items()}, "auto"
    if variant == "2:4":
        return {p: np.where(nm.prune(w, n=2, m=4)[1], w, 0).astype(np.float32) for p, w in weights.items()}, "nm:2,4"
    if variant in TENSOR_CORE:  # fp16 layers: the weights as the kernels hold them
        from sparsec.tc_linear import prune

        fmt = "nm_tc:1,10" if variant.startswith("90%") else "mma_sp:2,4"
        return {p: prune(w, fmt).astype(np.float16).astype(np.float32) for p, w in weights.items()}, fmt
    return {p: prune_vectors(w, 8, 0.9) for p, w in weights.items()}, "srbcrs:v8,int8"


def build(torch, st, weights, heads, fmt, device, dtype, quantize_inputs=False):
    """The encoder layer with dense (``fmt`` None) or sparsec projections. ``quantize_inputs``
    rounds each dense projection's input to int8 per tensor first, as the int8 SparseLinear
    does: the reference an int8 layer must match to float rounding."""
    F = torch.nn.functional

    class FakeQuant(torch.nn.Module):
        def forward(self, x):
            scale = x.abs().amax().clamp_min(1e-12) / 127
            return torch.clamp(torch.round(x / scale), -127, 127) * scale

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = heads
            self.proj = torch.nn.ModuleDict()
            for p, w in weights.items():
                wt = torch.from_numpy(w)
                if fmt is None:
                    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=True)
                    lin.weight.data.copy_(wt)
                    lin.bias.data.zero_()
                    if quantize_inputs:
                        lin = torch.nn.Sequential(FakeQuant(), lin)
                else:
                    lin = st.SparseLinear.from_dense(wt, bias=torch.zeros(w.shape[0]), fmt=fmt, device=device)
                self.proj[p] = lin.to(device)
            self.fused_ffn = None
            if fmt is not None and fmt.partition(":")[0] in ("nm_tc", "mma_sp"):
                from sparsec.tc_linear import SparseFFN, TensorCoreLinear

                # the FFN's first layer carries the GELU in its kernel
                self.proj["ffn_in"] = TensorCoreLinear.from_dense(
                    weights["ffn_in"], torch.zeros(weights["ffn_in"].shape[0]), fmt, activation="gelu", device=device)
                self.fused_ffn = SparseFFN(self.proj["ffn_in"], self.proj["ffn_out"])
            hidden = weights["query"].shape[0]
            self.ln1, self.ln2 = torch.nn.LayerNorm(hidden).to(device), torch.nn.LayerNorm(hidden).to(device)

        def ffn(self, x):
            if self.fused_ffn is not None:  # GELU in the first kernel, hidden kept feature-major
                return self.fused_ffn(x)
            return self.proj["ffn_out"](F.gelu(self.proj["ffn_in"](x)))

        def forward(self, x):
            b, s, h = x.shape
            q, k, v = (self.proj[p](x).view(b, s, self.heads, h // self.heads).transpose(1, 2)
                       for p in ("query", "key", "value"))
            a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, h)
            x = self.ln1(x + self.proj["output"](a))
            return self.ln2(x + self.ffn(x))

    model = Encoder()
    if fmt is None:
        return model.to(dtype)
    if model.fused_ffn is not None:  # fp16 layer norms; the Tensor Core layers keep fp32 biases
        model.ln1.to(dtype), model.ln2.to(dtype)
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=None, help="batch x sequence (default 8 x 512 on a GPU)")
    ap.add_argument("--out")
    args = ap.parse_args()

    import torch

    import sparsec.torch as st
    from sparsec.bench.report import finish
    from sparsec.measure import Timer
    from sparsec.reference import max_rel_err

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    batch, seq = (8, (args.tokens or 4096) // 8) if device == "cuda" else (2, (args.tokens or 64) // 2)
    timer = Timer(device, warmup_ms=20, budget_ms=200, max_reps=30)
    rows = []
    for lname, weights, heads in layers():
        x = torch.randn(batch, seq, weights["query"].shape[1], generator=torch.Generator().manual_seed(1)).to(device)
        for variant in CUDA_CORE + (TENSOR_CORE if device == "cuda" else ()):
            w, fmt = pruned(weights, variant)
            tensor_core = variant in TENSOR_CORE
            if fmt.startswith("srbcrs"):  # the dense reference multiplies the weights the kernel holds
                from sparsec.formats import srbcrs

                w = {p: (lambda q: (q[0].toarray() * q[1]).astype(np.float32))(srbcrs.quantize(m, 8))
                     for p, m in w.items()}
            sparse = build(torch, st, w, heads, fmt, device, torch.float16 if tensor_core else torch.float32)
            dense32 = build(torch, st, w, heads, None, device, torch.float32, quantize_inputs=fmt.startswith("srbcrs"))
            dense16 = build(torch, st, w, heads, None, device, torch.float16)
            with torch.no_grad():
                ref, got = dense32(x), sparse(x.half() if tensor_core else x).float()
                err = max_rel_err(got, ref)
                dense16_err = max_rel_err(dense16(x.half()).float(), ref)
                row = {"layer": lname, "variant": variant, "format": fmt, "tokens": batch * seq,
                       "density": float(np.mean([np.count_nonzero(v) / v.size for v in w.values()])),
                       "max_rel_err": err, "dense_fp16_max_rel_err": dense16_err,
                       # int8: the layers' float results differ in the last bits, and where an
                       # activation sits on a rounding boundary the next quantization flips one step
                       # (1/127 of that input's range): 1e-2 bounds it; fp32 formats match to 1e-4;
                       # fp16 (Tensor Core) layers as closely as the dense fp16 layer does, within 2x
                       "correct": err < (1e-2 if fmt.startswith("srbcrs") else
                                         max(2 * dense16_err, 1e-3) if tensor_core else 1e-4)}
                if device == "cuda":
                    x16 = x.half()
                    xs = x16 if tensor_core else x
                    for name, fn in (("sparsec_ms", lambda: sparse(xs)), ("dense_fp32_ms", lambda: dense32(x)),
                                     ("dense_fp16_ms", lambda: dense16(x16)),
                                     ("sparsec_ffn_ms", lambda: sparse.ffn(xs)),
                                     ("dense_fp16_ffn_ms", lambda: dense16.ffn(x16))):
                        row[name] = timer.measure([fn]).median_ms
                    row["vs_fp16"] = row["dense_fp16_ms"] / row["sparsec_ms"]
                    row["ffn_vs_fp16"] = row["dense_fp16_ffn_ms"] / row["sparsec_ffn_ms"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    columns = [("layer", lambda r: r["layer"]), ("variant", lambda r: r["variant"]),
               ("format", lambda r: r["format"]), ("max rel err:", lambda r: f"{r['max_rel_err']:.1e}"),
               ("layer ms sparsec / dense fp32 / dense fp16",
                lambda r: f"{r['sparsec_ms']:.3f} / {r['dense_fp32_ms']:.3f} / {r['dense_fp16_ms']:.3f}"
                if "sparsec_ms" in r else "-"),
               ("vs fp16:", lambda r: f"{r.get('vs_fp16', float('nan')):.2f}x"),
               ("FFN vs fp16:", lambda r: f"{r.get('ffn_vs_fp16', float('nan')):.2f}x")]
    finish(rows, columns, device, args.out, f", tokens {batch * seq}")


if __name__ == "__main__":
    main()
