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

Trust: a kernel reads index arrays without bounds checks, so an out-of-range index is an
out-of-bounds read. ``convert`` builds every index from a validated canonical CSR and then
*seals* the instance (``FormatInstance.seal``): ``arrays`` then holds read-only views, and the
seal records what was vouched for -- the format, the shape, the view objects, the number of
value slots -- with a token of this process. ``is_sealed()`` compares those (a few attribute
reads, no pass over the data), so a kernel call tells a converted, unmodified instance from
one built by hand, unpickled (the seal is not pickled), or changed since (an array replaced or
made writeable again, the shape or the format changed, ``data`` of another length); those get
their family's full check before every launch (``formats.validate.check_before_launch``).
Changing an index in place raises numpy's "assignment destination is read-only": copy the
array, change the copy, put it back, and the instance is checked at its next launch. Code
that hands index arrays to TVM or torch itself takes ``kernel_arrays()`` (writeable arrays
over the same memory: DLPack refuses read-only arrays, ``torch.from_numpy`` warns).
Not covered (deliberate circumvention): writing through the seal's private writeable arrays,
or flipping a view writeable, writing, and flipping it back.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

import numpy as np
import scipy.sparse as sp

from .axes import Axis

SUPPORTED_VALUE_DTYPES = ("float32", "float64", "float16")

# identifies this process: a seal that reached another process by any route other than
# pickle (which drops it) carries another object there, so the instance is checked again
_PROCESS_TOKEN = object()


@dataclass(frozen=True)
class Seal:
    """What ``FormatInstance.seal`` vouched for (see the module docstring)."""

    token: Any
    format: Any
    shape: Tuple[int, int]
    views: Dict[str, np.ndarray]  # the read-only arrays ``arrays`` holds
    kernel_arrays: Dict[str, np.ndarray]  # writeable arrays over the same memory (DLPack takes no read-only)
    data_size: int

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
    # who chose the format where convert(m, "auto") did: "record", "model" or "default"
    format_source: Optional[str] = field(default=None, compare=False)
    _coords: Any = field(default=None, repr=False, compare=False)
    _seal: Any = field(default=None, repr=False, compare=False)  # a Seal (see the module docstring)

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
        return slots_to_scipy(self, values)

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

    def edge_values(self, x):
        """Per-entry data for a kernel's further sparse inputs (``formats.edge_values``): ``x``
        holds one value (or row of values) per entry of the matrix in canonical CSR order, as
        ``to_scipy()`` lists them, shape (nnz,) or (nnz, *trailing), numpy or torch; or a scipy
        matrix with exactly this pattern. Laid out like ``data`` (padding 0), once."""
        from .edge_values import EdgeValues

        return EdgeValues.build(self, x)

    def coordinate_values(self, stored):
        """Values per stored slot, (stored, *trailing) (a sparse output), -> per entry,
        (nnz, *trailing) in canonical CSR order (aligned with ``to_scipy()``'s entries)."""
        from .edge_values import coordinate_values

        return coordinate_values(self, stored)

    def with_data(self, data: np.ndarray) -> "FormatInstance":
        """The same structure holding other values (same length and layout)."""
        data = np.ascontiguousarray(np.asarray(data).reshape(-1))
        want = self.data.size if self.format.value_bits == 4 and data.dtype == np.int8 else self.stored
        if data.size != want:
            raise ValueError(f"data should have {want} entries, got {data.size}")
        return FormatInstance(self.format, self.shape, self.arrays, data, self.nnz, self.conversion_s, self._coords,
                              _seal=self._seal)

    def astype(self, dtype) -> "FormatInstance":
        dtype = np.dtype(dtype)
        if dtype.name not in SUPPORTED_VALUE_DTYPES:
            raise TypeError(f"value dtype should be one of {SUPPORTED_VALUE_DTYPES}, got {dtype.name}")
        return self.with_data(self.data.astype(dtype))

    # ---- trust (see the module docstring) ------------------------------------------------------
    def seal(self, checked: bool = False, copy: Optional[bool] = None) -> "FormatInstance":
        """Vouch for the index arrays, so that kernel calls skip the full index check while the
        instance stays as it is now. Without ``checked``, the family's full check runs first
        and the arrays are copied (nothing outside the instance then refers to them): the way
        to give an instance built by hand the free path. ``checked=True`` (``convert``): the
        arrays were just built from validated input; ``copy`` (default: not ``checked``) says
        whether something outside may hold them."""
        copy = not checked if copy is None else copy
        if not checked:
            self._seal, self._coords = None, None  # coords: a cache, stale if an array was replaced
            _family(self.format).check(self, full=True)
        own = {}
        for n in self.format.index_array_names():
            a = self.arrays[n]
            own[n] = a.copy() if copy or not a.flags.writeable else a
        views = {}
        for n, a in own.items():
            views[n] = a.view()
            views[n].flags.writeable = False
        self.arrays.update(views)
        self._seal = Seal(_PROCESS_TOKEN, self.format, tuple(self.shape), views, own, int(self.data.size))
        return self

    def is_sealed(self) -> bool:
        """Whether the instance is as ``seal`` left it, in this process: the same format, shape
        and (read-only) index array objects, and as many value slots. O(number of arrays)."""
        s = self._seal
        if s is None or s.token is not _PROCESS_TOKEN or tuple(self.shape) != s.shape or \
                (self.format is not s.format and self.format != s.format):
            return False
        data = self.data
        if not isinstance(data, np.ndarray) or data.ndim != 1 or data.size != s.data_size:
            return False
        arrays = self.arrays
        return all(arrays.get(n) is a and not a.flags.writeable for n, a in s.views.items())

    def kernel_arrays(self) -> Dict[str, np.ndarray]:
        """The index arrays to hand a kernel, by name: a sealed instance's writeable arrays
        (the same objects every call, so device copies can be cached); otherwise ``arrays``,
        read-only ones copied (DLPack cannot export them)."""
        if self.is_sealed():
            return dict(self._seal.kernel_arrays)
        return {n: a if a.flags.writeable else a.copy()
                for n, a in ((n, self.arrays[n]) for n in self.format.index_array_names())}

    def __getstate__(self):
        """Pickle without the seal (the unpickled copy is checked before its first launch) and
        without device copies a kernel cached on the instance."""
        state = dict(self.__dict__)
        state["_seal"] = None
        for cache in ("_device_arrays", "_slot_map", "_slot_map_device"):
            state.pop(cache, None)
        return state

def slots_to_scipy(inst, values: np.ndarray | None = None) -> sp.csr_matrix:
    """One value per stored slot of ``inst`` (a format instance or a composite: anything with
    ``slot_values``, ``stored``, ``stored_coords`` and ``shape``) as canonical scipy CSR at the
    slots' coordinates. Built from coordinates, never by adding matrices: a sum drops explicit
    zeros, which are entries of the matrix."""
    vals = inst.slot_values() if values is None else np.asarray(values).reshape(-1)
    if vals.size != inst.stored:
        raise ValueError(f"values should have {inst.stored} entries (one per stored slot), got {vals.size}")
    if vals.dtype == np.float16:  # scipy.sparse has no float16; float32 holds it exactly
        vals = vals.astype(np.float32)
    rows, cols = inst.stored_coords()
    ok = rows >= 0
    m = sp.csr_matrix((vals[ok], (rows[ok], cols[ok])), shape=inst.shape)
    m.sort_indices()
    return m


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
