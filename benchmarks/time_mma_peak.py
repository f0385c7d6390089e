#!/usr/bin/env python3
"""Issue-rate ceilings of the warp-level Tensor Core instructions sparsec's kernels use
(GPU host): dense ``mma.sync`` fp16/bf16 (m16n8k16), 2:4 ``mma.sp`` fp16 (m16n8k32), int8
(m16n8k32) and int4 (m16n8k64), next to dense cuBLAS fp16 on a large GEMM.

Why: a Tensor Core SpMM built on ``mma.sync`` can go no faster than these rates, whatever
its memory pipeline does, so they bound what each of issue 6's ratios can reach (cuBLAS
itself runs on Hopper's ``wgmma``). Each warp issues ``CHAINS`` independent MMAs per
iteration on register operands (no memory traffic), enough warps fill every SM.

    python3 benchmarks/time_mma_peak.py [--out peaks.json]

Prints a table last: instruction, dense-equivalent TFLOP/s (a 2:4 MMA counts the math it
skips), and its ratio to cuBLAS fp16.
"""
from __future__ import annotations

import argparse
import json

CHAINS = 8
ITERS = 2048

# name: (PTX mnemonic, A regs, B regs, accumulator type, M*N*K of one instruction, sparse)
INSTRUCTIONS = {
    "mma f16 m16n8k16": ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", 4, 2, "f32", 16 * 8 * 16, False),
    "mma bf16 m16n8k16": ("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", 4, 2, "f32", 16 * 8 * 16, False),
    "mma.sp f16 m16n8k32": ("mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32",
                            4, 4, "f32", 16 * 8 * 32, True),
    "mma s8 m16n8k32": ("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32", 4, 2, "s32", 16 * 8 * 32, False),
    "mma s4 m16n8k64": ("mma.sync.aligned.m16n8k64.row.col.s32.s4.s4.s32", 4, 2, "s32", 16 * 8 * 64, False),
    "mma.sp s8 m16n8k64": ("mma.sp::ordered_metadata.sync.aligned.m16n8k64.row.col.s32.s8.s8.s32",
                           4, 4, "s32", 16 * 8 * 64, True),
}


def kernel_source(mnemonic: str, a_regs: int, b_regs: int, acc: str, sparse: bool) -> str:
    """A CUDA kernel: ``CHAINS`` accumulator sets per thread, ``ITERS`` rounds of MMAs."""
    ctype = "float" if acc == "f32" else "int"
    cons = "f" if acc == "f32" else "r"
    d = ", ".join(f"%{i}" for i in range(4))
    a = ", ".join(f"%{4 + i}" for i in range(a_regs))
    b = ", ".join(f"%{4 + a_regs + i}" for i in range(b_regs))
    c = d
    meta = f", %{4 + a_regs + b_regs}, 0x0" if sparse else ""
    asm = f"{mnemonic} {{{d}}}, {{{a}}}, {{{b}}}, {{{c}}}{meta};"
    ins = ", ".join([f'"r"(a[{i}])' for i in range(a_regs)] + [f'"r"(b[{i}])' for i in range(b_regs)]
                    + (['"r"(e)'] if sparse else []))
    return f"""
extern "C" __global__ void peak(const unsigned* seed, {ctype}* out) {{
  unsigned a[{a_regs}], b[{b_regs}];
  for (int i = 0; i < {a_regs}; ++i) a[i] = seed[(threadIdx.x + i) % 32];
  for (int i = 0; i < {b_regs}; ++i) b[i] = seed[(threadIdx.x + 7 * i) % 32];
  unsigned e = 0x44444444u;
  {ctype} d[{CHAINS}][4] = {{}};
  for (int it = 0; it < {ITERS}; ++it) {{
#pragma unroll
    for (int c = 0; c < {CHAINS}; ++c) {{
      asm volatile("{asm}"
                   : "+{cons}"(d[c][0]), "+{cons}"(d[c][1]), "+{cons}"(d[c][2]), "+{cons}"(d[c][3])
                   : {ins});
    }}
  }}
  {ctype} s = 0;
  for (int c = 0; c < {CHAINS}; ++c) s += d[c][0] + d[c][1] + d[c][2] + d[c][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}}
"""


def main():
    import cupy as cp
    import torch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    args = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    blocks, threads = sms * 8, 128
    seed = cp.asarray((torch.randint(0, 2**31, (32,), dtype=torch.int64) & 0x3C003C00).numpy().astype("uint32"))
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    rows = []
    for name, (mnemonic, ar, br, acc, mnk, sparse) in INSTRUCTIONS.items():
        kern = cp.RawKernel(kernel_source(mnemonic, ar, br, acc, sparse), "peak",
                            options=("--gpu-architecture=sm_90a",))
        out = cp.zeros(blocks * threads, dtype="float32" if acc == "f32" else "int32")
        kern((blocks,), (threads,), (seed, out))  # compile + warm up
        times = []
        for _ in range(9):
            start.record()
            kern((blocks,), (threads,), (seed, out))
            stop.record()
            stop.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, stop))
        ms = sorted(times)[len(times) // 2]
        warps = blocks * threads // 32
        flops = 2.0 * mnk * CHAINS * ITERS * warps
        rows.append({"instruction": name, "ptx": mnemonic, "ms": ms,
                     "dense_equivalent_tflops": flops / ms / 1e9, "sparse": sparse})
    a = torch.randn(8192, 8192, dtype=torch.float16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.float16, device="cuda")
    for _ in range(3):
        torch.mm(a, b)
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(9):
        ev0.record()
        torch.mm(a, b)
        ev1.record()
        ev1.synchronize()
        times.append(ev0.elapsed_time(ev1))
    cublas = 2.0 * 8192**3 / sorted(times)[4] / 1e9
    result = {"device": torch.cuda.get_device_name(), "cublas_fp16_8192_tflops": cublas, "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    print(f"device {result['device']}; dense cuBLAS fp16 8192^3: {cublas:.0f} TFLOP/s")
    print("| instruction | dense-equivalent TFLOP/s (TOP/s) | vs cuBLAS fp16 |")
    print("|---|---:|---:|")
    for r in rows:
        print(f"| {r['instruction']} | {r['dense_equivalent_tflops']:.0f} | {r['dense_equivalent_tflops'] / cublas:.2f}x |")


if __name__ == "__main__":
    main()
