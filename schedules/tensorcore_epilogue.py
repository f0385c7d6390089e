"""What a block SpMM does to its output after the reduction, as the Tensor Core template's store.

``C[i, k] = relu(sum_j A[i, j] * B[j, k] + bias[i])`` is two DSL iterations: the reduction
and a dense one over (i, k) that rewrites every element of C once (``schedules.epilogue``
fuses the same shape into the generic templates' stores). Lowered, the second is a dense
nest whose target is ``C[v_i, v_k]`` and whose value reads C only there, the operator's
dense inputs at indices made of v_i, v_k and constants, and constants. Several such nests
in a row compose (scale, then ReLU). A multi-head output ``C[i, h, k]`` (``tensorcore_heads``)
takes the same over (i, h, k): a bias per (h, k) or per (i, h).

:func:`epilogue_of` recognises that structure on the lowered program (None when the nests
after the reduction are anything else); :meth:`Epilogue.apply` builds the TIR expression
of one output element from the reduction's value, so the template applies it to the fp32
accumulator in its final store (one kernel, C written once). The reduction's value first
takes C's dtype, as the generic kernel stores it there before the epilogue reads it back.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

VALUE_CALLS = ("max", "min", "exp", "sqrt", "abs")
VALUE_OPS = ("+", "-", "*", "/", "<", "<=", ">", ">=", "==", "and")


@dataclass(frozen=True)
class Epilogue:
    """The dense nests after a block SpMM, each as (C's index vars, value expression).

    out      the output buffer's name (the reduction's target)
    steps    (((row var, [head var,] col var), value), ...) in program order; empty: C = acc
    extras   the names of the dense inputs only the epilogue reads, in argument order
    literal  the dtype float literals take (the program's compute dtype, as the emitter's)
    """

    out: str
    steps: Tuple[Tuple[str, str, object], ...]
    extras: Tuple[str, ...]
    literal: str = "float32"

    def apply(self, value, index, buffers: Dict[str, object]):
        """The element of C at ``index`` (its TIR indices) given the reduction's ``value`` (a
        PrimExpr of C's dtype); ``buffers`` maps each extra's name to its tirx.Buffer."""
        for names, expr in self.steps:
            value = _to_tir(expr, dict(zip(names, index)), self.out, value, buffers, self.literal)
        return value


def epilogue_of(program, out: str) -> Optional[Epilogue]:
    """The epilogue of a program whose first nest is a block SpMM into ``out``, or None when
    a later nest is not a dense element-wise rewrite of ``out`` (module docstring)."""
    from sparsec.expr import Const, Load, Var, walk

    core = {b.name for b in program.buffers if b.role in ("index", "output") or b.sparse}
    extras = tuple(b.name for b in program.buffers if b.name not in core and b.name != out)
    kinds = {b.name: b for b in program.buffers}
    if any(kinds[n].role != "input" or kinds[n].sparse for n in extras):
        return None
    steps = []
    for nest in program.nests[1:]:
        if not nest.dense or nest.reduce is not None or nest.fill or nest.atomic or nest.target.buffer != out:
            return None
        loops = [b.loop for blk in nest.blocks for b in blk]
        if len(loops) not in (2, 3) or loops[0].role != "root" or any(l.role != "dense" for l in loops[1:]):
            return None
        names = tuple(f"v_{l.name}" for l in loops)
        if tuple(getattr(i, "name", None) for i in nest.target.index) != names:
            return None
        for node in walk(nest.value, indices=False):  # index expressions are checked apart
            if isinstance(node, Load):
                if node.buffer == out:
                    ok = tuple(getattr(i, "name", None) for i in node.index) == names
                else:
                    ok = node.buffer in extras and all(
                        (isinstance(i, Var) and i.name in names) or (isinstance(i, Const) and
                                                                      isinstance(i.value, int))
                        for i in node.index)
                if not ok:
                    return None
            elif isinstance(node, Var):
                return None  # a loop variable used as a value, or a size: not an element-wise epilogue
            elif not _allowed(node):
                return None
        steps.append((names, nest.value))
    return Epilogue(out, tuple(steps), extras, program.dtype.out)


def _allowed(node) -> bool:
    from sparsec.expr import BinOp, Call, Const, Load, Select

    if isinstance(node, (Const, Load, Select)):
        return True
    if isinstance(node, BinOp):
        return node.op in VALUE_OPS
    if isinstance(node, Call):
        return node.fn in VALUE_CALLS or node.fn.startswith("cast:")
    return False


def _to_tir(e, env, out, value, buffers, literal):
    """The TIR PrimExpr of the flat expression ``e`` (an epilogue value): loads of ``out`` are
    ``value``, other loads read ``buffers`` at indices with ``env``'s row/col substituted."""
    from tvm import tirx

    from sparsec.expr import BinOp, Call, Const, Load, Select

    def index(x):
        return tirx.IntImm("int32", x.value) if isinstance(x, Const) else env[x.name]

    def go(x):
        if isinstance(x, Const):  # a value: literals take the compute dtype, as the emitter's
            return tirx.FloatImm(literal, float(x.value))
        if isinstance(x, Load):
            if x.buffer == out:
                return value
            return tirx.BufferLoad(buffers[x.buffer], [index(i) for i in x.index])
        if isinstance(x, Select):
            return tirx.if_then_else(go(x.cond), go(x.then), go(x.other))
        if isinstance(x, Call):
            args = [go(a) for a in x.args]
            if x.fn.startswith("cast:"):
                return tirx.Cast(x.fn[5:], args[0])
            return {"max": tirx.max, "min": tirx.min, "exp": tirx.exp, "sqrt": tirx.sqrt,
                    "abs": tirx.abs}[x.fn](*args)
        if isinstance(x, BinOp):
            a, b = go(x.a), go(x.b)
            if x.op == "and":
                return tirx.And(a, b)
            return {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "/": lambda: tirx.Div(a, b),
                    "<": lambda: a < b, "<=": lambda: a <= b, ">": lambda: a > b, ">=": lambda: a >= b,
                    "==": lambda: tirx.EQ(a, b)}[x.op]()
        raise TypeError(f"an epilogue cannot hold {type(x).__name__}")

    return go(e)
