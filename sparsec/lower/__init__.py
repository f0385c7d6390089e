"""The lowering pipeline: a dict of named stages, each from one IR to the next.

    bind       Operator + Format      -> BoundOperator   (stage I: format axes replace the sparse structure)
    positions  BoundOperator          -> PositionProgram (stage II: loops in position space, guards)
    flat       PositionProgram        -> FlatProgram     (stage III: flat buffers and offsets)
    script     FlatProgram            -> str             (TVMScript text)
    tir        str                    -> tvm PrimFunc

``lower(..., dump_ir=DIR)`` writes each stage's result as ``{op}.{stage}.txt``.
"""
from __future__ import annotations

import os
import pprint
from typing import Dict, Optional

import tvm

from ..dsl import Operator
from ..formats import Format
from ..dtypes import dtype_spec
from .bind import bind
from .emit import emit_script
from .flatten import flatten
from .positions import lower_positions

STAGES = ("bind", "positions", "flat", "script", "tir")


def lower(op: Operator, fmt: Format, params: Dict[str, int], dtype: str = "float32",
          dump_ir: Optional[str] = None, atomics: bool = False) -> tvm.tirx.PrimFunc:
    """Run every stage and return the PrimFunc, ready for ``tvm.s_tir.Schedule``."""
    return lower_program(op, fmt, params, dtype, dump_ir, atomics)[0]


def lower_program(op: Operator, fmt: Format, params: Dict[str, int], dtype: str = "float32",
                  dump_ir: Optional[str] = None, atomics: bool = False):
    """The PrimFunc and the flat program it came from (schedules read loop roles from it).
    ``atomics``: emit atomicAdd where rows repeat (CUDA); the CPU schedule runs those serially."""
    bound = bind(op, fmt, params)
    positions = lower_positions(bound)
    flat = flatten(positions, dtype_spec(dtype))
    script = emit_script(flat, atomics)
    try:
        func = tvm.script.from_source(script)
    except Exception as e:
        raise RuntimeError(f"sparsec emitted TVMScript that TVM rejects (a sparsec bug):\n{script}\n{e}") from e
    if dump_ir:
        os.makedirs(dump_ir, exist_ok=True)
        results = {"bind": bound, "positions": positions, "flat": flat, "script": script, "tir": func.script()}
        for stage in STAGES:
            text = results[stage] if isinstance(results[stage], str) else pprint.pformat(results[stage], width=110)
            with open(os.path.join(dump_ir, f"{op.name}.{stage}.txt"), "w") as f:
                f.write(text)
    return func, flat
