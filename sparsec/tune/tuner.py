"""Tuning runs: search one (op, matrix, width) or a whole suite, log every measurement, keep the model.

``tune_cases`` runs one model-guided search (``sparsec.tune.search``) per case, all with one
long-lived ``Runner``. Every measurement is appended to the JSON-lines log as one record
(atomically, so a killed run leaves a log that loads and ``resume=True`` continues it), and
each search first trains the model on the log's other matrices (transfer). After the run
the model, fitted on every measurement in the log, is saved beside it
(``<log stem>.model.json``), where ``sparsec.tune.apply`` finds it to rank the space of a
matrix it has never seen.

Each record stores the candidate's feature row (``extra["features"]``): training on a log
needs no access to the matrices that were measured.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from . import records as R
from .features import MatrixContext, feature_matrix
from .apply import INSTANCE_SIGNATURE, fit_log_model, model_path
from .model import FEATURES_KEY, training_rows
from .runner import Runner
from .search import Search, SearchResult, Trial
from .space import Space, candidate_id


@dataclass
class Case:
    """One tuning problem: a matrix (named) at one feature width."""

    name: str
    matrix: Any
    feat: int


@dataclass
class CaseResult:
    case: Case
    signature: str
    space_size: int
    search: SearchResult
    seconds: float
    measure_s: float = 0.0  # of ``seconds``, the part spent building and measuring (the rest: model, search)

    @property
    def speedup(self) -> Optional[float]:
        d, b = self.search.default, self.search.best
        if d is None or not d.ok or b is None:
            return None
        return d.time_ms / b.time_ms


def device_name(target: str) -> str:
    if not target.startswith("cuda"):
        return "cpu"
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return "cuda"


def _record(trial: Trial, case: Case, ctx: MatrixContext, features: List[float], target: str,
            device: str, default_id: str, instance_signature: Optional[str] = None) -> R.Record:
    c, res = trial.candidate, trial.result
    extra = {FEATURES_KEY: features, "source": trial.source, "round": trial.round,
             "default": candidate_id(c) == default_id}
    if instance_signature is not None and instance_signature != ctx.signature:
        extra[INSTANCE_SIGNATURE] = instance_signature
    for k in ("method", "max_rel_err", "compile_s", "load_s"):
        if res.get(k) is not None:
            extra[k] = res[k]
    if trial.predicted is not None:
        extra["predicted"] = float(trial.predicted)
    return R.Record(op=c["op"], format=c["format"], format_knobs=c["format_knobs"], schedule_knobs=c["schedule_knobs"],
                    feat=c["feat"], dtype=c["dtype"], matrix=case.name, signature=ctx.signature,
                    stats=dict(ctx.stats), target=target, device=device, time_ms=res.get("time_ms"),
                    status=res["status"], error=res.get("error"), trial=trial.index, extra=extra)


def _resumed(records: Sequence[R.Record], op: str, signature: str, target: str, feat: int, dtype: str):
    out = []
    for r in records:
        if (r.op, r.signature, r.target, r.feat, r.dtype) == (op, signature, target, feat, dtype):
            cand = {"op": r.op, "format": r.format, "format_knobs": r.format_knobs,
                    "schedule_knobs": r.schedule_knobs, "feat": r.feat, "dtype": r.dtype}
            out.append((cand, {"status": r.status, "time_ms": r.time_ms, "error": r.error}))
    return out


def tune_cases(op: str, cases: Sequence[Case], *, target: str = "llvm", trials: int = 64, log: Optional[str] = None,
               resume: bool = False, families: Optional[Sequence[str]] = None, size: str = "full",
               dtype: str = "float32", batch: int = 8, epsilon: float = 0.2, patience: Optional[int] = None,
               seed: int = 0, runner: Optional[Runner] = None, runner_options: Optional[Dict[str, Any]] = None,
               transfer: bool = True, save_model: bool = True, inject: Optional[Dict[int, str]] = None,
               on_trial: Optional[Callable[[Case, Trial], None]] = None,
               on_case: Optional[Callable[[Case, int], None]] = None) -> List[CaseResult]:
    """Tune every case in turn; returns one CaseResult per case. ``log`` defaults to
    ``tuning_logs/<op>_<target>.jsonl``. Without ``resume`` a case's earlier records in the
    log are not reused (they still train the model for other matrices)."""
    log = log or R.default_log_path(op, target)
    os.makedirs(os.path.dirname(os.path.abspath(log)), exist_ok=True)
    device = device_name(target)
    own_runner = runner is None
    runner = runner or Runner(target, **(runner_options or {}))
    results = []
    try:
        for case in cases:
            results.append(_tune_one(op, case, target, trials, log, resume, families, size, dtype, batch, epsilon,
                                     patience, seed, runner, transfer, device, inject or {}, on_trial, on_case))
    finally:
        if own_runner:
            runner.close()
    if save_model:
        save_log_model(log)
    return results


def _tune_one(op, case, target, trials, log, resume, families, size, dtype, batch, epsilon, patience, seed,
              runner, transfer, device, inject, on_trial, on_case) -> CaseResult:
    t0 = time.perf_counter()
    ctx = MatrixContext(case.matrix)
    space = Space(op, ctx.matrix, case.feat, dtype, families=families, size=size, stats=ctx.stats, target=target)
    if on_case:
        on_case(case, len(space))
    logged = R.load(log) if os.path.exists(log) else []
    resumed = _resumed(logged, op, ctx.signature, target, case.feat, dtype) if resume else []
    prior = training_rows([r for r in logged if r.op == op], exclude_signature=ctx.signature) if transfer else None
    X = feature_matrix(space.candidates, ctx)
    row = {candidate_id(c): i for i, c in enumerate(space.candidates)}
    default_id = candidate_id(space.default)

    measure = _Measurer(runner, ctx.matrix, seed, inject, first=len(resumed))
    stored = _StoredSignatures(ctx)

    def logged_trial(trial: Trial):
        x = X[row[candidate_id(trial.candidate)]]
        features = [None if not np.isfinite(v) else float(v) for v in x]
        R.append(log, _record(trial, case, ctx, features, target, device, default_id, stored(trial)))
        if on_trial:
            on_trial(case, trial)

    search = Search(space, ctx, measure, trials=trials, batch=batch, epsilon=epsilon, patience=patience, seed=seed,
                    prior=prior, on_trial=logged_trial)
    result = search.run(resumed)
    return CaseResult(case, ctx.signature, len(space), result, time.perf_counter() - t0, measure.seconds)


class _StoredSignatures:
    """The signature of the matrix a measured candidate's format stored, where it can differ
    from the case's: pruned to N:M (``mma_sp``, ``nm_tc``), quantized (``srbcrs`` int8), or
    values in a narrower dtype. ``sparsec.compile(inst, knobs="tuned")`` knows only that
    matrix, so a record names both. Computed once per format of the case, by the conversion
    the runner's workers make."""

    WIDE = ("float32", "float64")

    def __init__(self, ctx: MatrixContext):
        self.ctx, self.known = ctx, {}

    def __call__(self, trial: Trial) -> Optional[str]:
        from .. import workload
        from .signature import matrix_signature

        c = trial.candidate
        family = c["format"].split(":")[0]
        if not trial.ok or (c["dtype"] in self.WIDE and family not in (*workload.NM_FAMILIES, "srbcrs")):
            return None
        key = (c["format"], json.dumps(c["format_knobs"], sort_keys=True), c["dtype"])
        if key not in self.known:
            inst, _ = workload.convert(self.ctx.matrix, c["format"], c["format_knobs"], c["dtype"])
            self.known[key] = matrix_signature(inst.to_scipy())
        return self.known[key]


class _Measurer:
    """What the search measures through: the runner, with the test hook's faults marked on
    the candidates by trial number (the order they are picked in) and the time spent
    waiting on the runner counted. It offers the runner's submit/collect when it has them,
    so the search keeps the builders busy (``Search._run_pipelined``)."""

    def __init__(self, runner, matrix, seed: int, inject: Dict[int, str], first: int):
        self.runner, self.matrix, self.seed, self.inject = runner, matrix, seed, inject
        self.issued, self.seconds = first, 0.0
        if not (callable(getattr(runner, "submit", None)) and callable(getattr(runner, "collect", None))):
            self.submit = self.collect = None  # a runner with measure() alone: rounds, in step

    def _marked(self, cands):
        out = []
        for c in cands:
            fault = self.inject.get(self.issued)
            out.append({**c, "inject": fault} if fault else c)
            self.issued += 1
        return out

    def __call__(self, cands):
        t = time.perf_counter()
        try:
            return self.runner.measure(self._marked(cands), self.matrix, seed=self.seed)
        finally:
            self.seconds += time.perf_counter() - t

    def submit(self, cands):
        return self.runner.submit(self._marked(cands), self.matrix, seed=self.seed)

    def collect(self, at_least=None):
        t = time.perf_counter()
        try:
            return self.runner.collect(at_least)
        finally:
            self.seconds += time.perf_counter() - t


def save_log_model(log: str) -> Optional[str]:
    """Fit the model on every logged measurement with features and save it beside the log,
    with the log's digest and top records (``apply.fit_log_model``)."""
    if not os.path.exists(log):
        return None
    model = fit_log_model(log)
    if model is None:
        return None
    path = model_path(log)
    model.save(path)
    return path
