"""The Tensor Core operands a matrix is packed into (``mma_sp``'s 2:4 values and metadata,
``nm_tc``'s gathered values and columns), and how an instance carries them: cached under
:data:`CACHE` with the ``data`` array they were packed from, so a kernel hands the same
arrays to the device every call and values replaced later (``with_data``) are packed again.
The ``mma_sp`` and ``nm_tc`` families pack at conversion (:func:`seal`); the kernel layer
(``sparsec.tc_operands``) packs other instances (``nm:2:4``) on first use."""
from __future__ import annotations

import time
from typing import Callable, Dict

import numpy as np

from . import mma_sp, nm_tc

CACHE = "_packed_operands"  # instance attribute: (data packed from, {name: array})
SP24 = ("sp24_values", "sp24_meta")
GATHER = ("gather_values", "gather_cols")


def sp24_operands(inst) -> Dict[str, np.ndarray]:
    """The mma.sp operand of a 2:4 instance: compressed float16 values and metadata."""
    return dict(zip(SP24, mma_sp.pack(inst.to_dense().astype(np.float16))))


def gather_operands(inst) -> Dict[str, np.ndarray]:
    """The gathered layout of a vector-wise N:M instance: float16 values and kept columns."""
    n, m, vec = (int(inst.format.param(k, 1)) for k in ("n", "m", "vec"))
    return dict(zip(GATHER, nm_tc.pack(inst.to_dense(), n=n, m=m, vec=vec, dtype="float16")))


def seal(inst, pack: Callable[[object], Dict[str, np.ndarray]], t0: float, check: Callable[[object], None]):
    """``inst`` packed by ``pack`` when its values are float16 (the arrays joined to its own
    and cached), timed from ``t0`` and checked: the last step of a packed family's conversion."""
    if inst.data.dtype == np.float16:
        packed = pack(inst)
        inst.arrays.update(packed)
        inst.__dict__[CACHE] = (inst.data, dict(packed))
    inst.conversion_s = time.perf_counter() - t0
    check(inst)
    return inst
