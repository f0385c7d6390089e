"""Operators written in the DSL for the tests only: they show the DSL is not limited to the
library's SpMM and SDDMM (max reductions, several iterations, temporaries, no dense input)."""
import numpy as np

from sparsec import dsl


def rowsum() -> dsl.Operator:
    """y[i] = sum_j A[i, j]"""
    op = dsl.Operator("rowsum", "y[i] = sum_j A[i, j]")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    A = op.sparse_input("A", (I, J))
    y = op.dense_output("y", (I,))
    with op.iterate([I, J], "SR") as (i, j):
        y[i] += A[i, j]
    return op


def row_softmax() -> dsl.Operator:
    """O[i, j] = exp(A[i, j] - max_j A[i, :]) / sum_j exp(A[i, j] - max_j A[i, :]) over stored entries."""
    op = dsl.Operator("row_softmax", "softmax of each row over its stored entries")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    A = op.sparse_input("A", (I, J))
    O = op.sparse_output("O", (I, J))
    mx = op.dense_temp("mx", (I,))
    s = op.dense_temp("s", (I,))
    with op.iterate([I, J], "SR") as (i, j):
        mx[i] = dsl.maximum(mx[i], A[i, j])
    with op.iterate([I, J], "SR") as (i, j):
        s[i] += dsl.exp(A[i, j] - mx[i])
    with op.iterate([I, J], "SS") as (i, j):
        O[i, j] = dsl.exp(A[i, j] - mx[i]) / s[i]
    return op


def rowsum_reference(inst) -> np.ndarray:
    return np.asarray(inst.to_scipy().astype(np.float64).sum(axis=1)).ravel()


def row_softmax_reference(inst) -> np.ndarray:
    """float64 softmax per row over the stored slots, one value per slot (0 for padding)."""
    rows, _ = inst.stored_coords()
    ok = rows >= 0
    vals = inst.data.astype(np.float64)
    out = np.zeros(inst.stored)
    r, v = rows[ok], vals[ok]
    n = inst.shape[0]
    mx = np.full(n, -np.inf)
    np.maximum.at(mx, r, v)
    e = np.exp(v - mx[r])
    s = np.bincount(r, weights=e, minlength=n)
    out[ok] = e / s[r]
    return out


TEST_OPS = {"rowsum": (rowsum, rowsum_reference), "row_softmax": (row_softmax, row_softmax_reference)}
