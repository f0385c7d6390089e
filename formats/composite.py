"""Composite formats: one logical matrix stored as a list of parts, each in its own format.

SparseTIR's central idea: the best storage depends on the matrix, and one matrix can be
split — hyb puts each row (per column partition) into the smallest ELL bucket that holds
it; "bsr+csr" keeps dense blocks in BSR and the rest in CSR. Every stored entry of the
matrix lives in exactly one part, so an operator's result is the combination of its
result on each part: partial sums add up (SpMM), sparse outputs concatenate (SDDMM).

The values of all parts form one array (``data``), the parts' slots one after another;
a kernel receives each part's index arrays and the offset of its slots in ``data``.

Reuse. A family's parameters fix its part list: every part the parameters allow is
present, an empty one with no rows (hyb's empty buckets, bsr+csr's empty BSR or CSR
part), so a kernel compiled for one matrix runs on any other converted with the same
spec; only the parts' sizes change, and kernels take them at run time. The one thing a
part's *format* may still learn from its matrix is whether its rows repeat (hyb's widest
bucket splits rows longer than it): ``reuse_problem`` says when a kernel compiled for one
format cannot run on a matrix in another, and ``matrix_requirements`` what a kernel
compiled for a converted matrix (rather than for its spec) asks of later matrices.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import scipy.sparse as sp

from .base import Format, FormatInstance, slots_to_scipy


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

    @cached_property  # kernels compare specs on every call; the format is frozen
    def family_spec(self) -> str:
        """The family with its resolved parameters, without the part list, e.g.
        ``hyb:col_parts=1,buckets=1/2/4/8`` for a matrix converted with plain ``hyb``. Convert
        other matrices with it to get the same parts (a kernel compiled for this format then
        runs on them), or compile for it to get a kernel that depends on no one matrix."""
        knobs = ",".join(f"{k}={_text(v)}" for k, v in self.params)
        return f"{self.name}:{knobs}" if knobs else self.name

    @cached_property
    def spec(self) -> str:
        """``family_spec`` plus the part formats, e.g. ``hyb:col_parts=1,buckets=1/2[rell:1+rell:2,dup]``
        (what kernels record; the family's ``parse_spec`` ignores the part list, and
        ``registry.format_from_spec`` reads it back exactly)."""
        return f"{self.family_spec}[{'+'.join(p.spec for p in self.parts)}]"

    def param(self, name: str, default=None):
        return dict(self.params).get(name, default)


def takes_part(compiled: Format, got: Format) -> bool:
    """A kernel compiled for part format ``compiled`` computes correctly on a part in ``got``:
    the same format, or one whose rows may repeat (``unique=False`` root) where ``got``'s do
    not: such a part adds each row's partial results into an output filled first, which is
    also right for a row met once."""
    if compiled == got:
        return True
    if compiled.name != got.name or compiled.axes[0].unique or not got.axes[0].unique:
        return False
    relaxed = replace(compiled, axes=(replace(compiled.axes[0], unique=True),) + tuple(compiled.axes[1:]),
                      params=tuple((k, True if k == "unique" else v) for k, v in compiled.params))
    return relaxed == got


def _same_but_unique(a: Format, b: Format) -> bool:
    return takes_part(a, b) or takes_part(b, a)


def reuse_problem(compiled: "CompositeFormat", got) -> Optional[str]:
    """Why a kernel compiled for ``compiled`` would not compute correctly on a matrix in format
    ``got`` (None: it would). Equal part lists (``takes_part`` for each) are enough: parameters
    that only steer the split (bsr+csr's ``block_fill``) do not change the kernel. Rows that no
    two parts of ``compiled`` share must not be shared in ``got`` either (``disjoint_rows``)."""
    if not isinstance(got, CompositeFormat) or got.name != compiled.name:
        return f"compiled for {compiled.spec}, got a matrix in {got.spec}"
    fits = len(got.parts) == len(compiled.parts) and (got.disjoint_rows or not compiled.disjoint_rows)
    if not fits or not all(_same_but_unique(c, g) for c, g in zip(compiled.parts, got.parts)):
        if compiled.family_spec != got.family_spec:
            return (f"compiled for {compiled.family_spec}, got {got.family_spec}: convert the matrix with "
                    f"spec '{compiled.family_spec}'")
        return f"compiled for {compiled.spec}, got a matrix in {got.spec}"
    for k, (c, g) in enumerate(zip(compiled.parts, got.parts)):
        if not takes_part(c, g):
            return (f"compiled for {compiled.family_spec} from a matrix whose part {k} ({c.spec}) lists each "
                    f"row once; this matrix's part {k} is {g.spec}: its rows repeat (split over several "
                    f"positions), and the kernel would not add up their partial results")
    return None


def matrix_requirements(compiled: "CompositeFormat", template: "CompositeFormat") -> List[str]:
    """What a kernel compiled for ``compiled`` (a converted matrix's format) asks of a matrix
    beyond being converted with its ``family_spec``, whose kernel is ``template``: each part
    compiled for rows listed once where the template allows repeats."""
    return [f"part {k} ({c.spec}) lists each row once: a matrix whose part {k} is {t.spec} (rows repeat) "
            f"is refused; compile for the spec '{compiled.family_spec}' to take any"
            for k, (c, t) in enumerate(zip(compiled.parts, template.parts))
            if c != t and takes_part(t, c)]


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
    format_source: Optional[str] = field(default=None, compare=False)  # as FormatInstance's
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
        return slots_to_scipy(self, values)

    def to_dense(self, values: np.ndarray | None = None) -> np.ndarray:
        return self.to_scipy(values).toarray()

    def edge_values(self, x):
        """Per-entry data in the parts' stored layout (see ``FormatInstance.edge_values``)."""
        from .edge_values import EdgeValues

        return EdgeValues.build(self, x)

    def coordinate_values(self, stored):
        """(stored, *trailing) -> (nnz, *trailing) in canonical CSR order (``FormatInstance``'s)."""
        from .edge_values import coordinate_values

        return coordinate_values(self, stored)

    def __getstate__(self):
        """Pickle without caches of this process (slot maps, device copies)."""
        state = dict(self.__dict__)
        for cache in ("_device_arrays", "_slot_map", "_slot_map_device"):
            state.pop(cache, None)
        return state

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
