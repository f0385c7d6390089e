"""Composite formats: one logical matrix stored as a list of parts, each in its own format.

SparseTIR's central idea: the best storage depends on the matrix, and one matrix can be
split — hyb puts each row (per column partition) into the smallest ELL bucket that holds
it; "bsr+csr" keeps dense blocks in BSR and the rest in CSR. Every stored entry of the
matrix lives in exactly one part, so an operator's result is the combination of its
result on each part: partial sums add up (SpMM), sparse outputs concatenate (SDDMM).

The values of all parts form one array (``data``), the parts' slots one after another;
a kernel receives each part's index arrays and the offset of its slots in ``data``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import scipy.sparse as sp

from .base import Format, FormatInstance


@dataclass(frozen=True)
class CompositeFormat:
    """A named list of part formats. ``params`` are the knobs that produced the split
    (hyb's column partitions and buckets, bsr+csr's block and fill threshold)."""

    name: str
    parts: Tuple[Format, ...]
    params: Tuple[Tuple[str, Any], ...] = ()
    # no row has entries in two parts (hyb with one column partition): each part can own its
    # rows' results outright instead of adding into an output zeroed first
    disjoint_rows: bool = False

    def __post_init__(self):
        if not self.parts:
            raise ValueError(f"composite format {self.name!r} should have at least one part")

    @property
    def spec(self) -> str:
        """The family spec plus the parts actually stored (kernels are compiled per parts)."""
        knobs = ",".join(f"{k}={_text(v)}" for k, v in self.params)
        head = f"{self.name}:{knobs}" if knobs else self.name
        return f"{head}[{'+'.join(p.spec for p in self.parts)}]"

    def param(self, name: str, default=None):
        return dict(self.params).get(name, default)


def _text(v) -> str:
    if isinstance(v, (tuple, list)):
        return "/".join(map(str, v))
    return str(v)


@dataclass
class CompositeInstance:
    """One matrix split into parts. The parts share the logical ``shape``; ``data`` is
    their values one after another (``offsets[k]`` is where part k starts)."""

    format: CompositeFormat
    shape: Tuple[int, int]
    parts: List[FormatInstance]
    nnz: int
    conversion_s: float = 0.0
    _data: Optional[np.ndarray] = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        if len(self.parts) != len(self.format.parts):
            raise ValueError(f"{self.format.name}: {len(self.format.parts)} part formats but {len(self.parts)} parts")
        for p in self.parts:
            if tuple(p.shape) != tuple(self.shape):
                raise ValueError(f"every part should have the matrix's shape {self.shape}, got {p.shape}")

    @property
    def data(self) -> np.ndarray:
        if self._data is None:
            arrays = [p.data for p in self.parts]
            self._data = np.ascontiguousarray(np.concatenate(arrays)) if arrays else np.zeros(0, np.float32)
        return self._data

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def value_dtype(self) -> str:
        return self.parts[0].value_dtype

    @property
    def stored(self) -> int:
        return int(sum(p.stored for p in self.parts))

    @property
    def offsets(self) -> List[int]:
        """Index of each part's first slot in ``data``."""
        return [int(x) for x in np.cumsum([0] + [p.stored for p in self.parts])[:-1]]

    def slot_values(self) -> np.ndarray:
        return np.concatenate([p.slot_values() for p in self.parts]) if self.parts else self.data

    def stored_coords(self) -> Tuple[np.ndarray, np.ndarray]:
        rc = [p.stored_coords() for p in self.parts]
        return (np.concatenate([r for r, _ in rc]), np.concatenate([c for _, c in rc]))

    def valid_slots(self) -> np.ndarray:
        return self.stored_coords()[0] >= 0

    def to_scipy(self, values: np.ndarray | None = None) -> sp.csr_matrix:
        """The matrix's entries as canonical scipy CSR, explicit zeros kept, padding dropped
        (parts never share an entry)."""
        vals = self.slot_values() if values is None else np.asarray(values).reshape(-1)
        if vals.size != self.stored:
            raise ValueError(f"values should have {self.stored} entries (one per stored slot), got {vals.size}")
        if vals.dtype == np.float16:  # scipy.sparse has no float16; float32 holds it exactly
            vals = vals.astype(np.float32)
        rows, cols = self.stored_coords()
        ok = rows >= 0
        # built from coordinates, not by adding the parts: a sum of matrices drops explicit zeros,
        # which are entries of the matrix (formats.base)
        m = sp.csr_matrix((vals[ok], (rows[ok], cols[ok])), shape=self.shape)
        m.sort_indices()
        return m

    def to_dense(self, values: np.ndarray | None = None) -> np.ndarray:
        return self.to_scipy(values).toarray()

    def with_data(self, data: np.ndarray) -> "CompositeInstance":
        data = np.ascontiguousarray(np.asarray(data).reshape(-1))
        if data.size != self.stored:
            raise ValueError(f"data should have {self.stored} entries, got {data.size}")
        parts = [p.with_data(data[off:off + p.stored]) for p, off in zip(self.parts, self.offsets)]
        return CompositeInstance(self.format, self.shape, parts, self.nnz, self.conversion_s)

    def describe(self) -> Dict[str, Any]:
        """What the split looks like: per part its format, stored slots and padding."""
        return {"format": self.format.spec, "parts": [
            {"format": p.format.spec, "stored": p.stored, "nnz": p.nnz} for p in self.parts]}
