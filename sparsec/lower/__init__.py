"""The lowering pipeline: an ordered dict of named stages (``STAGES``), each from one IR to the next.

    bind       Operator          -> BoundOperator   (stage I: format axes replace the sparse structure)
    positions  BoundOperator     -> PositionProgram (stage II: loops in position space, guards)
    flat       PositionProgram   -> FlatProgram     (stage III: flat buffers and offsets)
    script     FlatProgram       -> str             (TVMScript text)
    tir        str               -> tvm PrimFunc

Each stage is a function ``(ir, ctx) -> next`` (``pipeline.LowerContext`` holds the operator,
format, compile-time parameters and dtype), run in order by ``pipeline.run_stages``.
``dump_ir=DIR`` writes each stage's result as ``DIR/{op}.{stage}.txt``;
``start_from=(stage, ir)`` takes ``ir`` as that stage's result and runs only the later stages
(e.g. ``("script", open("spmm.script.txt").read())`` after editing a dump). An error inside
a stage is re-raised as ``LoweringError("stage <name>: ...")`` with the original as cause.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Tuple, Union

from ..dsl import Operator
from ..formats import CompositeFormat, Format
from .flatten import FlatProgram
from .pipeline import STAGES, LowerContext, LoweringError, LoweringTypeError, run_stages

if TYPE_CHECKING:  # the annotations' PrimFunc; TVM itself is imported by the stage that builds TIR
    import tvm

__all__ = ["STAGES", "LowerContext", "LoweringError", "LoweringTypeError", "lower", "lower_flat", "lower_program", "run_stages"]


def lower(op: Operator, fmt: Union[Format, CompositeFormat], params: Dict[str, int], dtype: str = "float32",
          dump_ir: Optional[str] = None, atomics: bool = False,
          start_from: Optional[Tuple[str, Any]] = None) -> tvm.tirx.PrimFunc:
    """Run every stage and return the PrimFunc, ready for ``tvm.s_tir.Schedule``."""
    return lower_program(op, fmt, params, dtype, dump_ir, atomics, start_from)[0]


def lower_program(op: Operator, fmt: Union[Format, CompositeFormat], params: Dict[str, int],
                  dtype: str = "float32", dump_ir: Optional[str] = None, atomics: bool = False,
                  start_from: Optional[Tuple[str, Any]] = None,
                  segment_splits: Optional[Callable[[], int]] = None) -> Tuple[tvm.tirx.PrimFunc, FlatProgram]:
    """The PrimFunc and the flat program it came from (schedules read loop roles from it).
    ``atomics``: emit atomicAdd where rows repeat (CUDA); the CPU schedule runs those serially.
    ``start_from=(stage, ir)``: see the module docstring; when ``ir`` comes after the flat
    stage (a TVMScript or PrimFunc), the flat program is lowered from ``op`` x ``fmt`` again.
    ``segment_splits``: see ``emit_script`` (the matrix's share of a segment contraction)."""
    given = start_from[0] if isinstance(start_from, tuple) and start_from else None
    ctx = LowerContext(op, fmt, params, dtype, atomics, dump_ir, given, segment_splits)
    results = run_stages(ctx, start_from)
    flat = results.get("flat")
    if flat is None:
        flat = lower_flat(op, fmt, params, dtype, atomics)
    return results["tir"], flat


def lower_flat(op: Operator, fmt: Union[Format, CompositeFormat], params: Dict[str, int],
               dtype: str = "float32", atomics: bool = False) -> FlatProgram:
    """The flat program alone: all a schedule's choice of templates reads
    (``schedules.plan.templates``), without printing and parsing the TVMScript (about a
    quarter of a second an operator, which a tuner's pick paid before its first ranking)."""
    return run_stages(LowerContext(op, fmt, params, dtype, atomics), stop="flat")["flat"]
