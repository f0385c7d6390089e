"""Format declarations and converted matrices.

``Format`` is a declaration: a name, a chain of axes (``formats.axes``) and the knobs
that shaped it (block size, width). ``FormatInstance`` is one matrix stored in a
format: flat int32 index arrays named by the axes, and one flat value array with a
slot per stored position.

Padding. An operator's value is defined on the matrix's coordinates (its logical pattern:
the entries the user gave, explicit zeros included), never on the slots a format happens
to store. A stored slot that is not a coordinate is *padding* and holds 0. Formats mark it
in one of two ways, both readable by lowering:

  * a sentinel index -1 in a sparse axis (``Axis.padded``: ELL/rell/hyb rows, N:M windows
    short of N, SR-BCRS rows padded to the stride), and coordinates past the logical edge
    (axes of ``scale`` > 1), which stage II guards from the indices alone;
  * a *slot mask* for padding inside dense inner slots, which no index can mark (the
    implicit zeros of a BSR block, the rows of an N:M or SR-BCRS vector that lack a column
    another row of the vector has): ``Format.slot_mask`` names a uint8 array of the
    instance, one byte per stored slot laid out like the values (1 = a coordinate of the
    matrix, 0 = padding), made by ``convert`` from the input's pattern. Stage III maps it
    exactly like the value array. Formats without such padding (csr, ell, rell, hyb's
    buckets, N:M with V = 1) have no mask, and their kernels no mask parameter.

Lowering reads only ``Format.axes`` and the array names; conversions, validation and
statistics live in the per-format modules (``csr.py``, ``bsr.py``, ``ell.py``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Tuple

import numpy as np
import scipy.sparse as sp

from .axes import Axis

SUPPORTED_VALUE_DTYPES = ("float32", "float64", "float16")

# family name -> the module that knows its layout (root_extent, stored_coords); filled in by
# formats.registry, so that this module depends on no format module
FAMILIES: Dict[str, Any] = {}


def _family(fmt: "Format"):
    if fmt.name not in FAMILIES:
        raise ValueError(f"format family should be one of {sorted(FAMILIES)}, got {fmt.name!r}")
    return FAMILIES[fmt.name]


@dataclass(frozen=True)
class Format:
    """A sparse format as a composition of axes.

    ``params`` are the knobs that produced the axes, as sorted (name, value) pairs so
    that a Format is hashable and can key caches and tuning records.
    """

    name: str
    axes: Tuple[Axis, ...]
    params: Tuple[Tuple[str, Any], ...] = ()
    # How values are laid out beyond the axis chain's flat order:
    #   value_chunk k > 0: positions of the last variable axis come in chunks of k, and within
    #     a chunk values are stored [inner dense axes][k] (SR-BCRS: Magicube's V x stride tiles)
    #     instead of [k][inner dense axes];
    #   value_bits 4: int4, two values per int8 byte, the even slot in the low nibble.
    value_chunk: int = 0
    value_bits: int = 0
    # the name of the instance's slot-mask array (see the module docstring), "" when every
    # in-range slot with a valid index is a coordinate of the matrix
    slot_mask: str = ""

    def __post_init__(self):
        names = [a.name for a in self.axes]
        if len(set(names)) != len(names):
            raise ValueError(f"format {self.name!r}: axis names should be unique, got {names}")
        if not self.axes or self.axes[0].variable:
            raise ValueError(f"format {self.name!r}: the first axis should be DenseFixed or SparseFixed (the rows)")

    def runtime_extent_axes(self) -> Tuple[str, ...]:
        """Axes whose extent is known only at run time (kernels take ``n_<axis>`` scalars)."""
        out = []
        for i, a in enumerate(self.axes):
            if (getattr(a, "extent", 1) is None and not a.sparse) or (i == 0 and a.sparse and a.width is None):
                out.append(a.name)
        return tuple(out)

    @property
    def spec(self) -> str:
        """Short text form used by the CLI and in records, e.g. ``bsr:4x5`` or ``ell:8``
        (a family may word its own with a ``spec_text(fmt)`` function)."""
        fam = FAMILIES.get(self.name)
        if fam is not None and hasattr(fam, "spec_text"):
            return fam.spec_text(self)
        if not self.params:
            return self.name
        vals = []
        for _, v in self.params:
            vals.append("x".join(map(str, v)) if isinstance(v, tuple) else str(v))
        return f"{self.name}:{','.join(vals)}"

    def param(self, name: str, default=None):
        return dict(self.params).get(name, default)

    def index_array_names(self) -> Tuple[str, ...]:
        """Names of the index arrays a kernel takes, in axis order (indptr before indices)."""
        out = []
        for a in self.axes:
            for attr in ("indptr", "indices"):
                n = getattr(a, attr, None)
                if n is not None and n not in out:
                    out.append(n)
        return tuple(out)


@dataclass
class FormatInstance:
    """One matrix in one format.

    Invariants (checked by the format's ``check``):
      * ``arrays[name]`` is a C-contiguous 1-D int32 array for every name in
        ``format.index_array_names()``;
      * ``data`` is C-contiguous and 1-D, one slot per stored position, in the flat
        position order of ``formats.axes`` (BSR: block-major, then row, then column);
      * ``shape`` is the logical (rows, cols); stored slots whose coordinates fall
        outside it (BSR edge blocks), whose index is -1 (ELL padding) or whose slot-mask
        byte is 0 (a BSR block's implicit zeros) are padding and hold 0;
      * ``arrays[format.slot_mask]`` (formats with one): uint8, one per stored slot, laid
        out like ``data`` (see the module docstring).
    """

    format: Format
    shape: Tuple[int, int]
    arrays: Dict[str, np.ndarray]
    data: np.ndarray
    nnz: int
    conversion_s: float = 0.0
    _coords: Any = field(default=None, repr=False, compare=False)

    @property
    def dtype(self) -> np.dtype:
        """The array dtype of ``data`` (int8 bytes for packed int4: see ``value_dtype``)."""
        return self.data.dtype

    @property
    def value_dtype(self) -> str:
        """The dtype of one value: ``int4`` for packed formats, else ``data``'s dtype."""
        return "int4" if self.format.value_bits == 4 else self.data.dtype.name

    @property
    def stored(self) -> int:
        """Number of value slots (two per byte for packed int4)."""
        n = int(self.data.size)
        return 2 * n if self.format.value_bits == 4 else n

    def slot_values(self) -> np.ndarray:
        """One value per stored slot (packed int4 unpacked to int8), aligned with stored_coords."""
        if self.format.value_bits == 4:
            return _family(self.format).unpack_values(self)
        return self.data

    def root_extent(self) -> int:
        """Length of the first (row) axis: rows, or block rows."""
        return _family(self.format).root_extent(self)

    def extents(self) -> Dict[str, int]:
        """Run-time extent of each axis in ``format.runtime_extent_axes()``."""
        fam = _family(self.format)
        if hasattr(fam, "extents"):
            return fam.extents(self)
        return {self.format.axes[0].name: self.root_extent()}

    def stored_coords(self) -> Tuple[np.ndarray, np.ndarray]:
        """(row, col) of every stored slot, aligned with ``data``; -1 marks a slot that is
        not part of the matrix (padding: a -1 index, a 0 in the slot mask, or past the edge
        of the logical shape)."""
        if self._coords is None:
            self._coords = _family(self.format).stored_coords(self)
        return self._coords

    def valid_slots(self) -> np.ndarray:
        rows, _ = self.stored_coords()
        return rows >= 0

    def slot_mask(self) -> np.ndarray:
        """The uint8 slot mask a kernel of a masked format takes (``Format.slot_mask``): the
        array ``convert`` made, or, for an instance built without one, 1 for every in-range
        slot with a valid index (each stored slot is then a coordinate)."""
        name = self.format.slot_mask
        if name and name in self.arrays:
            return self.arrays[name]
        return self.valid_slots().astype(np.uint8)

    def to_scipy(self, values: np.ndarray | None = None) -> sp.csr_matrix:
        """The matrix's entries (its logical pattern) as a canonical scipy CSR matrix: explicit
        zeros the input stored are kept, padding (see the module docstring) is dropped. ``values`` replaces ``data`` (e.g. an SDDMM output)."""
        vals = self.slot_values() if values is None else np.asarray(values).reshape(-1)
        if vals.size != self.stored:
            raise ValueError(f"values should have {self.stored} entries (one per stored slot), got {vals.size}")
        if vals.dtype == np.float16:  # scipy.sparse has no float16; float32 holds it exactly
            vals = vals.astype(np.float32)
        rows, cols = self.stored_coords()
        ok = rows >= 0
        m = sp.csr_matrix((vals[ok], (rows[ok], cols[ok])), shape=self.shape)
        m.sort_indices()
        return m

    def to_dense(self, values: np.ndarray | None = None) -> np.ndarray:
        """The matrix as a dense numpy array (in the instance's dtype)."""
        dtype = self.dtype if values is None else np.asarray(values).dtype
        return self.to_scipy(values).toarray().astype(dtype, copy=False)

    def to_torch(self, layout: str = "csr", values: np.ndarray | None = None):
        """The matrix as a torch tensor: ``layout`` is "csr", "coo" or "dense" (torch is optional)."""
        import torch

        m = self.to_scipy(values)
        if layout == "dense":
            return torch.from_numpy(self.to_dense(values))
        if layout == "csr":
            return torch.sparse_csr_tensor(torch.from_numpy(m.indptr.astype(np.int64)),
                                           torch.from_numpy(m.indices.astype(np.int64)),
                                           torch.from_numpy(m.data), size=m.shape)
        if layout == "coo":
            c = m.tocoo()
            idx = torch.from_numpy(np.vstack([c.row, c.col]).astype(np.int64))
            return torch.sparse_coo_tensor(idx, torch.from_numpy(c.data), size=m.shape).coalesce()
        raise ValueError(f"layout should be 'csr', 'coo' or 'dense', got {layout!r}")

    def with_data(self, data: np.ndarray) -> "FormatInstance":
        """The same structure holding other values (same length and layout)."""
        data = np.ascontiguousarray(np.asarray(data).reshape(-1))
        want = self.data.size if self.format.value_bits == 4 and data.dtype == np.int8 else self.stored
        if data.size != want:
            raise ValueError(f"data should have {want} entries, got {data.size}")
        return FormatInstance(self.format, self.shape, self.arrays, data, self.nnz, self.conversion_s, self._coords)

    def astype(self, dtype) -> "FormatInstance":
        dtype = np.dtype(dtype)
        if dtype.name not in SUPPORTED_VALUE_DTYPES:
            raise TypeError(f"value dtype should be one of {SUPPORTED_VALUE_DTYPES}, got {dtype.name}")
        return self.with_data(self.data.astype(dtype))


def masked_coords(inst: "FormatInstance", rows: np.ndarray, cols: np.ndarray):
    """``(rows, cols)`` with the slots the instance's slot mask marks as padding set to -1
    (for the families' ``stored_coords``; unchanged without a mask)."""
    name = inst.format.slot_mask
    mask = inst.arrays.get(name) if name else None
    if mask is None:
        return rows, cols
    if mask.size != rows.size:
        raise ValueError(f"slot mask {name!r} should have one entry per stored slot ({rows.size}), got {mask.size}")
    pad = mask == 0
    rows, cols = rows.copy(), cols.copy()
    rows[pad] = -1
    cols[pad] = -1
    return rows, cols


def check_slot_mask(inst: "FormatInstance") -> None:
    """O(1): the slot mask, when the instance has one, is a C-contiguous 1-D uint8 array with
    one entry per stored slot (an instance built without one uses ``slot_mask()``'s default)."""
    name = inst.format.slot_mask
    mask = inst.arrays.get(name) if name else None
    if mask is None:
        return
    if not isinstance(mask, np.ndarray) or mask.dtype != np.uint8 or mask.ndim != 1 or not mask.flags.c_contiguous:
        desc = f"{mask.dtype.name} {mask.ndim}-D" if isinstance(mask, np.ndarray) else type(mask).__name__
        raise ValueError(f"arrays[{name!r}] (the slot mask) should be a contiguous 1-D uint8 array, got {desc}")
    if mask.size != inst.stored:
        raise ValueError(f"arrays[{name!r}] (the slot mask) should have one entry per stored slot ({inst.stored}), "
                         f"got {mask.size}")
