"""Stage I: bind an operator's sparse structure to a format's axis chain.

Each iteration's (row axis, sparse axis) pair is replaced by the format's axes, in
the format's order; the operator's dense axes follow in the order given. A format
axis inherits the S/R kind of the logical axis it contributes a coordinate to
(dim 0 -> the row axis, dim 1 -> the sparse axis). Nothing here looks at the
format's name: only its axes.

A composite format (hyb, bsr+csr) is decomposed here: every iteration is bound once
per part, the part's axes and index arrays renamed ``p<k>_...`` so that the parts
of one kernel never share a name.

An iteration that does not iterate (row, sparse axis) together is *dense*
(``Operator.is_sparse_iteration``): it does not depend on the format, so it is bound
once, whatever the parts, as plain loops over its axes in the order given (the row axis
over 0..rows, the column axis over 0..cols). Its first loop takes the role "root" (the
loop schedules distribute), the others "dense".
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Tuple, Union

from ..dsl import Axis as DslAxis
from ..dsl import Iteration, Operator, Statement
from ..formats import Format
from ..formats.axes import Axis as FmtAxis
from ..formats.composite import CompositeFormat


@dataclass(frozen=True)
class Loop:
    """One loop of a bound iteration.

    role: "root" (first format axis), "sparse" (a variable or sparse format axis),
    "block" (a dense format axis inside the chain, e.g. BSR's in-block rows) or
    "dense" (an operator axis outside the sparse structure, e.g. the feature axis).
    """

    name: str
    kind: str
    role: str
    fmt_axis: Optional[FmtAxis] = None
    extent: Optional[int] = None


@dataclass
class BoundIteration:
    name: str
    loops: List[Loop]
    statement: Statement
    chain: Tuple[FmtAxis, ...]
    row_axis: DslAxis
    col_axis: DslAxis
    part: int = 0
    origin: str = ""  # the DSL iteration's name (a composite binds it once per part)
    dense: bool = False  # a dense loop nest over coordinates (no format axes, ``chain`` empty)
    axes: Tuple[DslAxis, ...] = ()  # a dense iteration's operator axes, one per loop
    outer_kinds: str = ""  # S/R of the axes above the row axis (r in (r, i, j)), held by the root loop


@dataclass
class BoundOperator:
    op: Operator
    format: Union[Format, CompositeFormat]
    params: Dict[str, int]
    iterations: List[BoundIteration]
    parts: List[Format]

    @property
    def composite(self) -> bool:
        return isinstance(self.format, CompositeFormat)

    def extent(self, axis: DslAxis) -> int:
        """Compile-time extent of an operator dense axis."""
        if isinstance(axis.extent, int):
            return axis.extent
        return self.params[axis.extent]


def check_params(op: Operator, params: Dict[str, int]) -> Dict[str, int]:
    """``params`` checked against the operator's compile-time extents (``op.params()``): no
    unknown name (a misspelt ``feat`` would otherwise be ignored), none missing, each a positive
    int (numpy ints accepted; bools refused: ``True`` is no extent). Returns them as plain ints."""
    declared = op.params()
    unknown = [p for p in params if p not in declared]
    if unknown:
        raise ValueError(f"unknown compile parameter{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(f'{p}={params[p]!r}' for p in unknown)} for operator {op.name}; "
                         f"its compile parameters are {list(declared)}")
    missing = [p for p in declared if p not in params]
    if missing:
        raise ValueError(f"operator {op.name} needs compile-time values for {missing} (e.g. {missing[0]}=64)")
    out = {}
    for name, v in params.items():
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise ValueError(f"{name} should be a positive int (an axis extent of {op.name}), got {v!r}")
        out[name] = int(v)
    return out


def bind(op: Operator, fmt: Format, params: Dict[str, int]) -> BoundOperator:
    params = check_params(op, params)
    row, col = op.structure()
    parts = [prefixed(p, f"p{k}_") for k, p in enumerate(fmt.parts)] if isinstance(fmt, CompositeFormat) else [fmt]
    out = []
    for it in op.iterations:
        if not op.is_sparse_iteration(it):
            out.append(_bind_dense(it, row, col, params))
            continue
        for k, part in enumerate(parts):
            b = _bind_iteration(it, part, row, col, params)
            b.part, b.origin = k, it.name
            if len(parts) > 1 or isinstance(fmt, CompositeFormat):
                b.name = f"{it.name}_p{k}"
            out.append(b)
    return BoundOperator(op, fmt, dict(params), out, parts)


def prefixed(fmt: Format, prefix: str) -> Format:
    """``fmt`` with every axis, index-array and slot-mask name prefixed (a part of a composite)."""
    axes = []
    for a in fmt.axes:
        changes = {"name": prefix + a.name}
        for attr in ("indptr", "indices"):
            if getattr(a, attr, None) is not None:
                changes[attr] = prefix + getattr(a, attr)
        axes.append(replace(a, **changes))
    mask = prefix + fmt.slot_mask if fmt.slot_mask else ""  # the slot mask is a per-part array too
    return replace(fmt, axes=tuple(axes), slot_mask=mask)


def outer_of(row: DslAxis) -> Tuple[DslAxis, ...]:
    """The dense axes above the row axis (relations r in (r, i, j)), outermost first."""
    out, a = [], row.parent
    while a is not None:
        out.insert(0, a)
        a = a.parent
    return tuple(out)


def _bind_dense(it: Iteration, row: DslAxis, col: DslAxis, params) -> BoundIteration:
    """A dense iteration: one loop per axis, extents None for the matrix's rows and columns
    (known at run time), the compile-time extent otherwise."""
    loops = []
    for n, (a, k) in enumerate(zip(it.axes, it.kinds)):
        extent = None if a is row or a is col else (a.extent if isinstance(a.extent, int) else params[a.extent])
        loops.append(Loop(a.name, k, "root" if n == 0 else "dense", None, extent))
    return BoundIteration(it.name, loops, it.statement, (), row, col, 0, it.name, dense=True, axes=tuple(it.axes))


def _bind_iteration(it: Iteration, fmt: Format, row: DslAxis, col: DslAxis, params) -> BoundIteration:
    loops: List[Loop] = []
    for n, fa in enumerate(fmt.axes):
        logical = row if fa.dim == 0 else col
        role = "root" if n == 0 else ("sparse" if (fa.variable or fa.sparse) else "block")
        extent = getattr(fa, "extent", None) if role == "block" else None  # None: known at run time
        loops.append(Loop(fa.name, it.kind_of(logical), role, fa, extent))
    taken = {l.name for l in loops}
    outer = set(outer_of(row))
    for a, k in zip(it.axes, it.kinds):
        if a is row or a is col or a in outer:  # outer axes are the stacked rows' quotient: the root loop's
            continue
        if a.name in taken:
            raise ValueError(f"operator axis {a.name!r} clashes with an axis of format {fmt.name}; rename it")
        extent = a.extent if isinstance(a.extent, int) else params[a.extent]
        loops.append(Loop(a.name, k, "dense", None, extent))
    return BoundIteration(it.name, loops, it.statement, tuple(fmt.axes), row, col,
                          outer_kinds="".join(it.kind_of(a) for a in outer_of(row)))
