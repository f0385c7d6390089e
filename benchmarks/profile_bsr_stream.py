#!/usr/bin/env python3
"""Nsight Compute's view of BSR fp16 SpMM at few columns of B beside dense cuBLAS (GPU host):
which of the streaming kernel's knob sets, the block-row template and ``torch.matmul`` spend
their time where, on chosen cases of ``time_bsr_small_feat.py``'s suite.

    ncu --profile-from-start off --section SpeedOfLight --section Occupancy \
        --section WarpStateStats --section LaunchStats -o $OUT/prof \
        python3 benchmarks/profile_bsr_stream.py --cases random-4096x4096-b32-s70 --feat 64 \
        --knobs default '{"cluster": 4}' blockrow

Each kernel is checked against float64 on a NaN-poisoned output, warmed up, then called
twice between cudaProfilerStart / Stop (dense last).
"""
from __future__ import annotations

import argparse
import json
import sys

import _preamble  # noqa: F401,E402
from _helpers import profile_calls  # noqa: E402
from time_bsr_small_feat import check_and_time, suite_cases  # noqa: E402


def knob_sets(texts, block, feat, shape, density):
    """The knob sets ``texts`` name: "default" (what sparsec.compile picks), "blockrow" (the
    block-row template's defaults), or JSON knobs of the streaming kernel laid over its
    defaults for this case."""
    from sparsec.schedules import bsr_stream, tensorcore

    out = []
    for t in texts:
        if t == "default":
            out.append((t, None))
        elif t == "blockrow":
            out.append((t, tensorcore.default_knobs(block, feat, shape)))
        else:
            fixed = json.loads(t)
            out.append((t, bsr_stream.default_knobs((block, block), feat, *shape, density, fixed=fixed)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="+", required=True)
    ap.add_argument("--feat", type=int, default=64)
    ap.add_argument("--knobs", nargs="+", default=["default", "blockrow"])
    args = ap.parse_args(argv)
    import torch

    import sparsec
    from sparsec import formats

    calls, all_ok = [], True
    for name, dense, b in suite_cases(False, args.cases):
        A = formats.convert(dense, f"bsr:{b}x{b}")
        At = torch.from_numpy(dense).cuda()
        for label, knobs in knob_sets(args.knobs, b, args.feat, dense.shape, A.nnz / dense.size):
            k = sparsec.compile("spmm", A, target="cuda", feat=args.feat, knobs=knobs)
            ok, err, ms, B = check_and_time(k, A, dense, args.feat, lambda f, x: 0.0, torch)
            print(f"{'ok ' if ok else 'BAD'} {name} {label} {k.knobs} err {err:.1e}", flush=True)
            all_ok &= ok
            a, _, _ = k.prepare(A, B)
            calls.append((f"{name} {label}", k.executable[k.op_name], a))
        calls.append((f"{name} dense", torch.matmul, (At, B)))
    profile_calls(calls)
    return 0 if all_ok else 1  # a wrong kernel's profile is no evidence


if __name__ == "__main__":
    sys.exit(main())
