#!/usr/bin/env python3
"""Is it the kernel or the way it is launched? The block-row template's kernel for a MiniLM
layer, as ``sparsec.compile`` builds it, timed through TVM's launch and again as the same
CUDA source compiled by CuPy and launched by it, with the same grid, block, shared memory
and operands (the outputs compared first), plus variants of that source: the static
shared-memory tile moved into the dynamic buffer. Side by side with dense cuBLAS fp16, in
sparsec's timer (CUDA-graph replays, B rotated over copies).

    SPARSEC_DATA_DIR=.data python3 benchmarks/probe_tvm_launch.py [--out FILE]

Nsight Compute put this kernel's time outside its CTAs' active cycles 1-1.5 us above what an
empty kernel and cuBLAS's kernel show there (``results/profile_blockrow_minilm_H200.json``).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

import numpy as np

import _preamble  # noqa: F401,E402

CASES = (("minilm-L0-attn-q-b16-s90", 64), ("minilm-L0-attn-q-b16-s90", 16), ("minilm-L0-ffn-in-b16-s70", 64),
         ("minilm-L0-ffn-in-b16-s70", 16))


def launch_shape(src: str, knobs: dict, feat: int, n_io: int):
    """(grid, block, dynamic shared bytes) of the block-row template's kernel: a block row and
    an N tile a CTA; k_split x (block rows / warp_m) x (N tile / warp_n) warps."""
    threads = int(re.search(r"__launch_bounds__\((\d+)\)", src).group(1))
    grid = (n_io, feat // knobs["n_tile"], 1)
    block = (32, threads // 32, 1)
    return grid, block


def signature(src: str):
    """The kernel's name and its parameters [(type, name)] in order."""
    m = re.search(r'extern "C" __global__ void __launch_bounds__\(\d+\) (\w+)\(([^)]*)\) \{', src)
    params = []
    for p in m.group(2).split(","):
        words = p.replace("__restrict__", "").replace("*", " * ").split()
        params.append(("ptr" if "*" in words else words[0], words[-1]))
    return m.group(1), params


def static_to_dynamic(src: str, dyn: int):
    """The source with its static ``__shared__`` float tiles taken from the dynamic buffer
    after ``dyn`` bytes; returns (source, extra bytes)."""
    extra = 0
    for m in list(re.finditer(r"__shared__ alignas\(64\) float (\w+)\[(\d+)\];", src)):
        name, n = m.group(1), int(m.group(2))
        src = src.replace(m.group(0), f"float* {name} = (float*)(buf_dyn_shmem_ptr + {dyn + extra});")
        extra += 4 * n
    return src, extra


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "probe_tvm_launch.json"))
    args = ap.parse_args(argv)
    import cupy as cp
    import torch

    import sparsec
    from sparsec import formats
    from sparsec.measure import Timer

    def torch_stream():  # torch's current stream: the capture's while the timer captures a graph
        return cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    from sparsec.kernel import on_torch_stream
    from time_bsr_small_feat import suite_cases

    timer = Timer("cuda", warmup_ms=10.0, budget_ms=80.0, max_reps=200)
    rows = []
    for name, feat in CASES:
        (_, dense, b), = suite_cases(False, [name])
        A = formats.convert(dense, f"bsr:{b}x{b}")
        k = sparsec.compile("spmm", A, target="cuda", feat=feat)
        src = str(k.source())
        kname, sig = signature(src)
        rng = np.random.default_rng(0)
        Bs = [torch.from_numpy(rng.standard_normal((dense.shape[1], feat)).astype(np.float16)).cuda() for _ in range(8)]
        preps = [k.prepare(A, B, poison=True) for B in Bs]
        f = k.executable[k.op_name]
        by_name = {}
        for p, a in zip(k.params, preps[0][0]):
            by_name[p.name] = a
        n_io = int(A.arrays["indptr"].shape[0]) - 1
        grid, block = launch_shape(src, k.knobs, feat, n_io)
        ints = {"cols": dense.shape[1], "rows": dense.shape[0], "n_io": n_io}

        def pointer(x):
            return np.uint64(torch.utils.dlpack.from_dlpack(x).data_ptr() if not torch.is_tensor(x) else x.data_ptr())

        def operands(prep):
            named = {p.name: a for p, a in zip(k.params, prep[0])}
            out = []
            for typ, pname in sig:
                base = pname[:-4] if pname.endswith("_ptr") else pname
                if typ == "ptr":
                    key = base if base in named else {"A": "A"}.get(base, base)
                    out.append(pointer(named[key]))
                else:
                    out.append(np.int32(ints[base]))
            return out

        dyn = k.knobs["k_split"] * k.knobs["stages"] * 2 * 640 * 2 * (b // 16) * (k.knobs["n_tile"] // 16)
        variants = {"cupy": (src, 0)}
        moved, extra = static_to_dynamic(src, dyn)
        if extra:
            variants["cupy, static tile in the dynamic buffer"] = (moved, extra)
        row = {"case": name, "feat": feat, "knobs": k.knobs, "grid": grid, "block": block, "dyn_smem": dyn}
        with on_torch_stream(True):
            f(*preps[0][0])
        torch.cuda.synchronize()
        want = preps[0][1][0].clone()

        def tvm_call(i):
            with on_torch_stream(True):
                f(*preps[i][0])
        row["tvm_us"] = timer.measure([lambda i=i: tvm_call(i) for i in range(8)]).median_ms * 1e3
        At = torch.from_numpy(dense).cuda()
        row["dense_us"] = timer.measure([lambda B=B: torch.matmul(At, B) for B in Bs]).median_ms * 1e3
        for label, (code, more) in variants.items():
            try:
                kern = cp.RawModule(code=code, options=("-std=c++17", "-arch=sm_90a")).get_function(kname)
            except Exception:  # noqa: BLE001  (NVRTC without a header TVM's source includes: nvcc, CuPy's arch)
                kern = cp.RawModule(code=code, options=("-std=c++17",), backend="nvcc").get_function(kname)
            kern.max_dynamic_shared_size_bytes = dyn + more
            ops = [operands(p) for p in preps]
            preps[0][1][0].fill_(float("nan"))

            def call(i, kern=kern, ops=ops, smem=dyn + more):
                with torch_stream():
                    kern(grid, block, tuple(ops[i]), shared_mem=smem)
            call(0)
            torch.cuda.synchronize()
            same = bool(torch.equal(preps[0][1][0], want))
            us = timer.measure([lambda i=i: call(i) for i in range(8)]).median_ms * 1e3
            row[label] = {"us": us, "same_output": same}
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(args.out, "w") as fh:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, fh, indent=1)
    print(f"\n{torch.cuda.get_device_name()}: us, same operands and output")
    for r in rows:
        extra = " ".join(f"{k}: {v['us']:.2f}{'' if v['same_output'] else ' (DIFFERS)'}" for k, v in r.items()
                         if isinstance(v, dict) and "us" in v)
        print(f"{r['case']:<26} F{r['feat']:<3} dense {r['dense_us']:.2f} tvm {r['tvm_us']:.2f} {extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
