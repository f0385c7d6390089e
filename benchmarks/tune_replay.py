#!/usr/bin/env python3
"""Replay the tuner's search against exhaustively measured spaces (CPU; no GPU needed).

    python benchmarks/tune_replay.py benchmarks/results/tune_exhaustive_H200.json [--budget 0.2] [--seeds 10]

Input: ``tune_eval.py exhaustive`` output (every candidate of each matrix's small space,
measured on the GPU). For each matrix the same ``sparsec.tune.search.Search`` runs with a
measuring function that looks the measurement up, for ``budget`` x the space size trials;
reported is the best time found over the exhaustive best (as a fraction of its speed),
averaged over seeds, cold (no prior) and with transfer (the model trained on the other
matrices' measurements first). Also: the model's Spearman rank correlation on held-out
candidates (a random 20 % of each matrix, trained on the rest of all matrices) and per
unseen matrix (trained on the other matrices only).
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np

import _preamble  # noqa: F401,E402  (the one preamble: checkout root and benchmarks/data on sys.path)

from sparsec.tune.model import CostModel, spearman  # noqa: E402
from sparsec.tune.search import Search  # noqa: E402
from sparsec.tune.features import stored_row  # noqa: E402
from sparsec.tune.space import candidate_id  # noqa: E402


class _Ctx:
    """The search needs a context only for ``nnz`` (the model's target scale) here: the
    features were stored with the measurements."""

    def __init__(self, nnz):
        self.nnz = nnz


def _case_arrays(c):
    X = np.array([stored_row(row) for row in c["features"]], np.float32)
    t = np.array([r["time_ms"] if r["status"] == "ok" else np.nan for r in c["results"]])
    return X, t


def _y(c, t):
    return np.log(2.0 * c["nnz"] * c["feat"] / t)


def replay(c, X, t, budget, seed, prior):
    ids = [candidate_id(k) for k in c["candidates"]]
    table = dict(zip(ids, c["results"]))
    space = SimpleNamespace(candidates=c["candidates"], default=c["candidates"][ids.index(c["default"])])
    trials = max(1, int(math.ceil(budget * len(ids))))
    s = _make_search(space, X, c["nnz"], lambda cands: [table[candidate_id(k)] for k in cands],
                     trials, seed, prior)
    res = s.run()
    best_found = res.best.time_ms
    return float(np.nanmin(t) / best_found), len(res.trials)


def _make_search(space, X, nnz, measure, trials, seed, prior):
    """A Search over stored features (no matrix at hand): the constructor's featurisation is
    replaced by the stored rows; ``run`` (picking, refitting, stopping) is the GPU run's own."""
    class Stored(Search):
        def __init__(self):
            self.space, self.ctx, self.measure = space, _Ctx(nnz), measure
            self.trials, self.batch, self.epsilon, self.patience = trials, 4, 0.2, None
            self.rng = np.random.default_rng(seed)
            self.model = CostModel()
            self.prior = prior
            self.on_trial = None
            self._X = X
            self._ids = [candidate_id(k) for k in space.candidates]
            self._row = {k: i for i, k in enumerate(self._ids)}
    return Stored()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("table")
    ap.add_argument("--budget", type=float, default=0.2)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--out", help="write the figures as JSON")
    args = ap.parse_args()
    cases = json.loads(Path(args.table).read_text())["cases"]
    arrays = [_case_arrays(c) for c in cases]
    rows, out = [], {"budget": args.budget, "seeds": args.seeds, "cases": []}
    for i, c in enumerate(cases):
        X, t = arrays[i]
        others = [(arrays[j][0], _y(cases[j], arrays[j][1])) for j in range(len(cases)) if j != i]
        PX = np.concatenate([o[0] for o in others])
        Py = np.concatenate([o[1] for o in others])
        keep = np.isfinite(Py)
        prior = (PX[keep], Py[keep])
        cold = [replay(c, X, t, args.budget, s, None) for s in range(args.seeds)]
        warm = [replay(c, X, t, args.budget, s, prior) for s in range(args.seeds)]
        # unseen matrix: trained on the others only
        ok = np.isfinite(t)
        m = CostModel().fit_arrays(*prior)
        rho_unseen = spearman(m.predict_arrays(X[ok]), t[ok])
        # held-out candidates: 20 % of this matrix, trained on the rest of it and the others
        rng = np.random.default_rng(0)
        idx = np.flatnonzero(ok)
        test = rng.choice(idx, size=max(2, len(idx) // 5), replace=False)
        train = np.setdiff1d(idx, test)
        m2 = CostModel().fit_arrays(np.concatenate([prior[0], X[train]]),
                                    np.concatenate([prior[1], _y(c, t[train])]))
        rho_held = spearman(m2.predict_arrays(X[test]), t[test])
        rec = {"matrix": c["matrix"], "feat": c["feat"], "space": len(c["candidates"]), "trials": cold[0][1],
               "cold_mean": float(np.mean([f for f, _ in cold])), "cold_min": float(min(f for f, _ in cold)),
               "transfer_mean": float(np.mean([f for f, _ in warm])),
               "transfer_min": float(min(f for f, _ in warm)),
               "spearman_held_out": rho_held, "spearman_unseen_matrix": rho_unseen}
        out["cases"].append(rec)
        rows.append(rec)
    print("| matrix | F | space | trials | found (cold, mean/min) | found (transfer, mean/min) | "
          "Spearman held-out 20 % | Spearman unseen matrix |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['matrix']} | {r['feat']} | {r['space']} | {r['trials']} | "
              f"{100 * r['cold_mean']:.1f} % / {100 * r['cold_min']:.1f} % | "
              f"{100 * r['transfer_mean']:.1f} % / {100 * r['transfer_min']:.1f} % | "
              f"{r['spearman_held_out']:.3f} | {r['spearman_unseen_matrix']:.3f} |")
    for key in ("cold_mean", "transfer_mean", "spearman_held_out", "spearman_unseen_matrix"):
        out[f"avg_{key}"] = float(np.mean([r[key] for r in rows]))
    print(f"average over {len(rows)} matrices: found {100 * out['avg_cold_mean']:.1f} % cold, "
          f"{100 * out['avg_transfer_mean']:.1f} % with transfer, of the exhaustive best within "
          f"{100 * args.budget:.0f} % of the space; Spearman {out['avg_spearman_held_out']:.3f} held-out, "
          f"{out['avg_spearman_unseen_matrix']:.3f} unseen matrix")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
