"""Stage III: sparse buffers -> flat buffers.

Resolves every ``pos:<axis>`` placeholder into a flat offset with the composition
rules of ``formats.axes`` (SparseTIR's ComputeOffset), maps a sparse buffer's flat
position (and a slot mask's, in the part's own array) to where its value is stored (a format's chunked value order, a composite
part's offset in the shared value array, two int4 values per byte), casts values to
the accumulation dtype (and the result to its buffer's, where one declares another), and
gives every buffer its flat shape and dtype: a declared ``dtype`` as declared, else by role
(the matrix: the compile dtype's sparse values; other inputs: its dense dtype; outputs and
temporaries: its accumulation dtype). A sparse buffer is ``[slot, *trailing axes]``; edge
data (further sparse inputs) is never packed. Indirect indices keep their integer loads
(cast to int32 where declared narrower or wider), never the value cast. After this
stage the program reads only ordinary arrays.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, List, Tuple

from ..dtypes import DtypeSpec
from ..ir_attrs import fill_rows_parts
from ..expr import (BinOp, Call, Const, Expr, Let, Load, Select, Var, cast, simplify_add, simplify_mul, transform,
                    unpack_int4, walk)
from .lookup import Lookup, expand_lookup
from .positions import LoopNest, PositionProgram, extent_var, iv

INDEX_DTYPE = "int32"
MASK_DTYPE = "uint8"  # a slot mask (formats.base): 1 = a coordinate of the matrix, 0 = padding


@dataclass
class BufferDecl:
    name: str
    shape: Tuple[Expr, ...]
    dtype: str
    role: str  # index | input | output | temp
    sparse: bool = False


@dataclass
class FlatProgram:
    name: str
    nests: List[LoopNest]
    buffers: List[BufferDecl]
    size_vars: List[str]  # symbolic sizes bound from buffer shapes (nnz of variable axes)
    scalars: List[str]  # scalar kernel parameters, in order
    dtype: DtypeSpec
    bound: object


def _width(fa) -> Expr:
    if fa.sparse:
        return Const(fa.width)
    return Const(fa.extent) if fa.extent is not None else extent_var(fa.name)


def flat_offset(chain, idx: int, v: Dict[str, Expr]) -> Expr:
    """Flat position of chain axis ``idx``, from the iterators ``v`` (axis name -> expr)."""
    fa = chain[idx]
    if idx == 0:
        return v[fa.name]
    parent = flat_offset(chain, idx - 1, v)
    if fa.variable:
        return simplify_add(Load(fa.indptr, (parent,)), v[fa.name])
    return simplify_add(simplify_mul(parent, _width(fa)), v[fa.name])


def axis_total(chain, idx: int) -> Expr:
    """Number of flat positions of chain axis ``idx`` (the length of arrays over it)."""
    fa = chain[idx]
    if idx == 0:
        return extent_var(fa.name)
    if fa.variable:
        return Var(f"nnz_{fa.name}")
    return simplify_mul(axis_total(chain, idx - 1), _width(fa))


def value_index(fmt, chain, v: Dict[str, Expr]) -> Expr:
    """Where the value of the chain's last position is stored. With ``value_chunk`` k, the
    positions of the last variable axis form chunks of k, each stored [inner axes][k]."""
    last = len(chain) - 1
    k = fmt.value_chunk
    if not k:
        return flat_offset(chain, last, v)
    var = max(i for i, a in enumerate(chain) if a.variable)
    p = flat_offset(chain, var, v)
    inner, size = Const(0), 1
    for a in chain[var + 1:]:
        if a.sparse or a.variable or a.extent is None:
            raise ValueError(f"format {fmt.name}: a chunked value order needs fixed dense axes after {chain[var].name}")
        inner = simplify_add(simplify_mul(inner, Const(a.extent)), v[a.name])
        size *= a.extent
    return BinOp("+", BinOp("+", BinOp("*", BinOp("//", p, Const(k)), Const(k * size)), simplify_mul(inner, Const(k))),
                 BinOp("%", p, Const(k)))


def buffer_dtype(b, spec: DtypeSpec) -> str:
    """The array dtype of DSL buffer ``b`` in a kernel of precision ``spec`` (module docstring)."""
    if b.dtype is not None:
        return b.dtype
    if b.matrix:
        return spec.sparse_storage
    return spec.dense if b.role == "input" else spec.out


def _cast_values(e: Expr, value_dtype: Dict[str, str], out: str) -> Expr:
    """``e`` with value loads in another dtype than ``out`` cast to it; loads inside an index
    (indirect reads) stay integers, as int32."""
    if isinstance(e, Call) and e.fn == "unpack4":
        return e if out == "int32" else cast(out, e)
    if isinstance(e, Load):
        idx = tuple(_cast_index(i, value_dtype) for i in e.index)
        load = Load(e.buffer, idx)
        return cast(out, load) if e.buffer in value_dtype and value_dtype[e.buffer] != out else load
    if isinstance(e, BinOp):
        return BinOp(e.op, _cast_values(e.a, value_dtype, out), _cast_values(e.b, value_dtype, out))
    if isinstance(e, Call):
        return Call(e.fn, tuple(_cast_values(a, value_dtype, out) for a in e.args))
    if isinstance(e, Select):
        return Select(*(_cast_values(x, value_dtype, out) for x in (e.cond, e.then, e.other)))
    if isinstance(e, Let):  # a lookup's search: its bound values are indices
        return Let(e.var, e.value, _cast_values(e.body, value_dtype, out))
    return e


def _cast_index(e: Expr, value_dtype: Dict[str, str]) -> Expr:
    """An index expression: a load of a DSL buffer in it is an integer index, read as int32."""
    def fn(n):
        if isinstance(n, Load) and n.buffer in value_dtype and value_dtype[n.buffer] != INDEX_DTYPE:
            return cast(INDEX_DTYPE, n)
        return None

    return transform(e, fn)


def flatten(prog: PositionProgram, spec: DtypeSpec) -> FlatProgram:
    bound = prog.bound
    parts = bound.parts
    sparse_bufs = {b.name: b for b in bound.op.buffers if b.sparse}
    value_dtype = {b.name: buffer_dtype(b, spec) for b in bound.op.buffers}
    packed = {n for n, b in sparse_bufs.items() if b.matrix and any(p.value_bits == 4 for p in parts)}
    if packed and spec.sparse != "int4":
        raise TypeError(f"the format stores int4 values; compile it with dtype='int4', got {spec.name}")

    nests = []
    for nest in prog.nests:
        part = None if nest.fill or nest.dense else parts[nest.part or 0]
        chain = tuple(part.axes) if part is not None else ()
        loops = {b.loop.name: iv(b.loop) for blk in nest.blocks for b in blk}

        def resolve(n, chain=chain, loops=loops, part=part, nest=nest):
            if isinstance(n, Lookup):  # a dense nest's read of a sparse buffer at a coordinate
                return expand_lookup(n, bound.format)
            if isinstance(n, Var) and n.name.startswith("pos:"):
                names = [a.name for a in chain]
                return flat_offset(chain, names.index(n.name[4:]), loops)
            if isinstance(n, Load) and part is not None and n.buffer == part.slot_mask:
                return Load(n.buffer, (value_index(part, chain, loops),))  # per part: no offset
            if isinstance(n, Load) and n.buffer in sparse_bufs:
                idx = value_index(part, chain, loops)
                if nest.part is not None:
                    idx = BinOp("+", Var(f"off_p{nest.part}"), idx)
                if n.buffer in packed:
                    return unpack_int4(Load(n.buffer, (BinOp("//", idx, Const(2)),)), BinOp("%", idx, Const(2)))
                return Load(n.buffer, (idx,) + tuple(n.index[1:]))  # trailing dense axes: [slot, h]
            return None

        # value loads in another dtype than the accumulation are cast up (int8 -> int32); the
        # result is cast to its buffer's dtype where that is declared otherwise
        value = _cast_values(transform(nest.value, resolve), value_dtype, spec.out)
        target = transform(nest.target, resolve)
        target = Load(target.buffer, tuple(_cast_index(i, value_dtype) for i in target.index))
        if value_dtype[target.buffer] != spec.out:
            value = cast(value_dtype[target.buffer], value)
        blocks = [[type(b)(b.loop, transform(b.extent, resolve)) for b in blk] for blk in nest.blocks]
        guard = transform(nest.write_guard, resolve) if nest.write_guard is not None else None
        init_value = nest.init_value
        if init_value is not None:
            init_value = _cast_values(transform(init_value, resolve), value_dtype, spec.out)
            if value_dtype[target.buffer] != spec.out:
                init_value = cast(value_dtype[target.buffer], init_value)
        nests.append(replace(nest, blocks=blocks, target=target, value=value, write_guard=guard,
                             init_value=init_value))

    read = {n.buffer for nest in nests for e in [nest.value, nest.write_guard, nest.init_value] if e is not None
            for n in walk(e) if isinstance(n, Load)}
    buffers: List[BufferDecl] = []
    size_vars: List[str] = []
    for part in parts:
        chain = part.axes
        for i, fa in enumerate(chain):
            if fa.variable:
                buffers.append(BufferDecl(fa.indptr, (BinOp("+", axis_total(chain, i - 1), Const(1)),), INDEX_DTYPE,
                                          "index"))
                size_vars.append(f"nnz_{fa.name}")
            if fa.sparse:
                buffers.append(BufferDecl(fa.indices, (axis_total(chain, i),), INDEX_DTYPE, "index"))
        if part.slot_mask and part.slot_mask in read:  # only kernels that guard on it take it
            buffers.append(BufferDecl(part.slot_mask, (axis_total(chain, len(chain) - 1),), MASK_DTYPE, "index"))
    listed = [n.buffer for nest in nests for n in walk(nest.target)
              if isinstance(n, Load) and fill_rows_parts(n.buffer) is not None]
    for name in dict.fromkeys(listed):  # a fill over listed rows (lower.fill_rows): sized by its array
        buffers.append(BufferDecl(name, (Var(f"n_{name}"),), INDEX_DTYPE, "index"))
        size_vars.append(f"n_{name}")
    if bound.composite:
        n_slots = Var("slots")
        size_vars.append("slots")
    else:
        n_slots = axis_total(parts[0].axes, len(parts[0].axes) - 1)
    row, col = bound.op.structure()
    for b in bound.op.buffers:
        if b.sparse:
            shape = (BinOp("//", BinOp("+", n_slots, Const(1)), Const(2)),) if b.name in packed else (n_slots,)
            shape += tuple(Const(bound.extent(a)) for a in b.trailing)
        else:
            rows = Var("lrows") if row.parent is not None else Var("rows")
            shape = tuple(rows if a is row else Var("cols") if a is col else Const(bound.extent(a))
                          for a in b.axes)
        buffers.append(BufferDecl(b.name, shape, value_dtype[b.name], b.role, b.sparse))
    rank = {"index": 0, "input": 1, "output": 2, "temp": 3}
    buffers.sort(key=lambda b: rank[b.role])  # the kernel's argument order (stable within a role)
    scalars = [f"n_{a}" for a in prog.runtime_extents]
    if bound.composite:
        scalars += [f"off_p{k}" for k in range(len(parts))]
    if row.parent is not None:  # rows per outer coordinate of a stacked structure (r, i, j)
        scalars.append("lrows")
    return FlatProgram(bound.op.name, nests, buffers, size_vars, scalars + ["rows", "cols"], spec, bound)
