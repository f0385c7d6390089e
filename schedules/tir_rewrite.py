"""Rebuild a scheduled PrimFunc with some of its blocks replaced.

TVM 0.27 exposes no statement mutator to Python, so this walks the few statement kinds a
scheduled sparsec nest contains and rebuilds the path down to each block it changes.
"""
from __future__ import annotations

from typing import Callable, Optional
from .tvm_modules import s_tir, tirx

def map_blocks(stmt, fn: Callable[[s_tir.SBlock], Optional[s_tir.SBlock]]):
    """``stmt`` with every SBlock ``b`` (outermost first) replaced by ``fn(b)``; ``fn`` returns
    None to keep a block (its children are then visited)."""
    if isinstance(stmt, s_tir.SBlockRealize):
        new = fn(stmt.block)
        block = new if new is not None else with_fields(stmt.block, body=map_blocks(stmt.block.body, fn))
        if block.same_as(stmt.block):
            return stmt
        return s_tir.SBlockRealize(stmt.iter_values, stmt.predicate, block)
    if isinstance(stmt, tirx.SeqStmt):
        seq = [map_blocks(s, fn) for s in stmt.seq]
        return stmt if all(a.same_as(b) for a, b in zip(seq, stmt.seq)) else tirx.SeqStmt(seq)
    if isinstance(stmt, tirx.For):
        body = map_blocks(stmt.body, fn)
        if body.same_as(stmt.body):
            return stmt
        return tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body, stmt.thread_binding,
                        stmt.annotations, stmt.step)
    if isinstance(stmt, tirx.IfThenElse):
        then = map_blocks(stmt.then_case, fn)
        other = map_blocks(stmt.else_case, fn) if stmt.else_case is not None else None
        if then.same_as(stmt.then_case) and (other is None or other.same_as(stmt.else_case)):
            return stmt
        return tirx.IfThenElse(stmt.condition, then, other)
    if isinstance(stmt, tirx.AttrStmt):
        body = map_blocks(stmt.body, fn)
        return stmt if body.same_as(stmt.body) else tirx.AttrStmt(stmt.node, stmt.attr_key, stmt.value, body)
    return stmt


def map_stores(stmt, fn: Callable[[tirx.BufferStore], Optional[tirx.Stmt]]):
    """``stmt`` (a block body: loops, branches, stores) with each BufferStore replaced by
    ``fn(store)`` where that is not None. Nested blocks are left alone."""
    if isinstance(stmt, tirx.BufferStore):
        new = fn(stmt)
        return stmt if new is None else new
    if isinstance(stmt, tirx.SeqStmt):
        return tirx.SeqStmt([map_stores(s, fn) for s in stmt.seq])
    if isinstance(stmt, tirx.For):
        return tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, map_stores(stmt.body, fn),
                        stmt.thread_binding, stmt.annotations, stmt.step)
    if isinstance(stmt, tirx.IfThenElse):
        return tirx.IfThenElse(stmt.condition, map_stores(stmt.then_case, fn),
                               map_stores(stmt.else_case, fn) if stmt.else_case is not None else None)
    return stmt


def stores(stmt, attrs: bool = False):
    """The BufferStores of ``stmt`` (a block body), nested blocks left out; with ``attrs``
    also those under AttrStmts (pragmas and the like)."""
    if isinstance(stmt, tirx.BufferStore):
        yield stmt
    elif isinstance(stmt, tirx.SeqStmt):
        for s in stmt.seq:
            yield from stores(s, attrs)
    elif isinstance(stmt, tirx.For) or (attrs and isinstance(stmt, tirx.AttrStmt)):
        yield from stores(stmt.body, attrs)
    elif isinstance(stmt, tirx.IfThenElse):
        yield from stores(stmt.then_case, attrs)
        if stmt.else_case is not None:
            yield from stores(stmt.else_case, attrs)


def with_fields(block: s_tir.SBlock, **changes) -> s_tir.SBlock:
    """``block`` with some fields changed (``block`` itself when nothing changes)."""
    fields = dict(iter_vars=block.iter_vars, reads=block.reads, writes=block.writes, name_hint=block.name_hint,
                  body=block.body, init=block.init, alloc_buffers=block.alloc_buffers,
                  match_buffers=block.match_buffers, annotations=block.annotations)
    if all(v.same_as(fields[k]) if hasattr(v, "same_as") else v is fields[k] for k, v in changes.items()):
        return block
    fields.update(changes)
    return s_tir.SBlock(**fields)

