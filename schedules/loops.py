"""Finding a lowered loop nest's blocks and loops by role (names come from the emitter)."""
from __future__ import annotations
from .tvm_modules import s_tir

def inner_block(sch: s_tir.Schedule, nest):
    """The block holding the statement (the innermost block of the nest)."""
    return sch.get_sblock(nest.name)


def root_block(sch: s_tir.Schedule, nest):
    """The outermost block of the nest (the statement block when the nest has one level)."""
    return sch.get_sblock(nest.name if len(nest.blocks) == 1 else f"{nest.name}_0")


def has_dynamic_reduction(nest, cuda: bool = False) -> bool:
    """True when a reduction loop has a data-dependent extent: the T.init inside it would not
    run for an empty row, so the init must be hoisted (decompose_reduction)."""
    from sparsec.expr import Const

    has_init = nest.init or (cuda and nest.atomic)  # on CUDA, atomic nests are emitted with T.init
    return nest.reduce is not None and has_init and any(
        b.loop.kind == "R" and not isinstance(b.extent, Const) for blk in nest.blocks for b in blk)


def first_reduce_loop(sch, nest):
    """The schedule loop of the outermost reduction loop of the statement block."""
    blk = inner_block(sch, nest)
    loops = sch.get_loops(blk)
    names = [b.loop.name for b in nest.blocks[-1]]
    kinds = [b.loop.kind for b in nest.blocks[-1]]
    # sch.get_loops stops at the enclosing block: these are the statement block's own loops
    for rv, k in zip(loops, kinds):
        if k == "R":
            return rv
    raise ValueError(f"{nest.name}: no reduction loop among {names}")
