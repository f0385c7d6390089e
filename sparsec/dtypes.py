"""Precisions: which dtype the sparse values, the dense operands and the results take.

float32 and float64 kernels compute in their dtype. float16 and bfloat16 kernels read
16-bit values and dense operands and accumulate in float32, which is also the output
dtype (as Tensor Cores do; cast the result if 16 bits are wanted). Integer kernels
(SR-BCRS int8/int4) read int8 (or int4, packed two per byte) values and int8 dense
operands and accumulate exactly in int32, which is also the output dtype.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DtypeSpec:
    name: str
    sparse: str  # one value of the sparse matrix: float32 | float64 | float16 | bfloat16 | int8 | int4
    dense: str  # dense inputs
    out: str  # outputs, temporaries and the accumulation

    @property
    def sparse_storage(self) -> str:
        """The array dtype holding the sparse values (int4 is packed into int8 bytes)."""
        return "int8" if self.sparse == "int4" else self.sparse

    @property
    def exact(self) -> bool:
        return self.out.startswith("int")


SPECS = {
    "float32": DtypeSpec("float32", "float32", "float32", "float32"),
    "float64": DtypeSpec("float64", "float64", "float64", "float64"),
    "float16": DtypeSpec("float16", "float16", "float16", "float32"),
    "bfloat16": DtypeSpec("bfloat16", "bfloat16", "bfloat16", "float32"),
    "int8": DtypeSpec("int8", "int8", "int8", "int32"),
    "int4": DtypeSpec("int4", "int4", "int8", "int32"),
}


def dtype_spec(name) -> DtypeSpec:
    if isinstance(name, DtypeSpec):
        return name
    key = str(name) if name is not None else "float32"
    try:
        import numpy as np

        key = key if key == "int4" else np.dtype(key).name
    except TypeError:
        pass
    if key not in SPECS:
        raise TypeError(f"dtype should be one of {tuple(SPECS)}, got {key}")
    return SPECS[key]
