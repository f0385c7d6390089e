"""Operators written in the DSL for the tests only: they show the DSL is not limited to the
library's SpMM and SDDMM (max reductions, several iterations, temporaries, no dense input)."""
import numpy as np
import scipy.sparse as sp

from sparsec import dsl
from sparsec.reference import evaluate


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


def row_max() -> dsl.Operator:
    """y[i] = max_j A[i, j] (a row with no entries keeps the max identity)."""
    op = dsl.Operator("row_max", "y[i] = max_j A[i, j]")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    A = op.sparse_input("A", (I, J))
    y = op.dense_output("y", (I,))
    with op.iterate([I, J], "SR") as (i, j):
        y[i] = dsl.maximum(y[i], A[i, j])
    return op


def rownorm_spmm() -> dsl.Operator:
    """C = D^-1 A B with D the row sums of A: a row-normalised SpMM (mean aggregation)."""
    op = dsl.Operator("rownorm_spmm", "C[i, k] = sum_j A[i, j] / (sum_j A[i, j]) * B[j, k]")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    K = op.dense_fixed("k", extent="feat")
    A = op.sparse_input("A", (I, J))
    B = op.dense_input("B", (J, K))
    C = op.dense_output("C", (I, K))
    s = op.dense_temp("s", (I,))
    with op.iterate([I, J], "SR") as (i, j):
        s[i] += A[i, j]
    with op.iterate([I, J, K], "SRS") as (i, j, k):
        C[i, k] += A[i, j] / s[i] * B[j, k]
    return op


def _edge_softmax(op, with_spmm: bool):
    """SDDMM (no scale by A) -> row max -> row sum of exp -> normalise [-> SpMM with V]."""
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    K = op.dense_fixed("k", extent="feat")
    op.sparse_input("A", (I, J))
    X = op.dense_input("X", (I, K))
    Y = op.dense_input("Y", (J, K))
    S = op.sparse_temp("S", (I, J))
    mx = op.dense_temp("mx", (I,))
    s = op.dense_temp("s", (I,))
    with op.iterate([I, J, K], "SSR") as (i, j, k):
        S[i, j] += X[i, k] * Y[j, k]
    with op.iterate([I, J], "SR") as (i, j):
        mx[i] = dsl.maximum(mx[i], S[i, j])
    with op.iterate([I, J], "SR") as (i, j):
        s[i] += dsl.exp(S[i, j] - mx[i])
    if not with_spmm:
        P = op.sparse_output("P", (I, J))
        with op.iterate([I, J], "SS") as (i, j):
            P[i, j] = dsl.exp(S[i, j] - mx[i]) / s[i]
        return op
    D = op.dense_fixed("d", extent="feat")
    V = op.dense_input("V", (J, D))
    O = op.dense_output("O", (I, D))
    P = op.sparse_temp("P", (I, J))
    with op.iterate([I, J], "SS") as (i, j):
        P[i, j] = dsl.exp(S[i, j] - mx[i]) / s[i]
    with op.iterate([I, J, D], "SRS") as (i, j, d):
        O[i, d] += P[i, j] * V[j, d]
    return op


def edge_softmax() -> dsl.Operator:
    """P[i, j] = softmax_j(X[i, :] . Y[j, :]) over the matrix's entries (a GAT-style edge softmax)."""
    return _edge_softmax(dsl.Operator("edge_softmax", "P = row softmax of the SDDMM X Y^T on A's pattern"), False)


def edge_softmax_spmm() -> dsl.Operator:
    """O = edge_softmax(X, Y) @ V: the edge softmax's probabilities (a sparse temp) times V."""
    return _edge_softmax(dsl.Operator("edge_softmax_spmm", "O = softmax(X Y^T on A's pattern) V"), True)


def reference(op_fn, inst, *dense, **params):
    """The float64 reference of a test operator on ``inst``'s logical pattern
    (``sparsec.reference.evaluate``)."""
    return evaluate(op_fn(), inst, *dense, params=params)


def rowsum_reference(inst) -> np.ndarray:
    return reference(rowsum, inst)


def row_softmax_reference(inst) -> np.ndarray:
    """float64 softmax per row over the matrix's entries, one value per slot (0 for padding)."""
    return reference(row_softmax, inst)


TEST_OPS = {"rowsum": (rowsum, rowsum_reference), "row_softmax": (row_softmax, row_softmax_reference)}

# user-written operators that are not linear in A, for the format-invariance property test:
# name -> (operator, dense input shapes as functions of (rows, cols, feat))
NONLINEAR_OPS = {
    "row_softmax": (row_softmax, ()),
    "row_max": (row_max, ()),
    "rownorm_spmm": (rownorm_spmm, (("cols", "feat"),)),
    "edge_softmax": (edge_softmax, (("rows", "feat"), ("cols", "feat"))),
    "edge_softmax_spmm": (edge_softmax_spmm, (("rows", "feat"), ("cols", "feat"), ("cols", "feat"))),
}


# ---- comparing results across formats (the property test and benchmarks/check_format_invariance.py)


def rel_err(out, ref, dtype: str = "float32") -> float:
    """``sparsec.reference.max_rel_err``, except that the max/min identity (a row with no
    entries keeps the dtype's lowest/highest value) must match exactly and is left out of the
    scale (it would make every other error look tiny)."""
    from sparsec.reference import max_rel_err

    if sp.issparse(out) or sp.issparse(ref):  # on_coordinates' matrices: one pattern, then values
        if not (sp.issparse(out) and sp.issparse(ref) and out.shape == ref.shape
                and np.array_equal(out.indptr, ref.indptr) and np.array_equal(out.indices, ref.indices)):
            return float("inf")
        out, ref = out.data, ref.data
    out, ref = np.asarray(out, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    extreme = np.abs(ref) >= np.finfo(dtype).max if np.dtype(dtype).kind == "f" else np.zeros(ref.shape, bool)
    if np.any(out[extreme] != ref[extreme]):
        return float("inf")
    return max_rel_err(np.where(extreme, 0, out), np.where(extreme, 0, ref))


def on_coordinates(op: dsl.Operator, inst, out) -> np.ndarray:
    """A kernel's first output over the matrix's coordinates, whatever the format: a sparse
    output (one value per stored slot) becomes the canonical float64 CSR matrix it holds,
    padding dropped (never densified: a graph of 100k rows would be 80 GB); a dense output
    is itself. ``rel_err`` compares two such matrices pattern first, then values."""
    out = np.asarray(out[0] if isinstance(out, tuple) else out, dtype=np.float64)
    if op.outputs()[0].sparse:
        m = inst.to_scipy(out).tocsr().astype(np.float64)
        m.sort_indices()
        return m
    return out
