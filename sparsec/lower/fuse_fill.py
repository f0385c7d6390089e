"""A segment contraction's output fill runs in the contraction's own launch (CUDA).

A sum whose output rows several root positions share (RGCN's stacked relations adding into
one node's row) is lowered as a fill nest, which sets the output to its start value (0, or
the bias ``fold_epilogue`` moved there), and a contraction that adds into it atomically: two
launches. Here the fill becomes the contraction's *prologue*, and the kernel's thread blocks
order themselves through a small workspace parameter (``ir_attrs.SYNC_PREFIX``): the first
block to reach a group of output rows in a call fills it, and a block adds into rows only
once their group is filled (``schedules.segment_contract``). Where the rows are not a plain
function of the root position (hyb's buckets reach theirs through a row map) or several
parts add into the output, the fill keeps its own launch.

The workspace's counts say which call a launch is, so calls on one matrix must run one after
another: two launches of such a kernel on one matrix instance on different streams at once
would mix their counts. A block that waits for a fill longer than
``segment_contract.SPIN_LIMIT`` polls stops the launch with ``__trap`` (a CUDA error that
ends the process's CUDA context) rather than hang or add into an unfilled row.
``SPARSEC_FUSE_FILL=0`` (or ``ENABLED = False`` before compiling) keeps the fill a launch of
its own.
"""
from __future__ import annotations

import os
from dataclasses import replace
from typing import Optional

from sparsec.expr import Var
from sparsec.ir_attrs import SYNC_PREFIX
from sparsec.schedules import segment_contract

from .flatten import BufferDecl, FlatProgram

SYNC_LEN = "n_sync"  # the workspace's length, bound from the array

# On by default since the contraction finds its runs by warp ballots (segment_contract.
# runs). Measured on an H200 (benchmarks/results/rgcn_fill_H200.json, key
# "session22"; rgcn_bias R = 16 + root, bias in the fill), fused / two launches per layer:
# mdual 64x64 1.01, 64x16 1.02, R-MAT s18 64x64 1.03, 64x16 0.85; RGCN's forward pass in one
# launch per layer ran at 3.96x (mdual) and 3.75x (R-MAT s18) the fastest peer
# (examples/rgcn.py --relations 16). Before that change the fused build cost up to 9 % a
# layer and its forward pass sat at 3.01x, so it was off. ``benchmarks/time_rgcn_fill.py``
# compares both builds; set this False before compiling (or SPARSEC_FUSE_FILL=0 in the
# environment) to give every fill a launch of its own, e.g. to run one matrix's kernels on
# several streams at once (above).
ENABLED = os.environ.get("SPARSEC_FUSE_FILL", "1") == "1"


def fuse_fills(flat: FlatProgram, splits: Optional[int] = None) -> FlatProgram:
    """``flat`` with every fill nest that exactly one segment contraction adds into (the nest
    right after it, from the same DSL iteration) made that contraction's prologue, and the
    workspace parameter added. ``splits``: the matrix's split count (``segment_splits``)."""
    nests = list(flat.nests)
    names = []
    i = 0
    while i + 1 < len(nests):
        fill, nest = nests[i], nests[i + 1]
        later = nests[i + 2] if i + 2 < len(nests) else None
        shared = later is not None and later.origin == fill.origin and later.target.buffer == fill.target.buffer
        c = segment_contract.match(nest, flat) if nest.template == "segment_contract" else None
        if (fill.fill and not shared and c is not None and nest.origin == fill.origin
                and nest.target.buffer == fill.target.buffer and segment_contract.fuses_fill(c, fill)):
            nests[i:i + 2] = [replace(nest, prologue=fill)]
            names.append(SYNC_PREFIX + str(segment_contract.partition(c, splits).splits))
        i += 1
    flat.nests = nests
    have = {b.name for b in flat.buffers}
    for name in dict.fromkeys(names):
        if name not in have:
            flat.buffers = list(flat.buffers) + [BufferDecl(name, (Var(SYNC_LEN),), "int32", "index")]
    if names and SYNC_LEN not in flat.size_vars:
        flat.size_vars = list(flat.size_vars) + [SYNC_LEN]
    rank = {"index": 0, "input": 1, "output": 2, "temp": 3}
    flat.buffers = sorted(flat.buffers, key=lambda b: rank[b.role])  # index arrays first, as flatten orders them
    return flat
