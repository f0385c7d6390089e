"""Which kernel runs a float16 BSR SpMM at few columns of B when no knob names one: the
regions where ``bsr_gather``, ``bsr_ring``, ``bsr_stream`` or the block-row template
(``schedules.tensorcore``) was measured fastest on the H200, read off the matrix a kernel is
compiled for (shape, stored share) and the target (thread-block clusters). A knob only one
kernel has names that kernel. ``m`` is ``tensorcore_packed.match``'s ``PackedSpmm``.
"""
from __future__ import annotations

from . import bsr_gather, bsr_ring, bsr_stream

# where the few-column kernels beat the block-row template (H200, benchmarks/results/
# bsr_small_feat_stream_H200.json, bsr_small_feat_ring_H200.json): a matrix with at least this share
# of its blocks stored and this many columns; sparser or shorter rows are a few blocks each,
# and the block-row template's shorter prologue wins
BSR_STREAM_MIN_DENSITY = 0.2
BSR_STREAM_MIN_COLS = 1024


GATHER_ONLY = set(bsr_gather.KNOBS) - set(bsr_ring.KNOBS) - set(bsr_stream.KNOBS)  # knobs that name it


# where bsr_gather is the default: few columns of B on a matrix of short rows (under
# BSR_STREAM_MIN_COLS columns, where the block-row template was the default). H200, MiniLM's
# 384-column weights at 16 columns: 1.05-1.40x dense over 18 cases, the block-row template
# 0.95-1.36x beside it (results/bsr_small_feat_H200.json). At 64 columns it lost to the
# template in most until its warps' partial tiles were padded off the shared-memory banks
# (results/bsr_small_feat_gather_H200.json); padded, its defaults beat the template's in 6 of
# 7 of MiniLM's FFN-in and attention-Q cases with 16- and 32-row blocks at 70 and 90 %
# (0.83-1.10x dense against 0.74-0.97x, one run, results/bsr_small_feat_gather64_H200.json).
# 64-row blocks at 64 columns hold more accumulator tiles than it takes: the template's.
GATHER_MAX_FEAT = bsr_gather.MAX_FEAT


def gathers(m, knobs=None) -> bool:
    """``bsr_gather`` builds this BSR SpMM: a knob only it has is given; or no knob is, the
    kernel takes the block shape and width, the width is at most GATHER_MAX_FEAT, and the
    matrix compiled for (sm_90 on, where it was timed) has rows shorter than
    BSR_STREAM_MIN_COLS columns."""
    given = set(knobs or {})
    if given:
        return bool(given & GATHER_ONLY)
    return (m.layout == "bsr_blocks" and m.clusters and m.sized_for is not None and m.feat <= GATHER_MAX_FEAT
            and m.sized_for[1] < BSR_STREAM_MIN_COLS and bsr_gather.takes(m.tile, m.feat))


# where bsr_stream (B's rows resident, shared by a CTA's block rows) beats bsr_ring (B's rows
# gathered for each block, as many bytes as a 16 x 16 block at 16 columns): tiny blocks, few
# columns, many block rows (H200: 4096^2, 16 x 16, 70 %, 16 columns: 9.6 vs 11.7 us; at 24-64
# block rows bsr_ring won, results/bsr_small_feat_ring_H200.json)
STREAM_TINY_BLOCK, STREAM_MAX_FEAT_TINY, STREAM_MIN_BLOCK_ROWS = 256, 16, 128


def rings(m, knobs=None) -> bool:
    """``bsr_ring`` takes this BSR SpMM: its block shape, a multiple of 8 columns of B up to
    64, no knob only ``bsr_stream`` has (``nb``, ``bk``) given, and not a matrix of many
    block rows of tiny blocks at few columns (``bsr_stream``'s own region)."""
    given = set(knobs or {})
    if given & (set(bsr_stream.KNOBS) - set(bsr_ring.KNOBS)) or not bsr_ring.takes(m.tile, m.feat):
        return False
    if given & (set(bsr_ring.KNOBS) - set(bsr_stream.KNOBS)):
        return True  # a knob only bsr_ring has
    r, c = m.tile
    tiny = r * c <= STREAM_TINY_BLOCK and m.feat <= STREAM_MAX_FEAT_TINY
    many = m.sized_for is not None and m.sized_for[0] >= STREAM_MIN_BLOCK_ROWS * r
    return not (tiny and many)


def defers(m, knobs=None) -> bool:
    """True where the block-row BSR template (``schedules.tensorcore``) runs a program the
    few-column kernels (``bsr_gather``, ``bsr_ring``, ``bsr_stream``) could take: its knobs
    (n_tile, k_split, ...) are given; or none of theirs is, ``bsr_gather``'s region (above)
    does not hold, and the matrix compiled for (if any) is sparser or narrower than where
    they win (a format spec alone, or an arch without thread-block clusters: the block-row
    template too). On the H200's blocks suite
    ``bsr_ring``'s ratio to dense beat ``bsr_stream``'s in 23 of 24 cases of that region and
    lost to the block-row template's in most outside it, whose fewer dependent steps win on
    short walks (results/bsr_small_feat_ring_H200.json against bsr_small_feat_stream_H200.json)."""
    if m.layout != "bsr_blocks":
        return False
    knobs = knobs or {}
    if set(knobs) - set(bsr_stream.KNOBS) - set(bsr_ring.KNOBS) - set(bsr_gather.KNOBS):
        return True
    if knobs:
        return False  # their knobs given: theirs, or a refusal that names the arch
    if gathers(m):
        return False
    if not m.clusters or m.sized_for is None or m.density is None:
        return True
    return m.density < BSR_STREAM_MIN_DENSITY or m.sized_for[1] < BSR_STREAM_MIN_COLS
