"""Stage II: sparse iterations -> loops in position space.

Each loop gets an extent (a format axis's rule from ``formats.axes``), and every
coordinate in the statement is rewritten in terms of positions:

  * a sparse buffer read at (i, j) becomes a read at the position of the chain's
    last axis, written as the placeholder ``Var("pos:<axis>")`` that stage III
    resolves into a flat offset (and a value layout), followed by the iterators of its
    trailing dense axes (``L[i, j, h]``: slot-major ``[slot, h]``);
  * an indirect index (``W[E[i, j], f]``) becomes a load of the index buffer, rewritten by
    the same rules, in place of a coordinate;
  * a dense buffer read at a structural coordinate becomes
    ``sum(coord(axis) * axis.scale)`` over the format axes of that dimension, with
    ``coord`` a loop index (dense axis) or ``indices[pos]`` (sparse axis);
  * padding (index -1) and coordinates past the matrix edge become guards: on the
    write when they only involve the output's own axes, else folded into the value
    as ``select(guard, value, identity)`` so that a reduction skips them;
  * on a format with a slot mask (``Format.slot_mask``: padding inside dense inner slots,
    e.g. a BSR block's implicit zeros), every statement that is not padding-neutral
    (``lower.padding``) is guarded the same way by ``mask[pos] > 0``, the mask read at the
    position of the chain's last axis (stage III maps it like the value array). Neutral
    statements (SpMM, SDDMM) read no mask, and a format without one has no mask at all.

Loops are grouped into blocks: the row loop is a block of its own, and a variable
axis (extent from ``indptr``) opens a new, inner block, because its extent reads the
outer loops' positions.

A dense iteration (``bind``: no format axes) becomes a *dense* nest: its loops over
coordinates (rows, cols or a compile-time extent), the row loop a block of its own like a
sparse nest's, every access indexed by the loop iterators; it initialises what it reduces.

A reduction into a dense output whose rows more than one root position may reach
(the parts of a composite format, or a root listing rows with repeats) gets a
*fill* nest that sets the output to the identity first; each part then only adds
into it (no ``T.init``), atomically on GPUs when its own rows repeat.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Tuple

from ..dsl import IDENTITY, Access
from ..expr import BinOp, Call, Const, Expr, Load, Select, Var, simplify_add, simplify_mul, transform
from .bind import BoundIteration, BoundOperator, Loop, outer_of
from .lookup import Lookup
from .padding import neutral_iterations

ROWS, COLS = Var("rows"), Var("cols")
# rows per outer coordinate: a structure (r, i, j) is bound to its patterns stacked along the
# matrix's rows, row r * lrows + i (a kernel scalar, rows // the outer extent)
LROWS = Var("lrows")


def row_extent(row_axis) -> Expr:
    """The extent of the row axis as a loop over coordinates: rows, or lrows under outer axes."""
    return LROWS if row_axis.parent is not None else ROWS


def stacked_coordinate(axis, row_axis, stacked_row: Expr, in_block: Optional[Expr] = None) -> Optional[Expr]:
    """The coordinate of ``axis`` (the row axis or an axis above it) in a stacked row, or None
    for any other axis: i = row % lrows, r = row // lrows.

    ``in_block``: the row is ``stacked_row + in_block``, a block of rows (BSR's block rows, an
    N:M or SR-BCRS vector) starting at ``stacked_row``, whose size divides lrows (the kernel
    checks it before launch), so that a block never straddles two coordinates of the outer
    axis: i = start % lrows + in_block, r = start // lrows. Why: r then does not depend on the
    row in the block and i is affine in it, so a schedule can keep a block's results in
    registers (TVM bounds the region it writes: one r, the block's rows); ``(start +
    in_block) % lrows`` has no such bound."""
    if row_axis.parent is None:
        if axis is not row_axis:
            return None
        return stacked_row if in_block is None else simplify_add(stacked_row, in_block)
    if axis is row_axis:
        if in_block is None:
            return BinOp("%", stacked_row, LROWS)
        return BinOp("+", BinOp("%", stacked_row, LROWS), in_block)
    if axis is row_axis.parent:
        return BinOp("//", stacked_row, LROWS)
    return None


def row_block(chain) -> int:
    """Rows per block of a format's chain: the largest scale of its row axes (1 for formats that
    store rows one by one; BSR's block rows, an N:M or SR-BCRS vector's rows otherwise)."""
    return max((a.scale for a in chain if a.dim == 0), default=1)


def _split_rows(chain_loops) -> Optional[Tuple[Expr, Expr]]:
    """The row coordinate as (block start, row in the block) where the chain stores rows in
    blocks whose in-block axes stay inside one block (dense axes of known extent); else None."""
    rows = [l for l in chain_loops if l.fmt_axis.dim == 0]
    block = row_block([l.fmt_axis for l in rows])
    if block == 1:
        return None
    start, inner, span = Const(0), Const(0), 0
    for l in rows:
        fa = l.fmt_axis
        if fa.scale % block == 0:
            start = simplify_add(start, simplify_mul(_coordinate(l), Const(fa.scale)))
            continue
        if fa.sparse or fa.variable or getattr(fa, "extent", None) is None:
            return None
        inner = simplify_add(inner, simplify_mul(_coordinate(l), Const(fa.scale)))
        span += (fa.extent - 1) * fa.scale
    return (start, inner) if span < block else None


def pos(axis_name: str) -> Var:
    """Placeholder for the flat position of a format axis (resolved in stage III)."""
    return Var(f"pos:{axis_name}")


def extent_var(axis_name: str) -> Var:
    """The run-time extent of an axis, a scalar kernel parameter."""
    return Var(f"n_{axis_name}")


def iv(loop: Loop) -> Var:
    """The block iterator of a loop."""
    return Var(f"v_{loop.name}")


@dataclass
class LoopIR:
    loop: Loop
    extent: Expr


@dataclass
class LoopNest:
    """A bound iteration in position space: blocks of loops and one statement.

    ``init``: the statement block initialises its output (TensorIR's T.init); False for
    fill nests' consumers, which only add. ``atomic``: several root positions may add
    into one output element concurrently. ``part``: index of the composite part (or None).
    """

    name: str
    blocks: List[List[LoopIR]]
    target: Load
    value: Expr
    reduce: Optional[str]
    write_guard: Optional[Expr]
    roles: Dict[str, str]
    init: bool = True
    atomic: bool = False
    part: Optional[int] = None
    root_extent: Optional[Expr] = None
    fill: bool = False
    scatter: bool = False  # a reduction over the row axis: every row adds into outputs indexed by other coordinates
    dense: bool = False  # a dense iteration's nest: loops over coordinates, no sparse structure
    origin: str = ""  # the DSL iteration it comes from (its parts and fill nest share it)
    template: str = ""  # a schedule that emits this nest's kernel itself (CUDA: "segment_contract")
    init_value: Optional[Expr] = None  # what an owning nest's T.init stores (a folded epilogue's term), else 0
    # a fill nest this nest's kernel runs first, inside the same launch (``lower.fuse_fill``:
    # the output a segment contraction adds into, set to its start value)
    prologue: Optional["LoopNest"] = None


@dataclass
class PositionProgram:
    bound: BoundOperator
    nests: List[LoopNest]
    runtime_extents: List[str] = field(default_factory=list)  # axis names with an n_<axis> scalar


def lower_positions(bound: BoundOperator) -> PositionProgram:
    composite = bound.composite
    disjoint = composite and bound.format.disjoint_rows
    nests, filled = [], set()
    neutral = neutral_iterations(bound.op)
    for it in bound.iterations:
        if it.dense:
            nests.append(_lower_dense(it))
            continue
        st = it.statement
        unique = bound.parts[it.part].axes[0].unique
        dense_reduce = st.reduce is not None and not st.target.buffer.sparse
        # a reduction over the row axis (T[j, f] += A[i, j] * X[i, f]): every row adds into
        # the same output elements, like repeated rows
        over_rows = dense_reduce and it.loops[0].kind == "R"
        # a sum over an outer axis (Y[i, g] += A[r, i, j] ..): the stacked rows (r, i) of every r
        # add into row i, like a row that repeats
        over_outer = dense_reduce and "R" in it.outer_kinds
        unique = unique and not over_outer
        # a column axis above a row axis in a block outside the entries' block (tiled: tile
        # columns above a tile's rows): T.init in the inner block would run once per outer
        # column, so the output is set to the identity first and only added into
        outer_sum = dense_reduce and _outer_reduction(it)
        # rows that no part covers (and repeated rows) need the output set to the identity first
        if dense_reduce and (composite or not unique or over_rows or outer_sum) \
                and (it.origin, st.target.buffer.name) not in filled:
            filled.add((it.origin, st.target.buffer.name))
            nests.append(_fill(bound, it))
        # a part owns its rows' results (T.init, register accumulators) unless rows are shared
        shared = dense_reduce and ((composite and not disjoint) or not unique or over_rows or outer_sum)
        mask = bound.parts[it.part].slot_mask if it.origin not in neutral else ""
        nests.append(_lower(bound, it, init=not shared, slot_mask=mask, over_rows=over_rows, repeats=not unique))
    extents = [a.name for p in bound.parts for a in p.axes if a.name in p.runtime_extent_axes()]
    return PositionProgram(bound, nests, extents)


def _outer_reduction(it: BoundIteration) -> bool:
    """A reduction loop in a block that is neither the row loop's nor the innermost one."""
    blocks = _blocks(it.loops, it.chain)
    return any(b.loop.kind == "R" for blk in blocks[1:-1] for b in blk)


def _extent(loop: Loop, chain) -> Expr:
    fa = loop.fmt_axis
    if fa is None:
        return Const(loop.extent)
    if loop.role == "root" or (not fa.sparse and not fa.variable and fa.extent is None):
        return extent_var(fa.name)
    if fa.variable:
        parent = chain[chain.index(fa) - 1].name
        return BinOp("-", Load(fa.indptr, (BinOp("+", pos(parent), Const(1)),)), Load(fa.indptr, (pos(parent),)))
    if fa.sparse:
        return Const(fa.width)
    return Const(fa.extent)


def _coordinate(loop: Loop) -> Expr:
    fa = loop.fmt_axis
    if fa.sparse:
        return Load(fa.indices, (pos(fa.name),))
    return iv(loop)


def slot_mask_guard(mask: str, chain) -> Expr:
    """``mask[pos] > 0`` at the position of the chain's last axis (stage III: the value slot)."""
    return BinOp(">", Call("cast:int32", (Load(mask, (pos(chain[-1].name),)),)), Const(0))


def _lower(bound: BoundOperator, it: BoundIteration, init: bool, slot_mask: str = "",
           over_rows: bool = False, repeats: bool = False) -> LoopNest:
    chain = it.chain
    chain_loops = [l for l in it.loops if l.fmt_axis is not None]
    # logical coordinate of each dimension; it can run past the matrix edge when an axis
    # of that dimension counts in units larger than one (BSR block rows, N:M windows)
    coord: Dict[int, Expr] = {0: Const(0), 1: Const(0)}
    for l in chain_loops:
        d = l.fmt_axis.dim
        coord[d] = simplify_add(coord[d], simplify_mul(_coordinate(l), Const(l.fmt_axis.scale)))
    overhang = {d: any(l.fmt_axis.dim == d and l.fmt_axis.scale > 1 for l in chain_loops) for d in (0, 1)}
    block_rows = _split_rows(chain_loops) if it.row_axis.parent is not None else None
    row_at = (lambda a: stacked_coordinate(a, it.row_axis, *block_rows)) if block_rows else \
        (lambda a: stacked_coordinate(a, it.row_axis, coord[0]))
    by_axis = {l.name: l for l in it.loops}
    st = it.statement

    def rewrite_access(acc: Access) -> Load:
        buf = acc.buffer
        if buf.sparse:  # the entry's slot, then any trailing dense axes (stored slot-major)
            return Load(buf.name, (pos(chain[-1].name),) + tuple(iv(by_axis[a.name]) for a in buf.trailing))
        idx = []
        for a in acc.axes:
            if isinstance(a, Access):  # an indirect index: the value of an integer input
                idx.append(rewrite_access(a))
            elif row_at(a) is not None:
                idx.append(row_at(a))
            elif a is it.col_axis:
                idx.append(coord[1])
            else:
                idx.append(iv(by_axis[a.name]))
        return Load(buf.name, tuple(idx))

    value = transform(st.value, lambda n: rewrite_access(n) if isinstance(n, Access) else None)
    target = rewrite_access(st.target)

    # guards: padding slots and coordinates past the edge
    guards: List[Tuple[Expr, set]] = []
    for l in chain_loops:
        if l.fmt_axis.padded:
            guards.append((BinOp(">=", _coordinate(l), Const(0)), {l.name}))
    for d, bound_var in ((0, ROWS), (1, COLS)):
        if overhang[d]:
            names = {l.name for l in chain_loops if l.fmt_axis.dim == d}
            guards.append((BinOp("<", coord[d], bound_var), names))
    if slot_mask:
        guards.append((slot_mask_guard(slot_mask, chain), {l.name for l in chain_loops}))
    out_loops = set()
    if not st.target.buffer.sparse:
        outer = outer_of(it.row_axis)
        for a in st.target.axes:
            if a is it.row_axis or a in outer:
                out_loops |= {l.name for l in chain_loops if l.fmt_axis.dim == 0}
            elif a is it.col_axis:
                out_loops |= {l.name for l in chain_loops if l.fmt_axis.dim == 1}
            else:
                out_loops.add(a.name)
    write_guards = [g for g, used in guards if used <= out_loops]
    value_guards = [g for g, used in guards if not used <= out_loops]
    if value_guards:
        fallback = IDENTITY[st.reduce] if st.reduce else Const(0.0)
        value = Select(_all(value_guards), value, fallback)

    loops = it.loops
    if over_rows:  # rows add into shared outputs atomically (no T.init): the row loop itself reduces nothing
        loops = [replace(loops[0], kind="S")] + list(loops[1:])
    blocks = _blocks(loops, chain)
    roles = {l.name: l.role for l in it.loops}
    atomic = (not init) and (not chain[0].unique or over_rows or repeats)
    return LoopNest(it.name, blocks, target, value, st.reduce, _all(write_guards) if write_guards else None,
                    roles, init=init, atomic=atomic, part=it.part if bound.composite else None,
                    root_extent=extent_var(chain[0].name), scatter=over_rows, origin=it.origin)


def _blocks(loops, chain) -> List[List[LoopIR]]:
    """The row loop is a block of its own (schedules bind it to thread blocks, and TVM's
    cross-thread reductions want the reduction in an inner block); a variable axis starts a
    new, inner block, because its extent reads the outer loops' positions."""
    blocks: List[List[LoopIR]] = [[]]
    for l in loops:
        if blocks[-1] and (l.fmt_axis is not None and l.fmt_axis.variable or blocks[-1][-1].loop.role == "root"):
            blocks.append([])
        blocks[-1].append(LoopIR(l, _extent(l, chain)))
    return blocks


def _lower_dense(it: BoundIteration) -> LoopNest:
    """A dense iteration: loops over its axes' coordinates, accesses at the loop iterators."""
    extents = {it.row_axis.name: row_extent(it.row_axis), it.col_axis.name: COLS}
    loops = [LoopIR(l, Const(l.extent) if l.extent is not None else extents[l.name]) for l in it.loops]
    by_axis = {a: iv(l.loop) for a, l in zip(it.axes, loops)}
    st = it.statement
    lookups: List[Lookup] = []

    def rewrite(acc: Access) -> Expr:
        if acc.lookup:  # A[i, jd]: expanded for the format in stage III (lower.lookup)
            col = acc.axes[1]
            lookups.append(Lookup(acc.buffer.name, by_axis[acc.axes[0]], by_axis[col],
                                  tuple(by_axis[a] for a in acc.axes[2:]), loops[it.axes.index(col)].loop.extent,
                                  f"l__{it.name}_lk{len(lookups)}", acc.text))
            return lookups[-1]
        return Load(acc.buffer.name, tuple(rewrite(a) if isinstance(a, Access) else by_axis[a] for a in acc.axes))

    value = transform(st.value, lambda n: rewrite(n) if isinstance(n, Access) else None)
    # the first loop a block of its own, as a sparse nest's row loop; one block when it is a
    # reduction loop (a T.init in an inner block without it would run on every iteration)
    blocks = [loops[:1]] + ([loops[1:]] if len(loops) > 1 else []) if loops[0].loop.kind == "S" else [loops]
    return LoopNest(it.name, blocks, rewrite(st.target), value, st.reduce, None,
                    {l.loop.name: l.loop.role for l in loops}, init=True, root_extent=loops[0].extent, dense=True,
                    origin=it.origin)


def _fill(bound: BoundOperator, it: BoundIteration) -> LoopNest:
    """out[...] = identity over the whole output (rows x its dense axes)."""
    st = it.statement
    loops, idx = [], []
    for a in st.target.axes:
        if a is it.row_axis:
            loops.append(LoopIR(Loop("fill_row", "S", "root", None, None), row_extent(it.row_axis)))
        elif a is it.col_axis:
            loops.append(LoopIR(Loop("fill_col", "S", "dense", None, None), COLS))
        else:
            loops.append(LoopIR(Loop(a.name, "S", "dense", None, bound.extent(a)), Const(bound.extent(a))))
        idx.append(iv(loops[-1].loop))
    if not loops:
        raise ValueError(f"{it.name}: a reduction into the scalar {st.target.buffer.name} over several parts or "
                         "rows: give it an axis (e.g. over the row axis) and sum that afterwards")
    # the fill's outermost loop is the one schedules bind to thread blocks, whatever it indexes:
    # loops over rows or columns (run-time extents) first, compile-time extents inside
    loops = sorted(loops, key=lambda l: l.loop.extent is not None)
    loops = [LoopIR(Loop(l.loop.name, "S", "root" if n == 0 else "dense", None, l.loop.extent), l.extent)
             for n, l in enumerate(loops)]
    blocks = [loops[:1]] + ([loops[1:]] if len(loops) > 1 else [])
    name = f"{it.origin}_fill_{st.target.buffer.name}"
    return LoopNest(name, blocks, Load(st.target.buffer.name, tuple(idx)), IDENTITY[st.reduce], None, None,
                    {l.loop.name: l.loop.role for l in loops}, init=True, root_extent=loops[0].extent, fill=True,
                    origin=it.origin)


def _all(conds: List[Expr]) -> Expr:
    out = conds[0]
    for c in conds[1:]:
        out = BinOp("and", out, c)
    return out

