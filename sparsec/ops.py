"""Library operators, written once in the DSL and bound to a format at compile time."""
from __future__ import annotations

from typing import Callable, Dict

from .dsl import Operator


def spmm() -> Operator:
    """SpMM: ``C[i, k] = sum_j A[i, j] * B[j, k]`` (sparse A, dense B and C)."""
    op = Operator("spmm", "C[i, k] = sum_j A[i, j] * B[j, k]")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    K = op.dense_fixed("k", extent="feat")
    A = op.sparse_input("A", (I, J))
    B = op.dense_input("B", (J, K))
    C = op.dense_output("C", (I, K))
    with op.iterate([I, J, K], "SRS") as (i, j, k):
        C[i, k] += A[i, j] * B[j, k]
    return op


def sddmm() -> Operator:
    """SDDMM: ``C[i, j] = A[i, j] * sum_k X[i, k] * Y[j, k]`` over A's stored entries.

    Both dense operands are row-major over the features (X is rows x feat, Y is cols x feat),
    as in DGL and SparseTIR: a stored entry reads two contiguous feature rows."""
    op = Operator("sddmm", "C[i, j] = A[i, j] * sum_k X[i, k] * Y[j, k] over A's non-zeros")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    K = op.dense_fixed("k", extent="feat")
    A = op.sparse_input("A", (I, J))
    X = op.dense_input("X", (I, K))
    Y = op.dense_input("Y", (J, K))
    C = op.sparse_output("C", (I, J))
    # The dot product first, then the scale: an infinite A[i, j] gives +-inf as scipy does,
    # where folding A into every term (inf * x - inf * y) would give NaN.
    with op.iterate([I, J, K], "SSR") as (i, j, k):
        C[i, j] += X[i, k] * Y[j, k]
    with op.iterate([I, J], "SS") as (i, j):
        C[i, j] = A[i, j] * C[i, j]
    return op


LIBRARY: Dict[str, Callable[[], Operator]] = {"spmm": spmm, "sddmm": sddmm}


def get(name: str) -> Operator:
    """A fresh library operator by name."""
    if name not in LIBRARY:
        raise ValueError(f"operator should be one of {sorted(LIBRARY)}, got {name!r}")
    return LIBRARY[name]()
