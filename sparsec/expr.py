"""A small expression tree shared by the DSL and every lowering stage.

The DSL builds ``Access`` nodes (a buffer read at coordinate axes); stage II turns
them into ``Load`` nodes over flat arrays with position expressions; ``render``
prints any tree as TVMScript. Keeping one tree for all stages keeps each pass a
plain substitution.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Tuple, Union

Number = Union[int, float]


class Expr:
    """Base class: arithmetic operators build BinOp nodes."""

    def _bin(self, op, other, swap=False):
        other = wrap(other)
        return BinOp(op, other, self) if swap else BinOp(op, self, other)

    def __add__(self, o): return self._bin("+", o)
    def __radd__(self, o): return self._bin("+", o, True)
    def __sub__(self, o): return self._bin("-", o)
    def __rsub__(self, o): return self._bin("-", o, True)
    def __mul__(self, o): return self._bin("*", o)
    def __rmul__(self, o): return self._bin("*", o, True)
    def __truediv__(self, o): return self._bin("/", o)
    def __rtruediv__(self, o): return self._bin("/", o, True)
    def __neg__(self): return BinOp("-", Const(0), self)

    def __bool__(self):
        raise TypeError("a sparsec expression has no truth value; use sparsec.dsl.select for conditions")


@dataclass(frozen=True, eq=False)
class Const(Expr):
    value: Number


@dataclass(frozen=True, eq=False)
class Var(Expr):
    """A named scalar: a loop or block iterator, a symbolic size, a kernel parameter."""

    name: str


@dataclass(frozen=True, eq=False)
class BinOp(Expr):
    op: str  # + - * / // < <= >= and
    a: Expr
    b: Expr


@dataclass(frozen=True, eq=False)
class Call(Expr):
    """An elementwise function: exp, max, min, sqrt, abs."""

    fn: str
    args: Tuple[Expr, ...]


@dataclass(frozen=True, eq=False)
class Select(Expr):
    """``then`` where ``cond`` holds, else ``other``; the branch not taken is not evaluated,
    so it guards loads through padding or past the matrix edge."""

    cond: Expr
    then: Expr
    other: Expr


@dataclass(frozen=True, eq=False)
class Load(Expr):
    """A read of a flat (stage III) or multi-dimensional buffer at index expressions."""

    buffer: str
    index: Tuple[Expr, ...]


@dataclass(frozen=True, eq=False)
class Let(Expr):
    """``body`` with ``var`` (an int32 scalar) bound to ``value``: an expression that names an
    intermediate once (a lookup's binary search, ``lower.lookup``), so each step reads the
    previous one without copying it."""

    var: Var
    value: Expr
    body: Expr


def wrap(x) -> Expr:
    if isinstance(x, Expr):
        return x
    if isinstance(x, bool):
        raise TypeError("booleans are not sparsec values")
    if isinstance(x, (int, float)):
        return Const(x)
    raise TypeError(f"cannot use {type(x).__name__} in a sparsec expression")


def transform(e: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """Rebuild ``e`` bottom-up; ``fn`` returns a replacement for a node or None to keep it."""
    if isinstance(e, BinOp):
        e = BinOp(e.op, transform(e.a, fn), transform(e.b, fn))
    elif isinstance(e, Call):
        e = Call(e.fn, tuple(transform(a, fn) for a in e.args))
    elif isinstance(e, Select):
        e = Select(transform(e.cond, fn), transform(e.then, fn), transform(e.other, fn))
    elif isinstance(e, Load):
        e = Load(e.buffer, tuple(transform(i, fn) for i in e.index))
    elif isinstance(e, Let):
        e = Let(e.var, transform(e.value, fn), transform(e.body, fn))
    out = fn(e)
    return e if out is None else out


def walk(e: Expr, indices: bool = True):
    """Every node of ``e``, parents before children (without the index expressions of loads
    when ``indices`` is False)."""
    yield e
    children = ()
    if isinstance(e, BinOp):
        children = (e.a, e.b)
    elif isinstance(e, Call):
        children = e.args
    elif isinstance(e, Select):
        children = (e.cond, e.then, e.other)
    elif isinstance(e, Load) and indices:
        children = e.index
    elif isinstance(e, Let):
        children = (e.value, e.body)
    for c in children:
        yield from walk(c, indices)


def simplify_add(a: Expr, b: Expr) -> Expr:
    """a + b, dropping literal zeros (keeps emitted index expressions readable)."""
    if isinstance(a, Const) and a.value == 0:
        return b
    if isinstance(b, Const) and b.value == 0:
        return a
    return BinOp("+", a, b)


def simplify_mul(a: Expr, b: Expr) -> Expr:
    if isinstance(a, Const) and a.value == 1:
        return b
    if isinstance(b, Const) and b.value == 1:
        return a
    return BinOp("*", a, b)


_TIR_CALLS = {"exp": "T.exp", "max": "T.max", "min": "T.min", "sqrt": "T.sqrt", "abs": "T.abs", "tanh": "T.tanh",
              "erf": "T.erf"}


def cast(dtype: str, e: Expr) -> Expr:
    return Call(f"cast:{dtype}", (e,))


def unpack_int4(packed: Load, parity: Expr) -> Expr:
    """The signed nibble ``parity`` (0: low, 1: high) of an int8 byte, as int32."""
    return Call("unpack4", (packed, parity))


def render(e: Expr, dtype: str, names: Dict[str, str] | None = None) -> str:
    """TVMScript text for ``e``. Float literals take ``dtype``; ``names`` renames Vars."""
    names = names or {}
    if isinstance(e, Const):
        if isinstance(e.value, float):
            v = e.value
            if v in (float("inf"), float("-inf")):
                # the identity of a max/min reduction: the dtype's extreme value, which TVM
                # recognises as the identity of its max/min reducers (cross-thread reductions)
                return f'T.{"max" if v > 0 else "min"}_value("{dtype}")'
            if not dtype.startswith("float"):  # an integer computation: identities become ints
                return f"T.{dtype}({int(v)})"
            return f"T.{dtype}({v!r})"
        return str(e.value)
    if isinstance(e, Var):
        return names.get(e.name, e.name)
    if isinstance(e, Load):
        return f"{e.buffer}[{', '.join(render(i, 'int32', names) for i in e.index)}]"
    if isinstance(e, BinOp):
        a, b = render(e.a, dtype, names), render(e.b, dtype, names)
        if e.op == "and":
            return f"T.And({a}, {b})"
        return f"({a} {e.op} {b})"
    if isinstance(e, Call) and e.fn.startswith("cast:"):
        return f'T.Cast("{e.fn[5:]}", {render(e.args[0], dtype, names)})'
    if isinstance(e, Call) and e.fn == "unpack4":
        byte = render(e.args[0], dtype, names)
        # move the nibble to the top of an int32, then shift back arithmetically: sign extension
        return (f'T.shift_right(T.shift_left(T.Cast("int32", {byte}), 28 - 4 * {render(e.args[1], "int32", names)}), '
                f"28)")
    if isinstance(e, Call):
        if e.fn not in _TIR_CALLS:
            raise ValueError(f"function should be one of {sorted(_TIR_CALLS)}, got {e.fn!r}")
        return f"{_TIR_CALLS[e.fn]}({', '.join(render(a, dtype, names) for a in e.args)})"
    if isinstance(e, Select):
        return (f"T.if_then_else({render(e.cond, 'int32', names)}, "
                f"{render(e.then, dtype, names)}, {render(e.other, dtype, names)})")
    if isinstance(e, Let):
        return (f"T.Let({render(e.body, dtype, names)}, where={{{render(e.var, 'int32', names)}: "
                f"{render(e.value, 'int32', names)}}})")
    raise TypeError(f"cannot render {type(e).__name__}")
