"""The ``nm_tc`` format family: vector-wise N:M for the gathered Tensor Core SpMM.

Logically it is ``nm:N:M:vV`` with V rows sharing their kept columns (``formats.nm``'s
vector-wise axis chain, ``indices``, ``data`` and slot mask), so every operator lowers over
it on any target. Conversion also packs the matrix once into the layout the pipelined
kernel gathers from (``formats.nm_tc``), for float16 values:

* ``gather_values`` (Mp, Kc) float16: row r's values at its vector's kept columns;
* ``gather_cols``   (Mp/V, Kc) int32: each row vector's kept columns.

V is 16, 32, 64 or 128 (a multiple of the kernel's block rows); default 128. Spec grammar as
``nm``'s: ``nm_tc:N:M`` (V = 128), ``nm_tc:1:8:v16``, ``nm_tc:1,8,v=64``, ``nm_tc:1,8,128``.
"""
from __future__ import annotations

import time

import numpy as np

from . import nm, nm_tc, packed
from .base import Format, FormatInstance

NAME = "nm_tc"
DESCRIPTION = ("vector-wise N:M for the gathered Tensor Core SpMM: V rows (16..128) share N kept columns "
               "in every M, plus the float16 values and columns packed once for the kernel's gather")
PACKED = packed.GATHER
VECS = (16, 32, 64, 128)
DEFAULT_VEC = 128


def _vec(vec) -> int:
    if vec not in VECS or isinstance(vec, bool):
        raise ValueError(f"vec should be one of {VECS} (a multiple of the Tensor Core block's rows), got {vec!r}")
    return int(vec)


def parse_spec(arg: str | None) -> dict:
    """``"1:8"`` -> {n: 1, m: 8, vec: 128}; ``"1:8:v16"``, ``"1,8,v=16"``, ``"1,8,16"`` -> vec 16."""
    if not arg:
        return {"n": None, "m": None, "vec": DEFAULT_VEC}
    parts = [p for p in arg.replace(",", ":").split(":") if p.strip()]
    got = nm.parse_spec(arg if len(parts) != 2 else f"{arg}:{DEFAULT_VEC}")
    return {"n": got["n"], "m": got["m"], "vec": _vec(got["vec"])}


def declare(n=None, m=None, vec=DEFAULT_VEC) -> Format:
    if n is None or m is None:
        raise ValueError("nm_tc needs N and M: spec 'nm_tc:1:8' (or 'nm_tc:1:8:v16'), or n=1, m=8 (and vec=16)")
    fmt = nm.declare(n, m, _vec(vec))
    return Format(NAME, fmt.axes, fmt.params, slot_mask=fmt.slot_mask)


def tensor_core_layout(fmt: Format, dtype: str):
    """The packed operand a kernel may read: ``gather`` for float16 and bfloat16 values (the
    conversion packs float16 ones; bfloat16 ones are packed on a kernel's first call)."""
    return "gather" if dtype in ("float16", "bfloat16") else None


def _wrap(src: FormatInstance, t0: float) -> FormatInstance:
    """An ``nm:N:M:vV`` instance as an ``nm_tc`` one, packed when its values are float16."""
    n, m, vec = (int(src.format.param(k)) for k in ("n", "m", "vec"))
    arrays = {k: v for k, v in src.arrays.items() if k in ("indices", nm.MASK)}
    inst = FormatInstance(declare(n, m, vec), src.shape, arrays, src.data, src.nnz)
    return packed.seal(inst, packed.gather_operands, t0, check)


def from_matrix(matrix, *, n=None, m=None, vec=DEFAULT_VEC, shape=None, dtype=None) -> FormatInstance:
    """``matrix``, which must already be vector-wise N:M (the V rows of a vector use at most N
    distinct columns in every window of M; ``prune`` makes it so)."""
    t0 = time.perf_counter()
    return _wrap(nm.from_matrix(matrix, n=n, m=m, vec=_vec(vec), shape=shape, dtype=dtype), t0)


def prune(dense_or_sparse, *, n, m, vec=DEFAULT_VEC, dtype=None):
    """Magnitude pruning to vector-wise N:M (``formats.nm.prune``): ``(instance, keep)``."""
    t0 = time.perf_counter()
    src, keep = nm.prune(dense_or_sparse, n=n, m=m, vec=_vec(vec), dtype=dtype)
    return _wrap(src, t0), keep


root_extent, extents, stored_coords, stats = nm.root_extent, nm.extents, nm.stored_coords, nm.stats


def check(inst: FormatInstance, full: bool = False) -> None:
    """``formats.nm.check``, plus the packed layout: present for float16 values, checked by
    ``formats.nm_tc.check``; ``full`` also unpacks it against ``data``."""
    nm.check(inst, full)
    if inst.data.dtype != np.float16:
        return
    if not all(k in inst.arrays for k in PACKED):
        raise ValueError(f"arrays should hold the packed layout {list(PACKED)} for float16 values, got "
                         f"{sorted(inst.arrays)} (convert with sparsec.formats.convert(matrix, '{inst.format.spec}'))")
    values, cols = (inst.arrays[k] for k in PACKED)
    vec = int(inst.format.param("vec"))
    nm_tc.check(values, cols, inst.shape, vec)
    if full and not np.array_equal(nm_tc.unpack(values, cols, inst.shape, vec),
                                   inst.to_dense().astype(np.float64), equal_nan=True):
        raise ValueError("gather_values/gather_cols should encode the same matrix as data, got a different one")
