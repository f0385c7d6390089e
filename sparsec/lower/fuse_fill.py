"""A segment contraction's output fill runs inside the contraction's own launch (CUDA).

A sum whose rows are shared (RGCN's stacked relations adding into one output row) is lowered
as a fill nest, which sets the output to its start value (0, or the bias that
``fold_epilogue`` moved there), and a contraction that adds into it atomically. As two
kernels that is two launches per call. Neither kernel can simply do the other's work: the
contraction's blocks add into rows that other blocks own, and hub rows are split over
several blocks (``schedules.segment_contract``), so no block can tell when a row may be set.

Here the fill becomes the contraction's *prologue*: the kernel hands out work items by an
atomic ticket, the first ones fill the output and count themselves done, and a block waits
for that count only before its first atomic add. A block waits only for items handed out
before its own, to blocks that are already running and wait for nothing, so the launch
cannot deadlock whatever the hardware schedules. The counters live in a small workspace
parameter (``ir_attrs.TICKETS``) that the last block to finish sets back to zero.
"""
from __future__ import annotations

from dataclasses import replace

from sparsec.expr import Const
from sparsec.ir_attrs import TICKETS, TICKETS_LEN
from sparsec.schedules import segment_contract

from .flatten import BufferDecl, FlatProgram
from .positions import LoopNest


def fuse_fills(flat: FlatProgram) -> FlatProgram:
    """``flat`` with every fill nest whose output only segment contractions add into (the
    nests right after it, from its DSL iteration: one per composite part) made the prologue
    of each of them, and the fill nest gone (one launch fewer; the parts share the fill's
    counters, ``schedules.segment_contract``)."""
    nests = list(flat.nests)
    fused = False
    i = 0
    while i < len(nests):
        fill = nests[i]
        group = []
        for nest in nests[i + 1:]:
            if nest.origin != fill.origin or nest.target.buffer != fill.target.buffer:
                break
            group.append(nest)
        if fill.fill and group and _fill_fits(fill) and all(_adds_by_contraction(n, flat) for n in group):
            nests[i + 1:i + 1 + len(group)] = [replace(n, prologue=fill) for n in group]
            del nests[i]
            fused = True
        i += 1
    flat.nests = nests
    if fused and all(b.name != TICKETS for b in flat.buffers):
        flat.buffers = list(flat.buffers) + [BufferDecl(TICKETS, (Const(TICKETS_LEN),), "int32", "index")]
    return flat


def _fill_fits(fill: LoopNest) -> bool:
    """Rows (one run-time extent, the outermost loop) x compile-time extents, no guard."""
    loops = [b for blk in fill.blocks for b in blk]
    return fill.write_guard is None and all(isinstance(b.extent, Const) for b in loops[1:])


def _adds_by_contraction(nest: LoopNest, flat: FlatProgram) -> bool:
    if nest.template != "segment_contract" or nest.prologue is not None:
        return False
    c = segment_contract.match(nest, flat)
    return c is not None and c.atomic
