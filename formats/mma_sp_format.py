"""The ``mma_sp`` format family: 2:4 sparsity for the sparse Tensor Core instruction.

Logically it is ``nm:2:4`` (element-wise): the same axis chain, ``indices`` and ``data``
(``formats.nm``), so every operator lowers over it on any target. Conversion also packs the
matrix once into the operand of ``mma.sp.m16n8k32`` (``formats.mma_sp``: values and
metadata in the lane order the pipelined kernel copies as is), for float16 values:

* ``sp24_values`` (Mp, Kp/2) float16, rows padded to 16, columns to 32;
* ``sp24_meta``   (Mp/16, Kp/32, 16) uint32.

Other value dtypes carry no packed operand (the generic kernels run). Spec: ``mma_sp``
(``mma_sp:2:4`` and ``mma_sp:2,4`` are the same; the instruction's pattern is fixed).
"""
from __future__ import annotations

import time

import numpy as np

from . import mma_sp, nm, packed
from .base import Format, FormatInstance

NAME = "mma_sp"
DESCRIPTION = ("2:4 for the sparse Tensor Core instruction mma.sp: nm:2:4's axes, plus the float16 operand "
               "and metadata packed once in the instruction's lane order")
PACKED = packed.SP24
N, M = 2, 4


def parse_spec(arg: str | None) -> dict:
    """``""``, ``"2:4"`` or ``"2,4"`` -> {} (no parameters: the pattern is the instruction's)."""
    if arg and arg.replace(",", ":").replace(" ", "") != "2:4":
        raise ValueError(f"mma_sp is 2:4 only (the pattern of the mma.sp instruction), got {arg!r}; "
                         "write 'mma_sp', or 'nm:N:M' for other N:M patterns")
    return {}


def declare() -> Format:
    return Format(NAME, nm.declare(N, M).axes, (("n", N), ("m", M)))


def spec_text(fmt: Format) -> str:
    return NAME


def tensor_core_layout(fmt: Format, dtype: str):
    """The packed operand a kernel may read: ``sp24`` for float16 values."""
    return "sp24" if dtype == "float16" else None


def _wrap(src: FormatInstance, t0: float) -> FormatInstance:
    """An ``nm:2:4`` instance as an ``mma_sp`` one, packed when its values are float16."""
    inst = FormatInstance(declare(), src.shape, {"indices": src.arrays["indices"]}, src.data, src.nnz)
    return packed.seal(inst, packed.sp24_operands, t0, check)


def from_matrix(matrix, *, shape=None, dtype=None) -> FormatInstance:
    """``matrix`` (anything ``as_csr`` accepts), which must already be 2:4: at most two stored
    entries in every group of four columns of a row (``prune`` makes it so)."""
    t0 = time.perf_counter()
    return _wrap(nm.from_matrix(matrix, n=N, m=M, shape=shape, dtype=dtype), t0)


def prune(dense_or_sparse, *, dtype=None):
    """Magnitude pruning to 2:4 (``formats.nm.prune``): ``(instance, keep)``."""
    t0 = time.perf_counter()
    src, keep = nm.prune(dense_or_sparse, n=N, m=M, dtype=dtype)
    return _wrap(src, t0), keep


root_extent, extents, stored_coords, stats = nm.root_extent, nm.extents, nm.stored_coords, nm.stats


def check(inst: FormatInstance, full: bool = False) -> None:
    """``formats.nm.check``, plus the packed operand: present for float16 values, with the
    shapes ``formats.mma_sp`` gives the matrix; ``full`` also unpacks it against ``data``."""
    nm.check(inst, full)
    have = [n for n in PACKED if n in inst.arrays]
    if inst.data.dtype != np.float16:
        return
    if len(have) != len(PACKED):
        raise ValueError(f"arrays should hold the packed mma.sp operand {list(PACKED)} for float16 values, "
                         f"got {sorted(inst.arrays)} (convert with sparsec.formats.convert(matrix, 'mma_sp'))")
    mp, kp = mma_sp.padded_shape(*inst.shape)
    values, meta = (inst.arrays[n] for n in PACKED)
    if values.shape != (mp, kp // 2) or values.dtype != np.float16:
        raise ValueError(f"sp24_values should be float16 {(mp, kp // 2)} for shape {inst.shape}, "
                         f"got {values.dtype.name} {values.shape}")
    if meta.shape != (mp // 16, kp // 32, 16) or meta.dtype != np.uint32:
        raise ValueError(f"sp24_meta should be uint32 {(mp // 16, kp // 32, 16)} for shape {inst.shape}, "
                         f"got {meta.dtype.name} {meta.shape}")
    if full and not np.array_equal(mma_sp.unpack(values, meta, inst.shape).astype(np.float64),
                                   inst.to_dense().astype(np.float64), equal_nan=True):
        raise ValueError("sp24_values/sp24_meta should encode the same matrix as data, got a different one")
