"""Default CPU (llvm) schedule: rows in parallel, reductions initialised outside their loops."""
from __future__ import annotations

from .knobs import Knob, check_applicable, group, transformation
from .loops import first_reduce_loop, has_dynamic_reduction, inner_block, root_block
from .tvm_modules import s_tir, tvm
from .widen import NARROW, widen_accumulators, widen_outputs

DISTINCT_ROWS, SHARED_ROWS = "distinct_rows", "shared_rows"  # parallel_rows' shapes


def row_kind(nest) -> str:
    """``distinct_rows`` when the root (row) loop is spatial and never repeats a row (it may
    run in parallel), else ``shared_rows``."""
    return DISTINCT_ROWS if nest.blocks[0][0].loop.kind == "S" and not nest.atomic else SHARED_ROWS


@transformation(knobs={"parallel": Knob((True, False), shapes=(DISTINCT_ROWS,))}, shape=row_kind)
def parallel_rows(sch: s_tir.Schedule, nest, *, parallel: bool):
    """Run the root (row) loop in parallel when it is spatial and its rows never repeat
    (a root listing rows with repeats, e.g. hyb's split rows, would race on the CPU).

    Before: for i in n_i: (row block) ...      After: for i in T.parallel(n_i): ...
    """
    if parallel and row_kind(nest) == DISTINCT_ROWS:
        sch.parallel(sch.get_loops(root_block(sch, nest))[0])


def narrow_sum(nest, program) -> bool:
    """The nest sums into a buffer declared narrower (float16/bfloat16) than the kernel's
    float32 accumulation."""
    dtype = {b.name: b.dtype for b in program.buffers}.get(nest.target.buffer)
    return nest.reduce == "sum" and dtype in NARROW and dtype != program.dtype.out


def accumulate_locally(sch: s_tir.Schedule, nest) -> None:
    """Sum a narrow output in a local array, written back after the reduction's loops (under
    the statement block's leading spatial loops, if any, so that an entry's dot product needs
    one element, not a row's): ``finalize_cpu`` makes that array float32 (``schedules.widen``),
    so each element is rounded once instead of at every addition.

    Before: for i: for p, k: C[i, k] = C[i, k] + half(v)
    After:  for i: acc[k] = 0; for p, k: acc[k] = acc[k] + v; for k: C[i, k] = half(acc[k])
    """
    blk = inner_block(sch, nest)
    write_back = sch.cache_write(blk, 0, "local")
    lead = None
    for rv, b in zip(sch.get_loops(blk), nest.blocks[-1]):
        if b.loop.kind != "S":
            break
        lead = rv
    if lead is not None:
        sch.reverse_compute_at(write_back, lead)


@transformation()
def hoist_reduction_init(sch: s_tir.Schedule, nest):
    """Move T.init out of data-dependent reduction loops so empty rows are initialised.

    Before: for p in row_len: block(init: C = 0; C += ...)
    After:  block C_init: C = 0;  for p in row_len: block C_update: C += ...
    """
    if has_dynamic_reduction(nest):
        sch.decompose_reduction(inner_block(sch, nest), first_reduce_loop(sch, nest))


def plan(program):
    """(nest, transformation) for every nest: what the knobs check and the tuner read."""
    return [(nest, parallel_rows) for nest in program.nests]


def default_cpu(sch: s_tir.Schedule, program, **knobs) -> dict:
    """Apply the CPU template to every nest; returns the knobs that took effect. A knob the
    CPU template does not take here (a CUDA knob, an unknown one) is a ValueError."""
    check_applicable(knobs, [(t, shapes) for t, shapes, _ in group(plan(program))], f"{program.name} on llvm")
    used = {}
    for nest in program.nests:
        used.update(parallel_rows(sch, nest, **knobs))
        if narrow_sum(nest, program) and nest.init:
            accumulate_locally(sch, nest)
        hoist_reduction_init(sch, nest)
    return used


def finalize_cpu(mod, program):
    """Module-level rewrites after the per-nest templates: the local accumulators of narrow
    outputs made float32, and a narrow buffer that a nest adds into without owning its rows
    (no ``T.init``: hyb's split rows) summed in a float32 copy (``schedules.widen``)."""
    (gv, func), = mod.functions.items()
    shared = {n.target.buffer for n in program.nests if narrow_sum(n, program) and not n.init}
    return tvm.IRModule({gv: widen_outputs(widen_accumulators(func), shared)})
