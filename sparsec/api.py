"""``sparsec.compile``: the compiler (``sparsec.build.compile``) with what tuning found.

``knobs="tuned"`` needs the tuning logs, and the tuner builds its candidates through the
compiler; resolving it here, above both, keeps the compiler free of the tuner (imports
flow one way: this module -> tune -> build).
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


def compile(op: Union[str, Operator], fmt: Union[str, Format, FormatInstance, CompositeInstance, None] = None, *,
            target: str = "llvm",
            dtype: Optional[str] = None, knobs: Union[Dict[str, Any], str, None] = None,
            dump_ir: Optional[str] = None, **params: int) -> Kernel:
    """Compile ``op`` (a library name or a DSL Operator) for ``fmt`` (a spec such as
    ``"bsr:4x4"``, a Format, or a converted matrix whose format and dtype are used).
    Compile-time extents such as ``feat=64`` go in ``params``. Without ``fmt`` the format is
    the one the operator's declared axis kinds describe (``Operator.default_format``).
    ``knobs="tuned"`` (with a converted matrix) takes the schedule knobs of the best tuning
    record for this matrix, format, width and target (``sparsec.tune.apply``), else the
    template defaults."""
    if isinstance(knobs, str):
        knobs = tuned_knobs(op, fmt, knobs, target=target, dtype=dtype, feat=params.get("feat"))
    return build.compile(op, fmt, target=target, dtype=dtype, knobs=knobs, dump_ir=dump_ir, **params)


def tuned_knobs(op, fmt, knobs: str, *, target: str, dtype: Optional[str], feat: Optional[int]
                ) -> Optional[Dict[str, Any]]:
    """The schedule knobs ``knobs="tuned"`` stands for: the best logged record's for this
    matrix, else None (the template defaults)."""
    if knobs != TUNED or not isinstance(fmt, (FormatInstance, CompositeInstance)):
        raise ValueError(f"knobs should be a dict, or {TUNED!r} with a converted matrix, got {knobs!r}"
                         + ("" if knobs != TUNED else f" with fmt={type(fmt).__name__}"))
    if isinstance(op, Operator):
        op = op.name
    elif not isinstance(op, str):
        raise TypeError(f"op should be an operator name or a sparsec.dsl.Operator, got {type(op).__name__}")
    from .tune.apply import tuned_schedule_knobs

    return tuned_schedule_knobs(op, fmt, feat, target, dtype_spec(dtype or fmt.value_dtype).name) or None
