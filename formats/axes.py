"""Axis kinds: the levels every sparse format is composed of (SparseTIR's four kinds).

A format is a chain of axes, outermost first. Each axis states its properties as
plain flags, and lowering asks about those flags — never about a format's name:

    variable   the axis's extent depends on its parent's position (it owns an ``indptr``)
    sparse     the axis's coordinate is read from an ``indices`` array (not its loop index)
    padded     some stored slots are padding, marked by a sentinel index of -1
    unique     no coordinate repeats among the axis's positions (a root that lists row ids
               may repeat a row, e.g. hyb's split rows; kernels then combine partial sums)

Positions compose the way SparseTIR's ``ComputeOffset`` does, so every value and
index array can be stored flat:

    DenseFixed     pos = parent_pos * extent + p            (root: pos = p)
    DenseVariable  pos = indptr[parent_pos] + p,  p < indptr[parent_pos + 1] - indptr[parent_pos]
    SparseFixed    pos = parent_pos * width + p,   coord = indices[pos]   (-1 = padding)
    SparseVariable pos = indptr[parent_pos] + p,   coord = indices[pos]

Each axis contributes ``coord * scale`` to one logical dimension (``dim`` 0 = rows,
1 = columns); BSR's block-row axis has scale r and its in-block axis scale 1.

Padding that no axis flag can mark: a dense inner axis (BSR's in-block rows and columns,
an N:M or SR-BCRS vector's rows) stores every slot, entry or not. Such formats declare a
slot mask (``Format.slot_mask``, ``formats.base``): one byte per stored slot, 1 at the
matrix's coordinates. Stage II guards with it every statement that a padded slot could
change (``sparsec.lower.padding``); ``padded`` (-1 indices) and ``scale`` (the edge) are
guarded from the indices alone.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional


@dataclass(frozen=True)
class Axis:
    """One level of a format. ``name`` is unique within a format."""

    name: str
    dim: int
    scale: int = 1

    variable: ClassVar[bool] = False
    sparse: ClassVar[bool] = False
    padded: ClassVar[bool] = False
    unique: ClassVar[bool] = True

    def __post_init__(self):
        if self.dim not in (0, 1):
            raise ValueError(f"axis {self.name!r}: dim should be 0 (rows) or 1 (columns), got {self.dim}")
        if self.scale < 1:
            raise ValueError(f"axis {self.name!r}: scale should be >= 1, got {self.scale}")

    @property
    def kind(self) -> str:
        return type(self).__name__


@dataclass(frozen=True)
class DenseFixed(Axis):
    """A dense axis of fixed extent. ``extent=None`` means it is only known at run time
    (the root axis of a matrix, whose length is the number of (block) rows, or N:M's
    number of windows per row); kernels take it as a scalar ``n_<name>``."""

    extent: Optional[int] = None


@dataclass(frozen=True)
class DenseVariable(Axis):
    """A ragged dense axis: a per-parent length given by ``indptr`` (name of the index array)."""

    indptr: str = "indptr"
    variable: ClassVar[bool] = True


@dataclass(frozen=True)
class SparseFixed(Axis):
    """ELL-like: ``width`` slots per parent, coordinates in ``indices``; unused slots hold -1
    when ``padded``. As the first axis (no parent) with ``width=None`` it lists coordinates
    of a run-time length: hyb's buckets list their rows this way (``unique=False`` when a
    long row is split over several slots)."""

    width: Optional[int] = 1
    indices: str = "indices"
    padded: bool = True
    unique: bool = True
    sparse: ClassVar[bool] = True


@dataclass(frozen=True)
class SparseVariable(Axis):
    """CSR-like: a per-parent count from ``indptr`` and coordinates from ``indices``.
    ``padded``: some slots are padding with index -1 (SR-BCRS pads rows to the MMA k)."""

    indptr: str = "indptr"
    indices: str = "indices"
    padded: bool = False
    variable: ClassVar[bool] = True
    sparse: ClassVar[bool] = True


AXIS_KINDS = (DenseFixed, DenseVariable, SparseFixed, SparseVariable)
