#!/usr/bin/env python3
"""Where the streaming tiled kernel's time goes (``schedules/tiled_stream.py``): one weight,
timed three ways -- the benchmarks' timer in CUDA-graph and in eager mode, and 200
back-to-back launches between two CUDA events -- so a host-bound figure shows as such; or
(``--ncu``) a few launches for Nsight Compute (speed of light, occupancy, warp states,
scheduler, memory).

    python3 benchmarks/profile_tiled_stream.py [--shape 4096x4096] [--sparsity 0.9]
        [--tokens 16] [--tile 16x64] [--knobs '{"warps": 4}']
    ncu --kernel-name regex:tiled_stream --launch-skip 5 --launch-count 1 --section ... \\
        python3 benchmarks/profile_tiled_stream.py --ncu

Prints one JSON line: the timings and whether a launch captures into a CUDA graph.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

import numpy as np

import _preamble  # noqa: F401,E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="4096x4096")
    ap.add_argument("--sparsity", type=float, default=0.9)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--tile", default="16x64")
    ap.add_argument("--knobs", default="{}")
    ap.add_argument("--ncu", action="store_true", help="a few launches only (for a profiler)")
    args = ap.parse_args(argv)
    import torch
    import tvm

    from sparsec.formats import tiled
    from sparsec.kernel import on_torch_stream
    from sparsec.measure import Timer
    from sparsec.reference import max_rel_err
    from sparsec.schedules import tiled_stream as ts

    rows, cols = (int(x) for x in args.shape.split("x"))
    tile = tuple(int(x) for x in args.tile.split("x"))
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float16)
    inst, keep = tiled.prune(w, sparsity=args.sparsity, tile=tile)
    # the defaults sparsec.compile takes for this matrix (its density sizes the slots)
    knobs = {**ts.default_knobs(args.tokens, rows, cols, tile, inst.nnz / max(rows * cols, 1)),
             **json.loads(args.knobs)}
    fn = ts.build(tile, args.tokens, **knobs).mod["tiled_stream"]
    dev = tvm.cuda(0)
    ops = [tvm.runtime.tensor(np.ascontiguousarray(a), dev) for a in
           (inst.arrays["bitmap"], inst.arrays["tile_offsets"], inst.data.astype(np.float16))]
    x = rng.standard_normal((cols, args.tokens)).astype(np.float16)
    B = tvm.runtime.tensor(x, dev)
    C = tvm.runtime.tensor(np.full((rows, args.tokens), np.nan, np.float32), dev)
    fn(*ops, B, C)
    err = float(max_rel_err(C.numpy(), np.where(keep, w, 0).astype(np.float64) @ x.astype(np.float64)))
    out = {"device": torch.cuda.get_device_name(), "shape": [rows, cols], "sparsity": args.sparsity,
           "tokens": args.tokens, "tile": list(tile), "knobs": knobs, "max_rel_err": err,
           "plan_smem": ts.plan(tile, args.tokens, **knobs).smem}
    if args.ncu:
        for _ in range(8):
            fn(*ops, B, C)
        torch.cuda.synchronize()
        print(json.dumps(out))
        return 0

    def call():
        with on_torch_stream(True):
            fn(*ops, B, C)

    try:  # does a launch capture into a CUDA graph?
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            call()
        g.replay()
        torch.cuda.synchronize()
        out["graph_capture"] = "ok"
    except Exception:  # noqa: BLE001 - the reason is the finding
        out["graph_capture"] = traceback.format_exc().splitlines()[-1][:300]
    for mode in ("graph", "eager"):
        t = Timer("cuda", warmup_ms=10.0, budget_ms=100.0, max_reps=200, mode=mode).measure([call])
        out[f"timer_{mode}"] = t.as_dict()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(10):
        call()
    start.record()
    for _ in range(200):
        call()
    end.record()
    torch.cuda.synchronize()
    out["events_back_to_back_ms"] = start.elapsed_time(end) / 200
    print(json.dumps(out))
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "profile_tiled_stream.json"), "a") as f:
            f.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
