"""Row-list ELL ("rell"): an ELL bucket over a *list* of rows — the part format of hyb.

Axis chain (outermost first)::

    SparseFixed("r", dim=0, width=None, indices="row_ids", padded=False, unique=U)
    SparseFixed("j", dim=1, width=W, indices="col_ids")

``row_ids[e]`` is the matrix row of ELL row ``e`` (its length, ``n_r``, is known only at
run time); ``col_ids[e * W + s]`` is the column of slot ``s`` of that ELL row, -1 for
padding (value 0). A row longer than ``W`` is split over several consecutive ELL rows,
so its id repeats in ``row_ids``: the format then says ``unique=False`` (spec
``rell:W,dup``) and kernels must add partial results instead of storing them.

Within an ELL row the columns are strictly increasing and padding follows the real
entries; the pieces of a split row hold its entries in column order.
"""
from __future__ import annotations

import time

import numpy as np

from . import validate as V
from .axes import SparseFixed
from .base import Format, FormatInstance
from .convert import canonical_csr
from .stats import row_lengths_from_coords, summarize

NAME = "rell"
DESCRIPTION = "row-list ELL (hyb's bucket): listed rows, W slots each; long rows split over several (rell:W,dup)"

_DUP_WORDS = {"dup": False, "false": False, "unique": True, "true": True}


def _width(width):
    if isinstance(width, (bool, np.bool_)) or not isinstance(width, (int, np.integer)) or width < 1:
        raise ValueError(f"rell width should be a positive integer, got {width!r}")
    return int(width)


def _unique(unique):
    if not isinstance(unique, (bool, np.bool_)):
        raise ValueError(f"rell unique should be True or False, got {unique!r}")
    return bool(unique)


def parse_spec(arg: str | None) -> dict:
    """``"8"`` -> width 8, unique; ``"8,dup"`` -> width 8, rows may repeat. ``"8,True"`` and
    ``"8,False"`` (the generic ``Format.spec`` text) are accepted too."""
    if not arg:
        return {"width": None, "unique": None}
    head, _, tail = arg.partition(",")
    try:
        w = _width(int(head))
    except ValueError:
        raise ValueError(f"rell width should be a positive integer, got {head!r} (spec 'rell:W' or 'rell:W,dup')") from None
    if not tail.strip():
        return {"width": w, "unique": True}
    word = tail.strip().lower()
    if word not in _DUP_WORDS:
        raise ValueError(f"rell spec should be 'rell:W' or 'rell:W,dup', got 'rell:{arg}'")
    return {"width": w, "unique": _DUP_WORDS[word]}


def declare(width=None, unique=True) -> Format:
    if width is None:
        raise ValueError("rell needs its width (spec 'rell:8', or width=8), got none")
    w = _width(width)
    u = True if unique is None else _unique(unique)
    return Format(NAME, (SparseFixed("r", dim=0, width=None, indices="row_ids", padded=False, unique=u),
                         SparseFixed("j", dim=1, width=w, indices="col_ids")),
                  (("width", w), ("unique", u)))


def spec_text(fmt: Format) -> str:
    """The spec as ``parse_spec`` reads it best: ``rell:8`` or ``rell:8,dup``."""
    return f"{NAME}:{fmt.param('width')}" + ("" if fmt.param("unique") else ",dup")


def pack(rows, lengths, starts, indices, data, width, shape, nnz=None):
    """Build one instance from groups of entries (vectorised).

    Group ``g`` is matrix row ``rows[g]`` with entries ``indices/data[starts[g] :
    starts[g] + lengths[g]]`` (sorted by column). Each group takes ``ceil(len / width)``
    ELL rows (at least one), in group order. Used by ``from_matrix`` and by hyb.
    """
    w = _width(width)
    rows = np.asarray(rows, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    starts = np.asarray(starts, dtype=np.int64)
    pieces = np.maximum(-(-lengths // w), 1)
    n_ell = int(pieces.sum())
    first = np.zeros(rows.size + 1, dtype=np.int64)
    np.cumsum(pieces, out=first[1:])
    total = int(lengths.sum())
    g = np.repeat(np.arange(rows.size, dtype=np.int64), lengths)     # group of each entry
    off = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    src = starts[g] + off
    slot = first[g] * w + off                                        # pieces are consecutive ELL rows
    col_ids = np.full(n_ell * w, -1, dtype=np.int32)
    vals = np.zeros(n_ell * w, dtype=data.dtype)
    col_ids[slot] = indices[src]
    vals[slot] = data[src]
    row_ids = V.check_index(np.repeat(rows, pieces), "row_ids", shape=shape)
    fmt = declare(w, unique=bool(np.all(pieces == 1)) and np.unique(rows).size == rows.size)
    return FormatInstance(fmt, tuple(int(s) for s in shape), {"row_ids": row_ids, "col_ids": col_ids},
                          vals, int(total if nnz is None else nnz))


def from_matrix(matrix, *, shape=None, dtype=None, width=None, unique=None, rows=None) -> FormatInstance:
    """One bucket holding ``rows`` (default: every row, so that a kernel writes every row of a
    dense output; an empty row is one all-padding ELL row) of ``matrix``.

    ``width=None`` uses the longest listed row (at least 1). Rows longer than ``width``
    are split, which makes the format ``unique=False``; ``unique=True`` then raises.
    Listed rows with no entries keep one all-padding ELL row. Entries of rows not
    listed are not stored (the instance is then a part of the matrix, not all of it).
    """
    t0 = time.perf_counter()
    m = canonical_csr(matrix, shape=shape, dtype=dtype)
    M = m.shape[0]
    lengths = np.diff(m.indptr).astype(np.int64)
    if rows is None:  # every row: a kernel on a standalone instance then writes every row of its output
        rows = np.arange(M, dtype=np.int64)
    else:
        rows = np.asarray(rows)
        if rows.ndim != 1 or (rows.size and rows.dtype.kind not in "iu"):
            raise ValueError(f"rows should be a 1-D list of row indices, got {rows!r}")
        rows = rows.astype(np.int64)
        V.check_range(rows, M, minor="row", major="row")
        if np.unique(rows).size != rows.size:
            raise ValueError("rows should list each row once (long rows are split automatically), got a repeat")
    k = lengths[rows]
    if width is None:
        width = max(int(k.max(initial=0)), 1)
    w = _width(width)
    if unique is not None and _unique(unique) and np.any(k > w):
        r = int(rows[np.argmax(k > w)])
        raise ValueError(f"row {r} has {int(lengths[r])} non-zeros, more than the width {w}: it would be split, "
                         f"so unique should be False (spec 'rell:{w},dup'), got unique=True")
    inst = pack(rows, k, m.indptr[rows].astype(np.int64), m.indices, m.data, w, m.shape)
    if unique is False and inst.format.param("unique"):
        inst = FormatInstance(declare(w, unique=False), inst.shape, inst.arrays, inst.data, inst.nnz)
    inst.conversion_s = time.perf_counter() - t0
    check(inst)
    return inst


def root_extent(inst: FormatInstance) -> int:
    return int(inst.arrays["row_ids"].size)


def extents(inst: FormatInstance) -> dict:
    return {"r": root_extent(inst)}


def _w(inst) -> int:
    return int(inst.format.param("width"))


def stored_coords(inst: FormatInstance):
    cols = inst.arrays["col_ids"].astype(np.int64)
    rows = np.repeat(inst.arrays["row_ids"].astype(np.int64), _w(inst))
    rows[cols < 0] = -1
    return rows, cols


def check(inst: FormatInstance, full: bool = False) -> None:
    """O(1) size checks; ``full`` also scans ranges, order, padding, repeats and nnz."""
    V.check_instance_arrays(inst, ("row_ids", "col_ids"))
    M, N = inst.shape
    w = _w(inst)
    row_ids, col_ids = inst.arrays["row_ids"], inst.arrays["col_ids"]
    n = row_ids.size
    if col_ids.size != n * w:
        raise ValueError(f"col_ids has {col_ids.size} entries, should be ELL rows * width = {n} * {w} = {n * w}")
    if inst.data.size != col_ids.size:
        raise ValueError(f"data should have one value per slot ({col_ids.size}), got {inst.data.size}")
    if not full:
        return
    V.check_range(row_ids, M, minor="row id", major="ELL row", name="row_ids")
    if inst.format.param("unique") and V.has_repeats(row_ids):
        vals, counts = np.unique(row_ids, return_counts=True)
        raise ValueError(f"row ids should be unique in a unique=True rell (use 'rell:{w},dup'), "
                         f"got row {int(vals[np.argmax(counts > 1)])} more than once")
    V.check_padded_slots(col_ids, w, N, row="ELL row", name="col_ids")
    rows, cols = stored_coords(inst)
    ok = rows >= 0
    # with unique row ids, increasing columns within each ELL row already rule out repeats
    if not inst.format.param("unique") and V.has_repeats(rows[ok] * max(N, 1) + cols[ok]):
        raise ValueError("each (row, column) should be stored once, got a repeat across the pieces of a split row")
    if int(ok.sum()) != inst.nnz:
        raise ValueError(f"nnz should be the number of non-padding slots {int(ok.sum())}, got {inst.nnz}")
    if np.any(inst.data[~ok] != 0):
        raise ValueError("padding slots should hold 0, got a non-zero value")


def stats(inst: FormatInstance) -> dict:
    s = summarize(inst, row_lengths_from_coords(inst))
    s["width"] = _w(inst)
    s["unique"] = bool(inst.format.param("unique"))
    s["ell_rows"] = root_extent(inst)
    s["conversion_s"] = float(inst.conversion_s)
    return s
