"""``sparsec.compile``: the compiler (``sparsec.build.compile``) with what tuning found.

For a converted matrix, the schedule knobs default to what the tuning logs know (the best
record for this matrix, else the shipped cost model's pick); ``knobs="default"`` keeps the
templates' rule, ``knobs="tuned"`` asks for the logs explicitly. Those need the tuning logs,
and the tuner builds its candidates through the compiler; resolving them here, above both,
keeps the compiler free of the tuner (imports flow one way: this module -> tune -> build).
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Union

from . import build
from .dsl import Operator
from .dtypes import dtype_spec
from .formats import Format, FormatInstance
from .formats.composite import CompositeInstance
from .kernel import Kernel

TUNED = "tuned"
DEFAULT = "default"


def compile(op: Union[str, Operator], fmt: Union[str, Format, FormatInstance, CompositeInstance, None] = None, *,
            target: str = "llvm",
            dtype: Optional[str] = None, knobs: Union[Dict[str, Any], str, None] = None,
            dump_ir: Optional[str] = None, **params: int) -> Kernel:
    """Compile ``op`` (a library name or a DSL Operator) for ``fmt`` (a spec such as
    ``"bsr:4x4"``, a Format, or a converted matrix whose format and dtype are used).
    Compile-time extents such as ``feat=64`` go in ``params``. Without ``fmt`` the format is
    the one the operator's declared axis kinds describe (``Operator.default_format``).

    ``knobs``: a dict of schedule knobs (the rest by the templates' rule); ``"default"``, the
    rule alone; ``"tuned"`` (with a converted matrix), the best tuning record for this
    matrix, format, width and target, else the log's model's pick (``sparsec.tune.apply``),
    else the rule. Left out, for a library operator named by a string and a converted matrix,
    the same answer read from the shipped model file alone (no log to parse): the learned
    default; an Operator object keeps the rule.
    ``Kernel.extra["knobs_source"]`` says which answered ("record", "model", or "default: why")."""
    source = None
    if knobs is None and isinstance(fmt, (FormatInstance, CompositeInstance)) and _library_name(op):
        knobs, source = learned_knobs(_library_name(op), fmt, target=target, dtype=dtype, feat=params.get("feat"))
    elif knobs == DEFAULT:
        knobs, source = None, "default: asked for"
    elif isinstance(knobs, str):
        knobs = tuned_knobs(op, fmt, knobs, target=target, dtype=dtype, feat=params.get("feat"))
        source = "tuned" if knobs else "default: no record or model pick"
    kernel = build.compile(op, fmt, target=target, dtype=dtype, knobs=knobs, dump_ir=dump_ir, **params)
    if source is not None and isinstance(kernel, Kernel):
        kernel.extra["knobs_source"] = source
    return kernel


def _library_name(op) -> Optional[str]:
    """The library operator's name when ``op`` is given by name; None for an Operator object
    (a user's DSL operator may share a library name, but the logs measured the library's
    kernels, not its: it keeps the rule unless it asks for ``knobs="tuned"``)."""
    return op if isinstance(op, str) else None


def learned_knobs(op: str, inst, *, target: str, dtype: Optional[str], feat: Optional[int]):
    """(knobs or None, source) for a converted matrix compiled without knobs: the tuning
    logs' answer for ``target`` (``tune.apply.learned_schedule_knobs``), read from the model
    file shipped beside the log. Only where a log exists for the op and target; a pick that
    fails (a damaged model file) falls back to the rule with a warning, never the compile."""
    from .targets import parse_target
    from .tune.apply import learned_schedule_knobs, log_candidates

    name = parse_target(target).name
    if not log_candidates(op, name):
        return None, f"default: no tuning log for {op} on {name}"
    try:
        knobs, source = learned_schedule_knobs(op, inst, feat, name, dtype_spec(dtype or inst.value_dtype).name)
    except ImportError as e:  # the cost model needs the tune extra (xgboost)
        return None, f"default: no cost model here ({e})"
    except (ValueError, KeyError, TypeError, OSError) as e:
        import warnings

        warnings.warn(f"the learned default knobs failed ({e}); compiling with the templates' rule", stacklevel=3)
        return None, f"default: the pick failed ({type(e).__name__})"
    return (knobs or None), source


def tuned_knobs(op, fmt, knobs: str, *, target: str, dtype: Optional[str], feat: Optional[int]
                ) -> Optional[Dict[str, Any]]:
    """The schedule knobs ``knobs="tuned"`` stands for: the best logged record's for this
    matrix, else None (the template defaults)."""
    if knobs != TUNED or not isinstance(fmt, (FormatInstance, CompositeInstance)):
        raise ValueError(f"knobs should be a dict, {DEFAULT!r}, or {TUNED!r} with a converted matrix, got {knobs!r}"
                         + ("" if knobs != TUNED else f" with fmt={type(fmt).__name__}"))
    if isinstance(op, Operator):
        op = op.name
    elif not isinstance(op, str):
        raise TypeError(f"op should be an operator name or a sparsec.dsl.Operator, got {type(op).__name__}")
    from .targets import parse_target
    from .tune.apply import tuned_schedule_knobs

    return tuned_schedule_knobs(op, fmt, feat, parse_target(target).name,
                                dtype_spec(dtype or fmt.value_dtype).name) or None
