"""Horizontal fusion: a composite's parts in one kernel launch (SparseTIR's hfuse).

Each part of a composite format (hyb's buckets, bsr+csr's pieces) is its own loop nest
whose row loop the template binds to ``blockIdx.x``. Launched one by one, the narrow parts
are tiny kernels and the launches serialise. Fused, one grid holds every part's blocks:
block ``b`` runs part ``k`` where ``off_k <= b < off_k + blocks_k``, with its own row loop
variable running over the one value ``b - off_k``. One launch has one block shape, so only parts
with the same threadIdx extents share it (a non-linear operator's parts may get different
templates: a warp per row beside an atomic thread per row); parts run concurrently, so only
nests that write disjoint outputs, or add atomically, are fused: the parts of one
statement after its fill nest.
"""
from __future__ import annotations

from typing import List

from .tir_rewrite import with_fields
from .tvm_modules import s_tir, tirx

def _fusable_key(nest):
    """Nests with equal keys may share a launch: parts of one statement that own their
    outputs or add atomically (a part that adds into the output without atomics relies on
    the launches' order)."""
    if nest.part is None or nest.fill or not (nest.init or nest.atomic):
        return None
    return nest.name.rsplit("_p", 1)[0]


def fusable_groups(program) -> List[List[int]]:
    """Indices of consecutive nests that are parts of one statement (fill nests excluded)."""
    return _groups([_fusable_key(n) for n in program.nests])


def _groups(keys) -> List[List[int]]:
    groups, current, origin = [], [], None
    for i, key in enumerate(keys):
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
    """``func`` with each run of consecutive top-level launches of fusable parts (see
    :func:`fusable_groups`) launched as one kernel. Launches are matched to nests by block
    name, so nests a schedule merged away (SDDMM's scale) do not disturb the grouping."""
    realize = func.body
    if not isinstance(realize, s_tir.SBlockRealize) or not isinstance(realize.block.body, tirx.SeqStmt):
        return func
    seq = list(realize.block.body.seq)
    by_block = {}
    for n in program.nests:
        by_block[n.name] = n
        by_block[f"{n.name}_0"] = n
    keys = []
    for stmt in seq:
        nest = by_block.get(_first_block_name(stmt))
        keys.append(_fusable_key(nest) if nest is not None and _is_grid_loop(stmt) else None)
    groups = [run for g in _groups(keys) for run in _same_threads(g, seq) if len(run) > 1]
    if not groups:
        return func
    out, i = [], 0
    starts = {g[0]: g for g in groups}
    while i < len(seq):
        if i in starts:
            g = starts[i]
            out.append(_fuse([seq[j] for j in g]))
            i = g[-1] + 1
        else:
            out.append(seq[i])
            i += 1
    block = with_fields(realize.block, body=out[0] if len(out) == 1 else tirx.SeqStmt(out))
    return func.with_body(s_tir.SBlockRealize(realize.iter_values, realize.predicate, block))


def _same_threads(group, seq) -> List[List[int]]:
    """``group`` cut into runs of consecutive launches with the same threadIdx extents: one
    launch has one block shape, so parts that different templates scheduled (a warp-per-row
    reduction beside a thread-per-row atomic part) keep launches of their own."""
    runs: List[List[int]] = []
    last = None
    for i in group:
        sig = _thread_extents(seq[i])
        if runs and sig == last:
            runs[-1].append(i)
        else:
            runs.append([i])
        last = sig
    return runs


def _thread_extents(stmt):
    """{threadIdx.x/y/z: extent} of the loops bound to threads in ``stmt`` (None when one is
    not a constant, or a thread tag is bound twice with different extents)."""
    found = {}
    todo = [stmt]
    while todo:
        node = todo.pop()
        if isinstance(node, tirx.For) and node.thread_binding is not None:
            tag = node.thread_binding.thread_tag
            if tag.startswith("threadIdx"):
                ext = node.extent.value if isinstance(node.extent, tirx.IntImm) else None
                found[tag] = ext if found.get(tag, ext) == ext else None
        if isinstance(node, tirx.SeqStmt):
            todo.extend(node.seq)
        for field in ("body", "then_case", "else_case", "block"):
            child = getattr(node, field, None) if not isinstance(node, tirx.SeqStmt) else None
            if child is not None:
                todo.append(child)
    return tuple(sorted(found.items()))


def _first_block_name(stmt):
    while stmt is not None:
        if isinstance(stmt, s_tir.SBlockRealize):
            return stmt.block.name_hint
        if isinstance(stmt, tirx.SeqStmt):
            stmt = stmt.seq[0] if len(stmt.seq) else None
        elif isinstance(stmt, (tirx.For, tirx.AttrStmt)):
            stmt = stmt.body
        elif isinstance(stmt, tirx.IfThenElse):
            stmt = stmt.then_case
        else:
            return None
    return None


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
        # the part's own block loop becomes a one-iteration loop starting at bx - off: loop-domain
        # analyses (buffer compaction) still see a single point, which a let binding hides
        branch = tirx.For(l.loop_var, bx - off, tirx.IntImm("int32", 1), tirx.ForKind.SERIAL, l.body)
        body = branch if body is None else tirx.IfThenElse(bx < off + l.extent, branch, body)
    total = offsets[-1] + loops[-1].extent
    first = loops[0]
    return tirx.For(bx, tirx.IntImm("int32", 0), total, first.kind, body, first.thread_binding, first.annotations)
