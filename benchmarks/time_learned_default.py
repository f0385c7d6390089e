#!/usr/bin/env python3
"""The learned default against the rule, side by side on the GPU host: SpMM (float32) on a
few matrices no log names, each compiled four ways -- CSR with the rule's knobs
(``knobs="default"``), CSR with the learned default (no knobs: the shipped model's pick),
the rule-based format (``formats.choose``), and the tuning logs' pick of format and knobs
(``tune.apply.tuned_config``, what ``--format auto`` takes) -- checked against float64 on
NaN-poisoned outputs, then timed (TVM's time evaluator, median of 5 x 20 runs) beside
cuSPARSE (``torch.sparse.mm``, CUDA events, median of 50).

    python3 benchmarks/time_learned_default.py [--feat 32 128]

Writes ``$OUT/learned_default.json`` (a row per matrix and width, written after each row);
prints a table last.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import scipy.sparse as sp

import _preamble  # noqa: F401,E402


def matrices():
    """(name, float32 CSR): the embedded power grid, a 1M-entry R-MAT, a banded mesh-like
    matrix and a uniform random one."""
    from sparsec import datasets
    from sparsec.bench.rmat import rmat

    n = 200_000
    band = sp.diags([np.ones(n - abs(k), np.float32) for k in range(-3, 4)], list(range(-3, 4)), format="csr")
    return [("power_grid", datasets.default_matrix().astype(np.float32)),
            ("rmat_s16_1M", rmat(16, 1_000_000, seed=1).astype(np.float32)),
            ("band7_200k", band.astype(np.float32)),
            ("uniform_100k_1M", uniform(100_000, 1_000_000, seed=3))]


def uniform(n, nnz, seed):
    """An n x n float32 CSR with about ``nnz`` entries at uniform random places."""
    rng = np.random.default_rng(seed)
    m = sp.csr_matrix((rng.standard_normal(nnz).astype(np.float32),
                       (rng.integers(0, n, nnz), rng.integers(0, n, nnz))), shape=(n, n))
    m.sum_duplicates()
    return m


def cusparse_ms(m, B):
    import torch

    A = torch.sparse_csr_tensor(torch.from_numpy(m.indptr.astype(np.int64)), torch.from_numpy(m.indices.astype(np.int64)),
                                torch.from_numpy(m.data), size=m.shape).cuda()
    Bt = torch.from_numpy(B).cuda()
    for _ in range(5):
        torch.sparse.mm(A, Bt)
    times = []
    for _ in range(50):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        torch.sparse.mm(A, Bt)
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return float(np.median(times))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--feat", nargs="*", type=int, default=[32, 128])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    import torch

    import sparsec
    from sparsec import workload
    from sparsec.formats import convert
    from sparsec.formats.choose import default_format, row_stats
    from sparsec.reference import max_rel_err
    from sparsec.targets import parse_target
    from sparsec.tune.apply import tuned_config

    target = parse_target("cuda").name
    rows, bad = [], 0
    path = os.path.join(args.out, "learned_default.json")
    for name, m in matrices():
        for F in args.feat:
            B = np.random.default_rng(0).standard_normal((m.shape[1], F)).astype(np.float32)
            ref = m.astype(np.float64) @ B.astype(np.float64)
            csr = convert(m, "csr")
            rule_fmt = convert(m, default_format("spmm", row_stats(m), F))
            cand, source = tuned_config("spmm", m, F, target)
            auto, _ = workload.convert(m, cand["format"], cand["format_knobs"], "float32")
            ways = {"csr_rule": (csr, "default"), "csr_learned": (csr, None),
                    "rule_format": (rule_fmt, "default"), "auto": (auto, cand["schedule_knobs"] or "default")}
            row = {"matrix": name, "rows": m.shape[0], "nnz": int(m.nnz), "feat": F, "auto_source": source,
                   "auto_format": auto.format.spec, "rule_format": rule_fmt.format.spec, "results": {}}
            for way, (inst, knobs) in ways.items():
                k = sparsec.compile("spmm", inst, target=target, feat=F, knobs=knobs)
                err = float(max_rel_err(np.asarray(k(inst, B, poison=True)), ref))
                ms = k.time(inst, B, number=20, repeat=5)["median_ms"]
                ok = err < 1e-4
                bad += not ok
                row["results"][way] = {"ms": ms, "max_rel_err": err, "ok": ok, "knobs": k.knobs,
                                       "knobs_source": k.extra.get("knobs_source")}
            row["cusparse_ms"] = cusparse_ms(m, B)
            rows.append(row)
            with open(path, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "target": target, "rows": rows}, f, indent=1)
            print(json.dumps({k: v for k, v in row.items() if k != "results"}), flush=True)
    print(f"\n{'matrix':>16} {'F':>4} {'cuSPARSE':>9} {'csr rule':>9} {'csr learned':>11} {'rule fmt':>9} "
          f"{'auto':>9}  (x cuSPARSE; auto: the {target} log's pick)")
    for r in rows:
        c = r["cusparse_ms"]
        x = {w: c / v["ms"] for w, v in r["results"].items()}
        print(f"{r['matrix']:>16} {r['feat']:>4} {c:9.4f} {x['csr_rule']:8.2f}x {x['csr_learned']:10.2f}x "
              f"{x['rule_format']:8.2f}x {x['auto']:8.2f}x  {r['auto_source']} {r['auto_format'].split('[')[0]}")
    print(f"written {path}; {'all correct' if not bad else f'{bad} WRONG'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
