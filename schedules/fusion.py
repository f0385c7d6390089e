"""Horizontal fusion: a composite's parts in one kernel launch (SparseTIR's hfuse).

Each part of a composite format (hyb's buckets, bsr+csr's pieces) is its own loop nest
whose row loop the template binds to ``blockIdx.x``. Launched one by one, the narrow parts
are tiny kernels and the launches serialise. Fused, one grid holds every part's blocks:
block ``b`` runs part ``k`` where ``off_k <= b < off_k + blocks_k``, with its own row loop
variable bound to ``b - off_k``. The parts' thread extents must agree (the templates give
every part of one operator the same threadIdx shape); parts run concurrently, so only
nests that write disjoint outputs, or add atomically, are fused: the parts of one
statement after its fill nest.
"""
from __future__ import annotations

from typing import List

from tvm import s_tir, tirx

from .tir_rewrite import with_fields


def fusable_groups(program) -> List[List[int]]:
    """Indices of consecutive nests that are parts of one statement (fill nests excluded)."""
    groups, current, origin = [], [], None
    for i, nest in enumerate(program.nests):
        # a part that adds into the output without atomics relies on the launches' order
        safe = nest.part is not None and not nest.fill and (nest.init or nest.atomic)
        key = nest.name.rsplit("_p", 1)[0] if safe else None
        if key is not None and key == origin:
            current.append(i)
            continue
        if len(current) > 1:
            groups.append(current)
        current, origin = ([i], key) if key is not None else ([], None)
    if len(current) > 1:
        groups.append(current)
    return groups


def fuse_parts(func: tirx.PrimFunc, program) -> tirx.PrimFunc:
    """``func`` with each group of :func:`fusable_groups` launched as one kernel."""
    realize = func.body
    if not isinstance(realize, s_tir.SBlockRealize) or not isinstance(realize.block.body, tirx.SeqStmt):
        return func
    seq = list(realize.block.body.seq)
    groups = fusable_groups(program)
    if not groups or len(seq) != len(program.nests):
        return func
    out, done = [], set()
    for i, stmt in enumerate(seq):
        if i in done:
            continue
        group = next((g for g in groups if g[0] == i), None)
        loops = [seq[j] for j in group] if group else []
        if not group or not all(_is_grid_loop(l) for l in loops):
            out.append(stmt)
            continue
        out.append(_fuse(loops))
        done.update(group)
    block = with_fields(realize.block, body=tirx.SeqStmt(out))
    return func.with_body(s_tir.SBlockRealize(realize.iter_values, realize.predicate, block))


def _is_grid_loop(stmt) -> bool:
    return (isinstance(stmt, tirx.For) and stmt.thread_binding is not None
            and stmt.thread_binding.thread_tag == "blockIdx.x" and _is_zero(stmt.min))


def _is_zero(e) -> bool:
    return isinstance(e, tirx.IntImm) and e.value == 0


def _fuse(loops) -> tirx.For:
    bx = tirx.Var("part_block", "int32")
    offsets = [tirx.IntImm("int32", 0)]
    for l in loops[:-1]:
        offsets.append(offsets[-1] + l.extent)
    body = None
    for l, off in reversed(list(zip(loops, offsets))):
        branch = tirx.SeqStmt([tirx.Bind(l.loop_var, bx - off), l.body])
        body = branch if body is None else tirx.IfThenElse(bx < off + l.extent, branch, body)
    total = offsets[-1] + loops[-1].extent
    first = loops[0]
    return tirx.For(bx, tirx.IntImm("int32", 0), total, first.kind, body, first.thread_binding, first.annotations)
