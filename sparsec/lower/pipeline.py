"""The lowering stages as an ordered mapping of functions ``(ir, ctx) -> next``, run by one loop.

Why named stages: every intermediate IR can be dumped (``{op}.{stage}.txt``), the pipeline
can be entered after any stage with that stage's IR (a hand-edited TVMScript, a FlatProgram
built by a test), and an error raised inside a stage says which stage it came from.
"""
from __future__ import annotations

import os
import pprint
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, Optional, Tuple, Union

from sparsec.schedules import segment_contract

from ..dsl import Operator
from ..dtypes import dtype_spec
from ..formats import CompositeFormat, Format
from .bind import BoundOperator, bind, check_params
from .emit import emit_script
from .flatten import FlatProgram, flatten
from .fold_epilogue import fold_epilogues
from .fill_rows import restrict_fills
from . import fuse_fill
from .positions import PositionProgram, lower_positions
from ..lazy_module import lazy

tvm = lazy("tvm")  # imported when a stage builds TIR: lowering to flat buffers needs none of it

TVM_ERROR_LINES = 12  # lines of a TVM parse error kept in the message (it quotes the offending line)


class LoweringError(ValueError):
    """A lowering stage rejected its input. ``stage`` names the stage; the exception the stage
    raised is the ``__cause__``. A ValueError: what a stage rejects comes from the operator, the
    format, the compile parameters or an IR given with ``start_from``."""

    def __init__(self, stage: str, message: str):
        super().__init__(f"stage {stage}: {message}")
        self.stage = stage


class LoweringTypeError(LoweringError, TypeError):
    """A stage raised TypeError (e.g. an int4 format compiled with another dtype); still a TypeError."""


@dataclass(frozen=True)
class LowerContext:
    """What every stage may read besides its input IR. Validated once, here: the compile-time
    parameters must be exactly the operator's, positive ints; ``dtype`` must be known.
    ``given``: the stage whose IR came from the caller (``start_from``), else None."""

    op: Operator
    fmt: Union[Format, CompositeFormat]
    params: Dict[str, int] = field(default_factory=dict)
    dtype: str = "float32"
    atomics: bool = False
    dump_ir: Optional[str] = None
    given: Optional[str] = None
    segment_splits: Optional[Callable[[], int]] = None  # the matrix's split count, when it is known

    def __post_init__(self):
        if not isinstance(self.op, Operator):
            raise TypeError(f"op should be a sparsec.dsl.Operator, got {type(self.op).__name__}")
        if not isinstance(self.fmt, (Format, CompositeFormat)):
            raise TypeError(f"fmt should be a Format or CompositeFormat, got {type(self.fmt).__name__}")
        object.__setattr__(self, "params", check_params(self.op, self.params))
        object.__setattr__(self, "dtype", dtype_spec(self.dtype).name)


# ---- the stages ------------------------------------------------------------------------------
def bind_stage(op: Operator, ctx: LowerContext) -> BoundOperator:
    """Stage I: the operator's sparse structure replaced by the format's axes."""
    return bind(op, ctx.fmt, ctx.params)


def positions_stage(bound: BoundOperator, ctx: LowerContext) -> PositionProgram:
    """Stage II: loops in position space, guards for padding and edges; an added term after a
    shared-row sum becomes the value its fill starts from (``fold_epilogue``)."""
    return restrict_fills(fold_epilogues(lower_positions(bound)))


def flat_stage(prog: PositionProgram, ctx: LowerContext) -> FlatProgram:
    """Stage III: flat buffers, offsets and value layouts. For CUDA (``ctx.atomics``), nests a
    schedule emits whole are marked (``schedules.segment_contract``: a sum whose far factor
    does not depend on the entry), and, where ``fuse_fill.ENABLED``, the fill of the output
    such a sum adds into runs in its launch."""
    flat = flatten(prog, dtype_spec(ctx.dtype))
    if ctx.atomics:
        flat.nests = [replace(n, template="segment_contract") if segment_contract.match(n, flat) else n
                      for n in flat.nests]
        if fuse_fill.ENABLED and any(n.template == "segment_contract" for n in flat.nests):
            flat = fuse_fill.fuse_fills(flat, ctx.segment_splits() if ctx.segment_splits else None)
    return flat


def script_stage(flat: FlatProgram, ctx: LowerContext) -> str:
    """The flat program printed as TVMScript."""
    return emit_script(flat, ctx.atomics, ctx.segment_splits)


def tir_stage(script: str, ctx: LowerContext) -> tvm.tirx.PrimFunc:
    """TVMScript parsed into a PrimFunc. TVM's rejection is shortened to the lines that
    locate it, and the message says where the script came from and how to report it."""
    try:
        return tvm.script.from_source(script)
    except Exception as e:  # TVM raises its own error types (DiagnosticError, TVMError)
        lines = str(e).strip().splitlines()
        short = "\n".join(lines[:TVM_ERROR_LINES] + (["    ..."] if len(lines) > TVM_ERROR_LINES else []))
        name = ctx.op.name
        if ctx.given in ("script", "tir"):
            hint = "the TVMScript was given with start_from: check the edits"
        else:
            where = (f"{ctx.dump_ir}/{name}.*.txt hold the IR of every stage" if ctx.dump_ir else
                     f"rerun with dump_ir=DIR to write the IR of every stage to DIR/{name}.*.txt")
            hint = (f"sparsec emitted this TVMScript for {name} x {ctx.fmt.spec} ({ctx.dtype}); please report "
                    f"it as an issue with those files attached ({where})")
        raise LoweringError("tir", f"TVM rejects the TVMScript:\n{short}\n{hint}") from e


STAGES: Dict[str, Callable[[Any, LowerContext], Any]] = {
    "bind": bind_stage,
    "positions": positions_stage,
    "flat": flat_stage,
    "script": script_stage,
    "tir": tir_stage,
}
def stage_output(stage: str) -> type:
    """The IR ``stage`` produces: what ``start_from=(stage, ir)`` must be given (TVM's
    PrimFunc looked up only when asked for: TVM is imported on first use)."""
    if stage == "tir":
        return tvm.tirx.PrimFunc
    return {"bind": BoundOperator, "positions": PositionProgram, "flat": FlatProgram, "script": str}[stage]


def run_stages(ctx: LowerContext, start_from: Optional[Tuple[str, Any]] = None,
               stop: Optional[str] = None) -> Dict[str, Any]:
    """Run the stages in order and return every stage's IR by stage name.

    ``start_from=(stage, ir)``: ``ir`` is taken as that stage's result and only the stages after
    it run. ``stop``: the last stage to run. With ``ctx.dump_ir`` each result is written to
    ``{dump_ir}/{op}.{stage}.txt`` as soon as it exists, so a failing stage leaves its input."""
    names = list(STAGES)
    results: Dict[str, Any] = {}
    ir: Any = ctx.op
    first = 0
    if start_from is not None:
        stage, ir = _check_start(start_from)
        results[stage] = ir
        _dump(ctx, stage, ir)
        first = names.index(stage) + 1
    last = names.index(_check_stage(stop, "stop")) if stop is not None else len(names) - 1
    for name in names[first:last + 1]:
        ir = _run(name, ir, ctx)
        results[name] = ir
        _dump(ctx, name, ir)
    return results


def _run(name: str, ir: Any, ctx: LowerContext) -> Any:
    """One stage. What it rejects (ValueError, TypeError) is re-raised naming the stage; any
    other exception is a sparsec bug and keeps its type, with a note naming the stage."""
    try:
        return STAGES[name](ir, ctx)
    except LoweringError:
        raise
    except TypeError as e:
        raise LoweringTypeError(name, str(e)) from e
    except ValueError as e:
        raise LoweringError(name, str(e)) from e
    except Exception as e:
        e.add_note(f"raised in lowering stage {name!r} of {ctx.op.name} x {ctx.fmt.spec}")
        raise


def _check_stage(stage, what: str) -> str:
    if stage not in STAGES:
        raise ValueError(f"{what} should name a lowering stage, one of {list(STAGES)}, got {stage!r}")
    return stage


def _check_start(start_from) -> Tuple[str, Any]:
    if not isinstance(start_from, tuple) or len(start_from) != 2:
        raise ValueError(f"start_from should be a (stage, ir) pair, got {start_from!r}")
    stage, ir = start_from
    _check_stage(stage, "start_from's stage")
    want = stage_output(stage)
    if not isinstance(ir, want):
        raise TypeError(f"start_from=({stage!r}, ir): ir should be a {want.__name__} (what stage {stage} "
                        f"produces), got {type(ir).__name__}")
    return stage, ir


def _dump(ctx: LowerContext, stage: str, ir: Any) -> None:
    if not ctx.dump_ir:
        return
    os.makedirs(ctx.dump_ir, exist_ok=True)
    if isinstance(ir, str):
        text = ir
    elif isinstance(ir, tvm.tirx.PrimFunc):
        text = ir.script()
    else:
        text = pprint.pformat(ir, width=110)
    with open(os.path.join(ctx.dump_ir, f"{ctx.op.name}.{stage}.txt"), "w") as f:
        f.write(text)
