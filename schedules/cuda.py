"""Default CUDA schedule: rows to thread blocks, the feature dimension over threads.

Three shapes of loop nest occur, told apart by the operator's dense (feature) loop:

* spatial feature loop (SpMM): each thread owns ``vec`` consecutive features of a row
  and accumulates them in registers over the row's stored entries; rows_per_block
  rows share a thread block (threadIdx.y).
* reduction feature loop (SDDMM): the lanes of a warp split the dot product of each
  stored entry and combine it with a warp all-reduce.
* no feature loop (row-wise operators): one thread per row.
"""
from __future__ import annotations

from tvm import s_tir

from .knobs import transformation
from .loops import has_dynamic_reduction, inner_block, root_block

MAX_THREADS = 1024
WARP = 32


def _feature(nest):
    dense = [b for b in nest.blocks[-1] if b.loop.role == "dense"]
    return dense[-1] if dense else None


def _bind_root(sch, nest, per_block: int, tag: str):
    root = sch.get_loops(root_block(sch, nest))[0]
    bx, t = sch.split(root, [None, per_block])
    sch.bind(bx, "blockIdx.x")
    sch.bind(t, tag)


@transformation(knobs={"rows_per_block": (4, 1, 2, 8, 16), "vec": (4, 1, 2)})
def features_over_threads(sch: s_tir.Schedule, nest, *, rows_per_block: int, vec: int):
    """SpMM-like nests. Requires: the statement block's last loop is a spatial dense axis.

    Before: for i: for p in row_len: for k in F: C[i, k] += A[p] * B[col[p], k]
    After:  for bx (blockIdx.x): for ty (threadIdx.y, rows_per_block):
              for tx (threadIdx.x, F / vec): acc[vec] = 0
                for p in row_len: for v in vec: acc[v] += A[p] * B[col[p], tx * vec + v]
                C[i, tx * vec : tx * vec + vec] = acc      (vectorised store)
    """
    feat = _feature(nest)
    F = feat.loop.extent
    vec = vec if F % vec == 0 else 1
    tx = F // vec
    serial = 1
    while tx > 256 and tx % 2 == 0:  # keep thread blocks modest; extra features run serially
        tx //= 2
        serial *= 2
    rows_per_block = max(1, min(rows_per_block, MAX_THREADS // tx))
    blk = inner_block(sch, nest)
    loops = sch.get_loops(blk)
    k = loops[-1]
    k_s, k_t, k_v = sch.split(k, [serial, tx, vec])
    # the statement block's other loops (not the row loop, which stays outermost)
    own_ir = [b for b in nest.blocks[-1][:-1] if b.loop.role != "root"]
    own = loops[len(loops) - 1 - len(own_ir):-1]
    sch.reorder(k_t, *own, k_s, k_v)
    sch.bind(k_t, "threadIdx.x")
    if nest.reduce is not None and nest.init:
        acc = sch.cache_write(blk, 0, "local")
        sch.reverse_compute_at(acc, k_t)
        if vec > 1 and serial == 1:  # with serial features the write-back loop is longer than a vector
            sch.vectorize(sch.get_loops(acc)[-1])
        if has_dynamic_reduction(nest):
            kinds = [b.loop.kind for b in own_ir]
            first_r = next(rv for rv, kind in zip(own, kinds) if kind == "R")
            sch.decompose_reduction(blk, first_r)
    elif vec > 1 and serial == 1 and nest.reduce is None:  # an add into memory (parts) stays scalar
        sch.vectorize(k_v)
    _bind_root(sch, nest, rows_per_block, "threadIdx.y")


@transformation(knobs={"rows_per_block": (4, 1, 2, 8)})
def reduce_over_lanes(sch: s_tir.Schedule, nest, *, rows_per_block: int):
    """SDDMM-like nests. Requires: the statement block's last loop is a reduction dense axis.

    Before: for i: for p in row_len: for k in F: O[p] += A[p] * X[i, k] * Y[k, col[p]]
    After:  for bx: for ty (rows_per_block): for p in row_len:
              for ko: for lane (threadIdx.x, 32): partial sums -> warp all-reduce -> O[p]
    """
    # Always a whole warp: TVM then reduces with warp shuffles. A group narrower than a warp
    # (e.g. 17 lanes for feat=17) makes TVM reduce through shared memory with __syncthreads
    # inside the row loop, whose trip count differs between rows of one block: a deadlock.
    blk = inner_block(sch, nest)
    k = sch.get_loops(blk)[-1]
    _, k_l = sch.split(k, [None, WARP])
    sch.bind(k_l, "threadIdx.x")
    _bind_root(sch, nest, rows_per_block, "threadIdx.y")


@transformation(knobs={"threads_per_block": (64, 32, 128, 256)})
def rows_over_threads(sch: s_tir.Schedule, nest, *, threads_per_block: int):
    """Row-wise nests with no feature loop: one thread per (block) row."""
    if has_dynamic_reduction(nest):
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


def template_for(nest):
    """The transformation that fits a nest (decided by its feature loop)."""
    feat = _feature(nest)
    if feat is None:
        if nest.reduce is not None and nest.init and not nest.fill:
            return row_reduce_over_lanes
        return rows_over_threads
    return features_over_threads if feat.loop.kind == "S" else reduce_over_lanes


def default_cuda(sch: s_tir.Schedule, program, **knobs) -> dict:
    """Apply each nest's template with its defaults overridden by ``knobs``; returns the knobs used."""
    used = {}
    for nest in program.nests:
        t = template_for(nest)
        mine = {k: v for k, v in knobs.items() if k in t.knobs}
        t(sch, nest, **mine)
        used.update({**t.defaults(), **mine})
    return used
