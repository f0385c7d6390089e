"""CUDA template for dense nests: loops over coordinates, no sparse structure.

A dense iteration (``lower.positions``: ``LoopNest.dense``) is an ordinary loop nest: the
first loop (rows, columns or a dense axis) goes to thread blocks, and its inner loops take
the shape of the sparse templates' rows, so the same mappings serve them:

* innermost loop spatial (bias + ReLU over [I, K], ``H = X @ W`` over [J, F, G]): the
  features over threadIdx.x, ``vec`` at a time (vector loads and stores), rows over
  threadIdx.y and blocks; reduction loops in between run in each thread, accumulated in
  registers (``features_over_threads`` at its defaults);
* innermost loop a reduction (a row norm ``n[i] += C[i, k] * C[i, k]``): a warp per row,
  the lanes splitting the reduction (``row_reduce_over_lanes``);
* no inner loop (``y[i] = y[i] / d[i]``), or an inner loop over the matrix's rows or
  columns (a run-time extent): a thread per row (``rows_over_threads``).

No knobs: the nest is cheap beside a sparse nest (one pass over a dense array), and when it
is an epilogue it usually disappears into the sparse nest's kernel (``schedules.epilogue``).
"""
from __future__ import annotations

from tvm import s_tir

from .knobs import transformation


def _inner(nest):
    return nest.blocks[-1][-1] if len(nest.blocks) > 1 else None


@transformation()
def dense_over_threads(sch: s_tir.Schedule, nest):
    """Dense nests: the first loop over thread blocks, the inner loops as a sparse row's
    (see the module docstring). Requires: the first loop is spatial (its iterations run
    concurrently); a reduction over it is refused, naming what to write instead."""
    from . import cuda

    root = nest.blocks[0][0].loop
    if root.kind != "S":
        spatial = [b.loop.name for blk in nest.blocks for b in blk if b.loop.kind == "S"]
        hint = (f"iterate [{spatial[0]}, {root.name}, ...] with the spatial axis first" if spatial else
                "give the result a spatial axis to run over")
        raise ValueError(f"{nest.origin or nest.name}: a dense iteration that reduces over its first axis "
                         f"{root.name} has no spatial loop to spread over CUDA thread blocks; {hint}")
    inner = _inner(nest)
    if inner is None or inner.loop.extent is None:  # no inner loop, or one over rows/cols: serial per row
        cuda.rows_over_threads.fn(sch, nest, **cuda.rows_over_threads.defaults())
    elif inner.loop.kind == "S":
        cuda.features_over_threads.fn(sch, nest, **cuda.features_over_threads.defaults())
    else:
        cuda.row_reduce_over_lanes.fn(sch, nest, **cuda.row_reduce_over_lanes.defaults())
