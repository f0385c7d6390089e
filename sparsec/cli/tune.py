"""``sparsec tune``: tune an operator on a matrix or a suite, log it, report it.

    sparsec tune spmm --suite graphs --feat 32 128 --target cuda --trials 64 [--resume] [--plot tune.png]
    sparsec tune spmm --matrix A.npz --feat 64 --target llvm --trials 16 --formats csr,hyb
    sparsec tune sddmm --random 3000,2000,0.01 --dtype float64 --target llvm --trials 8
    sparsec tune spmm --matrix W.npz --feat 16 512 --target cuda --formats bsr,mma_sp,nm_tc --dtype float16
    sparsec tune spmm --matrix W.npz --feat 64 --target cuda --formats srbcrs --dtype int8
    sparsec tune spmm --matrix W.npz --feat 16 --target cuda --formats tiled --dtype float16

Shows a progress bar (tqdm; a line per case without it), then a table per case: the
untuned default, the best of each format family, the speedup of the best over the
default and, with ``--peer`` on a GPU, over cuSPARSE (the best and default are then timed
again by ``sparsec.bench``, side by side with cuSPARSE, as every benchmark is).

The tuner (and through it the compiler) is imported only when the command runs, so that
``sparsec --help`` stays fast; ``--plot`` without matplotlib is refused before any work.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import List

from .common import add_matrix_source, count, dumps, positive_int

# float formats (csr, hyb, ell, bsr; mma_sp and nm_tc at float16) and int8 SR-BCRS
TUNE_DTYPES = ("float32", "float64", "float16", "int8")
FORMATS_HELP = ("format families to search, comma separated (default csr,hyb,ell,bsr). The packed Tensor "
                "Core families change the matrix, as converting to them does: mma_sp (float16) keeps the 2 "
                "largest of every 4 entries along a row, nm_tc (float16) 1 of every 8 columns, chosen per "
                "vector of 128 rows, srbcrs (int8) quantizes the values to int8 unless they are int8 "
                "already; a matrix already in the pattern (pruned weights) stays as it is; tiled (float16) "
                "keeps every value, in bitmap tiles its Tensor Core kernel expands. Searched alone, "
                "their speedup is over the first one's untuned kernel")

# A round of candidates waits for its slowest build. On the GPU host (16 cores) a kernel
# builds in 2-8 s, except hyb with many column ranges: 16 ranges x 6 buckets are ~100 fused
# parts, 60-120 s to build, and such a candidate never won a logged case (tuning_logs/
# spmm_cuda_sm_90a.jsonl: the best hyb of every case has one column range; 58 of its 125
# sixteen-range builds timed out at 120 s). At 30 s those are recorded as timeouts and a
# round takes seconds instead of ~2 minutes (the first SDDMM tuning run spent 520 s on 48
# candidates). The CPU target's builds are slower, so it keeps the longer limit.
CUDA_BUILD_TIMEOUT = 30.0
BUILD_TIMEOUT = 120.0


def add_parser(sub, common):
    p = sub.add_parser("tune", parents=[common], help="tune formats x schedules with the XGBoost cost model")
    p.add_argument("op", choices=("spmm", "sddmm"), help="operator to tune")
    src = add_matrix_source(p, required=True, many=True)
    src.add_argument("--suite", choices=("graphs",), help="the graphs suite of sparsec.bench.suites")
    p.add_argument("--dtype", default="float32", choices=TUNE_DTYPES,
                   help="value dtype (default float32; float16 for mma_sp / nm_tc, int8 for srbcrs)")
    p.add_argument("--feat", type=positive_int, nargs="+", default=None, metavar="N",
                   help="dense feature width(s) (default 64; --suite: the suite's widths)")
    p.add_argument("--target", default="llvm", help="llvm, cuda, cuda:sm_90a (default llvm)")
    p.add_argument("--trials", type=positive_int, default=64, metavar="N", help="measurements per case (default 64)")
    p.add_argument("--formats", type=_families, metavar="csr,hyb,...", help=FORMATS_HELP)
    p.add_argument("--size", type=_size, default="full", metavar="full|small",
                   help="the full space (default), or a small enumerable one")
    p.add_argument("--log", metavar="FILE", help="JSON-lines log (default tuning_logs/<op>_<target>.jsonl)")
    p.add_argument("--resume", action="store_true", help="count this log's earlier measurements of a case")
    p.add_argument("--batch", type=positive_int, default=8, metavar="B", help="candidates per round (default 8)")
    p.add_argument("--epsilon", type=float, default=0.2, metavar="E", help="random share of a round (default 0.2)")
    p.add_argument("--patience", type=positive_int, metavar="K", help="stop a case after K rounds without gain")
    p.add_argument("--no-transfer", action="store_true", help="do not train on the log's other matrices")
    p.add_argument("--workers", type=positive_int, metavar="N", help="build processes (default: CPU count)")
    p.add_argument("--timeout", type=float, default=20.0, metavar="S", help="per-candidate measuring limit (s)")
    p.add_argument("--build-timeout", type=float, metavar="S",
                   help="per-candidate build limit (s); a slower build is recorded as a timeout "
                        f"(default {CUDA_BUILD_TIMEOUT:g} on CUDA, {BUILD_TIMEOUT:g} on the CPU)")
    p.add_argument("--devices", type=int, nargs="+", metavar="GPU", help="GPUs to measure on (default 0)")
    p.add_argument("--rpc", metavar="HOST:PORT", help="measure on the RPC servers of this TVM tracker "
                                                     "(builds stay here; see sparsec.tune.rpc)")
    p.add_argument("--rpc-key", metavar="KEY", help="the servers' device key, with --rpc")
    p.add_argument("--max-rmat", type=count, metavar="NNZ", help="--suite: leave out larger R-MAT graphs (4M)")
    p.add_argument("--peer", action="store_true", help="GPU: time default and best again beside cuSPARSE")
    p.add_argument("--json", metavar="FILE", help="write the per-case results (non-finite numbers as null)")
    p.add_argument("--plot", metavar="FILE.png", help="best-so-far vs trials, predicted vs measured "
                                                      "(needs matplotlib: pip install 'sparsec[tune]')")
    p.add_argument("--seed", type=int, default=0, help="random seed (exploration, inputs)")
    # tests: make measurements number N, M, ... crash / hang / return wrong results (N:kind,...)
    p.add_argument("--inject-faults", type=_faults, default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_tune)
    return p


def _families(text: str) -> List[str]:
    from ..tune.space import FAMILIES

    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in FAMILIES]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"--formats takes a comma list of {', '.join(FAMILIES)}; got {text!r}")
    return names


def _size(text: str) -> str:
    from ..tune.space import SIZES

    if text not in SIZES:
        raise argparse.ArgumentTypeError(f"--size should be one of {', '.join(SIZES)}; got {text!r}")
    return text


def _faults(text: str):
    out = {}
    for item in text.split(","):
        n, _, kind = item.partition(":")
        if not n.strip().isdigit() or kind not in ("crash", "hang", "wrong", "compile_error"):
            raise argparse.ArgumentTypeError(f"--inject-faults takes N:crash|hang|wrong|compile_error,...; got {text!r}")
        out[int(n)] = kind
    return out


def _cases(args):
    from .. import datasets, workload
    from ..tune.tuner import Case

    if args.suite:
        from ..bench import suites
        from ..bench.cases import graph_matrices

        feats = args.feat or list(suites.GRAPH_FEATS)
        mats = graph_matrices(suites.default_cache_dir(), max_rmat=args.max_rmat)
        return [Case(name, m, f) for name, m in mats for f in feats]
    if args.random is not None:
        m, seed = workload.random_matrix(args.random)
        name = "random-{}x{}-{}-s{}".format(*m.shape, args.random.split(",")[2], seed)
        return [Case(name, m, f) for f in (args.feat or [64])]
    out = []
    for path in args.matrix:
        m = datasets.load_npz(path)  # the checks and messages of every matrix file
        name = os.path.splitext(os.path.basename(path))[0]
        out += [Case(name, m, f) for f in (args.feat or [64])]
    return out


def check_plot_possible(path) -> None:
    """Refuse ``--plot`` before any work when matplotlib is missing (it is in the tune extra)."""
    if path is None:
        return
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ValueError(f"--plot {path} needs matplotlib, which is not installed: "
                         "pip install 'sparsec[tune]' (or matplotlib), or leave --plot out") from None


class _Progress:
    """tqdm over all trials when it is installed, else a line per case."""

    def __init__(self, total: int):
        try:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="trial", file=sys.stderr, dynamic_ncols=True)
        except ImportError:
            self.bar = None
        self.best = {}

    def case(self, case, size):
        msg = f"{case.name} F={case.feat}: {size} candidates"
        if self.bar is not None:
            self.bar.set_description(f"{case.name} F={case.feat}")
        else:
            print(msg, file=sys.stderr, flush=True)

    def trial(self, case, trial):
        key = (case.name, case.feat)
        if trial.ok:
            self.best[key] = min(self.best.get(key, math.inf), trial.time_ms)
        if self.bar is not None:
            self.bar.update(1)
            b = self.best.get(key)
            self.bar.set_postfix_str(f"best {b:.4g} ms" if b else trial.result.get("status", ""))

    def close(self):
        if self.bar is not None:
            self.bar.close()


def cmd_tune(args) -> int:
    check_plot_possible(args.plot)
    from ..bench.report import geomean
    from ..tune.tuner import tune_cases

    cases = _cases(args)
    if not cases:
        raise ValueError("nothing to tune: no matrices")
    if args.build_timeout is None:
        args.build_timeout = CUDA_BUILD_TIMEOUT if args.target.startswith("cuda") else BUILD_TIMEOUT
    runner = None
    if args.rpc or args.rpc_key:
        if not (args.rpc and args.rpc_key):
            raise ValueError("--rpc and --rpc-key go together")
        if args.devices:
            raise ValueError("--devices picks local GPUs; with --rpc every server under the key measures")
        from ..tune.rpc import RPCRunner

        runner = RPCRunner(args.rpc, args.rpc_key, args.target, timeout_s=args.timeout,
                           build_timeout_s=args.build_timeout, workers=args.workers)
    progress = _Progress(len(cases) * args.trials)
    started = time.perf_counter()
    try:
        results = tune_cases(
            args.op, cases, target=args.target, trials=args.trials, log=args.log, resume=args.resume,
            dtype=args.dtype, families=args.formats, size=args.size, batch=args.batch, epsilon=args.epsilon, patience=args.patience,
            seed=args.seed, transfer=not args.no_transfer, inject=args.inject_faults,
            runner_options={"workers": args.workers, "timeout_s": args.timeout, "devices": args.devices,
                            "build_timeout_s": args.build_timeout},
            runner=runner, on_trial=progress.trial, on_case=progress.case)
    finally:
        progress.close()
        if runner is not None:
            runner.close()
    wall = time.perf_counter() - started
    rows = [summary_row(r) for r in results]
    if args.peer:
        attach_peer_times(args.op, cases, rows, args.target)
    print(format_table(rows))
    gm = geomean([r["speedup"] for r in rows if r["speedup"]])
    if gm:
        print(f"geometric mean speedup over the untuned default: {gm:.2f}x over {len(rows)} cases")
    print(wall_line(results, wall))
    if args.json:
        with open(args.json, "w") as f:
            f.write(dumps({"op": args.op, "target": args.target, "dtype": args.dtype, "trials": args.trials,
                           "cases": rows}, indent=1))
    if args.plot:
        plot(results, args.plot)
    return 0


def wall_line(results, wall: float) -> str:
    """Where the tuning time went: building and measuring (overlapped in the runner; the
    workers' start-up falls in the first round), the model and search, and the rest
    (reading the log and matrices, fitting the saved model)."""
    trials = sum(len(r.search.trials) for r in results)
    measuring = sum(r.measure_s for r in results)
    searching = sum(r.seconds for r in results) - measuring
    return (f"wall time {wall:.1f} s for {trials} trials: building and measuring {measuring:.1f} s, "
            f"model and search {searching:.1f} s, other {wall - measuring - searching:.1f} s")


def summary_row(r) -> dict:
    from ..tune.space import describe

    s = r.search
    best, default = s.best, s.default
    fams = {}
    for t in s.measured:
        f = t.candidate["format"].split(":")[0]
        if f not in fams or t.time_ms < fams[f]["time_ms"]:
            fams[f] = {"time_ms": t.time_ms, "candidate": describe(t.candidate)}
    failed = {}
    for t in s.trials:
        if not t.ok:
            failed[t.result.get("status")] = failed.get(t.result.get("status"), 0) + 1
    return {"matrix": r.case.name, "feat": r.case.feat, "signature": r.signature, "space": r.space_size,
            "trials": len(s.trials), "stopped": s.stopped, "seconds": r.seconds, "measure_s": r.measure_s,
            "default_ms": default.time_ms if default and default.ok else None,
            "default": describe(default.candidate) if default else None,
            "best_ms": best.time_ms if best else None, "best": describe(best.candidate) if best else None,
            "best_candidate": best.candidate if best else None, "default_candidate": default.candidate if default else None,
            "speedup": r.speedup, "families": fams, "failed": failed}


def format_table(rows) -> str:
    fams = sorted({f for r in rows for f in r["families"]})
    peer = any("cusparse_ms" in r for r in rows)
    head = ["matrix", "F", "trials", "default ms", "best ms", "vs default"] + [f"best {f}" for f in fams]
    if peer:
        head += ["cuSPARSE ms", "best vs cuSPARSE"]
    head += ["best candidate", "failed"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["matrix"], str(r["feat"]), str(r["trials"]), _ms(r["default_ms"]), _ms(r["best_ms"]),
                 f"{r['speedup']:.2f}x" if r["speedup"] else "-"]
        cells += [_ms(r["families"].get(f, {}).get("time_ms")) for f in fams]
        if peer:
            cells += [_ms(r.get("cusparse_ms")), f"{r['vs_cusparse']:.2f}x" if r.get("vs_cusparse") else "-"]
        cells += [r["best"] or "-", ", ".join(f"{k} {v}" for k, v in sorted(r["failed"].items())) or "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ms(x) -> str:
    return f"{x:.4g}" if x else "-"


def attach_peer_times(op, cases, rows, target):
    """Time each case's default and best again with ``sparsec.bench`` (cuSPARSE beside them)."""
    from ..bench.cases import Case as BenchCase, MatrixCases
    from ..bench.run import Bench

    groups = []
    for case, row in zip(cases, rows):
        g = MatrixCases(case.name, case.matrix)
        for which in ("default_candidate", "best_candidate"):
            c = row.get(which)
            if c:
                g.cases.append(BenchCase(op, case.name, bench_spec(c), c["dtype"], case.feat,
                                         tuple(sorted(c["schedule_knobs"].items())), suite=which))
        groups.append(g)
    bench = Bench(target if target.startswith("cuda") else "llvm")
    recs = bench.run(groups)
    for row in rows:
        mine = [r for r in recs if r["matrix"] == row["matrix"] and r["feat"] == row["feat"] and r["status"] == "ok"]
        by = {r["suite"]: r for r in mine}
        d, b = by.get("default_candidate"), by.get("best_candidate")
        if b:
            peer = b["peers"].get(b["main_peer"], {})
            row.update(bench_best_ms=b["sparsec_ms"], cusparse_ms=peer.get("ms"), vs_cusparse=b["speedup"])
        if d:
            row["bench_default_ms"] = d["sparsec_ms"]
        if d and b:
            row["bench_speedup"] = d["sparsec_ms"] / b["sparsec_ms"]


def bench_spec(c) -> str:
    """A candidate's format as one spec string (``hyb:col_parts=2,buckets=1/2/4``)."""
    fk = c["format_knobs"]
    if not fk:
        return c["format"]
    return c["format"] + ":" + ",".join(f"{k}={v}" for k, v in sorted(fk.items()))


def plot(results, path: str):
    """Left: best time so far over the default's, per case, against trials. Right: the model's
    prediction (made before each measurement) against the measured log throughput."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from ..tune.features import MatrixContext
    from ..tune.model import log_throughput

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.8))
    xs, ys = [], []
    for r in results:
        s = r.search
        d = s.default
        if d is None or not d.ok:
            continue
        curve = np.array(s.best_so_far())
        a.plot(np.arange(1, len(curve) + 1), d.time_ms / curve, lw=0.8, alpha=0.7)
        ctx = None
        for t in s.measured:
            if t.predicted is not None and t.source != "resumed":
                ctx = ctx or MatrixContext(r.case.matrix)
                xs.append(t.predicted)
                ys.append(log_throughput(t.candidate, ctx, t.time_ms))
    a.set_xlabel("trials")
    a.set_ylabel("speedup of best so far over the untuned default")
    a.axhline(1.0, color="k", lw=0.5)
    a.set_title("search progress, one line per case")
    if xs:
        b.scatter(xs, ys, s=6, alpha=0.5)
        lo, hi = min(xs + ys), max(xs + ys)
        b.plot([lo, hi], [lo, hi], color="k", lw=0.5)
    b.set_xlabel("predicted log throughput (before measuring)")
    b.set_ylabel("measured log throughput")
    b.set_title("cost model: predicted vs measured")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
