"""CSR: a dense row axis over a variable-length sparse column axis.

The reference format: every other format converts from canonical CSR, and its
instance arrays are exactly that canonical CSR (no padding, ``stored == nnz``).
"""
from __future__ import annotations

import time

import numpy as np

from . import validate as V
from .axes import DenseFixed, SparseVariable
from .base import Format, FormatInstance
from .convert import canonical_csr
from .stats import summarize

NAME = "csr"
DESCRIPTION = "compressed sparse rows: indptr + sorted column indices, no padding"


def parse_spec(arg: str | None) -> dict:
    if arg:
        raise ValueError(f"csr takes no parameters: spec should be 'csr', got 'csr:{arg}'")
    return {}


def declare() -> Format:
    return Format(NAME, (DenseFixed("i", dim=0),
                         SparseVariable("j", dim=1, indptr="indptr", indices="indices")), ())


def from_matrix(matrix, *, shape=None, dtype=None) -> FormatInstance:
    t0 = time.perf_counter()
    m = canonical_csr(matrix, shape=shape, dtype=dtype)
    inst = FormatInstance(declare(), tuple(int(s) for s in m.shape),
                          {"indptr": m.indptr, "indices": m.indices}, m.data, int(m.nnz))
    inst.conversion_s = time.perf_counter() - t0
    check(inst)
    return inst


def root_extent(inst: FormatInstance) -> int:
    return int(inst.shape[0])


def stored_coords(inst: FormatInstance):
    return V.major_ids(inst.arrays["indptr"]), inst.arrays["indices"].astype(np.int64)


def check(inst: FormatInstance, full: bool = False) -> None:
    """O(1) consistency of the arrays with the shape; ``full`` also scans the indices."""
    V.check_instance_arrays(inst, ("indptr", "indices"))
    rows, cols = inst.shape
    indptr, indices = inst.arrays["indptr"], inst.arrays["indices"]
    if indptr.size != rows + 1:
        raise ValueError(f"indptr has {indptr.size} entries, should be rows + 1 = {rows + 1}")
    if indptr[-1] != indices.size:
        raise ValueError(f"indptr should end at nnz = len(indices) = {indices.size}, got {int(indptr[-1])}")
    if inst.data.size != indices.size:
        raise ValueError(f"data should have one value per index ({indices.size}), got {inst.data.size}")
    if inst.nnz != indices.size:
        raise ValueError(f"nnz should be len(indices) = {indices.size}, got {inst.nnz}")
    if full:
        V.check_indptr(indptr, rows, indices.size)
        V.check_range(indices, cols, V.major_ids(indptr), name="indices")
        V.check_sorted_rows(indptr, indices)


def stats(inst: FormatInstance) -> dict:
    return summarize(inst, np.diff(inst.arrays["indptr"]))
