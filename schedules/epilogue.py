"""Epilogue fusion: a dense element-wise nest folded into the launch of the sparse nest before it.

SpMM + bias + ReLU is two iterations: ``C[i, k] += A[i, j] * B[j, k]`` and the dense
``C[i, k] = maximum(C[i, k] + bias[k], 0)``. Scheduled alone, the second is a launch of its
own that reads C back from memory. Here it moves into the sparse nest's kernel: the stores
that leave the sparse nest's final value in C (the register accumulators' write-back, a
composite's fill) store ``f(value)`` instead, with ``f`` the epilogue's right-hand side,
and the epilogue's launch is dropped.

When (checked on the lowered program and on the scheduled IR; otherwise nothing changes and
the epilogue stays a launch of its own, after the sparse nest):

* the epilogue is a dense assignment whose target is indexed by exactly its loop iterators
  (it rewrites every element of its target once) and which reads the target only there;
* the nests just before it (one DSL iteration: a single format's nest, or a composite's
  fill and parts) write that target, and each part *owns* its rows (``init``, no atomics):
  parts that share rows (hyb's split rows or column partitions, bsr+csr) add into the
  output, so no single store holds the final value, and the epilogue must wait for all
  of them;
* in the scheduled IR, every store those nests make to the target is a plain store of a
  finished value (a block with no ``T.init`` whose value does not read the target), and
  there is at least one.

TVM has no primitive for this (both nests write C, so reverse_compute_inline and
reverse_compute_at refuse it), so it is an IR rewrite after scheduling, like
``cuda_sddmm.fuse_scale_epilogue``.
"""
from __future__ import annotations

from typing import List, Optional

import numpy as np

from .cuda_sddmm import _rewrite
from .tir_rewrite import map_blocks, with_fields
from .tvm_modules import ie, pe, s_tir, tirx, tvm, tvm_ffi, tvm_ir

FUSED_EPILOGUE = "sparsec.epilogue"  # annotation of a store block that now applies an epilogue


def epilogue_sources(program) -> List[tuple]:
    """(epilogue nest, [the nests whose stores take it]) for every dense nest that the rules of
    the module docstring allow to fuse, judged on the lowered program alone."""
    out = []
    nests = program.nests
    for e, nest in enumerate(nests):
        if not nest.dense or nest.reduce is not None or e == 0:
            continue
        prev = nests[e - 1]
        if prev.dense:
            continue
        producers = []
        for p in reversed(nests[:e]):
            if p.dense or p.origin != prev.origin:
                break
            producers.insert(0, p)
        if not _owns_target(nest, producers):
            continue
        out.append((nest, producers))
    return out


def _owns_target(epi, producers) -> bool:
    from sparsec.expr import Load, Var, walk

    tgt = epi.target
    loop_vars = [f"v_{b.loop.name}" for blk in epi.blocks for b in blk]
    idx = [i.name if isinstance(i, Var) else None for i in tgt.index]
    if None in idx or sorted(idx) != sorted(loop_vars):  # every loop, each once: every element, once
        return False
    reads_elsewhere = any(isinstance(n, Load) and n.buffer == tgt.buffer and n.index != tgt.index
                          for n in walk(epi.value))
    if reads_elsewhere:
        return False
    for p in producers:
        if p.target.buffer != tgt.buffer:
            return False
        if not p.fill and (p.atomic or not p.init):
            return False
    return any(not p.fill for p in producers)


def fuse_epilogues(func: tirx.PrimFunc, program) -> tirx.PrimFunc:
    """``func`` (scheduled) with every fusable epilogue folded into its sparse nest's stores
    and its own launch removed (see the module docstring)."""
    for epi, producers in epilogue_sources(program):
        fused = _fuse_one(func, epi, producers)
        if fused is not None:
            func = fused
    return func


def _top_level(func):
    realize = func.body
    if not isinstance(realize, s_tir.SBlockRealize):
        return None, []
    body = realize.block.body
    return realize, list(body.seq) if isinstance(body, tirx.SeqStmt) else [body]


def _blocks_under(stmt):
    found = []

    def visit(block):
        found.append(block)
        return None
    map_blocks(stmt, visit)
    return found


def _fuse_one(func, epi, producers) -> Optional[tirx.PrimFunc]:
    realize, seq = _top_level(func)
    names = {p.name for p in producers} | {f"{p.name}_0" for p in producers}
    epi_names = {epi.name, f"{epi.name}_0"}
    owner = [n for n, st in enumerate(seq) if any(b.name_hint in names for b in _blocks_under(st))]
    at = [n for n, st in enumerate(seq) if any(b.name_hint in epi_names for b in _blocks_under(st))]
    if not owner or len(at) != 1 or at[0] < max(owner):
        return None
    epi_stmt = seq[at[0]]
    epi_block = next((b for b in _blocks_under(epi_stmt) if b.name_hint == epi.name), None)
    if epi_block is None or not isinstance(epi_block.body, tirx.BufferStore):
        return None
    store = epi_block.body
    out = store.buffer
    if not all(isinstance(i, pe.Var) for i in store.indices):
        return None
    # every store of the output in the producers' launches must be final
    finals = []
    for n in owner:
        for b in _blocks_under(seq[n]):
            writes_out = [s for s in _stores(b.body) if s.buffer.same_as(out)]
            if not writes_out:
                continue
            if b.init is not None or not isinstance(b.body, tirx.BufferStore) or _reads(b.body.value, out):
                return None
            finals.append(b.name_hint)
    if not finals:
        return None
    own_vars = _block_vars(epi_stmt)

    def apply(block):
        if block.name_hint not in finals or not isinstance(block.body, tirx.BufferStore) \
                or not block.body.buffer.same_as(out):
            return None
        s = block.body
        vmap = {e: v for e, v in zip(store.indices, s.indices)}
        value = _rewrite(store.value, vmap, out, _opaque(s.value))
        if any(v.same_as(o) for v in _vars(value) for o in own_vars):
            raise _Unfusable
        reads = list(block.reads) + [_point(l) for l in _loads(value) if not _reads_region(block.reads, l)]
        return with_fields(block, body=tirx.BufferStore(out, value, s.indices), reads=reads,
                           annotations={**block.annotations, FUSED_EPILOGUE: epi.name})

    try:
        new_seq = [map_blocks(st, apply) if n in owner else st for n, st in enumerate(seq) if n != at[0]]
    except _Unfusable:
        return None
    body = new_seq[0] if len(new_seq) == 1 else tirx.SeqStmt(new_seq)
    block = with_fields(realize.block, body=body)
    return func.with_body(s_tir.SBlockRealize(realize.iter_values, realize.predicate, block))


def _opaque(value):
    """A fill's constant (the identity a row without entries keeps) as the same bits read back
    through CUDA's bit-cast intrinsic: TVM's simplifier folds ``0.0f / x`` to 0 and ``0.0f * x``
    to 0, which is not IEEE (0 / 0 is NaN, 0 * inf is NaN), so a row-normalising epilogue
    applied to an empty row's 0 would give 0 instead of its reference's NaN."""
    casts = {"float32": ("int32", np.float32, "__int_as_float"),
             "float64": ("int64", np.float64, "__longlong_as_double")}
    dt = str(getattr(value, "dtype", None) or getattr(value, "ty", ""))
    if not isinstance(value, pe.FloatImm) or dt not in casts:
        return value
    itype, ftype, fn = casts[dt]
    raw = int(np.array(value.value, dtype=ftype).view(itype))
    return tirx.call_pure_extern(dt, fn, tirx.IntImm(itype, raw))


class _Unfusable(Exception):
    """The epilogue's value still names one of its own loop variables after the rewrite."""


def _stores(stmt):
    from .tir_rewrite import stores

    return list(stores(stmt))


def _walk(e):
    """Every sub-expression of ``e`` (the expression kinds a scheduled store holds)."""
    found = []
    todo = [e]
    while todo:
        x = todo.pop()
        found.append(x)
        if isinstance(x, tvm_ir.TensorLoad):
            todo.extend(x.indices)
        elif isinstance(x, (pe.BinaryOpExpr, pe.CmpExpr, pe.And, pe.Or)):
            todo.extend([x.a, x.b])
        elif isinstance(x, pe.Not):
            todo.append(x.a)
        elif isinstance(x, pe.Select):
            todo.extend([x.condition, x.true_value, x.false_value])
        elif isinstance(x, pe.Cast):
            todo.append(x.value)
        elif isinstance(x, ie.Call):
            todo.extend(x.args)
    return found


def _loads(e):
    return [x for x in _walk(e) if isinstance(x, tvm_ir.TensorLoad)]


def _vars(e):
    return [x for x in _walk(e) if isinstance(x, pe.Var)]


def _reads(e, buf) -> bool:
    return any(l.source.same_as(buf) for l in _loads(e))


def _point(load) -> tirx.BufferRegion:
    return tirx.BufferRegion(load.source, [tvm.ir.Range.from_min_extent(i, 1) for i in load.indices])


def _reads_region(regions, load) -> bool:
    return any(r.source.same_as(load.source) and all(
        bool(tvm_ffi.structural_equal(rg.min, i)) and isinstance(rg.extent, pe.IntImm) and rg.extent.value == 1
        for rg, i in zip(r.region, load.indices)) for r in regions)


def _block_vars(stmt):
    """The loop and block iterator variables of ``stmt`` (a launch)."""
    out = []

    def visit(block):
        out.extend(iv.var for iv in block.iter_vars)
        return None
    map_blocks(stmt, visit)
    todo = [stmt]
    while todo:
        s = todo.pop()
        if isinstance(s, tirx.For):
            out.append(s.loop_var)
            todo.append(s.body)
        elif isinstance(s, tirx.SeqStmt):
            todo.extend(s.seq)
        elif isinstance(s, s_tir.SBlockRealize):
            todo.append(s.block.body)
        elif isinstance(s, tirx.IfThenElse):
            todo.extend([s.then_case] + ([s.else_case] if s.else_case is not None else []))
    return out
