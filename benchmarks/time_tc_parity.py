"""Where the compiled packed Tensor Core SpMM loses to the hand-written kernel: the kernel
built for one matrix size (M, K known at build time) against the kernel built for any size
(``M = K = None``, what ``sparsec.compile`` builds for a format spec), each with the committed
run's best knobs and with the compiler's default knobs, and the compiled kernel itself
(``sparsec.compile`` for the matrix: the any-size kernel carrying the body sized for it, float
and int8 alike), timed side by side in one process (TVM's time evaluator, median of 5 x 50
runs after a warm-up).

    python3 benchmarks/time_tc_parity.py [--cases N] [--out FILE]   (JSON also to $OUT)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

import _preamble  # noqa: F401,E402  (the one preamble: checkout root and benchmarks/data on sys.path)

RESULTS = Path(__file__).parent / "results"
TOKENS = (16, 512, 4096)


def timed(ex, name, args):
    import tvm

    ev = ex.mod.time_evaluator(name, tvm.cuda(0), number=50, repeat=5)
    return float(np.median([float(r) for r in ev(*args).results])) * 1e3


def with_compiled(row, k, A, B):
    """``row`` with the compiled kernel's time and knobs, printed."""
    row["compiled"] = k.time(A, B, number=50, repeat=5)["median_ms"]
    row["compiled_knobs"] = k.knobs
    print(" ".join(f"{n}={v:.4f}" if isinstance(v, float) else f"{n}={v}" for n, v in row.items()
                   if not n.endswith("knobs")), flush=True)
    return row


def packed_cases(limit):
    import torch

    import sparsec
    from sparsec.schedules import tc_pipeline as tp
    from sparsec.schedules.tensorcore_packed import default_pipeline_knobs
    from check_tc_formats import spmm_half_out
    from time_tc_pipeline import GATHER, operands, weights

    cases = json.load(open(RESULTS / "nm_tc_H200.json"))["cases"]
    spec_of = {"sp24": "mma_sp", "gather": "nm_tc:1:8:v128"}
    rng = np.random.default_rng(5)
    rows = []
    for mode in ("sp24", "gather"):
        layers = dict(weights(mode))
        picked = [c for c in cases if c["mode"] == mode and c["case"] in layers and c.get("best")
                  and c["N"] in TOKENS][:limit]
        for c in picked:
            A = sparsec.formats.convert(layers[c["case"]], spec_of[mode], dtype=np.float16)
            (da, de), kc = operands(mode, layers[c["case"]])
            B = torch.from_numpy(rng.standard_normal((c["K"], c["N"])).astype(np.float16)).cuda()
            out = torch.empty((c["M"], c["N"]), dtype=torch.float16, device="cuda")
            vec = GATHER["vec"] if mode == "gather" else 0
            default = default_pipeline_knobs(mode, vec or 1, c["N"], kc or None)
            row = {"mode": mode, "case": c["case"], "M": c["M"], "K": c["K"], "N": c["N"],
                   "best_knobs": c["best"]["knobs"], "default_knobs": default}
            for label, (M, K, knobs) in {"static_best": (c["M"], c["K"], c["best"]["knobs"]),
                                         "any_best": (None, None, c["best"]["knobs"]),
                                         "static_default": (c["M"], c["K"], default),
                                         "any_default": (None, None, default)}.items():
                ex = tp.build(mode, M, K, c["N"], arch="sm_90a", out_dtype="float16", vec=vec,
                              kc=kc if M is not None else 0, **knobs)
                row[label] = timed(ex, "tc_spmm", (da, de, B, out))
            rows.append(with_compiled(row, sparsec.compile(spmm_half_out(), A, target="cuda", feat=int(c["N"])),
                                      A, B))
    return rows


def int8_cases(limit):
    import torch

    import sparsec
    from lowprec import SPARSITIES, VECS, lowprec
    from sparsec.schedules import srbcrs_tensorcore as stc

    cases = json.load(open(RESULTS / "lowprec_int8_H200.json"))["cases"]
    layers = {name: (w, vec) for name, w, vec, _ in lowprec(vecs=VECS, sparsities=SPARSITIES)}
    rng = np.random.default_rng(6)
    rows = []
    picked = [c for c in cases if c["case"] in layers and c["N"] in (16, 2048) and c["sparsity"] == 0.9][:limit]
    for c in picked:
        w, vec = layers[c["case"]]
        scale = float(np.abs(w).max()) / 127 or 1.0
        A = sparsec.formats.convert(np.clip(np.round(w / scale), -127, 127), f"srbcrs:v{vec},int8")
        B = torch.from_numpy(rng.integers(-127, 127, (c["K"], c["N"])).astype(np.int8)).cuda()
        best = min((e for e in c["kernels"] if e.get("ms")), key=lambda e: e["ms"])["knobs"]
        ip, ix = (torch.from_numpy(A.arrays[n].astype(np.int32)).cuda() for n in ("indptr", "indices"))
        dv = torch.from_numpy(A.data.view(np.int32)).cuda().view(torch.uint32)
        out = torch.empty((c["M"], c["N"]), dtype=torch.int32, device="cuda")
        row = {"mode": "int8", "case": c["case"], "M": c["M"], "K": c["K"], "N": c["N"], "best_knobs": best}
        d8 = torch.from_numpy(A.data).cuda()  # the any-size kernel reads the values as the instance holds them
        for label, (M, K, values) in {"static_best": (c["M"], c["K"], dv), "any_best": (None, None, d8)}.items():
            ex = stc.build(M, K, int(c["N"]), vec, arch="sm_90a", **best)
            row[label] = timed(ex, "srbcrs_spmm", (ip, ix, values, B, out))
        rows.append(with_compiled(row, sparsec.compile("spmm", A, target="cuda", feat=int(c["N"])), A, B))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=6, help="most cases per mode")
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = packed_cases(args.cases) + int8_cases(args.cases)
    print(f"{'mode':<7} {'case':<34} {'N':>5} {'static/best':>11} {'any/best':>9} {'static/def':>10} "
          f"{'any/def':>8} {'compiled':>9}")
    for r in rows:
        print(f"{r['mode']:<7} {r['case']:<34} {r['N']:>5} {r['static_best']:>11.4f} {r['any_best']:>9.4f} "
              f"{r.get('static_default', float('nan')):>10.4f} {r.get('any_default', float('nan')):>8.4f} "
              f"{r['compiled']:>9.4f}")
    for path in filter(None, (args.out, os.environ.get("OUT") and os.path.join(os.environ["OUT"],
                                                                                "tc_parity.json"))):
        Path(path).write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
