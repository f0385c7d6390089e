"""Edge data: per-entry values on a converted matrix's pattern, in its stored-slot layout.

An operator may read further sparse inputs besides the matrix (edge weights, edge types,
multi-head logits: ``sparsec.dsl``). A kernel reads them like the matrix's own values, one
per stored slot (times trailing axes), so they must be laid out as the format stores its
values: composite parts one after another, BSR blocks with their implicit zeros, ELL rows
padded. Users think in coordinates, so the two meet here:

  * ``EdgeValues.build(inst, x)`` (``inst.edge_values(x)``): ``x`` per coordinate, in the
    canonical CSR order of the matrix (aligned with ``inst.to_scipy()``'s entries), shape
    ``(nnz,)`` or ``(nnz, *trailing)``, numpy or torch (or a scipy matrix with exactly the
    matrix's pattern) -> values per stored slot, 0 at padding, plus a token of the pattern
    they belong to (a kernel refuses them on another matrix) and, for integers, their range
    (a kernel checks index values against an extent in O(1));
  * ``coordinate_values(inst, stored)``: the way back, e.g. for a sparse output with
    trailing axes: ``(stored, *trailing)`` -> ``(nnz, *trailing)`` in canonical CSR order.

Cost: the slot <-> coordinate map is one argsort of the stored coordinates (O(stored log
stored)), cached on a sealed instance (its index arrays cannot change); a gather is then
O(stored x trailing) on the host, or on the GPU for a CUDA torch tensor (the map copied to
the device once per instance and device).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

import numpy as np


def pattern_token(inst) -> Any:
    """What identifies ``inst``'s stored layout: the seal of a sealed instance (an instance made
    by ``with_data`` shares it; a replaced index array breaks it), else the instance itself.
    A composite: the tuple of its parts' tokens."""
    parts = getattr(inst, "parts", None)
    if parts is not None and not hasattr(inst, "arrays"):
        return tuple(pattern_token(p) for p in parts)
    return inst._seal if inst.is_sealed() else inst


def same_pattern(a, b) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(same_pattern(x, y) for x, y in zip(a, b))
    return a is b


def _sealed(inst) -> bool:
    parts = getattr(inst, "parts", None)
    if parts is not None and not hasattr(inst, "arrays"):
        return all(p.is_sealed() for p in parts)
    return inst.is_sealed()


@dataclass(frozen=True)
class SlotMap:
    """``slots[e]``: the stored slot of the e-th entry in canonical CSR order (entries x 1)."""

    slots: np.ndarray  # int64, one per entry
    stored: int
    rows: np.ndarray  # the entries' coordinates, canonical order (for messages)
    cols: np.ndarray


def slot_map(inst) -> SlotMap:
    """The entry -> slot map of ``inst`` (cached while the instance stays sealed)."""
    token = pattern_token(inst)
    cache = inst.__dict__.get("_slot_map")
    if cache is not None and same_pattern(cache[0], token):
        return cache[1]
    rows, cols = inst.stored_coords()
    valid = np.flatnonzero(rows >= 0)
    n_cols = max(int(inst.shape[1]), 1)
    keys = rows[valid].astype(np.int64) * n_cols + cols[valid]
    order = np.argsort(keys, kind="stable")
    m = SlotMap(valid[order].astype(np.int64), int(inst.stored), rows[valid][order].astype(np.int64),
                cols[valid][order].astype(np.int64))
    if _sealed(inst):
        inst.__dict__["_slot_map"] = (token, m)
    return m


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def _dtype_name(x) -> str:
    return str(x.dtype).replace("torch.", "") if _is_torch(x) else np.dtype(x.dtype).name


def _device_slots(inst, m: SlotMap, device):
    """``m.slots`` as a torch int64 tensor on ``device`` (cached per instance and device)."""
    import torch

    cache = inst.__dict__.setdefault("_slot_map_device", {})
    key = str(device)
    hit = cache.get(key)
    if hit is None or hit[0] is not m:
        cache.clear()
        hit = cache[key] = (m, torch.from_numpy(m.slots).to(device))
    return hit[1]


def to_slots(inst, x, what: str = "values"):
    """Per-coordinate values ``x`` ((nnz, *trailing), numpy or torch) -> stored-slot layout
    ((stored, *trailing), same library and device, 0 at padding)."""
    m = slot_map(inst)
    shape = tuple(int(s) for s in x.shape)
    if not shape or shape[0] != m.slots.size:
        raise ValueError(f"{what} should have one value per entry of the matrix in canonical CSR order, shape "
                         f"({m.slots.size}, ...), got {shape}")
    if _is_torch(x):
        out = x.new_zeros((m.stored,) + shape[1:])
        out[_device_slots(inst, m, x.device)] = x
        return out
    out = np.zeros((m.stored,) + shape[1:], dtype=x.dtype)
    out[m.slots] = x
    return out


def coordinate_values(inst, stored):
    """Stored-slot values ``(stored, *trailing)`` (a sparse output, edge data) -> per entry
    ``(nnz, *trailing)`` in canonical CSR order (aligned with ``inst.to_scipy()``'s entries)."""
    m = slot_map(inst)
    if isinstance(stored, EdgeValues):
        stored = stored.values
    shape = tuple(int(s) for s in stored.shape)
    if not shape or shape[0] != m.stored:
        raise ValueError(f"stored values should have one row per stored slot ({m.stored}), got shape {shape}")
    if _is_torch(stored):
        return stored[_device_slots(inst, m, stored.device)]
    return np.asarray(stored)[m.slots]


@dataclass(frozen=True, eq=False)
class EdgeValues:
    """Per-entry values of one matrix in its stored-slot layout (see the module docstring).
    ``values``: (stored, *trailing), numpy (read-only) or torch; ``low``/``high``: the range of
    integer values (None for floats), for kernels that index with them."""

    values: Any
    pattern: Any
    shape: Tuple[int, int]
    nnz: int
    low: Optional[int] = None
    high: Optional[int] = None
    kernel_values: Any = field(default=None, repr=False)  # writeable twin of numpy ``values`` (DLPack)
    device_cache: Dict[str, Any] = field(default_factory=dict, repr=False)  # device copies by device

    @property
    def dtype(self) -> str:
        return _dtype_name(self.values)

    @property
    def trailing(self) -> Tuple[int, ...]:
        return tuple(int(s) for s in self.values.shape[1:])

    @classmethod
    def build(cls, inst, x) -> "EdgeValues":
        if hasattr(x, "tocsr") and hasattr(x, "nnz"):  # a scipy matrix: its pattern must be the matrix's
            x = _scipy_values(inst, x)
        elif not (_is_torch(x) or isinstance(x, np.ndarray)):
            x = np.asarray(x)
        if _is_torch(x) and x.requires_grad:
            raise ValueError("edge values require grad, and a kernel records no gradient; pass them .detach()-ed")
        stored = to_slots(inst, x, "edge values")
        low = high = None
        if not _dtype_name(stored).startswith(("float", "bfloat")) and stored.shape[0] and np.prod(stored.shape[1:]):
            low, high = int(stored.min()), int(stored.max())  # padding's 0 included: a kernel reads it too
        view = stored
        if isinstance(stored, np.ndarray):
            view = stored.view()
            view.flags.writeable = False  # the range above stays true
        return cls(view, pattern_token(inst), tuple(int(s) for s in inst.shape), int(x.shape[0]), low, high, stored)

    def belongs_to(self, inst) -> bool:
        return same_pattern(self.pattern, pattern_token(inst))

    def __repr__(self):
        return f"EdgeValues({self.dtype} {tuple(self.values.shape)} for a {self.shape} matrix with {self.nnz} entries)"


def _scipy_values(inst, x) -> np.ndarray:
    """A scipy matrix's values in canonical CSR order, refused unless its pattern is the matrix's."""
    m = x.tocsr(copy=True)
    m.sum_duplicates()
    m.sort_indices()
    ref = inst.to_scipy()
    if m.shape != ref.shape or m.nnz != ref.nnz or not (np.array_equal(m.indptr, ref.indptr)
                                                       and np.array_equal(m.indices, ref.indices)):
        raise ValueError(f"edge values given as a scipy matrix ({m.shape}, {m.nnz} entries) should have exactly the "
                         f"matrix's pattern ({ref.shape}, {ref.nnz} entries); give an array of one value per entry "
                         "in canonical CSR order instead")
    return m.data
