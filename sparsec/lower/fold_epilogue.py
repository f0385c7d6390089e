"""An added term after a shared-row sum becomes the value the sum starts from.

A sum whose rows are shared (stacked relations adding into one output row, a composite's
parts, repeated rows) is lowered as a fill nest that sets the output to 0 and parts that add
into it, atomically on CUDA; an epilogue after it cannot fuse into any one part's stores
(``schedules.epilogue``) and is a pass of its own over the output. When that epilogue only
adds a term that does not read the output, ``C[i, k] = C[i, k] + t(i, k)`` (a bias), the
sum may as well start from ``t``: the fill stores ``t`` instead of 0 and the epilogue's pass
is gone -- RGCN's bias costs nothing. A part that owns its rows (hyb's narrow buckets: the
fill then matters only for rows no part covers) starts them from the term instead of 0.
Exact by associativity up to the order of the float additions, which atomics leave
unspecified anyway.
"""
from __future__ import annotations

from dataclasses import replace
from typing import List, Optional

from sparsec.expr import BinOp, Const, Expr, Load, Var, transform, walk

from .positions import LoopNest, PositionProgram


def fold_epilogues(prog: PositionProgram) -> PositionProgram:
    """``prog`` with every additive epilogue after a filled sum folded into its fill nest."""
    nests: List[LoopNest] = list(prog.nests)
    e = 1
    while e < len(nests):
        folded = _fold(nests, e)
        if folded is None:
            e += 1
            continue
        f, fill = folded
        nests[f] = fill
        del nests[e]
    return replace(prog, nests=nests)


def _fold(nests: List[LoopNest], e: int) -> Optional[tuple]:
    """(index of the fill nest, the fill storing the epilogue's term) when nest ``e`` is an
    additive epilogue of the filled sum just before it, else None."""
    epi, prev = nests[e], nests[e - 1]
    if not epi.dense or epi.reduce is not None or prev.dense or prev.reduce != "sum":
        return None
    term = _added_term(epi)
    if term is None:
        return None
    producers = [(n, p) for n, p in enumerate(nests[:e]) if p.origin == prev.origin]
    fills = [(n, p) for n, p in producers if p.fill]
    if len(fills) != 1 or any(p.target.buffer != epi.target.buffer for _, p in producers):
        return None
    f, fill = fills[0]
    if not (isinstance(fill.value, Const) and fill.value.value == 0) or not _plain_index(fill.target):
        return None
    owners = [(n, p) for n, p in producers if not p.fill and p.init]
    if any(p.init_value is not None or p.reduce != "sum" for _, p in owners):
        return None
    for n, p in owners:  # a part owning its rows starts them from the term, not from 0
        nests[n] = replace(p, init_value=_at(term, epi.target, p.target))
    return f, replace(fill, value=_at(term, epi.target, fill.target))


def _at(term: Expr, epi_target: Load, target: Load) -> Expr:
    """``term`` (in the epilogue's iterators) at the element a nest's ``target`` writes."""
    names = {a.name: b for a, b in zip(epi_target.index, target.index)}
    return transform(term, lambda x: names.get(x.name) if isinstance(x, Var) else None)


def _added_term(epi: LoopNest) -> Optional[Expr]:
    """``t`` when the epilogue is ``C[idx] = C[idx] + t`` (or ``t + C[idx]``) with idx its loop
    iterators, each once (every element rewritten once), and t not reading C."""
    tgt = epi.target
    if not _plain_index(tgt):
        return None
    loop_vars = sorted(f"v_{b.loop.name}" for blk in epi.blocks for b in blk)
    if sorted(i.name for i in tgt.index) != loop_vars:
        return None
    v = epi.value
    if not isinstance(v, BinOp) or v.op != "+":
        return None
    for same, term in ((v.a, v.b), (v.b, v.a)):
        if _is_target(same, tgt) and not any(isinstance(n, Load) and n.buffer == tgt.buffer for n in walk(term)):
            return term
    return None


def _plain_index(load: Load) -> bool:
    names = [i.name for i in load.index if isinstance(i, Var)]
    return len(names) == len(load.index) and len(set(names)) == len(names)


def _is_target(x: Expr, tgt: Load) -> bool:
    return (isinstance(x, Load) and x.buffer == tgt.buffer and len(x.index) == len(tgt.index)
            and all(isinstance(a, Var) and a.name == b.name for a, b in zip(x.index, tgt.index)))
