#!/usr/bin/env python3
"""Knob sweep of the streaming BSR kernel (``schedules/bsr_stream.py``) on chosen cases of
``time_bsr_small_feat.py``'s suite, beside its default knobs, the block-row template and
dense cuBLAS fp16 (CUDA-graph medians, each kernel checked against float64 on its first
call). For choosing defaults, not a result to quote on its own.

    python3 benchmarks/sweep_bsr_stream.py --cases random-4096x4096-b16-s70 ... [--feats 16 64]
        [--warps 16 8 4] [--clusters 8 4] [--stages 4 6 8] [--bks 8 16]
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

import _preamble  # noqa: F401,E402
from _helpers import make_timed  # noqa: E402
from time_bsr_small_feat import check_and_time, suite_cases  # noqa: E402


def main() -> int:
    import torch

    import sparsec
    from sparsec import formats
    from sparsec.schedules import bsr_stream, tensorcore

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="+", required=True)
    ap.add_argument("--feats", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--warps", type=int, nargs="+", default=[16, 8, 4])
    ap.add_argument("--clusters", type=int, nargs="+", default=[8, 4])
    ap.add_argument("--stages", type=int, nargs="+", default=[4, 6, 8])
    ap.add_argument("--bks", type=int, nargs="*", default=[],
                    help="block columns of B resident at once (default: the fewest phases that fit)")
    args = ap.parse_args()
    timed = make_timed("cuda")
    rows, all_ok = [], True
    for name, dense, b in suite_cases(False, args.cases):
        A = formats.convert(dense, f"bsr:{b}x{b}")
        At = torch.from_numpy(dense).cuda()
        density = A.nnz / dense.size
        for feat in args.feats:
            rec = {"case": name, "feat": feat, "runs": []}
            default = bsr_stream.default_knobs((b, b), feat, *dense.shape, density)
            sets = [default] + [bsr_stream.default_knobs((b, b), feat, *dense.shape, density,
                                                         fixed={"warps": w, "cluster": c, "stages": s,
                                                                **({"bk": k} if k else {})})
                                for w, c, s, k in itertools.product(args.warps, args.clusters, args.stages,
                                                                    args.bks or [None])]
            seen = []
            for knobs in sets:
                if knobs in seen or not bsr_stream._fits((b, b), feat, knobs):
                    continue
                seen.append(knobs)
                k = sparsec.compile("spmm", A, target="cuda", feat=feat, knobs=knobs)
                ok, err, ms, B = check_and_time(k, A, dense, feat, timed, torch)
                all_ok &= ok
                rec["runs"].append({"knobs": knobs, "ms": ms, "ok": ok, "default": knobs == default,
                                    "ctas_per_sm": bsr_stream.plan((b, b), feat, **knobs).ctas_per_sm,
                                    "estimate_ns": bsr_stream.estimate_ns((b, b), feat, knobs, *dense.shape, density)})
                print(f"    {ms * 1e3:6.2f} us {knobs} {rec['runs'][-1]['ctas_per_sm']}/SM", flush=True)
            old = tensorcore.default_knobs(b, feat, dense.shape)
            k = sparsec.compile("spmm", A, target="cuda", feat=feat, knobs=old)
            ok, _, rec["blockrow_ms"], B = check_and_time(k, A, dense, feat, timed, torch)
            all_ok &= ok
            rec["dense_ms"] = timed(lambda _: torch.matmul(At, B), [None])
            best = min(rec["runs"], key=lambda r: r["ms"])
            print(f"{name:<28} feat={feat:<3} dense {rec['dense_ms'] * 1e3:6.2f} us  block-row "
                  f"{rec['blockrow_ms'] * 1e3:6.2f}  default {rec['runs'][0]['ms'] * 1e3:6.2f} {rec['runs'][0]['knobs']}"
                  f"  best {best['ms'] * 1e3:6.2f} {best['knobs']}", flush=True)
            rows.append(rec)
    out = {"device": torch.cuda.get_device_name(), "rows": rows, "all_ok": all_ok}
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "sweep_bsr_stream.json").write_text(json.dumps(out, indent=1))
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
