"""Atomic write-back for nests whose rows repeat (hyb's split rows, several column parts).

The emitter writes such a nest as an ordinary reduction marked with ``ATOMIC_ATTR``, so a
schedule can accumulate a row's partial result in registers. This pass then makes every
store of a marked block that reaches global memory an ``atomicAdd``, and drops a marked
block's initialisation of global memory (the fill nest has already set the identity):
one atomic per output element per (split) row instead of one per stored entry.
"""
from __future__ import annotations

from tvm import s_tir, tirx
from tvm.ir import TensorLoad
from tvm_ffi import structural_equal

from sparsec.ir_attrs import ATOMIC_ATTR

from .tir_rewrite import map_blocks, map_stores, stores, with_fields


def atomic_writeback(func: tirx.PrimFunc) -> tirx.PrimFunc:
    marked = set()

    def visit(block: s_tir.SBlock):
        if ATOMIC_ATTR not in block.annotations:
            if any(block.name_hint == f"{m}_init" for m in marked) and _writes_global(block):
                # decompose_reduction's init of a marked block: the fill nest did it already
                return with_fields(block, body=tirx.Evaluate(0), writes=[])
            return None
        marked.add(block.name_hint)
        init = block.init
        if init is not None and _stores_global(init):
            init = None
        body = map_stores(block.body, _atomic_add)
        return with_fields(block, body=body, init=init)

    return func.with_body(map_blocks(func.body, visit))


def mark_atomic(sch: s_tir.Schedule, block) -> None:
    """Let ``block`` (e.g. cache_write's write-back of a marked block) store atomically."""
    sch.annotate(block, ATOMIC_ATTR, 1)


def _is_global(buf) -> bool:
    return buf.scope() in ("global", "")


def _writes_global(block) -> bool:
    return any(_is_global(w.buffer) for w in block.writes)


def _stores_global(stmt) -> bool:
    return any(_is_global(st.buffer) for st in stores(stmt))


def _atomic_add(store: tirx.BufferStore):
    if not _is_global(store.buffer):
        return None
    value = store.value
    if isinstance(value, tirx.Add) and _is_same_load(value.a, store):
        value = value.b
    elif isinstance(value, tirx.Add) and _is_same_load(value.b, store):
        value = value.a
    target = tirx.BufferLoad(store.buffer, store.indices)
    return tirx.Evaluate(tirx.call_extern(store.buffer.dtype, "atomicAdd", tirx.address_of(target), value))


def _is_same_load(e, store) -> bool:
    return (isinstance(e, TensorLoad) and e.source.same_as(store.buffer)
            and len(e.indices) == len(store.indices)
            and all(structural_equal(a, b) for a, b in zip(e.indices, store.indices)))
