"""Default CUDA schedule: rows to thread blocks, the feature dimension over threads.

Three shapes of loop nest occur, told apart by the operator's dense (feature) loop:

* spatial feature loop (SpMM): each thread owns ``vec`` consecutive features of a row
  and accumulates them in registers over the row's stored entries; rows_per_block
  rows share a thread block (threadIdx.y).
* reduction feature loop (SDDMM): the lanes of a warp split the dot product of each
  stored entry and combine it with a warp all-reduce.
* no feature loop (row-wise operators): one thread per row.

A dense nest (a dense iteration: no sparse structure) reuses these mappings
(``dense_over_threads``).
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

from .atomics import atomic_writeback, mark_atomic
from .epilogue import fuse_epilogues
from .fusion import fuse_parts
from .widen import widen_accumulators
from .cuda_sddmm import is_fused, lane_groups
from .knobs import Knob, Transformation, check_applicable, group, transformation
from .loops import has_dynamic_reduction, inner_block, root_block
from .tvm_modules import s_tir, tvm

MAX_THREADS = 1024
AUTO_THREADS = 128
WARP = 32


def _feature(nest):
    dense = [b for b in nest.blocks[-1] if b.loop.role == "dense"]
    return dense[-1] if dense else None


def _thread_loops(nest):
    """The statement block's trailing spatial dense loops that the threads of a row share: the
    feature loop, and before it the spatial dense loops of constant extent whose iterators index
    the output's trailing axes in the same order (heads then features, ``C[i, h, f]``), so that
    fused they run over contiguous elements. Why: spreading only the features over threads
    leaves each thread a serial loop over the heads."""
    from sparsec.expr import Var

    own = [b for b in nest.blocks[-1] if b.loop.role != "root"]
    tail = []
    for b in reversed(own):
        if b.loop.role != "dense" or b.loop.kind != "S" or not isinstance(b.loop.extent, int):
            break
        tail.insert(0, b)
    index = list(getattr(nest.target, "index", ()))
    while len(tail) > 1:
        names = [e.name if isinstance(e, Var) else None for e in index[-len(tail):]]
        if len(index) >= len(tail) and names == [f"v_{b.loop.name}" for b in tail]:
            break
        tail.pop(0)
    return tail


def _feature_width(nest) -> int:
    """Elements of a row that ``features_over_threads`` spreads over its threads."""
    loops = _thread_loops(nest)
    return int(np.prod([b.loop.extent for b in loops])) if loops else _feature(nest).loop.extent


def _bind_root(sch, nest, per_block: int, tag: str, coarsen: int = 1, interleave: bool = False):
    """Rows to thread blocks: ``per_block`` rows side by side (``tag``), ``coarsen`` such
    groups in each block, one after another or, with ``interleave``, unrolled so that the
    groups' loads are in flight together (a chain of ``coarsen`` memory latencies becomes one)."""
    root = sch.get_loops(root_block(sch, nest))[0]
    if coarsen > 1:
        bx, c, t = sch.split(root, [None, coarsen, per_block])
        if interleave:
            sch.unroll(c)
    else:
        bx, t = sch.split(root, [None, per_block])
    sch.bind(bx, "blockIdx.x")
    sch.bind(t, tag)


FIXED, DYNAMIC, BLOCKS = "fixed", "dynamic", "blocks"  # row shapes (features_over_threads.shape)
MAX_COARSEN = 32  # row groups a block takes at most (fixed-width rows)


def row_shape(nest) -> str:
    """How a nest's rows run, which decides the knobs that take effect on it:

    * ``fixed``: every entry loop has a constant extent (ELL, hyb's buckets, a fill nest
      with no entries): the entries are unrolled fully, and a block takes
      ``slots_per_block`` slots' worth of rows (``slots_per_block``, ``interleave``);
    * ``dynamic``: the innermost entry loop has a data-dependent extent (CSR), unrolled
      ``unroll`` times;
    * ``blocks``: neither (BSR: a data-dependent count of blocks whose inner loops are
      constant, unrolled fully; a nest that does not accumulate).
    """
    from sparsec.expr import Const

    own_ir = [b for b in nest.blocks[-1][:-1] if b.loop.role != "root"]
    if _fixed_width(own_ir) is not None and nest.blocks[0][0].loop.role == "root":
        return FIXED
    entries = [b for b in own_ir if b.loop.kind == "R"]
    accumulates = nest.reduce is not None and (nest.init or nest.atomic)
    if accumulates and entries and not isinstance(entries[-1].extent, Const):
        return DYNAMIC
    return BLOCKS


def resolve_rows(feat: int, knobs, width=None) -> dict:
    """What ``features_over_threads`` makes of its knobs (defaults for those not given) at
    feature width ``feat``: the feature slices (``feat_tiles``, 1 unless it divides feat),
    the vector width (1 unless it divides a slice), ``threads_per_row`` (at most 256;
    ``serial`` chunks of features beyond run one after another), ``rows_per_block``
    ("auto": blocks of about 128 threads; at most 1024 threads a block) and, for rows of
    fixed ``width``, ``coarsen``: the row groups a block takes."""
    k = {**features_over_threads.defaults(), **knobs}
    tiles = k["feat_tiles"] if feat % k["feat_tiles"] == 0 else 1
    F = feat // tiles
    vec = k["vec"] if F % k["vec"] == 0 else 1
    tx = F // vec
    serial = 1
    while tx > 256 and tx % 2 == 0:  # keep thread blocks modest; extra features run serially
        tx //= 2
        serial *= 2
    rows_per_block = k["rows_per_block"]
    if rows_per_block == "auto":  # about 128 threads a block: measured best on H200 graphs at F = 32..512
        rows_per_block = max(1, min(16, AUTO_THREADS // tx))
    rows_per_block = max(1, min(rows_per_block, MAX_THREADS // tx))
    coarsen = 1
    if width is not None:
        coarsen = max(1, min(MAX_COARSEN, k["slots_per_block"] // (rows_per_block * width)))
    return {"feat_tiles": tiles, "vec": vec, "threads_per_row": tx, "serial": serial,
            "rows_per_block": rows_per_block, "coarsen": coarsen}


def _resolve_nest(nest, knobs) -> dict:
    return resolve_rows(_feature_width(nest), knobs)


def _prune(nest, knobs):
    """Why a combination of the knobs that apply to ``nest`` is no distinct kernel, or None."""
    feat = _feature_width(nest)
    k = {**features_over_threads.defaults(), **knobs}
    if feat % k["feat_tiles"]:
        return "feat_tiles does not divide the feature width"
    if (feat // k["feat_tiles"]) % k["vec"]:
        return "vec does not divide the feature width"
    r = resolve_rows(feat, k)
    if k["rows_per_block"] != "auto" and int(k["rows_per_block"]) * r["threads_per_row"] > MAX_THREADS:
        return f"more than {MAX_THREADS} threads a block"
    if "interleave" in knobs and knobs["interleave"] == 0 and k["slots_per_block"] <= r["rows_per_block"]:
        return "interleave without coarsening"
    return None


@transformation(knobs={
    "rows_per_block": Knob(("auto", 1, 2, 4, 8, 16), search={FIXED: ("auto", 1, 2, 4)},
                           small={DYNAMIC: ("auto", 1, 2, 4, 8), FIXED: ("auto", 1), BLOCKS: ("auto", 1)}),
    "vec": Knob((4, 1, 2), search=(4, 2, 1), small=(4,)),
    # fixed-width rows: 256..1024 slots never came within 3 % of the best on the H200 graphs
    # log (784 measurements, 49 cases) and were the slowest to build
    "slots_per_block": Knob((64, 32, 128, 256, 512, 1024), shapes=(FIXED,), search=(64, 128), small=(64, 512)),
    "unroll": Knob((2, 1, 4, 8), shapes=(DYNAMIC,), search=(1, 2, 4, 8), small=(1, 2, 4)),
    "interleave": Knob((1, 0), shapes=(FIXED,), small=(1, 0)),
    "feat_tiles": Knob((1, 2, 4, 8), omit_default=True),  # came after the first logs
}, shape=row_shape, resolve=_resolve_nest, prune=_prune)
def features_over_threads(sch: s_tir.Schedule, nest, *, rows_per_block: int, vec: int, slots_per_block: int,
                          unroll: int, interleave: int, feat_tiles: int):
    """SpMM-like nests. Requires: the statement block's last loop is a spatial dense axis.

    Before: for i: for p in row_len: for k in F: C[i, k] += A[p] * B[col[p], k]
    After:  for bx (blockIdx.x): for c (coarsen): for ty (threadIdx.y, rows_per_block):
              for tx (threadIdx.x, F / vec): acc[vec] = 0
                for p in row_len (unrolled): acc[0:vec] += A[p] * B[col[p], tx * vec : tx * vec + vec]
                C[i, tx * vec : tx * vec + vec] = acc      (vector load of B, vector store of C)

    ``vec`` features per thread give 128-bit loads and stores; several rows share a warp when
    F / vec < 32 (sub-warp rows); ``rows_per_block="auto"`` makes blocks of about 128 threads.
    A row of fixed width w (ELL, hyb's buckets) has its entry loop unrolled fully and a block
    takes ``slots_per_block / w`` rows (coarsening over groups of ``rows_per_block``, unrolled
    with ``interleave`` so that the groups' gathers overlap), so narrow buckets do not launch
    swarms of tiny blocks; a row of data-dependent length has its entry loop unrolled
    ``unroll`` times (:func:`row_shape`; :func:`resolve_rows` turns the knobs into numbers).

    ``feat_tiles`` > 1 cuts the features into that many slices on ``blockIdx.y``. The grid
    runs every row block of the first slice before the next slice, so the rows of B being
    gathered at any moment are ``F / feat_tiles`` wide: on a wide F whose B outgrows the L2
    cache the slice may still fit. The cost is each row's indices read once per slice.
    """
    own_ir = [b for b in nest.blocks[-1][:-1] if b.loop.role != "root"]
    width = _fixed_width(own_ir) if row_shape(nest) == FIXED else None
    r = resolve_rows(_feature_width(nest), {"rows_per_block": rows_per_block, "vec": vec,
                                             "slots_per_block": slots_per_block, "feat_tiles": feat_tiles},
                     width)
    feat_tiles, vec, tx, serial = r["feat_tiles"], r["vec"], r["threads_per_row"], r["serial"]
    rows_per_block, coarsen = r["rows_per_block"], r["coarsen"]
    blk = inner_block(sch, nest)
    loops = sch.get_loops(blk)
    extra = len(_thread_loops(nest)) - 1
    if extra > 0:  # heads and features: one loop over the row's contiguous output elements
        sch.fuse(*loops[-1 - extra:])
        own_ir = own_ir[:-extra]
        loops = sch.get_loops(blk)
    k = loops[-1]
    k_f, k_s, k_t, k_v = sch.split(k, [feat_tiles, serial, tx, vec])
    # the statement block's other loops (not the row loop, which stays outermost)
    own = loops[len(loops) - 1 - len(own_ir):-1]
    # Serial feature chunks (F / vec > 256) go outside the row's entry loop, each with its own
    # vec accumulators written back after it: with the chunks inside, a thread's accumulators
    # sit tx * vec apart in C, and the write-back TVM derives covers the whole span between
    # them -- other threads' outputs (wrong results at F >= 2048, measured on the H200).
    if serial > 1:
        sch.reorder(k_f, k_t, k_s, *own, k_v)
    else:
        sch.reorder(k_f, k_t, *own, k_s, k_v)
    sch.bind(k_t, "threadIdx.x")
    if feat_tiles > 1:
        sch.bind(k_f, "blockIdx.y")
    accumulates = nest.reduce is not None and (nest.init or nest.atomic)
    # vector stores need the features contiguous in the output: not in a transposed one (T[k, i])
    contiguous = _features_last(nest)
    if accumulates:
        acc = sch.cache_write(blk, 0, "local")
        sch.reverse_compute_at(acc, k_s if serial > 1 else k_t)
        if nest.atomic:  # rows repeat: the write-back adds into the filled output (schedules.atomics)
            mark_atomic(sch, acc)
        elif vec > 1 and contiguous:
            sch.vectorize(sch.get_loops(acc)[-1])
        if has_dynamic_reduction(nest, cuda=True):
            kinds = [b.loop.kind for b in own_ir]
            first_r = next(rv for rv, kind in zip(own, kinds) if kind == "R")
            sch.decompose_reduction(blk, first_r)
    # an add into memory (parts) stays scalar; so does a store into a transposed output
    if vec > 1 and (accumulates or (nest.reduce is None and contiguous)):
        sch.vectorize(k_v)
    if accumulates:
        _unroll_entries(sch, own, own_ir, unroll)
    _bind_root(sch, nest, rows_per_block, "threadIdx.y", coarsen, bool(interleave))


def _features_last(nest) -> bool:
    """The output's last index is the feature loop's iterator: a thread's ``vec`` features are
    consecutive in memory (``C[i, k]``), not a row apart (``T[k, i]``)."""
    from sparsec.expr import Var

    last = nest.target.index[-1] if nest.target.index else None
    return isinstance(last, Var) and last.name == f"v_{_feature(nest).loop.name}"


def _fixed_width(own_ir):
    """Stored entries per row when every reduction loop has a constant extent, else None."""
    from sparsec.expr import Const

    width = 1
    for b in own_ir:
        if b.loop.kind != "R":
            continue
        if not isinstance(b.extent, Const):
            return None
        width *= int(b.extent.value)
    return width


def _unroll_entries(sch, own, own_ir, unroll: int):
    """Unroll the innermost reduction loop over stored entries: fully when its extent is a
    small constant, else by ``unroll`` (independent loads in flight)."""
    from sparsec.expr import Const

    pairs = [(rv, b) for rv, b in zip(own, own_ir) if b.loop.kind == "R"]
    if not pairs:
        return
    rv, b = pairs[-1]
    if isinstance(b.extent, Const):
        if int(b.extent.value) <= 64:
            sch.unroll(rv)
    elif unroll > 1:
        _, inner = sch.split(rv, [None, unroll])
        sch.unroll(inner)


@transformation(knobs={"threads_per_block": (64, 32, 128, 256)})
def rows_over_threads(sch: s_tir.Schedule, nest, *, threads_per_block: int):
    """Row-wise nests with no feature loop: one thread per (block) row."""
    if has_dynamic_reduction(nest, cuda=True):
        from .loops import first_reduce_loop

        sch.decompose_reduction(inner_block(sch, nest), first_reduce_loop(sch, nest))
    _bind_root(sch, nest, threads_per_block, "threadIdx.x")


@transformation(knobs={"rows_per_block": (4, 1, 2, 8)})
def row_reduce_over_lanes(sch: s_tir.Schedule, nest, *, rows_per_block: int):
    """Row reductions with no feature loop (row sums, a softmax's max and sum): a warp per
    row, its stored entries spread over the 32 lanes and combined with warp shuffles. Faster
    than a thread per row on long rows, and the tree combines fewer terms in sequence.

    Requires: the statement block initialises its output (T.init) and has a reduction loop.
    Before: for i: for p in row_len: y[i] += A[p]
    After:  for bx: for ty (rows_per_block): for po in ceil(row_len / 32): for lane (threadIdx.x, 32):
              partial += A[p] -> warp all-reduce -> y[i]
    """
    blk = inner_block(sch, nest)
    loops = sch.get_loops(blk)
    own_ir = [b for b in nest.blocks[-1] if b.loop.role != "root"]
    own = loops[len(loops) - len(own_ir):]
    spatial = [rv for rv, b in zip(own, own_ir) if b.loop.kind == "S"]
    reduce = [rv for rv, b in zip(own, own_ir) if b.loop.kind == "R"]
    r_o, r_l = sch.split(reduce[0], [None, WARP])
    sch.reorder(*spatial, r_o, *reduce[1:], r_l)  # spatial loops outside, the lane loop innermost
    sch.bind(r_l, "threadIdx.x")
    _bind_root(sch, nest, rows_per_block, "threadIdx.y")


def _dense_inner(nest):
    return nest.blocks[-1][-1] if len(nest.blocks) > 1 else None


@transformation()
def dense_over_threads(sch: s_tir.Schedule, nest):
    """Dense nests (``LoopNest.dense``: loops over coordinates, no sparse structure): the first
    loop over thread blocks, the inner loops mapped like a sparse row's, so the sparse
    templates serve them at their defaults (no knobs of its own: the nest is one pass over a
    dense array, and an epilogue usually disappears into the sparse nest's launch,
    ``schedules.epilogue``):

    * innermost loop spatial (bias + ReLU over [I, K], ``H = X @ W`` over [J, F, G]): the
      features over threadIdx.x, ``vec`` at a time, rows over threadIdx.y and blocks,
      reduction loops in between per thread in registers (``features_over_threads``);
    * innermost loop a reduction (``n[i] += C[i, k] * C[i, k]``): a warp per row, the lanes
      splitting it (``row_reduce_over_lanes``);
    * no inner loop, or one over the matrix's rows or columns (a run-time extent): a thread
      per row (``rows_over_threads``).

    Requires: the first loop is spatial (its iterations run concurrently); a reduction over
    it is refused, naming what to write instead."""
    root = nest.blocks[0][0].loop
    if root.kind != "S":
        spatial = [b.loop.name for blk in nest.blocks for b in blk if b.loop.kind == "S"]
        hint = (f"iterate [{spatial[0]}, {root.name}, ...] with the spatial axis first" if spatial else
                "give the result a spatial axis to run over")
        raise ValueError(f"{nest.origin or nest.name}: a dense iteration that reduces over its first axis "
                         f"{root.name} has no spatial loop to spread over CUDA thread blocks; {hint}")
    inner = _dense_inner(nest)
    if inner is None or inner.loop.extent is None:  # no inner loop, or one over rows/cols: serial per row
        rows_over_threads.fn(sch, nest, **rows_over_threads.defaults())
    elif inner.loop.kind == "S":
        features_over_threads.fn(sch, nest, **features_over_threads.defaults())
    else:
        row_reduce_over_lanes.fn(sch, nest, **row_reduce_over_lanes.defaults())


def template_for(nest):
    """The transformation that fits a nest (decided by its feature loop; a dense nest, with
    no sparse structure, by ``dense_over_threads``)."""
    if nest.template == "segment_contract":
        return segment_contract_kernel
    if nest.dense:
        return dense_over_threads
    feat = _feature(nest)
    if nest.scatter or (feat is not None and feat.loop.extent is None):
        # rows add into outputs indexed by their entries' columns (atomics per entry), or the
        # innermost loop runs over rows / columns (a run-time extent): a thread per row
        return rows_over_threads
    if feat is None:
        if nest.reduce is not None and nest.init and not nest.fill:
            return row_reduce_over_lanes
        return rows_over_threads
    if feat.loop.kind == "S":
        return features_over_threads
    others = [b.loop for b in nest.blocks[-1] if b.loop.role != "root" and b.loop is not feat.loop]
    if all(l.kind == "S" for l in others):
        return lane_groups
    # a reduction over the entries and over a dense axis with the feature loop reduced too
    # (W[E[i, j], g, f] * X[j, f] summed over j and f): no lane template fits; a thread per row
    return rows_over_threads


@transformation()
def segment_contract_kernel(sch: s_tir.Schedule, nest):
    """Nests the emitter wrote as a whole kernel (``schedules.segment_contract``): its loops
    are bound already, nothing to do."""


def _fused_by(nest, step) -> bool:
    """True when ``lane_groups``, scheduling ``step``'s nest, moves ``nest`` into its kernel
    (``cuda_sddmm.fuse_scale_epilogue``): an element-wise nest with no reduction that rewrites
    the reduction's output in place (SDDMM's scale; per head, the multi-head SDDMM's)."""
    dot, t = step
    feat = _feature(nest)
    return (t is lane_groups and (feat is None or feat.loop.kind == "S") and nest.reduce is None
            and not nest.fill and nest.part == dot.part and nest.target.buffer == dot.target.buffer)


def plan(program) -> List[Tuple[object, Optional[Transformation]]]:
    """(nest, transformation) for every nest of ``program`` in order; None for a nest that
    an earlier nest's transformation takes into its own kernel (each reduction takes the
    first such nest). What the knobs check and the tuner's space read, without a schedule."""
    steps: list = []
    taken = set()
    for nest in program.nests:
        t = template_for(nest)
        if t is rows_over_threads or t is features_over_threads:
            owner = next((i for i, s in enumerate(steps) if i not in taken and _fused_by(nest, s)), None)
            if owner is not None:
                taken.add(owner)
                t = None
        steps.append((nest, t))
    return steps


def default_cuda(sch: s_tir.Schedule, program, **knobs) -> dict:
    """Apply each nest's template with its defaults overridden by ``knobs``; returns the knobs
    that took effect. A knob no template applied here takes is a ValueError."""
    steps = plan(program)
    check_applicable(knobs, [(t, shapes) for t, shapes, _ in group(steps)], f"{program.name} on cuda")
    used = {}
    for nest, t in steps:
        if t is None:
            if not is_fused(sch, nest):  # the fusion was left undone: a kernel of its own
                template_for(nest)(sch, nest)
            continue
        used.update(t(sch, nest, **{k: v for k, v in knobs.items() if k in t.knobs}))
    return used


def finalize_cuda(mod, program):
    """Module-level rewrites after the per-nest templates: atomic write-backs for nests whose
    rows repeat, dense epilogues folded into the launch of the sparse nest they follow
    (``schedules.epilogue``), horizontal fusion of a composite's parts into one launch, then
    the register accumulators of float16/bfloat16 outputs made float32 (``schedules.widen``:
    last, so that the rewrites before it see the write-backs they match on)."""
    (gv, func), = mod.functions.items()
    fused = fuse_parts(fuse_epilogues(atomic_writeback(func), program), program)
    return tvm.IRModule({gv: widen_accumulators(fused)})
