"""SDDMM on CUDA, Sputnik-style: one pass, sub-warp lane groups, vector loads.

The lowered SDDMM has two nests: the dot products ``C[p] += X[i, k] * Y[col[p], k]``
(a reduction over the feature axis k, spatial over the stored entries p) and the scale
``C[p] = A[p] * C[p]``. Here they become one kernel:

* ``fuse_scale_epilogue`` moves the scale into the dot nest, right after each entry's
  reduction, and accumulates the dot in a register (``acc``) instead of in ``C``. The
  dot is finished before it is scaled, so an infinite A[p] still gives +-inf.
* ``lane_groups`` spreads the feature axis over ``lanes`` threads (a power of two, so
  TVM reduces them with warp shuffles of that width), each lane reading ``vec``
  consecutive features of X[i, :] and Y[col, :] as one vector load; ``groups`` lane
  groups take a row's entries in turn (threadIdx.y) and ``rows_per_block`` rows share a
  thread block (threadIdx.z). X[i, :] is loaded once per row into registers.

TVM has no primitive that merges two sibling nests that update one buffer in place (both
blocks write ``C``, so compute_at / reverse_compute_inline refuse), so the fusion edits
the IR through ``ScheduleState.replace``; it is checked structurally first and left
undone (two kernels, as before) when the nests do not have the expected shape.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

from .knobs import Knob, transformation
from .loops import inner_block, root_block
from .tvm_modules import ie, pe, s_tir, te, tirx, tvm, tvm_ffi

WARP = 32
MAX_THREADS = 1024
FUSED = "sparsec.fused_into"  # annotation of a scale block moved into its dot nest

# ---------------------------------------------------------------- small IR rewriter


def _rewrite(e, vmap: Dict, buf=None, load=None):
    """``e`` with variables replaced by ``vmap`` and every load of ``buf`` by ``load``."""
    def r(x):
        return _rewrite(x, vmap, buf, load)

    if isinstance(e, ie.TensorLoad):
        if buf is not None and e.source.same_as(buf):
            return load
        return te.BufferLoad(e.source, [r(i) for i in e.indices])
    if isinstance(e, pe.Var):
        if isinstance(vmap, _Probe):
            vmap.probe(e)
        for k, v in vmap.items():
            if k.same_as(e):
                return v
        return e
    if isinstance(e, (pe.IntImm, pe.FloatImm, tirx.stmt.StringImm)):
        return e
    if isinstance(e, pe.Not):
        return pe.Not(r(e.a))
    if isinstance(e, (pe.BinaryOpExpr, pe.CmpExpr, pe.And, pe.Or)):
        return type(e)(r(e.a), r(e.b))
    if isinstance(e, pe.Select):
        return pe.Select(r(e.condition), r(e.true_value), r(e.false_value))
    if isinstance(e, pe.Cast):
        return pe.Cast(e.ty, r(e.value))
    if isinstance(e, ie.Call):
        return ie.Call(e.op, [r(a) for a in e.args], e.attrs, e.ty_args, ret_ty=e.ty)
    raise NotImplementedError(f"unexpected expression {type(e).__name__} in an SDDMM nest")


def _region(reg, vmap, buf=None, new_buf=None):
    if buf is not None and reg.source.same_as(buf):
        return tirx.BufferRegion(new_buf, [tvm.ir.Range(0, 1)])
    return tirx.BufferRegion(reg.source, [tvm.ir.Range.from_min_extent(_rewrite(x.min, vmap), _rewrite(x.extent, vmap))
                                          for x in reg.region])


def _chain(stmt) -> Tuple[List[tirx.For], object]:
    """The perfectly nested loops from ``stmt`` down to the first statement that is not a loop."""
    loops = []
    while isinstance(stmt, tirx.For):
        loops.append(stmt)
        stmt = stmt.body
    return loops, stmt


def _relooped(loops, body):
    for lp in reversed(loops):
        body = tirx.For(lp.loop_var, lp.min, lp.extent, lp.kind, body, lp.thread_binding, lp.annotations)
    return body


def _find_block(stmt, name):
    """The SBlockRealize named ``name`` under ``stmt`` (loops, sequences, realizes), or None."""
    if isinstance(stmt, s_tir.SBlockRealize):
        return stmt if stmt.block.name_hint == name else _find_block(stmt.block.body, name)
    if isinstance(stmt, tirx.For):
        return _find_block(stmt.body, name)
    if isinstance(stmt, tirx.SeqStmt):
        return next((r for r in (_find_block(x, name) for x in stmt.seq) if r is not None), None)
    return None


def _replace_block(stmt, name, new):
    """``stmt`` with the realize of the block named ``name`` replaced by ``new``."""
    if isinstance(stmt, s_tir.SBlockRealize):
        return new if stmt.block.name_hint == name else stmt
    if isinstance(stmt, tirx.For):
        return _relooped([stmt], _replace_block(stmt.body, name, new))
    if isinstance(stmt, tirx.SeqStmt):
        return tirx.SeqStmt([_replace_block(x, name, new) for x in stmt.seq])
    return stmt


def _guard_blocks(stmt, skip, pred):
    """``stmt`` with every block realize but ``skip`` also predicated on ``pred``."""
    if isinstance(stmt, s_tir.SBlockRealize):
        if stmt.block.name_hint == skip:
            return stmt
        return s_tir.SBlockRealize(stmt.iter_values, tirx.all(pred, stmt.predicate), stmt.block)  # pred first: && short-circuits
    if isinstance(stmt, tirx.For):
        return _relooped([stmt], _guard_blocks(stmt.body, skip, pred))
    if isinstance(stmt, tirx.SeqStmt):
        return tirx.SeqStmt([_guard_blocks(x, skip, pred) for x in stmt.seq])
    return stmt


def _stmt_uses(stmt, var) -> bool:
    """True when ``var`` occurs free in ``stmt``."""
    return any(v.same_as(var) for v in tirx.analysis.undefined_vars(stmt))


def _conjuncts(e):
    return _conjuncts(e.a) + _conjuncts(e.b) if isinstance(e, pe.And) else [e]


def _loop_vars(stmt):
    if isinstance(stmt, tirx.For):
        return [stmt.loop_var] + _loop_vars(stmt.body)
    if isinstance(stmt, tirx.SeqStmt):
        return [v for x in stmt.seq for v in _loop_vars(x)]
    if isinstance(stmt, s_tir.SBlockRealize):
        return _loop_vars(stmt.block.body)
    return []


def _uses(e, var) -> bool:
    found = []

    def visit(x):
        if isinstance(x, pe.Var) and x.same_as(var):
            found.append(x)
        return x
    _rewrite(e, _Probe(visit))
    return bool(found)


class _Probe(dict):
    """A var map that reports every variable it is asked about and maps none."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def items(self):
        return ()

    def probe(self, v):
        self.fn(v)


def _eq(a, b) -> bool:
    return bool(tvm_ffi.structural_equal(a, b))


def _epilogue(stmt, outer, dot_realize):
    """(outer realize, inner realize, {var: replacement}) when the pristine nest ``stmt`` rewrites
    the dot's output element-wise in place over the same rows and entries, else None."""
    if not isinstance(stmt, tirx.For) or not isinstance(stmt.body, s_tir.SBlockRealize):
        return None
    e_outer = stmt.body
    loops, e_inner = _chain(e_outer.block.body)
    if not isinstance(e_inner, s_tir.SBlockRealize) or not isinstance(e_inner.block.body, tirx.BufferStore):
        return None
    blk, dot = e_inner.block, dot_realize.block
    spatial = [iv for iv in dot.iter_vars if iv.iter_type == tirx.IterVar.DataPar]
    if (not e_inner.block.body.buffer.same_as(dot.body.buffer) or blk.init is not None
            or len(blk.iter_vars) != len(spatial) or len(loops) != len(spatial)
            or any(iv.iter_type != tirx.IterVar.DataPar for iv in blk.iter_vars)
            or len(e_outer.block.iter_vars) != len(outer.block.iter_vars)
            or not all(_eq(v, lp.loop_var) for v, lp in zip(e_inner.iter_values, loops))):
        return None
    vmap = {a.var: b.var for a, b in zip(e_outer.block.iter_vars, outer.block.iter_vars)}
    if not all(_eq(_rewrite(a.dom.extent, vmap), b.dom.extent) for a, b in zip(blk.iter_vars, spatial)):
        return None
    vmap.update({a.var: b.var for a, b in zip(blk.iter_vars, spatial)})
    if not all(_eq(_rewrite(a, vmap), b) for a, b in zip(blk.body.indices, dot.body.indices)):
        return None
    values = dict(zip([iv.var for iv in dot.iter_vars], dot_realize.iter_values))
    # the epilogue's loops stand for the dot's spatial iterators (their bindings, in the dot's loops)
    loop_map = {lp.loop_var: values[iv.var] for lp, iv in zip(loops, spatial)}
    return e_outer, e_inner, loop_map


def fuse_scale_epilogue(sch: s_tir.Schedule, nest) -> bool:
    """Move the element-wise nest that rewrites this reduction nest's output in place (SDDMM's
    ``C[p] = A[p] * C[p]``) into the reduction nest, after each entry's reduction, with the
    reduction accumulated in a register. Returns False (and changes nothing) when the nests do
    not have that shape.

    Requires: ``nest``'s statement block (possibly split and reordered already, with cache
    reads under its reduction loops) has its spatial loops outside its reduction loops; a later,
    unscheduled nest has the same rows and entries, writes the same element and reads the
    dot's output only there. Bind threads after this (TVM's region-cover flags of the rebuilt
    scope are not recomputed, so cache_read would refuse it).

    Before: for i: for p, k: C[p] += X[i, k] * Y[col[p], k]
            for i: for p: C[p] = A[p] * C[p]
    After:  for i: for p: { for k: acc += X[i, k] * Y[col[p], k]
                            C[p] = A[p] * acc }
    """
    root_rv = sch.get_sblock("root")
    root = sch.get(root_rv)
    stmts = list(root.body.seq) if isinstance(root.body, tirx.SeqStmt) else [root.body]
    d = next((n for n, st in enumerate(stmts) if _find_block(st, nest.name) is not None), None)
    if d is None:
        return False
    outer = _find_block(stmts[d], f"{nest.name}_0")
    dot_realize = _find_block(stmts[d], nest.name)
    blk = dot_realize.block
    if outer is None or blk.init is None or not isinstance(blk.body, tirx.BufferStore):
        return False
    red = [v for iv, v in zip(blk.iter_vars, dot_realize.iter_values) if iv.iter_type == tirx.IterVar.CommReduce]
    if len(red) + sum(iv.iter_type == tirx.IterVar.DataPar for iv in blk.iter_vars) != len(blk.iter_vars) or not red:
        return False
    # the entry loops: from the row block down to the first loop a reduction iterator uses;
    # a loop's body may first read what its entries share (lane_groups' per-row cache reads)
    loops, heads, rest = [], [], outer.block.body
    while True:
        head = []
        if isinstance(rest, tirx.SeqStmt) and _find_block(rest.seq[-1], nest.name) is not None:
            head, rest = list(rest.seq[:-1]), rest.seq[-1]
        if loops:
            heads.append(head)
        elif head:
            return False
        if not isinstance(rest, tirx.For) or any(_uses(v, rest.loop_var) for v in red):
            break
        loops.append(rest)
        rest = rest.body
    if not isinstance(rest, tirx.For):
        return False
    found = None
    for e in range(d + 1, len(stmts)):
        found = _epilogue(stmts[e], outer, dot_realize)
        if found is not None:
            break
    if found is None:
        return False
    e_outer, e_inner, loop_map = found
    store = blk.body
    out = store.buffer
    acc = tirx.decl_buffer((1,), out.dtype, "acc", scope="local")
    acc0 = te.BufferLoad(acc, [tirx.IntImm("int32", 0)])
    zero = [tirx.IntImm("int32", 0)]
    # the reduction into the register
    red_blk = s_tir.SBlock(blk.iter_vars, blk.reads, [tirx.BufferRegion(acc, [tvm.ir.Range(0, 1)])], blk.name_hint,
                     tirx.BufferStore(acc, _rewrite(store.value, {}, out, acc0), zero),
                     tirx.BufferStore(acc, _rewrite(blk.init.value, {}, out, acc0), zero),
                     blk.alloc_buffers, blk.match_buffers, blk.annotations)
    reduction = _replace_block(rest, nest.name, s_tir.SBlockRealize(dot_realize.iter_values, dot_realize.predicate,
                                                              red_blk))
    # cache reads under the reduction loops load only for entries that exist (a split's tail
    # would otherwise read column indices past the row, and past the array at the last row)
    inner_loops = _loop_vars(rest)  # the reduction loops: the scale sits outside them
    entry_pred = [c for c in _conjuncts(dot_realize.predicate) if not any(_uses(c, v) for v in inner_loops)]
    if entry_pred:
        reduction = _guard_blocks(reduction, nest.name, tirx.all(*entry_pred))
    # the scale, bound like the dot's entries (and predicated like them)
    e_blk = e_inner.block
    o_iv = e_outer.block.iter_vars
    e_store = e_blk.body
    scale = s_tir.SBlock(list(o_iv) + list(e_blk.iter_vars),
                   # acc is left out of the reads: TVM's region-cover check does not see that the
                   # predicated reduction covers it, though both blocks share the predicate
                   [r for r in e_blk.reads if not r.source.same_as(out)], list(e_blk.writes), e_blk.name_hint,
                   tirx.BufferStore(out, _rewrite(e_store.value, {}, out, acc0), e_store.indices),
                   None, e_blk.alloc_buffers, e_blk.match_buffers, {**e_blk.annotations, FUSED: nest.name})
    spatial_values = [v for iv, v in zip(blk.iter_vars, dot_realize.iter_values) if iv.iter_type == tirx.IterVar.DataPar]
    pred = tirx.all(*entry_pred, _rewrite(e_inner.predicate, loop_map))
    scale_realize = s_tir.SBlockRealize([iv.var for iv in outer.block.iter_vars] + spatial_values, pred, scale)
    body = tirx.SeqStmt([reduction, scale_realize])
    for lp, head in reversed(list(zip(loops, heads))):
        # what a loop's body reads first without its variable (X[i, :] under the entry
        # loop) moves before the loop: read once, not once per entry
        inside = [h for h in head if _stmt_uses(h, lp.loop_var)]
        before = [h for h in head if not _stmt_uses(h, lp.loop_var)]
        body = _relooped([lp], tirx.SeqStmt(inside + [body]) if inside else body)
        if before:
            body = tirx.SeqStmt(before + [body])
    ob = outer.block
    vmap = {a.var: b.var for a, b in zip(o_iv, ob.iter_vars)}
    extra = [_region(r, vmap) for r in e_outer.block.reads
             if not r.source.same_as(out) and not any(x.source.same_as(r.source) for x in ob.reads)]
    new_outer = s_tir.SBlock(ob.iter_vars, list(ob.reads) + extra, ob.writes, ob.name_hint, body, ob.init,
                       list(ob.alloc_buffers) + [acc], ob.match_buffers, ob.annotations)
    fused = _replace_block(stmts[d], ob.name_hint, s_tir.SBlockRealize(outer.iter_values, outer.predicate, new_outer))
    new = [fused if n == d else st for n, st in enumerate(stmts) if st is not None and n != e]
    new_root = s_tir.SBlock(root.iter_vars, root.reads, root.writes, root.name_hint,
                      new[0] if len(new) == 1 else tirx.SeqStmt(new), root.init, root.alloc_buffers,
                      root.match_buffers, root.annotations)
    sch.state.replace(sch.get_sref(root_rv), new_root, {root: new_root})
    return True


def _cache_per_row(sch: s_tir.Schedule, nest, name: str, lanes: int, vec: int, at) -> None:
    """Read the statement's operand ``name`` (the same for all a row's entries: X[i, :]) into
    registers at the top of the entry loop ``at`` (``fuse_scale_epilogue`` then moves it
    before the loop, as it reads nothing that changes from entry to entry): each lane loads
    the (k_o, vec) features it multiplies, as vectors, into a local buffer indexed by
    (k_o, vec) only, so its indices are constants once k_o is unrolled (registers, no stack)."""
    blk = inner_block(sch, nest)
    reads = [r.source.name for r in sch.get(blk).reads]
    if name not in reads:
        return
    cache = sch.cache_read(blk, reads.index(name), "local")
    sch.compute_at(cache, at)
    sch.transform_layout(cache, ("write", 0), lambda *ix: (ix[-1] // (lanes * vec), ix[-1] % vec),
                         assume_injective_transform=True)
    c_o, c_l, c_v = sch.split(sch.get_loops(cache)[-1], [None, lanes, vec])
    sch.unroll(c_o)
    sch.bind(c_l, "threadIdx.x")
    sch.vectorize(c_v)


def is_fused(sch: s_tir.Schedule, nest) -> bool:
    """True when ``nest`` (an element-wise nest) was moved into a reduction nest."""
    try:
        blk = sch.get(sch.get_sblock(nest.name))
    except Exception:  # noqa: BLE001  (TVM raises its own error for a missing block)
        return False
    return FUSED in blk.annotations


# ---------------------------------------------------------------- defaults


def default_vec(feat: int) -> int:
    """Features per lane: a float4 when the row length allows it, else float2, else scalars."""
    return 4 if feat % 4 == 0 else 2 if feat % 2 == 0 else 1


def default_lanes(feat: int, vec: int) -> int:
    """Lanes per entry: feat / vec rounded down to a power of two, at most a warp."""
    lanes = 1
    while lanes * 2 <= min(WARP, max(1, feat // vec)):
        lanes *= 2
    return lanes


# ---------------------------------------------------------------- the template


def resolve_lanes(feat: int, knobs) -> dict:
    """What ``lane_groups`` makes of its knobs (defaults for those not given; 0: chosen from
    feat) at feature width ``feat``: vec, lanes, groups, ``threads_per_row`` (lanes x
    groups) and rows_per_block (at most 1024 threads a block)."""
    k = {**lane_groups.defaults(), **knobs}
    vec = k["vec"] or default_vec(feat)
    if feat % vec:
        vec = 1
    lanes = k["lanes"] or default_lanes(feat, vec)
    groups = k["groups"] or max(1, WARP // lanes)
    rows_per_block = max(1, min(k["rows_per_block"], MAX_THREADS // (lanes * groups)))
    return {"vec": vec, "lanes": lanes, "groups": groups, "threads_per_row": lanes * groups,
            "rows_per_block": rows_per_block}


def _feat(nest) -> int:
    return int(nest.blocks[-1][-1].loop.extent)


def _prune(nest, knobs):
    r = resolve_lanes(_feat(nest), knobs)
    if r["threads_per_row"] > MAX_THREADS:
        return f"lanes x groups over {MAX_THREADS} threads"
    return None


@transformation(knobs={"lanes": Knob((0, 1, 2, 4, 8, 16, 32), search=(0, 4, 8, 16, 32), small=(0, 8, 32)),
                       "vec": Knob((0, 1, 2, 4), search=(0, 4)),
                       "groups": Knob((0, 1, 2, 4, 8, 16, 32), search=(0, 1, 2, 4), small=(0, 1, 4)),
                       "rows_per_block": Knob((4, 1, 2, 8, 16), search=(4, 1, 2, 8), small=(4, 1, 8)),
                       "unroll": Knob((1, 2, 4, 8), search=(1, 2, 4, 8), small=(1, 4))},
                resolve=lambda nest, knobs: resolve_lanes(_feat(nest), knobs), prune=_prune)
def lane_groups(sch: s_tir.Schedule, nest, *, lanes: int, vec: int, groups: int, rows_per_block: int, unroll: int):
    """SDDMM-like nests: the statement block's last loop is a reduction over a dense feature
    axis, its other loops are spatial (the stored entries). 0 means "chosen from feat":
    vec = 4/2/1 as feat allows, lanes = feat / vec rounded down to a power of two (<= 32),
    groups = 32 / lanes (one warp per row). ``unroll``: entries a lane group takes in one
    unrolled step, so that their gathers are in flight together.

    Before: for i: for p in row_len: for k in F: C[p] += X[i, k] * Y[col[p], k]
            for i: for p in row_len: C[p] = A[p] * C[p]
    After:  for bx (blockIdx.x): for tz (threadIdx.z, rows_per_block):
              xr[vec * ko] = X[i, lane * vec ...]                      (registers, vector loads)
              for po in ceil(row_len / groups): for ty (threadIdx.y, groups):
                for ko: for lane (threadIdx.x, lanes):
                  yv[vec] = Y[col[p], (ko * lanes + lane) * vec ...]   (vector load)
                  acc += sum_v xr[v] * yv[v]    -> shuffle all-reduce over the lanes
                C[p] = A[p] * acc
    """
    r = resolve_lanes(_feat(nest), {"lanes": lanes, "vec": vec, "groups": groups, "rows_per_block": rows_per_block})
    vec, lanes, groups, rows_per_block = r["vec"], r["lanes"], r["groups"], r["rows_per_block"]
    if lanes * groups > MAX_THREADS:
        raise ValueError(f"{nest.name}: lanes * groups should be at most {MAX_THREADS}, got {lanes} * {groups}")
    per_row = set(row_operands(nest)) if vec > 1 else set()
    blk = inner_block(sch, nest)
    loops = sch.get_loops(blk)
    own = len(nest.blocks[-1])
    spatial, k = loops[-own:-1], loops[-1]
    p = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    p_o, p_g = sch.split(p, [None, groups])
    k_o, k_l, k_v = sch.split(k, [None, lanes, vec])
    sch.reorder(k_o, k_l, k_v)
    for name in per_row:
        _cache_per_row(sch, nest, name, lanes, vec, p_o)
    if vec > 1:  # each lane reads its vec features of Y[col, :] as one vector, entry by entry
        for name in feature_operands(nest):
            names = [r.source.name for r in sch.get(blk).reads]
            if name in names and name not in per_row:
                cache = sch.cache_read(blk, names.index(name), "local")
                sch.compute_at(cache, k_l)
                # one entry's vector: indexed by the feature alone, so that the register
                # array's index is a constant (TVM's compaction otherwise keeps the gathered
                # row's index in it, and a data-dependent index puts the array on the stack)
                sch.transform_layout(cache, ("write", 0), lambda *ix: (ix[-1] % vec,), assume_injective_transform=True)
                sch.vectorize(sch.get_loops(cache)[-1])
    fused = fuse_scale_epilogue(sch, nest)  # srefs survive by name only
    blk = inner_block(sch, nest)
    *_, p_o, p_g, k_o, k_l, k_v = sch.get_loops(blk)
    if per_row:  # constant indices into the row's registers (a local array indexed by a loop is stack memory)
        sch.unroll(k_o)
    if unroll > 1:  # entries a lane group takes in one unrolled step: their loads in flight together
        _, p_u = sch.split(p_o, [None, unroll])
        sch.unroll(p_u)
    if not fused:
        # No epilogue writes the entry: reduce into a register and store it from a block of its
        # own under the entry loop, which carries the split's predicate (entries past the row's
        # end). TVM's cross-thread lowering drops the block predicate from the store it makes
        # itself, so a lane group past the row's end would overwrite the next row's entries.
        store = sch.cache_write(blk, 0, "local")
        sch.reverse_compute_at(store, p_g)
        blk = inner_block(sch, nest)
        *_, p_o, p_g, k_o, k_l, k_v = sch.get_loops(blk)
    sch.bind(p_g, "threadIdx.y")
    sch.bind(k_l, "threadIdx.x")
    sch.unroll(k_v)
    bx, tz = sch.split(sch.get_loops(root_block(sch, nest))[0], [None, rows_per_block])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tz, "threadIdx.z")


def row_operands(nest):
    """The feature operands whose element does not depend on the entry (SDDMM's X[i, :], read
    at the row; not Y[col[p], :]): loaded once per row and reused for all its entries."""
    from sparsec.expr import Load, Var, walk

    root = f"v_{nest.blocks[0][0].loop.name}"
    k = f"v_{nest.blocks[-1][-1].loop.name}"
    loads = [n for n in walk(nest.value) if isinstance(n, Load) and n.buffer in feature_operands(nest)]
    out = []
    for name in dict.fromkeys(n.buffer for n in loads):
        used = {v.name for n in loads if n.buffer == name for i in n.index for v in walk(i) if isinstance(v, Var)}
        if used <= {root, k}:
            out.append(name)
    return out


def feature_operands(nest):
    """Names of the buffers the statement reads along its feature loop (SDDMM's X and Y,
    attention's Q and K), in order of first use: the ones a lane loads as vectors."""
    from sparsec.expr import Load, Var, walk

    k = f"v_{nest.blocks[-1][-1].loop.name}"
    return list(dict.fromkeys(n.buffer for n in walk(nest.value) if isinstance(n, Load) and n.index
                              and isinstance(n.index[-1], Var) and n.index[-1].name == k))
