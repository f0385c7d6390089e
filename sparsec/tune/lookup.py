"""Find tuning logs and read the best record's schedule knobs, without the compiler.

``sparsec.compile(..., knobs="tuned")`` calls :func:`tuned_schedule_knobs`; this module
imports nothing that imports the compiler, so the compiler and the tuner do not depend on
each other in a circle.

Logs are looked for in ``$SPARSEC_TUNING_LOGS`` (a directory), ``./tuning_logs`` and the
source checkout's ``tuning_logs/``, as ``<op>_<target>.jsonl`` with the model beside it
(:func:`model_path`).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Optional

from . import records as R


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
    """Schedule knobs of the best logged record for this instance's matrix whose format is
    the instance's own; {} (the template defaults) when there is none."""
    from ..formats import make_format
    from .signature import matrix_signature

    logs = log_candidates(op, target)
    if not logs or feat is None:
        return {}
    sig = matrix_signature(inst.to_scipy())
    mine = _spec_key(inst.format.spec)
    for path in logs:
        ok = [r for r in R.load(path) if r.status == "ok" and r.op == op and r.signature == sig
              and r.target == target and r.feat == feat and r.dtype == dtype]
        for r in sorted(ok, key=lambda r: r.time_ms):
            try:
                spec = make_format(_spec(r)).spec
            except ValueError:
                continue
            if _spec_key(spec) == mine:
                return dict(r.schedule_knobs)
    return {}


def _spec(r: R.Record) -> str:
    fk = r.format_knobs
    return r.format if not fk else r.format + ":" + ",".join(f"{k}={v}" for k, v in sorted(fk.items()))


def _spec_key(spec: str) -> str:
    """A composite's spec without its trailing part list (parts depend on the matrix)."""
    return spec.split("[", 1)[0]
