"""ELL: a dense row axis over ``width`` column slots per row; short rows are padded.

Fixed-width rows make every row the same loop, at the cost of storing
``rows * width`` slots: the padding ratio is max/mean row length. Padding slots have
index -1 and value 0, and always follow a row's real entries (sorted by column).
"""
from __future__ import annotations

import time

import numpy as np

from . import validate as V
from .axes import DenseFixed, SparseFixed
from .base import Format, FormatInstance
from .convert import canonical_csr
from .stats import row_lengths_from_coords, summarize

NAME = "ell"
DESCRIPTION = "ELLPACK: fixed width slots per row (padded with -1), width = longest row unless given"


def _width(width):
    if width is None:
        return None
    if isinstance(width, (bool, np.bool_)) or not isinstance(width, (int, np.integer)) or width < 1:
        raise ValueError(f"ELL width should be a positive integer, got {width!r}")
    return int(width)


def parse_spec(arg: str | None) -> dict:
    if not arg:
        return {"width": None}
    try:
        w = int(arg)
    except ValueError:
        raise ValueError(f"ELL width should be a positive integer, got {arg!r}") from None
    return {"width": _width(w)}


def declare(width=None) -> Format:
    """``width=None`` declares a template (``spec`` "ell") whose width is chosen by
    ``from_matrix``; only instances' formats (with a width) are meant for lowering."""
    w = _width(width)
    return Format(NAME, (DenseFixed("i", dim=0), SparseFixed("j", dim=1, width=w, indices="indices")),
                  () if w is None else (("width", w),))


def from_matrix(matrix, *, shape=None, dtype=None, width=None) -> FormatInstance:
    t0 = time.perf_counter()
    w = _width(width)
    m = canonical_csr(matrix, shape=shape, dtype=dtype)
    rows = m.shape[0]
    lengths = np.diff(m.indptr)
    longest = int(lengths.max()) if rows else 0
    if w is None:
        w = max(longest, 1)
    elif longest > w:
        r = int(np.argmax(lengths > w))
        raise ValueError(f"row {r} has {int(lengths[r])} non-zeros, more than the ELL width {w}; "
                         f"use a larger width (or none: the longest row sets it)")
    rowid = V.major_ids(m.indptr)
    slot = rowid * w + (np.arange(m.nnz, dtype=np.int64) - m.indptr[rowid])
    indices = np.full(rows * w, -1, dtype=np.int32)
    data = np.zeros(rows * w, dtype=m.data.dtype)
    indices[slot] = m.indices
    data[slot] = m.data
    inst = FormatInstance(declare(w), tuple(int(s) for s in m.shape), {"indices": indices}, data, int(m.nnz))
    inst.conversion_s = time.perf_counter() - t0
    check(inst)
    return inst


def root_extent(inst: FormatInstance) -> int:
    return int(inst.shape[0])


def _w(inst) -> int:
    w = inst.format.param("width")
    if w is None:
        raise ValueError("an ELL instance's format should have a width, got a template format 'ell'")
    return int(w)


def stored_coords(inst: FormatInstance):
    idx = inst.arrays["indices"].astype(np.int64)
    rows = np.repeat(np.arange(inst.shape[0], dtype=np.int64), _w(inst))
    rows[idx < 0] = -1
    return rows, idx


def check(inst: FormatInstance, full: bool = False) -> None:
    V.check_instance_arrays(inst, ("indices",))
    rows, cols = inst.shape
    w = _w(inst)
    indices = inst.arrays["indices"]
    if indices.size != rows * w:
        raise ValueError(f"indices has {indices.size} entries, should be rows * width = {rows} * {w} = {rows * w}")
    if inst.data.size != indices.size:
        raise ValueError(f"data should have one value per slot ({indices.size}), got {inst.data.size}")
    if full:
        V.check_padded_slots(indices, w, cols, row="row", name="indices")
        pad = indices.reshape(rows, w) < 0
        if int((~pad).sum()) != inst.nnz:
            raise ValueError(f"nnz should be the number of non-padding slots {int((~pad).sum())}, got {inst.nnz}")
        if np.any(inst.data[pad.reshape(-1)] != 0):
            raise ValueError("padding slots should hold 0, got a non-zero value")


def stats(inst: FormatInstance) -> dict:
    s = summarize(inst, row_lengths_from_coords(inst))
    s["width"] = _w(inst)
    return s
