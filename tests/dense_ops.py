"""Operators with dense iterations, for tests/test_dsl_dense_iterations.py and the GPU check
benchmarks/check_dense_iterations.py: an epilogue over the row axis (bias + ReLU, a row
normalisation, an in-place ReLU, an L2 row norm), a transform over the column axis alone
(H = X @ W, then SpMM of H), an iteration over dense axes only. Each comes with the float64
numpy formula it computes (``FORMULAS``), written independently of ``reference.evaluate``."""
import numpy as np

from sparsec import dsl


def _spmm(name: str, doc: str):
    """(op, I, K, C) after ``C[i, k] += A[i, j] * B[j, k]``: the sparse nest every epilogue
    operator here starts from (its inputs A and B, declared first)."""
    op = dsl.Operator(name, doc)
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    K = op.dense_fixed("k", extent="feat")
    A = op.sparse_input("A", (I, J))
    B = op.dense_input("B", (J, K))
    C = op.dense_output("C", (I, K))
    with op.iterate([I, J, K], "SRS") as (i, j, k):
        C[i, k] += A[i, j] * B[j, k]
    return op, I, K, C


def spmm_bias_relu() -> dsl.Operator:
    op, I, K, C = _spmm("spmm_bias_relu", "C = relu(A @ B + bias)")
    bias = op.dense_input("bias", (K,))
    with op.iterate([I, K], "SS") as (i, k):
        C[i, k] = dsl.maximum(C[i, k] + bias[k], 0.0)
    return op


def spmm_row_bias_relu() -> dsl.Operator:
    """C[i, k] = relu(sum_j A[i, j] * B[j, k] + bias[i]): a bias per output row."""
    op, I, K, C = _spmm("spmm_row_bias_relu", "C = relu(A @ B + bias[:, None])")
    bias = op.dense_input("bias", (I,))
    with op.iterate([I, K], "SS") as (i, k):
        C[i, k] = dsl.maximum(C[i, k] + bias[i], 0.0)
    return op


def spmm_scaled_half() -> dsl.Operator:
    """C = relu(s[i] * (A @ B) * 0.5) stored as float16: a per-row scale, a constant, an
    activation and a cast, in two iterations after the reduction."""
    op = dsl.Operator("spmm_scaled_half", "C = half(relu(0.5 * s[:, None] * (A @ B)))")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    K = op.dense_fixed("k", extent="feat")
    A = op.sparse_input("A", (I, J))
    B = op.dense_input("B", (J, K))
    s = op.dense_input("s", (I,))
    C = op.dense_output("C", (I, K), dtype="float16")
    with op.iterate([I, J, K], "SRS") as (i, j, k):
        C[i, k] += A[i, j] * B[j, k]
    with op.iterate([I, K], "SS") as (i, k):
        C[i, k] = C[i, k] * s[i] * 0.5
    with op.iterate([I, K], "SS") as (i, k):
        C[i, k] = dsl.maximum(C[i, k], 0.0)
    return op


def transform_aggregate() -> dsl.Operator:
    """A GCN layer: H = X @ W over the columns (once per column), then C = A @ H."""
    op = dsl.Operator("gcn_layer", "C = A @ (X @ W)")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    F = op.dense_fixed("f", extent="fin")
    G = op.dense_fixed("g", extent="fout")
    A = op.sparse_input("A", (I, J))
    X = op.dense_input("X", (J, F))
    W = op.dense_input("W", (F, G))
    H = op.dense_temp("H", (J, G))
    C = op.dense_output("C", (I, G))
    with op.iterate([J, F, G], "SRS") as (j, f, g):
        H[j, g] += X[j, f] * W[f, g]
    with op.iterate([I, J, G], "SRS") as (i, j, g):
        C[i, g] += A[i, j] * H[j, g]
    return op


def row_normalised() -> dsl.Operator:
    """C = D^-1 A B with D the row sums of A (a row with no entries: 0 / 0)."""
    op = dsl.Operator("mean_spmm", "C[i, k] = (A @ B)[i, k] / deg[i]")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    K = op.dense_fixed("k", extent="feat")
    A = op.sparse_input("A", (I, J))
    B = op.dense_input("B", (J, K))
    C = op.dense_output("C", (I, K))
    deg = op.dense_temp("deg", (I,))
    with op.iterate([I, J], "SR") as (i, j):
        deg[i] += A[i, j]
    with op.iterate([I, J, K], "SRS") as (i, j, k):
        C[i, k] += A[i, j] * B[j, k]
    with op.iterate([I, K], "SS") as (i, k):
        C[i, k] = C[i, k] / deg[i]
    return op


def inplace_relu() -> dsl.Operator:
    op, I, K, C = _spmm("spmm_relu", "C = relu(A @ B)")
    with op.iterate([I, K], "SS") as (i, k):
        C[i, k] = dsl.maximum(C[i, k], 0.0)
    return op


def dense_only() -> dsl.Operator:
    """An iteration over dense axes only (a weight scaled per input feature) beside an SpMM."""
    op = dsl.Operator("scaled_weight_spmm", "V = W * s[f]; C = A @ B")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    F = op.dense_fixed("f", extent="fin")
    G = op.dense_fixed("g", extent="fout")
    A = op.sparse_input("A", (I, J))
    B = op.dense_input("B", (J, G))
    W = op.dense_input("W", (F, G))
    s = op.dense_input("s", (F,))
    C = op.dense_output("C", (I, G))
    V = op.dense_output("V", (F, G))
    with op.iterate([F, G], "SS") as (f, g):
        V[f, g] = W[f, g] * s[f]
    with op.iterate([I, J, G], "SRS") as (i, j, g):
        C[i, g] += A[i, j] * B[j, g]
    return op


def l2_rows() -> dsl.Operator:
    """SpMM, then each row scaled to unit L2 norm: a reduction over the row axis alone's features."""
    op, I, K, C = _spmm("spmm_l2", "C = rownormalize(A @ B)")
    n = op.dense_temp("n", (I,))
    with op.iterate([I, K], "SR") as (i, k):
        n[i] += C[i, k] * C[i, k]
    with op.iterate([I, K], "SS") as (i, k):
        C[i, k] = C[i, k] / dsl.sqrt(n[i] + 1.0)
    return op


def _formulas():
    """name -> (operator, params, input shapes (rows, cols -> tuple), numpy formula on the
    logical float64 matrix m and the float64 inputs) for the check script and the tests."""
    def relu_bias(m, B, bias):
        return np.maximum(m @ B + bias, 0.0)

    def gcn(m, X, W):
        return m @ (X @ W)

    def mean(m, B):
        with np.errstate(all="ignore"):
            return (m @ B) / np.asarray(m.sum(axis=1))  # a row with no entries: 0 / 0 = NaN

    def relu(m, B):
        return np.maximum(m @ B, 0.0)

    def scaled(m, B, W, s):
        return m @ B, W * s[:, None]

    def l2(m, B):
        c = m @ B
        return c / np.sqrt((c * c).sum(axis=1, keepdims=True) + 1.0)

    return {
        "spmm_bias_relu": (spmm_bias_relu, {"feat": None}, lambda r, c, f: [(c, f), (f,)], relu_bias),
        "transform_aggregate": (transform_aggregate, {"fin": 4, "fout": None}, lambda r, c, f: [(c, 4), (4, f)], gcn),
        "row_normalised": (row_normalised, {"feat": None}, lambda r, c, f: [(c, f)], mean),
        "inplace_relu": (inplace_relu, {"feat": None}, lambda r, c, f: [(c, f)], relu),
        "dense_only": (dense_only, {"fin": 4, "fout": None}, lambda r, c, f: [(c, f), (4, f), (4,)], scaled),
        "l2_rows": (l2_rows, {"feat": None}, lambda r, c, f: [(c, f)], l2),
    }


FORMULAS = _formulas()
