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

import hashlib
import math
import numbers
import os
import warnings
from dataclasses import dataclass
from functools import lru_cache
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
    here = Path(__file__).resolve()
    # $SPARSEC_TUNING_LOGS, the working directory's, the source checkout's, the installed package's
    dirs = [os.environ.get("SPARSEC_TUNING_LOGS"), os.path.join(os.getcwd(), R.LOG_DIR),
            str(here.parents[2] / R.LOG_DIR), str(here.parents[1] / R.LOG_DIR)]
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
    from .signature import matrix_signature

    logs = log_candidates(op, target)
    if not logs or feat is None:
        return {}
    sig = matrix_signature(inst.to_scipy())
    mine = _format_key(inst.format.spec)
    records = {path: R.load(path) for path in logs}
    for path in logs:
        knobs = _record_knobs(_own_format(records[path], op, target, dtype, mine), feat, sig)
        if knobs is not None:
            return knobs
    for path in logs:
        knobs = model_schedule_knobs(op, inst, feat, target, dtype, path, records[path],
                                     model_of=lambda p=path: _cached_log_model(p, records[p]))
        if knobs is not None:
            return knobs
    return {}


def learned_schedule_knobs(op: str, inst, feat: Optional[int], target: str, dtype: str
                           ) -> Tuple[Dict[str, Any], str]:
    """(knobs, source): what ``sparsec.compile`` takes by default for a converted matrix --
    the schedule knobs of the best logged record for this matrix in this format ("record"),
    else the shipped model's pick among the configurations of this format that won on other
    matrices, where the log holds at least ``MIN_CASES`` cases of the format ("model"), else
    ``({}, "default: <why>")`` (the template's rule). It reads only
    the model file beside the log (its top records and booster: no log to parse, no fit),
    looks at the matrix only when the log knows its format, and then once (statistics and
    signature), so a pick costs those and one prediction over a few candidates."""
    from .features import MatrixContext

    logs = log_candidates(op, target)
    if not logs:
        return {}, f"default: no tuning log for {op} on {target}"
    if feat is None:
        return {}, "default: no feature width to look up"
    mine = _format_key(inst.format.spec)
    ctx = None
    for path in logs:
        records, model = _log_knowledge(path)
        ours = _own_format(records, op, target, dtype, mine)
        if not ours:
            continue
        ctx = ctx or MatrixContext(_float_values(inst.to_scipy()))
        knobs = _record_knobs(ours, feat, ctx.signature)
        if knobs is not None:
            return knobs, "record"
        cases = {(r.signature, r.feat) for r in ours}
        if model is None:
            continue
        if len(cases) < MIN_CASES:
            return {}, (f"default: the tuning log has {len(cases)} case(s) of {mine} for {op}, {dtype}: too few "
                        f"(under {MIN_CASES}) to trust the model's pick over the rule")
        why = outside_range(model, ctx.stats) or _rule_beyond_log(op, inst, feat, target, dtype, ours)
        if why:
            return {}, f"default: {why}"
        knobs = model_schedule_knobs(op, inst, feat, target, dtype, path, records, model_of=lambda m=model: m,
                                     ctx=ctx)
        if knobs is not None:
            return knobs, "model"
    return {}, f"default: the tuning log has no winning configuration of {mine} for {op}, {dtype} at feat={feat}"


def _rule_beyond_log(op: str, inst, feat: int, target: str, dtype: str, records) -> Optional[str]:
    """Why the rule answers before the model (None where it does not): for this matrix the
    rule schedules with transformations none of whose knobs any logged record of the format
    set -- a kernel the log never measured, such as ``csr_split`` on skewed rows, which the
    model's pick among the measured configurations would pass over."""
    from ..build import row_lengths
    from ..targets import parse_target
    from .space import schedule_uses

    logged = {k for r in records for k in r.schedule_knobs}
    try:
        uses = schedule_uses(op, inst.format.spec, feat, dtype, parse_target(target).kind, rows=row_lengths(inst))
    except (ValueError, TypeError, KeyError):  # a spec the lowering cannot take alone: the model decides
        return None
    theirs = {k for u in uses for k in u.knobs}
    if not logged or not theirs or theirs & logged:
        return None
    names = ", ".join(sorted({u.transformation.name for u in uses}))
    return f"for this matrix the rule takes {names}, whose knobs the tuning log has not searched"


MIN_CASES = 5  # logged (matrix, width) cases of a format the model must have seen to pick its knobs


def _own_format(records, op: str, target: str, dtype: str, mine: str) -> List[R.Record]:
    """The ok records of ``op`` on ``target`` in ``dtype`` whose format is the instance's
    own by :func:`_format_key` (``mine``: hyb by its column ranges, whatever its buckets; a
    record whose spec this sparsec cannot read is passed over)."""
    return [r for r in records if r.status == "ok" and r.op == op and r.target == target and r.dtype == dtype
            and _record_spec_key(_spec(r)) == mine]


@lru_cache(maxsize=4096)
def _record_spec_key(spec: str) -> Optional[str]:
    """:func:`_format_key` of a record's format (None where this sparsec cannot read the
    spec): a log repeats a few dozen specs over hundreds of records, each parsed once."""
    try:
        return _format_key(spec)
    except ValueError:
        return None


def _format_key(spec: str) -> str:
    """What a format's schedule knobs transfer across: the spec without a composite's part
    list, and for hyb its column ranges alone (its buckets follow each matrix's row lengths,
    as ``transfer.config_key`` leaves them free), so a converted hyb instance meets the
    records of other matrices with its col_parts."""
    from ..formats import make_format

    fmt = make_format(_spec_key(spec))
    if fmt.name == "hyb":
        return f"hyb:col_parts={dict(fmt.params)['col_parts']}"
    return _spec_key(fmt.spec)


def _record_knobs(records, feat: int, signature: str) -> Optional[Dict[str, Any]]:
    """The schedule knobs of the fastest of ``records`` measured at ``feat`` on the matrix
    with ``signature`` (the one the tuner was given, or the one its format stored), or None."""
    mine = [r for r in records if r.feat == feat and signature in (r.signature, r.extra.get(INSTANCE_SIGNATURE))]
    return dict(min(mine, key=lambda r: r.time_ms).schedule_knobs) if mine else None


def _float_values(m):
    """``m`` with float values (integer formats hold int8/int4 values; the statistics and
    signature a pick reads take floats, as the tuner's matrices were)."""
    return m if m.dtype in (np.float16, np.float32, np.float64) else m.astype(np.float32)


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
                         model_of: Optional[Callable[[], Any]] = None, ctx=None) -> Optional[Dict[str, Any]]:
    """The model's pick of schedule knobs for ``inst`` on a shape no record names: the
    configurations of the instance's format (the same spec) that won on the log's other
    matrices for ``target`` (``transfer.winning_keys``), kept where this format's space at
    ``feat`` still holds them, and the format's untuned kernel, ranked by the model on
    this matrix ({} when the untuned kernel wins). None when the log has no winner of this
    format or no model: transfer, not a guess over a space the model never saw measured.
    The model is ``model_of()`` when given, else the log's (:func:`_log_model` on ``records``);
    ``ctx``, the matrix's ``MatrixContext`` when the caller has it."""
    from ..formats import make_format
    from .features import MatrixContext
    from .space import FAMILIES, Space, candidate_id
    from .transfer import config_key, winning_keys

    family = inst.format.spec.split(":")[0]
    if family not in FAMILIES:
        return None
    mine = _format_key(inst.format.spec)
    ours = [r for r in records if r.op == op and r.target == target]
    if family == "hyb":  # records of any buckets with these column ranges; candidates in the instance's own
        params = dict(make_format(_spec_key(inst.format.spec)).params)
        own = {"col_parts": int(params["col_parts"]), "buckets": "/".join(str(int(b)) for b in params["buckets"])}
        found = any(r.status == "ok" and r.format == "hyb" and _record_spec_key(_spec(r)) == mine for r in ours)
        specs = {"hyb": own} if found else {}
    else:
        specs = {r.format: None for r in ours
                 if r.status == "ok" and not r.format_knobs and _record_spec_key(r.format) == mine}
    if not specs:
        return None
    keys = winning_keys(ours, op)
    ctx = ctx or MatrixContext(_float_values(inst.to_scipy()))
    space = Space(op, ctx.matrix, feat, dtype, families=(family,), stats=ctx.stats, target=target)
    pool, seen = [], set()
    for spec in sorted(specs):
        for i, c in enumerate(space.format_candidates(spec, specs[spec])):
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


AUTO_FORMAT_OPS = ("spmm", "sddmm")  # the operators the tuner measures
AUTO_FORMAT_DTYPES = ("float32", "float64", "float16")  # values the tuner's float formats take


def auto_format_pick(matrix, op: str, feat, target, dtype) -> Optional[Tuple[str, Dict[str, Any], str]]:
    """``formats.convert(m, "auto")``'s learned picker (entry point ``learned`` of the group
    ``sparsec.format_pickers``): (format, format knobs, "record" | "model") from
    :func:`tuned_config`, or None where it has nothing to add to the rule: no width or
    target given, an operator or dtype the tuner does not measure, no log for the target."""
    from ..dtypes import dtype_spec
    from ..targets import parse_target

    if feat is None or target is None or op not in AUTO_FORMAT_OPS:
        return None
    name = dtype_spec(dtype if isinstance(dtype, str) else np.dtype(dtype).name).name
    if name not in AUTO_FORMAT_DTYPES:
        return None
    cand, source = tuned_config(op, matrix, int(feat), parse_target(target).name, name)
    if source == "default":
        return None
    return cand["format"], dict(cand["format_knobs"]), source


def tuned_config(op: str, matrix, feat: int, target: str, dtype: str = "float32", log: Optional[str] = None,
                 families: Optional[Sequence[str]] = None) -> Tuple[Dict[str, Any], str]:
    """(candidate, source): the fastest logged record for this matrix (by content
    signature), width, dtype and target; else the log's model's top pick among the
    configurations that won on the logged matrices (``transfer.zero_shot_pick``) in the
    space of ``families`` (default: the tuner's, which leaves out the packed Tensor Core
    formats: they prune or quantize the matrix, so only a caller who names them gets them),
    unless the matrix is outside the model's range (:func:`outside_range`); else sparsec's
    untuned default."""
    from .features import MatrixContext
    from .space import Space
    from .transfer import config_key, winning_keys, zero_shot_pick

    ctx = MatrixContext(matrix)
    logs = [p for p in ([log] if log else log_candidates(op, target)) if p and os.path.isfile(p)]
    known = {path: _log_knowledge(path) for path in logs}
    for path in logs:
        best = R.best(known[path][0], op, ctx.signature, target, feat=feat, dtype=dtype)
        if best is not None:
            return _record_candidate(best), "record"
    def space(only=None):
        return Space(op, ctx.canonical, feat, dtype, families=families, stats=ctx.stats, target=target, only=only)

    for path in logs:
        records, model = known[path]
        if model is None or outside_range(model, ctx.stats):
            continue
        # the space of the configurations that won somewhere (all a pick ranks), unless none
        # fits this matrix: then the whole space, as transfer_pool falls back to
        keys = winning_keys(records, op, exclude_signature=ctx.signature)
        narrow = space(keys)
        fits = any(config_key(c) in keys for c in narrow.candidates)
        return zero_shot_pick(model, narrow if fits else space(), ctx, records, keys), "model"
    return space(()).default, "default"  # the default alone: no knob product enumerated (1.0 -> 0.3 s at 4M entries)


def log_digest(log: str) -> str:
    """SHA-256 of the log's bytes: a saved model serves only the log it was fitted on."""
    with open(log, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def top_records(records) -> List[R.Record]:
    """The ``transfer.TOP_PER_CASE`` fastest ok records of every logged case (op, matrix
    signature, target, width, dtype), in the order ``records.best`` breaks ties: all that
    :func:`tuned_config` reads of a log (the best record of a case, and the configurations
    that won somewhere), a few hundred records where the log holds thousands."""
    from .transfer import TOP_PER_CASE

    cases: Dict[tuple, List[R.Record]] = {}
    for r in records:
        if r.status == "ok" and r.time_ms is not None:
            cases.setdefault((r.op, r.signature, r.target, r.feat, r.dtype), []).append(r)
    return [r for rs in cases.values() for r in sorted(rs, key=lambda r: (r.time_ms, r.timestamp, r.trial))
            [:TOP_PER_CASE]]


# what a pick reads of a record (records.best, transfer.winning_keys, _record_candidate): the
# feature rows, statistics and versions stay in the log
_PICK_FIELDS = ("op", "format", "format_knobs", "schedule_knobs", "feat", "dtype", "signature", "target",
                "time_ms", "status", "timestamp", "trial")


def fit_log_model(log: str, records=None):
    """The cost model fitted on every measurement of ``log`` with features (None when too
    few), carrying the log's digest and :func:`top_records` (``CostModel.meta``)."""
    from .model import CostModel, training_rows

    records = R.load(log) if records is None else records
    model = CostModel().fit_arrays(*training_rows(records))
    if not model.trained:
        return None
    model.meta = {"log_sha256": log_digest(log),
                  "top_records": [{k: v for k, v in R.to_plain(r).items() if k in _PICK_FIELDS}
                                  for r in top_records(records)],
                  "matrix_range": matrix_range(records)}
    return model


# the matrix statistics whose logged span bounds where the model is trusted, and how far
# beyond it (a factor): trees predict flat past their last split, so far above the logged
# sizes and row lengths (where caches and long rows change what is fast) their ranking says
# nothing, and the rule answers instead. Below the span, matrices are small and launch-bound,
# as the smallest logged ones are: the model keeps them
RANGE_STATS = ("rows", "cols", "nnz", "row_len_mean", "row_len_max", "row_len_cv")
RANGE_MARGIN = 4.0
# ... and below it, for the spread of row lengths: a model fitted on skewed graphs alone has
# never seen a mesh. Measured (benchmarks/results/learned_vs_rule_default_H200.json): the
# SDDMM log's graphs have row-length CV >= 1.13, and on copter2 (CV 0.33) its pick ran at
# 0.73-0.96x of the rule's CSR at every width. A matrix whose CV is under the smallest logged
# divided by this margin gets the rule
CV_MARGIN = 2.0


def matrix_range(records) -> Dict[str, List[float]]:
    """{statistic: [smallest, largest]} over the matrices of the ok records (``RANGE_STATS``)."""
    out: Dict[str, List[float]] = {}
    for r in records:
        if r.status != "ok":
            continue
        for name in RANGE_STATS:
            v = r.stats.get(name)
            if isinstance(v, numbers.Real) and math.isfinite(v):
                lo, hi = out.get(name, (v, v))
                out[name] = [min(lo, float(v)), max(hi, float(v))]
    return out


def outside_range(model, stats) -> Optional[str]:
    """Why the matrix with ``stats`` is outside the range of matrices ``model`` was fitted
    on (a statistic more than ``RANGE_MARGIN`` times above the largest logged, or row lengths
    ``CV_MARGIN`` times more even than the most even logged), else None
    (also for a model saved without its range)."""
    span = model.meta.get("matrix_range") if model is not None else None
    if not isinstance(span, dict):
        return None
    for name in RANGE_STATS:
        v, bounds = stats.get(name), span.get(name)
        if not isinstance(v, numbers.Real) or not isinstance(bounds, list) or len(bounds) != 2:
            continue
        lo, hi = bounds
        if name == "row_len_cv":
            if v < lo / CV_MARGIN:
                return (f"the matrix is outside the cost model's range (row_len_cv {v:.3g}: rows more regular than "
                        f"{1 / CV_MARGIN:g}x the most regular logged, {lo:.3g})")
            continue
        if v > hi * RANGE_MARGIN:
            return (f"the matrix is outside the cost model's range ({name} {v:g}, over {RANGE_MARGIN:g}x the "
                    f"largest logged, {hi:g})")
    return None


def _saved_model(log: str):
    """The model saved beside ``log`` if it was fitted on this very log (its digest), else
    None. A model this sparsec cannot read (other feature names, a damaged file) is a
    stale cache: refitted, with a warning, rather than failing the compile."""
    from .model import CostModel

    saved = model_path(log)
    if not os.path.isfile(saved):
        return None
    try:
        model = CostModel.load(saved)
    except ValueError as e:
        warnings.warn(f"{e}; refitting the model from {log}", stacklevel=4)
        return None
    return model if model.meta.get("log_sha256") == log_digest(log) else None


def _refit(log: str, records):
    """Fit the model on ``records`` (``log``'s) and save it beside the log where the
    directory is writable (a read-only install refits per process instead)."""
    model = fit_log_model(log, records)
    if model is not None:
        try:
            model.save(model_path(log))
        except OSError:
            pass
    return model


def _log_model(log: str, records):
    """The model saved beside ``log`` when it was fitted on the log as it is now, else one
    fitted now on the log's ``records`` (about a second: logs carry their feature rows) and
    saved, else None (too few measurements)."""
    return _saved_model(log) or _refit(log, records)


_KNOWLEDGE: Dict[tuple, Any] = {}  # (log, its size and mtime) -> (records, model): read once a process


def _log_knowledge(log: str):
    """(records, model) for :func:`tuned_config`: a fresh saved model and the top records it
    carries (no log to parse, no fit: ``sparsec tune`` and ``python -m sparsec.tune.refit``
    write it), else the whole log and a model fitted on it now. Kept for the process while
    neither the log nor the model file changes (their sizes and modification times)."""
    key = (os.path.abspath(log), *_stamp(log), *_stamp(model_path(log)))
    if key not in _KNOWLEDGE:
        _KNOWLEDGE.clear()
        _KNOWLEDGE[key] = _read_knowledge(log)
    return _KNOWLEDGE[key]


def _stamp(path: str) -> tuple:
    """(size, modification time) of ``path``, or (None, None) where there is no such file."""
    try:
        st = os.stat(path)
    except OSError:
        return None, None
    return st.st_size, st.st_mtime_ns


def _read_knowledge(log: str):
    model = _saved_model(log)
    if model is not None and isinstance(model.meta.get("top_records"), list):
        try:
            return [R.Record.trusted(d) for d in model.meta["top_records"]], model
        except ValueError as e:  # a damaged file: the log still holds everything
            warnings.warn(f"{model_path(log)}: {e}; reading {log} instead", stacklevel=3)
    records = R.load(log)
    return records, _refit(log, records)


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
