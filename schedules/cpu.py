"""Default CPU (llvm) schedule: rows in parallel, reductions initialised outside their loops."""
from __future__ import annotations

from tvm import s_tir

from .knobs import transformation
from .loops import first_reduce_loop, has_dynamic_reduction, inner_block, root_block


@transformation(knobs={"parallel": (True, False)})
def parallel_rows(sch: s_tir.Schedule, nest, *, parallel: bool):
    """Run the root (row) loop in parallel when it is spatial.

    Before: for i in n0: (row block) ...      After: for i in T.parallel(n0): ...
    """
    root = nest.blocks[0][0].loop
    if parallel and root.kind == "S":
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
