"""Kernel arguments for edge data and indirect indices, checked before launch.

Edge data (an operator's sparse inputs after the matrix: ``sparsec.dsl``) comes either as
``EdgeValues`` (``inst.edge_values(x)``, already in the stored-slot layout) or as a plain
per-entry array, (nnz, *trailing) in canonical CSR order, laid out at call time
(``formats.edge_values``: a gather through a cached slot map, on the GPU for CUDA tensors).

Indirect indices (``W[E[i, j], f]``) are read without bounds checks by the kernel, so every
value of an index input is checked against the extent of each axis it indexes before launch:
O(1) for ``EdgeValues`` (their range is recorded when made), one vectorised pass otherwise
(numpy on the host; torch on the tensor's device, one synchronisation). A value out of range
is a ValueError naming the buffer, the coordinate, the value and the extent.
"""
from __future__ import annotations

from typing import Any, Dict, Tuple

import numpy as np

from .formats.edge_values import EdgeValues, slot_map, to_slots


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def _dtype_name(x) -> str:
    if _is_torch(x):
        return str(x.dtype).replace("torch.", "")
    return np.dtype(getattr(x, "dtype", type(x))).name


def edge_layout(op_name: str, p, x, A) -> Any:
    """``x`` (EdgeValues, or a per-entry numpy array / torch tensor) for sparse input ``p`` of a
    kernel, in the stored-slot layout of ``A``; refused by name when it does not fit."""
    trailing = tuple(int(d) for d in p.shape[1:])
    if isinstance(x, EdgeValues):
        if not x.belongs_to(A):
            raise ValueError(f"{op_name}: {p.name} holds EdgeValues made for another matrix ({x.shape[0]}x{x.shape[1]}"
                             f", {x.nnz} entries, or this matrix before it was converted again / changed); make "
                             f"them for this matrix with inst.edge_values(values)")
        if x.dtype != p.dtype or x.trailing != trailing:
            raise TypeError(f"{op_name}: {p.name} should be {p.dtype} edge values with trailing shape {trailing}, got "
                            f"{x.dtype} with {x.trailing}")
        return x.kernel_values
    if not (_is_torch(x) or isinstance(x, np.ndarray)):
        raise TypeError(f"{op_name}: {p.name} is edge data: give inst.edge_values(values) or a numpy array / torch "
                        f"tensor of one value per entry in canonical CSR order, got {type(x).__name__}")
    nnz = slot_map(A).slots.size
    want = (nnz,) + trailing
    if tuple(int(d) for d in x.shape) != want:
        raise ValueError(f"{op_name}: {p.name} is edge data: it should have shape {want} (one value per entry of the "
                         f"matrix, in canonical CSR order as inst.to_scipy() lists them), got {tuple(x.shape)}")
    if _dtype_name(x) != p.dtype:
        raise TypeError(f"{op_name}: {p.name} should be {p.dtype}, got {_dtype_name(x)}")
    if isinstance(x, np.ndarray) and not x.dtype.isnative:
        x = x.astype(x.dtype.newbyteorder("="))
    return to_slots(A, x, p.name)


def check_indices(op_name: str, p, x, A, sizes: Dict[str, int]) -> None:
    """Every value of index input ``p`` (given as ``x``: EdgeValues, a per-entry array, or a dense
    array) lies in [0, extent) for each axis it indexes (``p.index_extents``)."""
    for dim, label in p.index_extents:
        extent = int(sizes[dim]) if isinstance(dim, str) else int(dim)
        if isinstance(x, EdgeValues):
            if x.low is None or (x.low >= 0 and x.high < extent):
                continue
            bad = _first_bad(x.values, extent)
            rows, cols = A.stored_coords()
            slot = bad[0]
            where = f"({int(rows[slot])}, {int(cols[slot])})" + _trail(bad[1:])
        else:
            bad = _first_bad(x, extent)
            if bad is None:
                continue
            if p.sparse:
                m = slot_map(A)
                where = f"({int(m.rows[bad[0]])}, {int(m.cols[bad[0]])})" + _trail(bad[1:])
            else:
                where = str(tuple(bad)) if len(bad) > 1 else f"[{bad[0]}]"
        value = x.values[bad] if isinstance(x, EdgeValues) else x[bad]
        raise ValueError(f"{op_name}: {p.name} at {where} is {int(value)}, out of range for {label} (extent "
                         f"{extent}): every value of an index buffer should be in [0, {extent}), as the kernel reads "
                         f"through it unchecked")


def _trail(idx: Tuple[int, ...]) -> str:
    return f", trailing index {tuple(idx)}" if idx else ""


def _first_bad(x, extent: int):
    """The index tuple of the first value outside [0, extent), or None (vectorised)."""
    if _is_torch(x):
        bad = (x < 0) | (x >= extent)
        if not bool(bad.any()):
            return None
        return tuple(int(i) for i in bad.nonzero()[0])
    bad = (x < 0) | (x >= extent)
    if not bad.any():
        return None
    return tuple(int(i) for i in np.argwhere(bad)[0])
