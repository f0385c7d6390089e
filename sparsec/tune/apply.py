"""Use what tuning found: the best logged record, else the model's top pick, else the default.

``tuned_config(op, matrix, feat, target)`` answers which format and knobs to compile with,
and says where the answer came from ("record", "model" or "default"). ``compile_tuned``
converts the matrix and compiles it. ``tuned_schedule_knobs`` answers the narrower
question of ``sparsec.compile(..., knobs="tuned")`` (``sparsec.api``): the schedule knobs
of the best record for a matrix already converted to its format, else, for a shape no
record names, the model's pick among this format's configurations that won elsewhere.

Logs are looked for in ``$SPARSEC_TUNING_LOGS`` (a directory), ``./tuning_logs`` and the
source checkout's ``tuning_logs/``, as ``<op>_<target>.jsonl`` with the model beside it
(:func:`model_path`).
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import records as R

SOURCES = ("record", "model", "default")


def model_path(log: str) -> str:
    """Where the model trained on ``log`` is kept: beside it, ``<log stem>.model.json``."""
    p = Path(log)
    return str(p.with_name(p.stem + ".model.json"))


def log_candidates(op: str, target: str) -> List[str]:
    """Existing log files for (op, target), most specific first."""
    name = os.path.basename(R.default_log_path(op, target))
    dirs = [os.environ.get("SPARSEC_TUNING_LOGS"), os.path.join(os.getcwd(), R.LOG_DIR),
            str(Path(__file__).resolve().parents[2] / R.LOG_DIR)]
    seen, out = set(), []
    for d in dirs:
        if d:
            p = os.path.abspath(os.path.join(d, name))
            if p not in seen and os.path.isfile(p):
                seen.add(p)
                out.append(p)
    return out


def tuned_schedule_knobs(op: str, inst, feat: Optional[int], target: str, dtype: str) -> Dict[str, Any]:
    """Schedule knobs for this instance: the best logged record's for its matrix (the
    matrix the tuner was given, or the one its format stores: pruned to N:M, quantized, in
    ``dtype``) whose format is the instance's own; else the log's model's pick among the
    configurations of this format that won on other logged matrices (:func:`model_schedule_knobs`);
    {} (the template defaults) when there is neither."""
    from ..formats import make_format
    from .signature import matrix_signature

    logs = log_candidates(op, target)
    if not logs or feat is None:
        return {}
    sig = matrix_signature(inst.to_scipy())
    mine = _spec_key(inst.format.spec)
    records = {path: R.load(path) for path in logs}
    for path in logs:
        ok = [r for r in records[path] if r.status == "ok" and r.op == op and sig in (r.signature, r.extra.get(
              INSTANCE_SIGNATURE)) and r.target == target and r.feat == feat and r.dtype == dtype]
        for r in sorted(ok, key=lambda r: r.time_ms):
            try:
                spec = make_format(_spec(r)).spec
            except ValueError:
                continue
            if _spec_key(spec) == mine:
                return dict(r.schedule_knobs)
    for path in logs:
        knobs = model_schedule_knobs(op, inst, feat, target, dtype, path, records[path],
                                     model_of=lambda p=path: _cached_log_model(p, records[p]))
        if knobs is not None:
            return knobs
    return {}


_MODELS: Dict[tuple, Any] = {}  # (log, its size and mtime) -> its model: fitted once a process, not per compile


def _cached_log_model(log: str, records):
    st = os.stat(log)
    key = (os.path.abspath(log), st.st_size, st.st_mtime_ns)
    if key not in _MODELS:
        _MODELS.clear()
        _MODELS[key] = _log_model(log, records)
    return _MODELS[key]


INSTANCE_SIGNATURE = "instance_signature"  # a record's extra: the signature of the matrix its format stored


def model_schedule_knobs(op: str, inst, feat: int, target: str, dtype: str, log: str, records,
                         model_of: Optional[Callable[[], Any]] = None) -> Optional[Dict[str, Any]]:
    """The model's pick of schedule knobs for ``inst`` on a shape no record names: the
    configurations of the instance's format (the same spec) that won on the log's other
    matrices for ``target`` (``transfer.winning_keys``), kept where this format's space at
    ``feat`` still holds them, and the format's untuned kernel, ranked by the model on
    this matrix ({} when the untuned kernel wins). None when the log has no winner of this
    format or no model: transfer, not a guess over a space the model never saw measured.
    The model is ``model_of()`` when given, else the log's (:func:`_log_model` on ``records``)."""
    from ..formats import make_format
    from .features import MatrixContext
    from .space import FAMILIES, Space, candidate_id
    from .transfer import config_key, winning_keys

    family = inst.format.spec.split(":")[0]
    if family not in FAMILIES:
        return None
    mine = _spec_key(inst.format.spec)
    ours = [r for r in records if r.op == op and r.target == target]
    specs = set()
    for r in ours:
        try:
            if r.status == "ok" and not r.format_knobs and _spec_key(make_format(r.format).spec) == mine:
                specs.add(r.format)
        except ValueError:
            continue
    if not specs:
        return None
    keys = winning_keys(ours, op)
    ctx = MatrixContext(inst.to_scipy())
    space = Space(op, ctx.matrix, feat, dtype, families=(family,), stats=ctx.stats, target=target)
    pool, seen = [], set()
    for spec in sorted(specs):
        for i, c in enumerate(space.format_candidates(spec)):
            if (i == 0 or config_key(c) in keys) and candidate_id(c) not in seen:
                seen.add(candidate_id(c))
                pool.append(c)
    if len(pool) <= len(specs):
        return None  # no winning configuration fits this format here
    model = model_of() if model_of is not None else _log_model(log, records)
    if model is None:
        return None
    pick = pool[int(np.argmax(model.predict(pool, ctx)))]
    return {} if pick["schedule_knobs"] == space.format_default(pick["format"])["schedule_knobs"] else \
        dict(pick["schedule_knobs"])


def _spec(r: R.Record) -> str:
    fk = r.format_knobs
    return r.format if not fk else r.format + ":" + ",".join(f"{k}={v}" for k, v in sorted(fk.items()))


def _spec_key(spec: str) -> str:
    """A composite's spec without its trailing part list (parts depend on the matrix)."""
    return spec.split("[", 1)[0]


def _record_candidate(r: R.Record) -> Dict[str, Any]:
    return {"op": r.op, "format": r.format, "format_knobs": dict(r.format_knobs),
            "schedule_knobs": dict(r.schedule_knobs), "feat": r.feat, "dtype": r.dtype}


def tuned_config(op: str, matrix, feat: int, target: str, dtype: str = "float32", log: Optional[str] = None,
                 families: Optional[Sequence[str]] = None) -> Tuple[Dict[str, Any], str]:
    """(candidate, source): the fastest logged record for this matrix (by content
    signature), width, dtype and target; else the log's model's top pick among the
    configurations that won on the logged matrices (``transfer.zero_shot_pick``) in the
    space of ``families`` (default: the tuner's, which leaves out the packed Tensor Core
    formats: they prune or quantize the matrix, so only a caller who names them gets them);
    else sparsec's untuned default."""
    from .features import MatrixContext
    from .space import Space
    from .transfer import zero_shot_pick

    ctx = MatrixContext(matrix)
    logs = [p for p in ([log] if log else log_candidates(op, target)) if p and os.path.isfile(p)]
    records = {path: R.load(path) for path in logs}
    for path in logs:
        best = R.best(records[path], op, ctx.signature, target, feat=feat, dtype=dtype)
        if best is not None:
            return _record_candidate(best), "record"
    space = Space(op, ctx.matrix, feat, dtype, families=families, stats=ctx.stats, target=target)
    for path in logs:
        model = _log_model(path, records[path])
        if model is not None:
            return zero_shot_pick(model, space, ctx, records[path]), "model"
    return space.default, "default"


def _log_model(log: str, records):
    """The model saved beside ``log``, else one fitted now on the log's ``records`` (about a
    second: logs carry their feature rows), else None. A saved model this sparsec cannot
    read (other feature names, a damaged file) is a stale cache: it is refitted, with a
    warning, rather than failing the compile."""
    from .model import CostModel, training_rows

    saved = model_path(log)
    if os.path.isfile(saved):
        try:
            return CostModel.load(saved)
        except ValueError as e:
            warnings.warn(f"{e}; refitting the model from {log}", stacklevel=3)
    model = CostModel().fit_arrays(*training_rows(records))
    return model if model.trained else None


@dataclass
class TunedKernel:
    """A kernel compiled with tuned choices, the matrix converted to its format, and where
    the choice came from. Call it with the dense inputs."""

    kernel: Any
    matrix: Any
    candidate: Dict[str, Any]
    source: str

    def __call__(self, *dense, **kw):
        return self.kernel(self.matrix, *dense, **kw)


def compile_tuned(op: str, matrix, *, feat: int, target: str = "llvm", dtype: str = "float32",
                  log: Optional[str] = None, families: Optional[Sequence[str]] = None) -> TunedKernel:
    """Convert ``matrix`` and compile ``op`` with the tuned format and knobs (among
    ``families``, as :func:`tuned_config` chooses)."""
    from .. import workload
    from ..build import compile as sparsec_compile

    cand, source = tuned_config(op, matrix, feat, target, dtype, log, families)
    inst, _ = workload.convert(matrix, cand["format"], cand["format_knobs"], dtype)
    kernel = sparsec_compile(op, inst, target=target, feat=feat, knobs=cand["schedule_knobs"] or None)
    return TunedKernel(kernel, inst, cand, source)
