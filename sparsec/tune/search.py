"""Model-guided search over one space: rounds of measurements picked by the cost model.

Each round measures ``batch`` candidates not yet measured: the untuned default first (it
is the baseline every speedup is reported against), then mostly the model's top
predictions, and an ``epsilon`` share drawn at random (so a model that is wrong about a
region of the space still gets shown that region). After each round the model is refitted
on everything measured so far, plus ``prior`` samples from other matrices (transfer: a
model fitted on earlier tuning runs ranks a new matrix's space from the first round).
The search stops at ``trials`` measurements, when the space is exhausted, or when the best
time has not improved by :data:`MIN_GAIN` for ``patience`` rounds.

Measuring is a function of a list of candidates returning the runner's result dicts, so
the same search runs on a GPU (``sparsec.tune.runner.Runner``) or replays a table of
earlier measurements (the evaluation of the search itself).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .features import feature_matrix
from .model import CostModel, log_throughput
from .space import candidate_id

MIN_GAIN = 0.01  # a new best must be this much faster to count as progress


@dataclass
class Trial:
    """One measured candidate: its round, what the model predicted before measuring it (None
    before the model had data), and the runner's result."""

    index: int
    round: int
    candidate: Dict[str, Any]
    result: Dict[str, Any]
    predicted: Optional[float] = None
    source: str = "model"  # default | model | explore | resumed

    @property
    def ok(self) -> bool:
        return self.result.get("status") == "ok" and (self.result.get("time_ms") or 0) > 0

    @property
    def time_ms(self) -> Optional[float]:
        return self.result.get("time_ms") if self.ok else None


@dataclass
class SearchResult:
    trials: List[Trial] = field(default_factory=list)
    default_id: str = ""
    stopped: str = ""

    @property
    def measured(self) -> List[Trial]:
        return [t for t in self.trials if t.ok]

    @property
    def best(self) -> Optional[Trial]:
        ok = self.measured
        return min(ok, key=lambda t: t.time_ms) if ok else None

    @property
    def default(self) -> Optional[Trial]:
        return next((t for t in self.trials if candidate_id(t.candidate) == self.default_id), None)

    def best_so_far(self) -> List[float]:
        """Best time after each trial (inf until the first success)."""
        out, best = [], math.inf
        for t in self.trials:
            if t.ok:
                best = min(best, t.time_ms)
            out.append(best)
        return out


MeasureFn = Callable[[List[Dict[str, Any]]], List[Dict[str, Any]]]


class Search:
    """One model-guided search. ``space`` is a :class:`sparsec.tune.space.Space`, ``ctx`` the
    matrix's :class:`sparsec.tune.features.MatrixContext`; ``prior`` (X, y) training rows from
    other matrices; ``on_trial(trial)`` is called after every measurement (logging, progress)."""

    def __init__(self, space, ctx, measure: MeasureFn, *, trials: int, batch: int = 8, epsilon: float = 0.2,
                 patience: Optional[int] = None, seed: int = 0, model: Optional[CostModel] = None,
                 prior: Optional[Tuple[np.ndarray, np.ndarray]] = None,
                 on_trial: Optional[Callable[[Trial], None]] = None):
        if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
            raise ValueError(f"trials should be a positive int, got {trials!r}")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch should be a positive int, got {batch!r}")
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon should be in [0, 1], got {epsilon!r}")
        if patience is not None and (isinstance(patience, bool) or not isinstance(patience, int) or patience < 1):
            raise ValueError(f"patience should be a positive int or None, got {patience!r}")
        self.space, self.ctx, self.measure = space, ctx, measure
        self.trials, self.batch, self.epsilon, self.patience = trials, batch, epsilon, patience
        self.rng = np.random.default_rng(seed)
        self.model = model or CostModel()
        self.prior = prior
        self.on_trial = on_trial
        self._X = feature_matrix(space.candidates, ctx) if len(space) else np.zeros((0, 0), np.float32)
        self._ids = [candidate_id(c) for c in space.candidates]
        self._row = {k: i for i, k in enumerate(self._ids)}

    def run(self, resumed: Sequence[Tuple[Dict[str, Any], Dict[str, Any]]] = ()) -> SearchResult:
        """Search; ``resumed`` (candidate, result) pairs measured by an earlier run count as
        trials already made (``--resume``)."""
        res = SearchResult(default_id=candidate_id(self.space.default))
        done = set()
        for cand, result in resumed:
            key = candidate_id(cand)
            if key in self._row and key not in done:
                done.add(key)
                res.trials.append(Trial(len(res.trials), 0, cand, result, source="resumed"))
        self._refit(res)
        if callable(getattr(self.measure, "submit", None)) and callable(getattr(self.measure, "collect", None)):
            return self._run_pipelined(res, done)
        rounds, stale, best = 0, 0, self._best(res)
        while len(res.trials) < self.trials:
            todo = [i for i, k in enumerate(self._ids) if k not in done]
            if not todo:
                res.stopped = "space exhausted"
                break
            rounds += 1
            picks = self._pick(todo, min(self.batch, self.trials - len(res.trials)), done)
            cands = [self.space.candidates[i] for i, _, _ in picks]
            results = self.measure(cands)
            for (i, pred, source), result in zip(picks, results):
                done.add(self._ids[i])
                self._record(res, Trial(len(res.trials), rounds, self.space.candidates[i], result, pred, source))
            self._refit(res)
            new_best = self._best(res)
            stale = 0 if new_best < best * (1 - MIN_GAIN) else stale + 1
            best = min(best, new_best)
            if self.patience is not None and stale >= self.patience:
                res.stopped = f"no gain in {self.patience} rounds"
                break
        else:
            res.stopped = "trial budget"
        return res

    def _run_pipelined(self, res: SearchResult, done: set) -> SearchResult:
        """The search over a measurer that takes candidates and hands results back as they
        finish (``submit(cands) -> tickets``, ``collect(at_least) -> [(ticket, result)]``,
        e.g. :class:`sparsec.tune.runner.Runner`). ``batch`` candidates stay in flight: when
        half of them are back, the model is refitted and new picks fill the free places, so
        one slow build no longer holds a whole round. A trial is numbered in the order it
        was picked and carries the round that picked it."""
        in_flight: Dict[int, Tuple[int, int, Optional[float], str, int]] = {}  # ticket -> pick
        issued, rounds, stale, best = len(res.trials), 0, 0, self._best(res)
        stopped = None
        while True:
            room = min(self.batch - len(in_flight), self.trials - issued) if stopped is None else 0
            todo = [i for i, k in enumerate(self._ids) if k not in done] if room > 0 else []
            if room > 0 and not todo:
                stopped = "space exhausted"
            if todo:
                rounds += 1
                picks = self._pick(todo, room, done)
                tickets = self.measure.submit([self.space.candidates[i] for i, _, _ in picks])
                for t, (i, pred, source) in zip(tickets, picks):
                    done.add(self._ids[i])
                    in_flight[t] = (issued, i, pred, source, rounds)
                    issued += 1
            if not in_flight:
                break
            for t, result in self.measure.collect(at_least=max(1, min(len(in_flight), (self.batch + 1) // 2))):
                index, i, pred, source, rnd = in_flight.pop(t)
                self._record(res, Trial(index, rnd, self.space.candidates[i], result, pred, source))
            self._refit(res)
            new_best = self._best(res)
            stale = 0 if new_best < best * (1 - MIN_GAIN) else stale + 1
            best = min(best, new_best)
            if stopped is None and self.patience is not None and stale >= self.patience:
                stopped = f"no gain in {self.patience} rounds"
        res.trials.sort(key=lambda t: t.index)
        res.stopped = stopped or "trial budget"
        return res

    def _record(self, res: SearchResult, t: Trial):
        res.trials.append(t)
        if self.on_trial:
            self.on_trial(t)

    # ---- internals ----------------------------------------------------------------------------
    @staticmethod
    def _best(res: SearchResult) -> float:
        b = res.best
        return b.time_ms if b else math.inf

    def _refit(self, res: SearchResult):
        rows, ys = [], []
        for t in res.measured:
            i = self._row.get(candidate_id(t.candidate))
            if i is not None:
                rows.append(self._X[i])
                ys.append(log_throughput(t.candidate, self.ctx, t.time_ms))
        X = np.array(rows, np.float32).reshape(len(rows), self._X.shape[1])
        y = np.array(ys, np.float64)
        if self.prior is not None and len(self.prior[1]):
            X = np.concatenate([self.prior[0].astype(np.float32), X])
            y = np.concatenate([self.prior[1].astype(np.float64), y])
        self.model.fit_arrays(X, y)

    def _pick(self, todo: List[int], k: int, done: set) -> List[Tuple[int, Optional[float], str]]:
        """``k`` rows of ``todo``: the default if unmeasured, the model's best, some random."""
        picks: List[Tuple[int, Optional[float], str]] = []
        default_row = self._row[candidate_id(self.space.default)]
        trained = self.model.trained
        preds = self.model.predict_arrays(self._X[todo]) if trained else None
        pred_of = dict(zip(todo, preds)) if preds is not None else {}
        if default_row in todo:
            picks.append((default_row, pred_of.get(default_row), "default"))
        left = [i for i in todo if i != default_row]
        n_explore = k - len(picks) if not trained else int(round(self.epsilon * (k - len(picks))))
        n_model = k - len(picks) - n_explore
        if n_model > 0:
            order = sorted(left, key=lambda i: -pred_of[i])
            for i in order[:n_model]:
                picks.append((i, float(pred_of[i]), "model"))
        chosen = {i for i, _, _ in picks}
        pool = [i for i in left if i not in chosen]
        if n_explore > 0 and pool:
            for i in self.rng.choice(pool, size=min(n_explore, len(pool)), replace=False):
                picks.append((int(i), pred_of.get(int(i)), "explore"))
        return picks[:k]
