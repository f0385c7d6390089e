"""Emit TVM TIR: print the flat program as TVMScript and parse it into a PrimFunc.

Each loop nest becomes nested s_tir blocks, one per block level of stage II, with
explicit read/write regions (auto-inference would list ``indptr`` and the output as
reads, which makes blocks "incomplete" for ``sch.bind``). A reduction keeps
TensorIR's ``T.init()`` form; schedules decompose it (``decompose_reduction``) so
that rows with no stored entries still get their initial value.
"""
from __future__ import annotations

from typing import List, Set

from sparsec.schedules import segment_contract
from sparsec.schedules.atomics import ATOMIC_MINMAX_DTYPES

from ..dsl import IDENTITY
from ..expr import BinOp, Expr, Load, Var, render, walk
from ..ir_attrs import ATOMIC_ATTR, SYNC_PREFIX
from .flatten import FlatProgram
from .lookup import hoist_lets, let_vars
from .positions import LoopNest, iv


class _Printer:
    def __init__(self):
        self.lines: List[str] = []

    def __call__(self, depth: int, text: str):
        self.lines.append("    " * depth + text)


def emit_script(prog: FlatProgram, atomics: bool = False, segment_splits=None) -> str:
    """TVMScript source of the whole operator (one PrimFunc). ``atomics``: updates that several
    root positions may make to one element at once become atomics (CUDA: ``atomicAdd``, and
    an atomic max/min for max/min reductions, see ``schedules.atomics``). ``segment_splits``:
    a callable giving the blocks that share a segment contraction's groups for the matrix
    compiled for (``schedules.segment_contract.splits_for``), called only if one is emitted."""
    names = [b.name for b in prog.buffers]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"buffer names clash with the format's index arrays: {sorted(dup)}; rename the buffers")
    shapes = {b.name: b.shape for b in prog.buffers}
    dtypes = {b.name: b.dtype for b in prog.buffers}
    p = _Printer()
    args = [f"{b.name}_h: T.handle" for b in prog.buffers] + [f"{s}: T.int32" for s in prog.scalars]
    p(0, "@T.prim_func(s_tir=True)")
    p(0, f"def {prog.name}({', '.join(args)}):")
    p(1, f'T.func_attr({{"global_symbol": "{prog.name}", "tirx.noalias": True}})')
    for v in prog.size_vars:
        p(1, f"{v} = T.int32()")
    for b in prog.buffers:
        shape = ", ".join(render(s, "int32") for s in b.shape)
        p(1, f'{b.name} = T.match_buffer({b.name}_h, ({shape},), "{b.dtype}")')
    for nest in prog.nests:
        if nest.atomic and atomics and nest.reduce != "sum" and prog.dtype.out not in ATOMIC_MINMAX_DTYPES:
            raise ValueError(f"{nest.name}: rows repeat in this format, so its {nest.reduce} reduction needs an "
                             f"atomic {nest.reduce}, which sparsec emits for {', '.join(ATOMIC_MINMAX_DTYPES)}, not "
                             f"{prog.dtype.out}; use a format whose rows are unique (not hyb's split rows)")
        if nest.template == "segment_contract":
            _emit_contraction(p, nest, prog, shapes, segment_splits() if segment_splits else None)
            continue
        _emit_nest(p, nest, shapes, prog.dtype.out, atomics and nest.atomic, dtypes[nest.target.buffer])
    return "\n".join(p.lines) + "\n"


def _emit_contraction(p: _Printer, nest: LoopNest, prog: FlatProgram, shapes, splits=None) -> None:
    """A nest whose kernel ``schedules.segment_contract`` writes whole (thread-bound loops)."""
    reads = [nest.value] + list(nest.target.index) + ([nest.write_guard] if nest.write_guard is not None else [])
    reads += [b.extent for blk in nest.blocks for b in blk]
    writes = [nest.target.buffer]
    c = segment_contract.match(nest, prog)
    if nest.prologue is not None:  # the output's fill, in the same launch (lower.fuse_fill)
        reads += [nest.prologue.value] + [b.extent for blk in nest.prologue.blocks for b in blk]
        writes.append(SYNC_PREFIX + str(segment_contract.partition(c, splits).splits))
    names = list(dict.fromkeys(l.buffer for e in reads for l in _loads(e)))
    segment_contract.emit(p, 1, nest, c, prog.dtype.out,
                          [_full(n, shapes) for n in names], ", ".join(_full(n, shapes) for n in writes), splits)


def _full(name: str, shapes) -> str:
    return f"{name}[{', '.join('0:' + render(s, 'int32') for s in shapes[name])}]"


def _loads(e: Expr) -> List[Load]:
    return [n for n in walk(e) if isinstance(n, Load)]


def _emit_nest(p: _Printer, nest: LoopNest, shapes, dtype: str, atomic: bool, target_dtype: str = ""):
    all_reads = []
    for e in [nest.value] + [i for i in nest.target.index] + [g for g in (nest.write_guard, nest.init_value)
                                                              if g is not None]:
        all_reads += [l.buffer for l in _loads(e)]
    for blk in nest.blocks:
        for b in blk:
            all_reads += [l.buffer for l in _loads(b.extent)]
    all_reads = list(dict.fromkeys(all_reads))
    bound_vars: Set[str] = set()
    depth = 1
    for level, blk in enumerate(nest.blocks):
        inner = level == len(nest.blocks) - 1
        loop_names = [f"l_{b.loop.name}" for b in blk]
        extents = [render(b.extent, "int32") for b in blk]
        if level == 0:  # at least one row iteration (a CUDA grid of 0 blocks is a launch error), guarded
            extents[0] = f"T.max({extents[0]}, 1)"
        if len(blk) == 1:
            p(depth, f"for {loop_names[0]} in range({extents[0]}):")
        else:
            p(depth, f"for {', '.join(loop_names)} in T.grid({', '.join(extents)}):")
        depth += 1
        block_name = nest.name if inner else f"{nest.name}_{level}"
        p(depth, f'with T.sblock("{block_name}"):')
        depth += 1
        for b, ext in zip(blk, extents):
            kind = "spatial" if b.loop.kind == "S" else "reduce"
            p(depth, f"v_{b.loop.name} = T.axis.{kind}({ext}, l_{b.loop.name})")
            bound_vars.add(f"v_{b.loop.name}")
        if level == 0 and not inner:
            p(depth, f"T.where(l_{blk[0].loop.name} < {render(blk[0].extent, 'int32')})")
        if inner:
            guards = ([nest.write_guard] if nest.write_guard is not None else [])
            if level == 0:
                guards.append(BinOp("<", iv(blk[0].loop), blk[0].extent))
            if guards:
                own = {f"v_{b.loop.name}": f"l_{b.loop.name}" for b in blk}  # T.where takes loop vars
                cond = guards[0] if len(guards) == 1 else BinOp("and", guards[0], guards[1])
                p(depth, f"T.where({render(cond, 'int32', own)})")
            reads = [l for l in _loads(nest.value)] + [l for i in nest.target.index for l in _loads(i)]
            if nest.init_value is not None:
                reads += _loads(nest.init_value)
            bound_here = set(let_vars(nest.value))  # a lookup's search reads where its steps lead: the whole array
            read_txt = ", ".join(dict.fromkeys(
                _full(l.buffer, shapes) if any(isinstance(n, Var) and n.name in bound_here for n in walk(l)) else
                render(l, dtype) for l in reads))
            p(depth, f"T.reads({read_txt})")
            p(depth, f"T.writes({render(nest.target, dtype)})")
            target = render(nest.target, dtype)
            if atomic:
                # Written as an owning reduction (T.init, then +=) marked ATOMIC_ATTR: the schedule
                # accumulates it in registers like any other, and schedules.atomics turns the
                # stores that reach global memory into atomicAdd (one per output element per row).
                p(depth, f'T.sblock_attr({{"{ATOMIC_ATTR}": 1}})')
            if nest.reduce is not None and (nest.init or atomic):
                p(depth, "with T.init():")
                start = _identity(nest.reduce) if nest.init_value is None or atomic else nest.init_value
                p(depth + 1, f"{target} = {render(start, target_dtype or dtype)}")
            lets, value = hoist_lets(nest.value)  # a lookup's search: one statement per step
            for var, bound in lets:
                p(depth, f"{var.name}: T.int32 = {render(bound, 'int32')}")
            if nest.reduce is not None:
                p(depth, f"{target} = {_combine(nest.reduce, target, render(value, dtype))}")
            else:
                p(depth, f"{target} = {render(value, dtype)}")
        else:
            p(depth, f"T.reads({', '.join(_full(n, shapes) for n in all_reads)})")
            p(depth, f"T.writes({_region(nest.target, shapes, bound_vars)})")


def _identity(kind: str) -> Expr:
    return IDENTITY[kind]


def _combine(kind: str, acc: str, val: str) -> str:
    if kind == "sum":
        return f"{acc} + {val}"
    return f"T.{kind}({acc}, {val})"


def _region(target: Load, shapes, bound_vars: Set[str]) -> str:
    """The part of the output an outer block writes: a point along dimensions whose index
    depends only on iterators bound so far, the whole extent along the others."""
    parts = []
    for dim, idx in zip(shapes[target.buffer], target.index):
        used = {n.name for n in walk(idx) if isinstance(n, Var)}
        has_load = any(isinstance(n, Load) for n in walk(idx))
        if used <= bound_vars and not has_load:
            parts.append(render(idx, "int32"))
        else:
            parts.append(f"0:{render(dim, 'int32')}")
    return f"{target.buffer}[{', '.join(parts)}]"
