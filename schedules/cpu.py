"""Default CPU (llvm) schedule: rows in parallel, reductions initialised outside their loops."""
from __future__ import annotations

from tvm import s_tir

from .knobs import transformation
from .loops import first_reduce_loop, has_dynamic_reduction, inner_block, root_block


@transformation(knobs={"parallel": (True, False)})
def parallel_rows(sch: s_tir.Schedule, nest, *, parallel: bool):
    """Run the root (row) loop in parallel when it is spatial and its rows never repeat
    (a root listing rows with repeats, e.g. hyb's split rows, would race on the CPU).

    Before: for i in n_i: (row block) ...      After: for i in T.parallel(n_i): ...
    """
    root = nest.blocks[0][0].loop
    if parallel and root.kind == "S" and not nest.atomic:
        sch.parallel(sch.get_loops(root_block(sch, nest))[0])


@transformation()
def hoist_reduction_init(sch: s_tir.Schedule, nest):
    """Move T.init out of data-dependent reduction loops so empty rows are initialised.

    Before: for p in row_len: block(init: C = 0; C += ...)
    After:  block C_init: C = 0;  for p in row_len: block C_update: C += ...
    """
    if has_dynamic_reduction(nest):
        sch.decompose_reduction(inner_block(sch, nest), first_reduce_loop(sch, nest))


def default_cpu(sch: s_tir.Schedule, program, **knobs) -> dict:
    """Apply the CPU template to every nest; returns the knobs used."""
    used = dict(parallel_rows.defaults())
    used.update({k: v for k, v in knobs.items() if k in parallel_rows.knobs})
    for nest in program.nests:
        parallel_rows(sch, nest, **used)
        hoist_reduction_init(sch, nest)
    return used
