#!/usr/bin/env python3
"""`sparsec tune` on the Tensor Core formats (issue 23, "Tuned"): tune, then time the untuned
and the tuned kernel of each case side by side.

    python benchmarks/tune_tc.py --quick [--out results.json]      # on the GPU host, < 400 s
    python benchmarks/tune_tc.py --dry-run                          # no GPU: the cases and their spaces

Cases (BERT-base-shaped weights of benchmarks/data/lowprec.py, pruned as its suites prune):

* ``mma_sp``: 2:4 along K (the nm suite's 2of4), float16, N = 16 and 512 columns of B;
* ``nm_tc``: vector-wise 1:8 in row vectors of 128 (benchmarks/time_tc_pipeline.py's gather
  weights), float16, N = 16 and 512;
* ``srbcrs``: int8 SR-BCRS, row vectors of 8 at 90 % sparsity (the lowprec suite's v8-s90,
  quantized to int8 as benchmarks/check_tc_formats.py's speed_int8 does), N = 16 and 512;
* ``bsr``: 32 x 32 blocks at 90 % block sparsity of the 768 x 3072 weight, float16, N = 16 and 64.

Each family is tuned by ``sparsec.tune.tuner.tune_cases`` (the small space, a few trials; the
families' format parameters are searched too: SR-BCRS's vector length, BSR's block), logged
to ``$OUT/tune_tc_logs/spmm_<target>.jsonl`` (or ``--log-dir``). Then, in this process, for
each case: the **default** is ``sparsec.compile`` of the case's format with no knobs (the
template's own choice), the **tuned** kernel the best record's format and knobs, and the
**model** kernel the knobs ``sparsec.compile(inst, knobs="tuned")`` would take for this
shape had it never been tuned (the log's model, fitted without this case's records, ranking
the configurations that won on the other cases: ``sparsec.tune.apply.model_schedule_knobs``).
Each is checked against the float64 reference on NaN-poisoned outputs and timed with the
benchmarks' timer (CUDA-graph replay over rotated inputs), alternating default and tuned
twice (the lower median of each counts).

Prints a table (default ms, tuned ms, speedup = default / tuned, model ms) and the geometric
means; writes ``tune_tc.json`` to ``$OUT`` and to ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

import _preamble  # noqa: F401,E402  (the one preamble: checkout root and benchmarks/data on sys.path)

from sparsec.bench.report import geomean  # noqa: E402

TARGET = "cuda:sm_90a"
WEIGHTS = ("bert-ffn-in", "bert-ffn-out")  # 3072 x 768 and 768 x 3072
GATHER = {"n": 1, "m": 8, "vec": 128}
FAMILIES = {  # family -> (dtype, format spec of the default, feats)
    "mma_sp": ("float16", "mma_sp", (16, 512)),
    "nm_tc": ("float16", "nm_tc:1:8:v128", (16, 512)),
    "srbcrs": ("int8", "srbcrs:v8,int8", (16, 512)),
    "bsr": ("float16", "bsr:32x32", (16, 64)),
}


def _as_csr(w: np.ndarray, dtype: str) -> sp.csr_matrix:
    """The pruned weight as float32 CSR holding values the kernel's dtype represents exactly
    (so the tuner's record and ``knobs="tuned"`` name the same matrix)."""
    if dtype == "float16":
        w = w.astype(np.float16)
    return sp.csr_matrix(np.asarray(w, np.float32))


def cases(quick: bool):
    """``[(name, family, spec, dtype, matrix, feat)]``."""
    from lowprec import BERT_BASE_SHAPES, prune_vectors, weights

    from sparsec.bench.suites import prune_blocks
    from sparsec.formats import nm, nm_tc

    layers = dict(weights(minilm_layers={}, bert_shapes=BERT_BASE_SHAPES))
    names = WEIGHTS if quick else tuple(BERT_BASE_SHAPES)
    out = []
    for family, (dtype, spec, feats) in FAMILIES.items():
        if family == "srbcrs":
            w = prune_vectors(layers["bert-ffn-out"], 8, 0.9)
            scale = float(np.abs(w).max()) / 127 or 1.0
            mats = [("bert-ffn-out-v8-s90", np.clip(np.round(w / scale), -127, 127))]
        elif family == "bsr":
            mats = [("bert-ffn-out-b32-s90", prune_blocks(layers["bert-ffn-out"], 32, 0.9))]
        elif family == "mma_sp":
            mats = [(f"{n}-2of4", np.where(nm.prune(layers[n], n=2, m=4)[1], layers[n], 0)) for n in names]
        else:
            mats = [(f"{n}-1of8-v128", nm_tc.prune(layers[n], **GATHER)) for n in names]
        for name, w in mats:
            m = _as_csr(w, dtype)
            out += [(name, family, spec, dtype, m, f) for f in feats]
    return out


def check_cases(all_cases, size: str) -> list:
    """No GPU: each case's matrix converts to its format unchanged (it is in the format's
    pattern already), and its tuning space holds Tensor Core candidates. Rows for the table."""
    from sparsec import workload
    from sparsec.tune.space import Space

    rows = []
    for name, family, spec, dtype, m, feat in all_cases:
        inst, info = workload.convert(m, spec, {}, dtype)
        kept = inst.to_scipy()
        if kept.shape != m.shape or kept.nnz != m.nnz or info["quantized"]:
            raise AssertionError(f"{name}: converting to {spec} changed the matrix ({m.nnz} -> {kept.nnz} entries)")
        space = Space("spmm", m, feat, dtype, families=(family,), size=size, target=TARGET)
        tc = [c for c in space.candidates if c["format"].split(":")[0] == family]
        if len(tc) < 2:
            raise AssertionError(f"{name} N={feat}: {len(tc)} {family} candidates")
        rows.append({"case": name, "format": spec, "dtype": dtype, "shape": list(m.shape), "nnz": int(m.nnz),
                     "feat": feat, "space": len(space), "family_candidates": len(tc)})
    return rows


def tune(all_cases, args, log_dir: Path):
    """Tune every case, one ``tune_cases`` call per family through one runner; returns
    {(name, feat): CaseResult} and the log path."""
    from sparsec.tune import records as R
    from sparsec.tune.runner import Runner
    from sparsec.tune.tuner import Case, tune_cases

    log = str(log_dir / Path(R.default_log_path("spmm", TARGET)).name)
    results = {}
    with Runner(TARGET, timeout_s=30.0, build_timeout_s=180.0, workers=args.workers) as runner:
        for family, (dtype, _, _) in FAMILIES.items():
            mine = [c for c in all_cases if c[1] == family]
            if not mine:
                continue
            t0 = time.perf_counter()
            got = tune_cases("spmm", [Case(name, m, feat) for name, _, _, _, m, feat in mine], target=TARGET,
                             trials=args.trials, batch=args.batch, log=log, resume=args.resume, families=[family],
                             size=args.size,
                             dtype=dtype, runner=runner, seed=args.seed)
            for c, r in zip(mine, got):
                results[(c[0], c[5])] = r
            print(f"tuned {family}: {len(mine)} cases, {sum(len(r.search.trials) for r in got)} trials, "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)
    return results, log


def held_out_pick(log: str, name: str, signature: str, inst, feat: int, dtype: str):
    """The knobs ``knobs="tuned"`` would give this case had it never been tuned: the model
    fitted on the other cases' records ranks the configurations that won there. None when
    there is no such pick (the default then)."""
    from sparsec.tune import records as R
    from sparsec.tune.apply import model_schedule_knobs

    others = [r for r in R.load(log) if r.signature != signature and r.matrix != name]
    return model_schedule_knobs("spmm", inst, feat, TARGET, dtype, log + ".held-out", others)


def timed(kernel, inst, dense_dev, timer) -> float:
    from sparsec.measure import device_l2_bytes, free_device_bytes, prepare_sparsec, rotation_count

    prepared = prepare_sparsec(kernel, inst, dense_dev, poison=False, layout="kernel")
    copies = rotation_count(prepared.nbytes, device_l2_bytes(), free_device_bytes("cuda"))
    calls = [prepared] + [prepared.clone() for _ in range(copies - 1)]
    return timer.measure(calls).median_ms


def checked(kernel, inst, dense, dense_dev, dtype) -> float:
    """The kernel's max relative error against the float64 reference on poisoned outputs;
    AssertionError past the dtype's tolerance."""
    from sparsec.reference import REFERENCES, TOLERANCE, max_rel_err

    out = kernel(inst, *dense_dev, poison=True)
    out = out.double().cpu().numpy() if hasattr(out, "cpu") else np.asarray(out, np.float64)
    err = max_rel_err(out, REFERENCES["spmm"](inst, *dense))
    if not err <= TOLERANCE[dtype]:
        raise AssertionError(f"{kernel.format_spec}: max relative error {err:.3g} > {TOLERANCE[dtype]:g}")
    return err


def compare(all_cases, results, log: str, model: bool):
    """Default, tuned and (``model``) held-out model kernels of each case, checked and timed side by side."""
    import torch

    import sparsec
    from sparsec import workload
    from sparsec.measure import Timer

    timer = Timer("cuda", warmup_ms=10.0, budget_ms=100.0, min_reps=10, max_reps=50)
    rows = []
    for name, family, spec, dtype, m, feat in all_cases:
        r = results[(name, feat)]
        best = r.search.best
        row = {"case": name, "format": spec, "dtype": dtype, "feat": feat, "shape": list(m.shape), "nnz": int(m.nnz),
               "trials": len(r.search.trials), "space": r.space_size}
        if best is None:
            rows.append({**row, "error": "no candidate measured ok"})
            continue
        inst, _ = workload.convert(m, spec, {}, dtype)
        default = sparsec.compile("spmm", inst, feat=feat, target=TARGET)
        tinst, _ = workload.convert(m, best.candidate["format"], best.candidate["format_knobs"], dtype)
        tuned = sparsec.compile("spmm", tinst, feat=feat, target=TARGET, knobs=best.candidate["schedule_knobs"])
        dense = workload.dense_inputs(default, inst, 0)
        dense_dev = [torch.from_numpy(np.ascontiguousarray(x)).cuda() for x in dense]
        errs = [checked(default, inst, dense, dense_dev, dtype), checked(tuned, tinst, dense, dense_dev, dtype)]
        d_ms, t_ms = [], []
        for _ in range(2):
            d_ms.append(timed(default, inst, dense_dev, timer))
            t_ms.append(timed(tuned, tinst, dense_dev, timer))
        searched_default = r.search.default
        row.update(default_ms=min(d_ms), tuned_ms=min(t_ms), speedup=min(d_ms) / min(t_ms),
                   default_knobs=default.knobs, tuned_format=best.candidate["format"],
                   tuned_knobs=best.candidate["schedule_knobs"], search_best_ms=best.time_ms,
                   search_default_ms=searched_default.time_ms if searched_default is not None else None,
                   max_rel_err=max(errs))
        if model:
            picked = held_out_pick(log, name, r.signature, inst, feat, dtype)
            row["model_knobs"] = picked
            if picked:
                k = sparsec.compile("spmm", inst, feat=feat, target=TARGET, knobs=picked)
                checked(k, inst, dense, dense_dev, dtype)
                row["model_ms"] = timed(k, inst, dense_dev, timer)
            else:
                row["model_ms"] = row["default_ms"]  # no pick: the untuned kernel
            row["model_speedup"] = row["default_ms"] / row["model_ms"]
        rows.append(row)
        print(f"{name:<24} {spec:<16} N={feat:<4} default {row['default_ms']:.4f} ms  tuned {row['tuned_ms']:.4f} ms"
              f"  {row['speedup']:.2f}x" + (f"  model {row['model_ms']:.4f} ms" if model else ""), flush=True)
    return rows


def table(rows, model: bool) -> str:
    head = ["case", "format", "N", "default ms", "tuned ms", "speedup (default/tuned)", "tuned format: knobs"]
    if model:
        head += ["model ms", "model speedup"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['case']} | {r['format']} | {r['feat']} | {r['error']} |")
            continue
        knobs = " ".join(f"{k}={v}" for k, v in sorted(r["tuned_knobs"].items()))
        cells = [r["case"], r["format"], str(r["feat"]), f"{r['default_ms']:.4f}", f"{r['tuned_ms']:.4f}",
                 f"{r['speedup']:.2f}x", f"{r['tuned_format']}: {knobs}"]
        if model:
            cells += [f"{r['model_ms']:.4f}", f"{r['model_speedup']:.2f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(rows, model: bool) -> dict:
    ok = [r for r in rows if "speedup" in r]
    out = {"cases": len(rows), "ok": len(ok), "geomean_speedup": geomean([r["speedup"] for r in ok]) if ok else None,
           "min_speedup": min((r["speedup"] for r in ok), default=None), "by_format": {}}
    for spec in dict.fromkeys(r["format"] for r in ok):
        mine = [r["speedup"] for r in ok if r["format"] == spec]
        out["by_format"][spec] = geomean(mine)
    if model and ok:
        out["geomean_model_speedup"] = geomean([r["model_speedup"] for r in ok])
    return out


def write(result: dict, out: str | None):
    for path in filter(None, (out, os.environ.get("OUT") and os.path.join(os.environ["OUT"], "tune_tc.json"))):
        Path(path).write_text(json.dumps(result, indent=1, default=str))
        print(f"wrote {path}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="two weights, 8 trials a case (under 400 s on an H100)")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: build the cases, check them and their spaces")
    ap.add_argument("--trials", type=int, help="measurements a case (default 8 with --quick, else 24)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--size", default="small", choices=("small", "full"))
    ap.add_argument("--workers", type=int, help="build processes (default: CPU count)")
    ap.add_argument("--no-model", action="store_true", help="skip the held-out model picks")
    ap.add_argument("--log-dir", help="where the tuning log goes (default $OUT/tune_tc_logs, else a temporary folder)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resume", action="store_true",
                    help="count the log's earlier measurements of a case (with --log-dir: re-time a finished run)")
    ap.add_argument("--out", help="results JSON")
    args = ap.parse_args(argv)
    args.trials = args.trials or (8 if args.quick else 24)
    t0 = time.perf_counter()
    all_cases = cases(args.quick)
    if args.dry_run:
        rows = check_cases(all_cases, args.size)
        for r in rows:
            print(f"{r['case']:<24} {r['format']:<16} {r['dtype']:<8} {r['shape'][0]}x{r['shape'][1]} "
                  f"nnz={r['nnz']:<8} N={r['feat']:<4} space {r['space']} ({r['family_candidates']} of its family)")
        print(f"{len(rows)} cases ok in {time.perf_counter() - t0:.1f} s")
        write({"dry_run": True, "cases": rows}, args.out)
        return 0
    import tempfile

    log_dir = Path(args.log_dir or (os.path.join(os.environ["OUT"], "tune_tc_logs") if os.environ.get("OUT")
                                    else tempfile.mkdtemp(prefix="tune_tc-")))
    log_dir.mkdir(parents=True, exist_ok=True)
    results, log = tune(all_cases, args, log_dir)
    tuned_s = time.perf_counter() - t0
    rows = compare(all_cases, results, log, not args.no_model)
    print(table(rows, not args.no_model))
    s = summary(rows, not args.no_model)
    print(f"geometric mean speedup of the tuned kernels over the untuned defaults: {s['geomean_speedup']:.3f}x "
          f"(min {s['min_speedup']:.3f}x) over {s['ok']} cases"
          + (f"; held-out model picks {s['geomean_model_speedup']:.3f}x" if "geomean_model_speedup" in s else ""))
    wall = time.perf_counter() - t0
    print(f"wall {wall:.0f} s (tuning {tuned_s:.0f} s); log {log}")
    import torch

    write({"target": TARGET, "device": torch.cuda.get_device_name(0), "trials": args.trials, "size": args.size,
           "quick": args.quick, "log": log, "wall_s": wall, "tuning_s": tuned_s, "summary": s, "cases": rows}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
