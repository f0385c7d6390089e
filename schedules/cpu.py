"""Default CPU (llvm) schedule: rows in parallel, reductions initialised outside their loops."""
from __future__ import annotations

from .knobs import Knob, check_applicable, group, transformation
from .loops import first_reduce_loop, has_dynamic_reduction, inner_block, root_block
from .tvm_modules import s_tir

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
        hoist_reduction_init(sch, nest)
    return used
