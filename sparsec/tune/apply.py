"""Use what tuning found: the best logged record, else the model's top pick, else the default.

``tuned_config(op, matrix, feat, target)`` answers which format and knobs to compile with,
and says where the answer came from ("record", "model" or "default"). ``compile_tuned``
converts the matrix and compiles it. (``sparsec.compile(..., knobs="tuned")`` reads the
logs through ``sparsec.tune.lookup``, which does not depend on the compiler.)
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from . import records as R
from .lookup import log_candidates, model_path

SOURCES = ("record", "model", "default")


def _record_candidate(r: R.Record) -> Dict[str, Any]:
    return {"op": r.op, "format": r.format, "format_knobs": dict(r.format_knobs),
            "schedule_knobs": dict(r.schedule_knobs), "feat": r.feat, "dtype": r.dtype}


def tuned_config(op: str, matrix, feat: int, target: str, dtype: str = "float32", log: Optional[str] = None
                 ) -> Tuple[Dict[str, Any], str]:
    """(candidate, source): the fastest logged record for this matrix (by content
    signature), width, dtype and target; else the log's model's top pick among the
    configurations that won on the logged matrices (``transfer.zero_shot_pick``); else
    sparsec's untuned default."""
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
    space = Space(op, ctx.matrix, feat, dtype, stats=ctx.stats, target=target)
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
                  log: Optional[str] = None) -> TunedKernel:
    """Convert ``matrix`` and compile ``op`` with the tuned format and knobs."""
    from .. import workload
    from ..build import compile as sparsec_compile

    cand, source = tuned_config(op, matrix, feat, target, dtype, log)
    inst, _ = workload.convert(matrix, cand["format"], cand["format_knobs"], dtype)
    kernel = sparsec_compile(op, inst, target=target, feat=feat, knobs=cand["schedule_knobs"] or None)
    return TunedKernel(kernel, inst, cand, source)
