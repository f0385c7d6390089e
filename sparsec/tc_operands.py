"""The packed Tensor Core operands a kernel reads, produced from a format instance.

A kernel built by ``schedules.tensorcore_packed`` names the packed operands it takes
(``sp24_values``/``sp24_meta``: ``formats.mma_sp``'s packing; ``gather_values``/``gather_cols``:
``formats.nm_tc``'s) among its index parameters. The ``mma_sp`` and ``nm_tc`` families pack
them at conversion; an ``nm:2:4`` instance is packed here on its first call. Either way the
arrays are cached on the instance with the ``data`` array they were packed from, so a kernel
hands the same objects to the device cache every call, and an instance whose values were
replaced (``with_data``) is packed again rather than read stale. The kernels themselves
handle any matrix size (their edges are bounds-checked), so nothing here pads B or C.

A segment contraction that runs its output's fill in its own launch names a workspace too
(``ir_attrs.SYNC_PREFIX`` and its split count): int32 zeros, sized for the instance's root
positions and rows, made once and cached like the packed operands; the kernel keeps its
counts there from call to call, so each call must hand it the same array.
"""
from __future__ import annotations

from typing import Dict, Sequence

import numpy as np

from .formats.packed import CACHE, GATHER, SP24, gather_operands, sp24_operands
from .ir_attrs import SYNC_PREFIX, fill_rows_name, fill_rows_parts, sync_words

PACKERS = {**{n: sp24_operands for n in SP24}, **{n: gather_operands for n in GATHER}}


def _positions(inst) -> int:
    """At least the root positions and output rows of any kernel on ``inst``: its rows (all
    leading axes) or its longest index array (hyb's split rows), whichever is more."""
    parts = getattr(inst, "parts", None) or (inst,)
    longest = max((a.shape[0] for p in parts for a in p.arrays.values() if isinstance(a, np.ndarray) and a.ndim),
                  default=0)
    return max(int(np.prod(inst.shape[:-1])), int(longest))


def fill_rows(inst, parts) -> Dict[str, np.ndarray]:
    """The rows of ``inst`` that none of its ``parts`` stores an entry in, ascending: the rows
    a fill over listed rows must set (``lower.fill_rows``)."""
    name = fill_rows_name(parts)
    members = getattr(inst, "parts", None)
    if members is None or max(parts) >= len(members):
        raise ValueError(f"this kernel reads {name}, the rows none of parts {list(parts)} of a composite stores; "
                         f"a matrix in format {inst.format.spec} has no such parts")
    covered = np.zeros(int(inst.shape[0]), dtype=bool)
    for k in parts:
        rows = members[k].stored_coords()[0]
        covered[rows[rows >= 0]] = True
    return {name: np.flatnonzero(~covered).astype(np.int32)}


def _packer(name: str, inst=None):
    parts = fill_rows_parts(name)
    if parts is not None:
        return lambda inst: fill_rows(inst, parts)
    if name.startswith(SYNC_PREFIX) and name[len(SYNC_PREFIX):].isdigit():
        splits = int(name[len(SYNC_PREFIX):])
        return lambda inst: {name: np.zeros(sync_words(_positions(inst), splits), dtype=np.int32)}
    if name not in PACKERS and inst is not None and name in getattr(inst, "arrays", {}):
        # an array the format stores but its generic lowering does not read (``tiled``'s
        # bitmap and tile offsets): the kernel takes it as it is
        return lambda inst: {name: inst.arrays[name]}
    return PACKERS.get(name)


def packed_operands(inst, names: Sequence[str]) -> Dict[str, np.ndarray]:
    """The arrays ``names`` (packed operands, or arrays the instance stores beside its index
    arrays) of ``inst``, packed at most once per values array; ValueError naming an operand
    no packing produces."""
    unknown = [n for n in names if _packer(n, inst) is None]
    if unknown:
        raise ValueError(f"this kernel reads the arrays {unknown}, which a matrix in format {inst.format.spec} "
                         f"does not carry (known packed operands: {sorted(PACKERS)})")
    cached = inst.__dict__.get(CACHE)
    if cached is None or cached[0] is not inst.data:
        cached = (inst.data, {})
        inst.__dict__[CACHE] = cached
    arrays = cached[1]
    for n in names:
        if n not in arrays:
            arrays.update(_packer(n, inst)(inst))
    return {n: arrays[n] for n in names}
