"""Lookups: a sparse buffer read at a coordinate that is not its own entry (``A[i, jd]``).

In a dense iteration a sparse buffer may be read at a dense column axis ``jd``
(``sparsec.dsl``: ``Access.lookup``): the value at (i, jd) where (i, jd) is an entry of the
matrix, else 0 (SparseTIR's ``csrmm_dense_iter``). Stage II writes it as a ``Lookup`` node
(row and column coordinates as expressions); stage III expands it here for the format into
a binary search over the row's stored column indices, as one expression: a fixed number of
steps (log2 of the most entries that can lie before the sought column), each ``Let``-bound,
every index load guarded by an ``if_then_else`` so no read leaves the row.

Formats: a root axis over (block) rows, then one sparse column axis whose indices are
sorted within a row and whose padding (-1) follows the entries, then optional dense in-block
axes (csr, ell, bsr). Explicit zeros are entries (their value, 0, is read); padding never
matches (its index is -1). Other formats are refused by name, saying which to use.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

from ..formats import CompositeFormat
from ..expr import BinOp, Call, Const, Expr, Let, Load, Select, Var, simplify_mul, walk

LOOKUP_FORMATS = "csr, ell or bsr:RxC"


@dataclass(frozen=True, eq=False)
class Lookup(Expr):
    """``buffer`` at (``row``, ``col``) and its trailing dense indices; 0 where (row, col) is
    no entry. ``col_extent``: the compile-time extent of the column coordinate (jd < col_extent),
    which bounds how many entries can precede it in a row. ``name``: a prefix for the
    search's variables, unique within the kernel."""

    buffer: str
    row: Expr
    col: Expr
    trailing: Tuple[Expr, ...]
    col_extent: int
    name: str
    text: str = ""  # how the user wrote it (A[i, jd]), for refusals


def lookup_refusal(text: str, fmt) -> str:
    """Why ``fmt`` has no lookup, and what to use instead; empty when it has one."""
    if isinstance(fmt, CompositeFormat):
        return (f"{text} reads a sparse buffer at a coordinate that may not be stored (a lookup), which needs one "
                f"sorted column list per row; the composite format {fmt.spec} splits rows over its parts, so bind the "
                f"operator to {LOOKUP_FORMATS} instead")
    chain = fmt.axes
    why = ""
    if not chain or chain[0].sparse or chain[0].variable or chain[0].dim != 0:
        why = "its first axis is not a dense row axis"
    elif len(chain) < 2 or not chain[1].sparse or chain[1].dim != 1:
        why = "its column indices do not sit directly under the rows"
    elif any(a.sparse or a.variable or a.extent is None or a.scale != 1 for a in chain[2:]):
        why = "it has inner axes that are not fixed dense blocks"
    elif fmt.value_chunk or fmt.value_bits:
        why = "its values are stored in chunks or packed"
    elif chain[1].padded and chain[1].variable:
        why = "its rows are padded inside a variable axis"
    else:
        inner = {d: [a for a in chain[2:] if a.dim == d] for d in (0, 1)}
        for d, scale in ((0, chain[0].scale), (1, chain[1].scale)):
            ext = 1
            for a in inner[d]:
                ext *= a.extent
            if ext != scale:
                why = "its in-block axes do not tile its blocks"
    if not why:
        return ""
    return (f"{text} reads a sparse buffer at a coordinate that may not be stored (a lookup, a binary search over a "
            f"row's sorted column indices); format {fmt.spec} has none ({why}): bind the operator to "
            f"{LOOKUP_FORMATS} instead")


def expand_lookup(lk: Lookup, fmt) -> Expr:
    """The expression that reads ``lk`` on ``fmt`` (one part, not composite)."""
    why = lookup_refusal(lk.text or lk.buffer, fmt)
    if why:
        raise ValueError(why)
    root, cols, inner = fmt.axes[0], fmt.axes[1], fmt.axes[2:]
    row_block = lk.row if root.scale == 1 else BinOp("//", lk.row, Const(root.scale))
    col_block = lk.col if cols.scale == 1 else BinOp("//", lk.col, Const(cols.scale))
    names = {k: Var(f"{lk.name}_{k}") for k in ("lo", "hi", "t")}
    if cols.variable:
        lo, hi = Load(cols.indptr, (row_block,)), Load(cols.indptr, (BinOp("+", row_block, Const(1)),))
        longest = -(-lk.col_extent // cols.scale)
    else:
        lo = simplify_mul(row_block, Const(cols.width))
        hi = BinOp("+", names["lo"], Const(cols.width))
        longest = min(-(-lk.col_extent // cols.scale), cols.width)
    # at most t entries precede column t in a sorted, duplicate-free row: it lies in [lo, min(hi, lo + t + 1))
    end = Var(f"{lk.name}_end")
    target = names["t"]

    def before(p: Expr) -> Expr:
        """indices[p] sorts before the target (padding, -1, does not: it follows the entries)."""
        idx = Load(cols.indices, (p,))
        less = BinOp("<", idx, target)
        return BinOp("and", BinOp(">=", idx, Const(0)), less) if cols.padded else less

    steps = []
    s = 1
    while s <= longest:
        steps.append(s)
        s *= 2
    found_at = Var(f"{lk.name}_p{len(steps)}")
    slot: Expr = found_at
    for n, a in enumerate(inner):  # the in-block position: the coordinate's digits within its block
        coord = lk.row if a.dim == 0 else lk.col
        below = 1  # the extents of the later in-block axes of the same dimension
        for b in inner[n + 1:]:
            below *= b.extent if b.dim == a.dim else 1
        digit = BinOp("%", coord if below == 1 else BinOp("//", coord, Const(below)), Const(a.extent))
        slot = BinOp("+", simplify_mul(slot, Const(a.extent)), digit)
    value = Load(lk.buffer, (slot,) + tuple(lk.trailing))
    found = Select(BinOp("<", found_at, end), Select(BinOp("==", Load(cols.indices, (found_at,)), target), value,
                                                     Const(0.0)), Const(0.0))
    # the steps, largest first: p_{k+1} = p_k + step where indices[p_k + step - 1] (inside the row's
    # candidates) sorts before t; every load is guarded, so each step is safe to compute anywhere
    body: Expr = found
    for k in range(len(steps), 0, -1):
        step = steps[len(steps) - k]
        prev = Var(f"{lk.name}_p{k - 1}")
        probe = BinOp("+", prev, Const(step - 1)) if step > 1 else prev
        advance = Select(BinOp("<", probe, end), Call("cast:int32", (before(probe),)), Const(0))
        body = Let(Var(f"{lk.name}_p{k}"), BinOp("+", prev, simplify_mul(Const(step), advance)), body)
    body = Let(Var(f"{lk.name}_p0"), names["lo"], body)
    bound = Call("min", (BinOp("+", BinOp("+", names["lo"], target), Const(1)), names["hi"]))
    body = Let(end, bound, body)
    body = Let(names["hi"], hi, body)
    body = Let(names["lo"], lo, body)
    return Let(target, col_block, body)


def hoist_lets(e: Expr) -> Tuple[List[Tuple[Var, Expr]], Expr]:
    """``e`` without its ``Let`` nodes, and their bindings in order (outer first): the kernel
    binds them as statements before the store (TVM's analyses substitute a ``Let`` expression's
    value into its uses, which grows exponentially along a search's chain of steps; a statement
    binding stays one variable). A lookup's bindings are safe to evaluate unconditionally."""
    out: List[Tuple[Var, Expr]] = []

    def strip(n: Expr) -> Expr:
        if isinstance(n, Let):
            out.append((n.var, strip(n.value)))
            return strip(n.body)
        if isinstance(n, BinOp):
            return BinOp(n.op, strip(n.a), strip(n.b))
        if isinstance(n, Call):
            return Call(n.fn, tuple(strip(a) for a in n.args))
        if isinstance(n, Select):
            return Select(strip(n.cond), strip(n.then), strip(n.other))
        if isinstance(n, Load):
            return Load(n.buffer, tuple(strip(i) for i in n.index))
        return n

    rest = strip(e)
    return out, rest


def let_vars(e: Expr):
    """The names every ``Let`` in ``e`` binds (the kernel declares them as int32 scalars)."""
    return [n.var.name for n in walk(e) if isinstance(n, Let)]
