"""Input checks shared by every format: catch bad matrices before they reach a kernel.

A compiled kernel trusts its index arrays (an out-of-range column is an out-of-bounds
read, not an exception), so everything is checked once, here, with messages of the
form "X should be Y, got Z" that name the offending row or position. All checks are
vectorised: they cost a few passes over the index arrays.

Policy on non-canonical input (chosen so that every accepted input has exactly one
meaning):

* unsorted column indices within a row are sorted, whatever the source — order
  carries no meaning in CSR;
* duplicate (row, column) entries are *summed* for scipy matrices, torch tensors and
  ``(data, (row, col))`` COO tuples, because that is what those containers mean by a
  duplicate (scipy's ``sum_duplicates``, torch's ``coalesce``);
* duplicates in a raw ``(data, indices, indptr)`` tuple are *rejected*: raw CSR arrays
  with a repeated column are usually a bug upstream (sum? last wins?), so we refuse
  to guess and name the row;
* explicit zeros are kept (they are stored entries), and so are NaN and Inf, which
  propagate through kernels as they do through scipy.

Index arrays may be any integer dtype; int64 is downcast to int32 when every value
fits, because sparsec kernels take int32 indices.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

from .base import FAMILIES, SUPPORTED_VALUE_DTYPES

INT32_MAX = np.iinfo(np.int32).max


def check_shape(shape) -> Tuple[int, int]:
    """A logical (rows, cols) pair of non-negative ints."""
    try:
        dims = tuple(shape)
    except TypeError:
        raise TypeError(f"shape should be a (rows, cols) pair, got {shape!r}") from None
    if len(dims) != 2:
        raise ValueError(f"shape should be a (rows, cols) pair, got {shape!r}")
    out = []
    for d in dims:
        if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)):
            raise TypeError(f"shape should hold integers, got {shape!r}")
        out.append(int(d))
    if out[0] < 0 or out[1] < 0:
        raise ValueError(f"shape should be non-negative, got {tuple(out)}")
    return out[0], out[1]


def check_values(data, dtype=None, name: str = "values") -> np.ndarray:
    """A 1-D value array of a supported float dtype.

    ``dtype=None`` accepts only float16/32/64 (no silent cast from int or bool: cast
    explicitly, or pass ``dtype=``); an explicit ``dtype`` casts any real numeric input.
    Complex values are always refused: dropping the imaginary part is never intended.
    """
    data = np.asarray(data)
    if data.ndim != 1:
        raise ValueError(f"{name} should be 1-D, got shape {data.shape}")
    src = data.dtype
    if dtype is None:
        if src.name not in SUPPORTED_VALUE_DTYPES:
            raise TypeError(
                f"value dtype should be one of {', '.join(SUPPORTED_VALUE_DTYPES)}, got {src.name}"
                " (cast the matrix first, or pass dtype=)"
            )
        return np.ascontiguousarray(data)
    dtype = np.dtype(dtype)
    if dtype.name not in SUPPORTED_VALUE_DTYPES:
        raise TypeError(f"dtype should be one of {', '.join(SUPPORTED_VALUE_DTYPES)}, got {dtype.name}")
    if src.kind not in "biuf":
        raise TypeError(f"value dtype should be real (bool, int or float) to cast to {dtype.name}, got {src.name}")
    return np.ascontiguousarray(data.astype(dtype, copy=False))


def check_index(arr, name: str, nnz: int | None = None, shape=None) -> np.ndarray:
    """A 1-D integer index array as int32, downcasting wider ints whose values fit."""
    arr = np.asarray(arr)
    if arr.ndim != 1:
        raise ValueError(f"{name} should be 1-D, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} dtype should be an integer type (int32 or int64), got {arr.dtype.name}")
    if arr.dtype == np.int32:
        return np.ascontiguousarray(arr)
    if arr.size and (int(arr.max()) > INT32_MAX or int(arr.min()) < -INT32_MAX - 1):
        raise ValueError(
            f"index arrays need int64 (nnz={nnz if nnz is not None else arr.size}, shape={shape}, "
            f"largest {name} value {int(arr.max())}), which sparsec kernels do not support: indices are int32"
        )
    return np.ascontiguousarray(arr.astype(np.int32))


def check_indptr(indptr: np.ndarray, n_major: int, nnz: int, name: str = "indptr", major: str = "row") -> None:
    """indptr has n_major + 1 entries, starts at 0, never decreases and ends at nnz."""
    if indptr.size != n_major + 1:
        raise ValueError(f"{name} has {indptr.size} entries, should be {major}s + 1 = {n_major + 1}")
    if indptr[0] != 0:
        raise ValueError(f"{name} should start at 0, got {int(indptr[0])}")
    drops = np.flatnonzero(np.diff(indptr) < 0)
    if drops.size:
        k = int(drops[0])
        raise ValueError(
            f"{name} should be non-decreasing, got {name}[{k + 1}] = {int(indptr[k + 1])} < "
            f"{name}[{k}] = {int(indptr[k])} ({major} {k} has negative length)"
        )
    if indptr[-1] != nnz:
        raise ValueError(f"{name} should end at nnz = len(indices) = {nnz}, got {int(indptr[-1])}")


def check_lengths(data: np.ndarray, indices: np.ndarray, what: str = "indices") -> None:
    if data.size != indices.size:
        raise ValueError(f"data should have one value per entry of {what} ({indices.size}), got {data.size}")


def major_ids(indptr: np.ndarray) -> np.ndarray:
    """The row (major) of every entry, from a validated indptr."""
    return np.repeat(np.arange(indptr.size - 1, dtype=np.int64), np.diff(indptr))


def check_range(idx: np.ndarray, bound: int, owner: np.ndarray | None = None,
                minor: str = "column", major: str = "row", name: str | None = None) -> None:
    """Every index in [0, bound); names the first offender, its row (or position) and, given
    ``name``, the array and the position in it."""
    bad = np.flatnonzero((idx < 0) | (idx >= bound))
    if bad.size:
        k = int(bad[0])
        where = f"in {major} {int(owner[k])}" if owner is not None else f"at position {k}"
        array = f" (at {name}[{k}])" if name else ""
        raise ValueError(f"{minor} index {int(idx[k])} {where} is out of range: should be in [0, {bound}){array}")


def canonical(rowid: np.ndarray, cols: np.ndarray, data: np.ndarray, n_rows: int,
              duplicates: str, minor: str = "column", major: str = "row"):
    """Sort entries by (row, col) and resolve duplicates ("sum" or "reject").

    Returns (indptr int32, indices int32, data). ``rowid`` and ``cols`` must already be
    in range; the input order within a row is irrelevant.
    """
    rowid = np.asarray(rowid, dtype=np.int64)
    # copies, so that the result never aliases the caller's arrays
    cols, data = np.array(cols, copy=True), np.array(data, copy=True)
    if cols.size > 1:
        same = rowid[1:] == rowid[:-1]
        step = cols[1:].astype(np.int64) - cols[:-1]
        if bool(np.any(rowid[1:] < rowid[:-1]) or np.any(same & (step < 0))):
            order = np.lexsort((cols, rowid))
            rowid, cols, data = rowid[order], cols[order], data[order]  # (copies: fine, rare)
            same = rowid[1:] == rowid[:-1]
            step = cols[1:].astype(np.int64) - cols[:-1]
        dup = same & (step == 0)
        if dup.any():
            if duplicates == "reject":
                k = int(np.flatnonzero(dup)[0])
                raise ValueError(
                    f"{major} {int(rowid[k])} should hold each {minor} once, got {minor} index "
                    f"{int(cols[k])} twice (duplicates in raw CSR arrays are ambiguous: sum them "
                    f"first, e.g. scipy's sum_duplicates())"
                )
            starts = np.flatnonzero(np.concatenate(([True], ~dup)))
            data = np.add.reduceat(data, starts).astype(data.dtype, copy=False)
            rowid, cols = rowid[starts], cols[starts]
    counts = np.bincount(rowid, minlength=n_rows) if rowid.size else np.zeros(n_rows, np.int64)
    indptr = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return (
        check_index(indptr, "indptr", nnz=int(indptr[-1])),
        check_index(np.asarray(cols), "indices", nnz=int(indptr[-1])),
        np.ascontiguousarray(data),
    )


def check_compressed(indptr, indices, shape, nnz_what: str = "indices",
                     major: str = "row", minor: str = "column") -> Tuple[np.ndarray, np.ndarray]:
    """Full structural check of a compressed (CSR-like) pair; returns them as int32."""
    n_major, n_minor = shape
    indptr = check_index(indptr, "indptr", shape=shape)
    indices = check_index(indices, "indices", nnz=np.asarray(indices).size, shape=shape)
    check_indptr(indptr, n_major, indices.size, major=major)
    check_range(indices, n_minor, major_ids(indptr), minor=minor, major=major)
    return indptr, indices


def check_sorted_rows(indptr: np.ndarray, indices: np.ndarray, what: str = "indices") -> None:
    """Strictly increasing indices within every row (the canonical form kernels assume)."""
    if indices.size < 2:
        return
    rowid = major_ids(indptr)
    bad = np.flatnonzero((rowid[1:] == rowid[:-1]) & (indices[1:] <= indices[:-1]))
    if bad.size:
        k = int(bad[0])
        raise ValueError(
            f"{what} should be strictly increasing within each row, got {int(indices[k])} then "
            f"{int(indices[k + 1])} in row {int(rowid[k])}"
        )


def check_instance_arrays(inst, names, value_dtypes=SUPPORTED_VALUE_DTYPES) -> None:
    """O(1) checks every format shares: arrays present, int32, 1-D, contiguous; data 1-D and
    of one of ``value_dtypes`` (SR-BCRS passes its own: int8 bytes for int8/int4)."""
    check_shape(inst.shape)
    for n in names:
        a = inst.arrays.get(n)
        if a is None:
            raise ValueError(f"arrays should contain {n!r} for format {inst.format.spec}, got {sorted(inst.arrays)}")
        if not isinstance(a, np.ndarray) or a.dtype != np.int32 or a.ndim != 1 or not a.flags.c_contiguous:
            desc = f"{a.dtype.name} {a.ndim}-D" if isinstance(a, np.ndarray) else type(a).__name__
            raise ValueError(f"{n} should be a contiguous 1-D int32 array, got {desc}")
    d = inst.data
    if not isinstance(d, np.ndarray) or d.ndim != 1 or not d.flags.c_contiguous:
        raise ValueError(f"data should be a contiguous 1-D array, got {getattr(d, 'shape', type(d).__name__)}")
    if d.dtype.name not in value_dtypes:
        raise TypeError(f"value dtype should be one of {', '.join(value_dtypes)}, got {d.dtype.name}")


def check_padded_slots(indices: np.ndarray, width: int, cols: int, row: str = "row",
                       name: str | None = None) -> None:
    """ELL-style slots (``width`` per row): column indices in [0, cols), strictly increasing
    within a row, then -1 padding after the row's entries. ``name``: the array, for messages."""
    bad = np.flatnonzero((indices < -1) | (indices >= cols))
    if bad.size:
        k = int(bad[0])
        array = f" (at {name}[{k}])" if name else ""
        raise ValueError(f"column index {int(indices[k])} in {row} {k // width} is out of range: "
                         f"should be in [0, {cols}) or -1 (padding){array}")
    grid = indices.reshape(-1, width).astype(np.int64)
    pad = grid < 0
    if width > 1:
        real_after_pad = pad[:, :-1] & ~pad[:, 1:]
        unsorted = ~pad[:, 1:] & ~pad[:, :-1] & (grid[:, 1:] <= grid[:, :-1])
        for what, mask in ((f"padding should follow a {row}'s entries", real_after_pad),
                           (f"indices should be strictly increasing within each {row}", unsorted)):
            r = np.flatnonzero(mask.any(axis=1))
            if r.size:
                raise ValueError(f"{what}, got {row} {int(r[0])}: {grid[r[0]].tolist()[:16]}")


def has_repeats(keys: np.ndarray) -> bool:
    """Whether any value occurs twice: a sort and one comparison (``np.unique`` hashes, which
    costs ~7x as much on a million int64 keys with numpy 2.4)."""
    if keys.size < 2:
        return False
    s = np.sort(keys)
    return bool((s[1:] == s[:-1]).any())


def check_before_launch(inst) -> None:
    """Before a kernel reads ``inst``'s index arrays. An instance ``convert`` made and sealed,
    unchanged since, costs a few attribute reads (``FormatInstance.is_sealed``; a composite:
    the same parts, each sealed, in the composite's shape and part formats). Any other (built
    by hand, unpickled, changed since) gets its family's full check first -- each part of a
    composite, then the composite's own -- so that an out-of-range index is a ValueError naming
    the array, the row and the value, never an out-of-bounds read. Its cost is measured by
    ``benchmarks/time_index_check.py``."""
    if is_trusted(inst):
        return
    parts = getattr(inst, "parts", None)
    where = f"the {inst.format.spec} matrix (not sealed by convert: built by hand, unpickled, or changed since)"
    try:
        try:
            _full_check(inst)
        except (ValueError, TypeError):
            for k, part in enumerate(parts or ()):  # on failure only: which part (the check ran them all)
                try:
                    _full_check(part)
                except (ValueError, TypeError) as e:
                    raise type(e)(f"part {k} ({part.format.spec}): {e}") from None
            raise
        if parts is not None and inst.data.size != sum(p.data.size for p in parts):
            raise ValueError(f"data should hold the parts' {sum(p.data.size for p in parts)} values, got "
                             f"{inst.data.size}; build the composite again rather than replacing a part's data")
    except (ValueError, TypeError) as e:
        raise type(e)(f"{where} failed the index check made before a kernel reads it: {e}") from None


def is_trusted(inst) -> bool:
    """Whether ``inst`` is as ``convert`` sealed it (see ``check_before_launch``)."""
    parts = getattr(inst, "parts", None)
    if parts is None:
        return inst.is_sealed()
    fmt_parts = inst.format.parts
    shape = tuple(inst.shape)
    return (len(parts) == len(fmt_parts) and inst.data.size == sum(p.data.size for p in parts)
            and all(p.is_sealed() and tuple(p.shape) == shape and (p.format is f or p.format == f)
                    for p, f in zip(parts, fmt_parts)))


def _full_check(inst) -> None:
    """The family's full check, on coordinates recomputed from the current arrays."""
    for p in getattr(inst, "parts", None) or (inst,):
        p._coords = None  # a cache of stored_coords, stale if an array was replaced
    FAMILIES[inst.format.name].check(inst, full=True)
