"""A composite's fill sets only the rows that no part stores.

A sum over a composite's parts (hyb's buckets) is lowered as a fill nest that sets the whole
output to its start value, then the parts: those that own their rows (a narrow bucket: each
row in one ELL row) store their results, those that share rows (the widest bucket's split
rows, column ranges) add into them. Rows a storing part writes are written twice -- once by
the fill, once by the part -- and on a hyb SpMM the fill is 10-20 % of the call. Here the fill
runs over a list of rows instead: those that no storing part writes (rows with no entries, and
the rows of the parts that add), ``C[fill_rows[q], ...] = start``. The list is a kernel
parameter named after the storing parts (``ir_attrs.fill_rows_name``), made from the matrix
instance by the runtime (``sparsec.tc_operands``), so it follows the compiled kernel's parts,
not the instance's (a kernel that adds a part's rows atomically may take an instance whose
part could have stored them).

Why this is exact: the fill launch runs before the parts' launch; a storing part overwrites
every element of its rows whatever the fill left there (a folded epilogue's term included:
``fold_epilogue`` starts an owning part's rows from it); a row that no storing part writes is
filled as before. Rows are taken from the parts' stored entries, so a part that also stores
rows with no entry (none of hyb's do) only leaves the fill more rows than it needs.
"""
from __future__ import annotations

import os
from dataclasses import replace
from typing import List

from sparsec.expr import Load, Var, transform
from sparsec.ir_attrs import fill_rows_name

from .bind import Loop
from .positions import ROWS, LoopIR, LoopNest, PositionProgram, iv


# On by default; ``SPARSEC_FILL_ROWS=0`` in the environment (or ``ENABLED = False`` before
# compiling) keeps every fill over all rows: ``benchmarks/time_fill_rows.py`` times both builds
ENABLED = os.environ.get("SPARSEC_FILL_ROWS", "1") == "1"


def restrict_fills(prog: PositionProgram) -> PositionProgram:
    """``prog`` with each composite fill over all rows narrowed to the rows no storing part of
    the same statement writes, where there is a storing part."""
    if not ENABLED or not prog.bound.composite:
        return prog
    nests: List[LoopNest] = list(prog.nests)
    for n, fill in enumerate(nests):
        if not fill.fill:
            continue
        row = _row_loop(fill)
        if row is None:
            continue
        parts = [p for p in nests if not p.fill and p.origin == fill.origin and p.part is not None
                 and p.target.buffer == fill.target.buffer]
        storing = {p.part for p in parts if p.init and not p.atomic and not p.scatter}
        # a part that skips some of its rows' stores (a write guard) does not own them
        if not storing or any(p.write_guard is not None for p in parts if p.part in storing):
            continue
        nests[n] = _over_listed_rows(fill, row, fill_rows_name(sorted(storing)))
    return replace(prog, nests=nests)


def _row_loop(fill: LoopNest):
    """The fill's loop over the matrix's rows when it is the root loop and indexes the
    output's first axis (not a stacked structure's lrows), else None."""
    root = fill.blocks[0][0]
    if root.loop.name != "fill_row" or root.extent != ROWS:
        return None
    first = fill.target.index[0] if fill.target.index else None
    return root if isinstance(first, Var) and first.name == iv(root.loop).name else None


def _over_listed_rows(fill: LoopNest, row: LoopIR, name: str) -> LoopNest:
    loop = Loop("fill_pos", "S", "root", None, None)
    listed = Load(name, (iv(loop),))
    old = iv(row.loop).name

    def at_listed(e):
        return transform(e, lambda x: listed if isinstance(x, Var) and x.name == old else None)

    blocks = [[LoopIR(loop, Var(f"n_{name}"))] + fill.blocks[0][1:]] + fill.blocks[1:]
    roles = {("fill_pos" if k == row.loop.name else k): v for k, v in fill.roles.items()}
    return replace(fill, blocks=blocks, target=at_listed(fill.target), value=at_listed(fill.value), roles=roles,
                   root_extent=Var(f"n_{name}"))
