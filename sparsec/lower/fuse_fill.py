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
ends the process's CUDA context) rather than hang or add into an unfilled row. That is one
more reason the fusion is off by default.
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

# Off by default, for now. Measured on an H200 (benchmarks/results/rgcn_fill_H200.json,
# rgcn_bias R = 16 + root, bias in the fill; this tree: "session18.v6_one_protocol_copy"),
# the fused kernel is as correct as the two launches (check_axis_trees 56/56) but up to 9 %
# slower per layer (mdual 64x64 1.07x, 64x16 1.02x; R-MAT s18 64x64 1.02x, 64x16 1.09x the
# two launches), and RGCN's forward pass with it ran at 3.01x / 3.01x the fastest peer
# (2.81x-3.02x over five runs of this and close variants), against 3.15x / 3.17x with two
# launches on the same machine: too thin a margin, and 5 % of every user's forward pass.
# ``benchmarks/time_rgcn_fill.py`` compares both builds; set this True before compiling (or
# SPARSEC_FUSE_FILL=1 in the environment, for whole scripts such as examples/rgcn.py) to
# make every contraction that fits one launch.
ENABLED = os.environ.get("SPARSEC_FUSE_FILL", "0") == "1"


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
