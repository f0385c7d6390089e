#!/usr/bin/env python3
"""Per-kernel device time of sparsec's SpMM and cuSPARSE's, from the CUDA profiler (GPU host).

The benchmark's times are whole calls; this splits them into the kernels each call
launches (a hyb SpMM's fill and fused parts, cuSPARSE's helper kernels), so a slow call
can be traced to the kernel that makes it slow. Each setting is checked against float64
first.

    python3 benchmarks/profile_kernels.py --matrix as-22july06 cond-mat --feat 32 128 \
        --setting 'csr' 'csr:unroll=8' 'hyb' 'hyb:slots_per_block=256'

A setting is FORMAT[:knob=value,...]. Prints one table (kernel, calls, mean us) per case and
writes $OUT/profile_kernels.json.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys

import numpy as np

import _preamble  # noqa: F401,E402  (the one preamble: checkout root and benchmarks/data on sys.path)
if "TVM_CUDA_COMPILE_MODE" not in os.environ:
    os.environ["TVM_CUDA_COMPILE_MODE"] = "nvcc"


def parse_setting(text: str):
    fmt, _, rest = text.partition(":")
    knobs = {}
    for item in filter(None, rest.split(",")):
        k, _, v = item.partition("=")
        knobs[k] = v if v == "auto" else int(v)
    return fmt, knobs


def kernel_times(fn, calls: int = 20):
    """{kernel name: (launches per call, mean device us)} over ``calls`` calls of ``fn``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    acc = collections.defaultdict(list)
    for ev in prof.events():
        if ev.device_type.name == "CUDA":
            acc[ev.name].append(ev.device_time if hasattr(ev, "device_time") else ev.cuda_time)
    return {name: (len(v) / calls, float(np.mean(v))) for name, v in acc.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--matrix", nargs="+", required=True)
    ap.add_argument("--feat", nargs="+", type=int, default=[32, 128])
    ap.add_argument("--setting", nargs="+", default=["csr", "hyb"])
    args = ap.parse_args(argv)
    import torch
    import tvm_ffi

    import sparsec
    from sparsec.bench import suites
    from sparsec.formats import convert

    specs = {s.name: s for s in suites.RMAT_SPECS}
    real = None
    out, dev = [], torch.device("cuda")
    for name in args.matrix:
        if name in specs:
            m = suites.rmat_graph(suites.default_cache_dir(), specs[name])
        else:
            real = real or dict(suites.real_graphs(suites.default_cache_dir()))
            m = real[name]
        m = m.tocsr().astype(np.float32)
        a64 = torch.sparse_csr_tensor(torch.from_numpy(m.indptr.astype(np.int64)),
                                      torch.from_numpy(m.indices.astype(np.int64)),
                                      torch.from_numpy(m.data.astype(np.float64)), size=m.shape, device=dev)
        a32 = a64.to(torch.float32)
        for feat in args.feat:
            b = torch.randn(m.shape[1], feat, device=dev)
            ref = torch.sparse.mm(a64, b.double())
            case = {"matrix": name, "nnz": int(m.nnz), "feat": feat, "runs": []}
            with tvm_ffi.use_torch_stream():
                case["runs"].append({"setting": "cuSPARSE", "kernels": kernel_times(lambda: torch.sparse.mm(a32, b))})
                for text in args.setting:
                    fmt, knobs = parse_setting(text)
                    inst = convert(m, fmt)
                    k = sparsec.compile("spmm", inst, feat=feat, target="cuda", knobs=knobs)
                    got = k(inst, b, poison=True)
                    err = ((got.double() - ref).norm() / ref.norm()).item()
                    prepared, _, _ = k.prepare(inst, b)
                    fn = k.executable[k.op_name]
                    case["runs"].append({"setting": text, "format": inst.format.spec, "err": err,
                                         "kernels": kernel_times(lambda: fn(*prepared))})
            out.append(case)
            print(f"\n{name} (nnz {m.nnz:,}) F={feat}")
            for run in case["runs"]:
                total = sum(n * us for n, us in run["kernels"].values())
                err = f" err {run['err']:.1e}" if "err" in run else ""
                print(f"  {run['setting']:28s} total {total:8.2f} us{err}")
                for kname, (n, us) in sorted(run["kernels"].items(), key=lambda kv: -kv[1][1] * kv[1][0]):
                    print(f"      {n:4.1f} x {us:8.2f} us  {kname[:90]}")
    with open(os.path.join(os.environ.get("OUT", "."), "profile_kernels.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "cases": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
