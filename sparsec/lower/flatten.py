"""Stage III: sparse buffers -> flat buffers.

Resolves every ``pos:<axis>`` placeholder into a flat offset with the composition
rules of ``formats.axes`` (SparseTIR's ComputeOffset), and gives every buffer its
flat shape. After this stage the program reads only ordinary arrays.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

from ..expr import BinOp, Const, Expr, Load, Var, simplify_add, simplify_mul, transform
from .positions import ROOT, LoopNest, PositionProgram, iv

INDEX_DTYPE = "int32"


@dataclass
class BufferDecl:
    name: str
    shape: Tuple[Expr, ...]
    dtype: str
    role: str  # index | input | output | temp


@dataclass
class FlatProgram:
    name: str
    nests: List[LoopNest]
    buffers: List[BufferDecl]
    size_vars: List[str]  # symbolic sizes bound from buffer shapes (nnz of variable axes)
    scalars: List[str]  # scalar kernel parameters
    dtype: str
    bound: object


def flat_offset(chain, axis_name: str, nest: LoopNest) -> Expr:
    """Flat position of ``axis_name`` within the chain, as an expression of block iterators."""
    loops = {b.loop.name: b.loop for blk in nest.blocks for b in blk}
    idx = [a.name for a in chain].index(axis_name)
    fa = chain[idx]
    v = iv(loops[fa.name])
    if idx == 0:
        return v
    parent = flat_offset(chain, chain[idx - 1].name, nest)
    if fa.variable:
        return simplify_add(Load(fa.indptr, (parent,)), v)
    width = fa.width if fa.sparse else fa.extent
    return simplify_add(simplify_mul(parent, Const(width)), v)


def axis_total(chain, idx: int) -> Expr:
    """Number of flat positions of chain axis ``idx`` (the length of arrays over it)."""
    fa = chain[idx]
    if idx == 0:
        return ROOT
    if fa.variable:
        return Var(f"nnz_{fa.name}")
    width = fa.width if fa.sparse else fa.extent
    return simplify_mul(axis_total(chain, idx - 1), Const(width))


def flatten(prog: PositionProgram, dtype: str) -> FlatProgram:
    bound = prog.bound
    chain = tuple(bound.format.axes)
    nests = []
    for nest in prog.nests:
        def resolve(n, nest=nest):
            if isinstance(n, Var) and n.name.startswith("pos:"):
                return flat_offset(chain, n.name[4:], nest)
            return None

        blocks = [[type(b)(b.loop, transform(b.extent, resolve)) for b in blk] for blk in nest.blocks]
        nests.append(LoopNest(nest.name, blocks, transform(nest.target, resolve), transform(nest.value, resolve),
                              nest.reduce, transform(nest.write_guard, resolve) if nest.write_guard is not None
                              else None, nest.roles))

    buffers: List[BufferDecl] = []
    size_vars: List[str] = []
    for i, fa in enumerate(chain):
        if i == 0:
            continue
        if fa.variable:
            buffers.append(BufferDecl(fa.indptr, (BinOp("+", axis_total(chain, i - 1), Const(1)),), INDEX_DTYPE, "index"))
            size_vars.append(f"nnz_{fa.name}")
        if fa.sparse:
            buffers.append(BufferDecl(fa.indices, (axis_total(chain, i),), INDEX_DTYPE, "index"))
    order = list(bound.format.index_array_names())
    buffers.sort(key=lambda b: order.index(b.name))
    n_slots = axis_total(chain, len(chain) - 1)
    row, col = bound.op.structure()
    for b in bound.op.buffers:
        if b.sparse:
            shape = (n_slots,)
        else:
            shape = tuple(Var("rows") if a is row else Var("cols") if a is col else Const(bound.extent(a))
                          for a in b.axes)
        buffers.append(BufferDecl(b.name, shape, dtype, b.role))
    # index arrays, then sparse values and dense inputs, outputs, temps (the kernel's argument order)
    rank = {"index": 0, "input": 1, "output": 2, "temp": 3}
    buffers.sort(key=lambda b: rank[b.role])
    return FlatProgram(bound.op.name, nests, buffers, size_vars, ["n0", "rows", "cols"], dtype, bound)
