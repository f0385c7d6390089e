"""Multi-head SpMM operators written by a user, for the Tensor Core tests and the GPU check
(benchmarks/check_tensorcore_bsr.py): the library's ``multihead_spmm`` structure under other
names, with element-wise epilogues over (row, head, feature) after the reduction, and
variants the BSR Tensor Core template must leave to the CUDA-core template."""
from sparsec import dsl


def _heads(name: str, doc: str, pattern: bool = True, features_first: bool = False):
    """(op, R, G, F, Y) after ``Y[r, g, c] += W[r, s, g] * X[s, g, c]``: per-head weights W on the
    pattern of the matrix M (declared first, its values unread) or, without ``pattern``, W is
    the matrix itself with a trailing head axis. ``features_first``: the loops run over the
    features before the heads."""
    op = dsl.Operator(name, doc)
    R = op.dense_fixed("r")
    S = op.sparse_variable("s", parent=R)
    G = op.dense_fixed("g", extent="heads")
    F = op.dense_fixed("c", extent="feat")
    if pattern:
        op.sparse_input("M", (R, S))
    W = op.sparse_input("W", (R, S, G))
    X = op.dense_input("X", (S, G, F))
    Y = op.dense_output("Y", (R, G, F))
    if features_first:
        with op.iterate([R, S, F, G], "SRSS") as (r, s, c, g):
            Y[r, g, c] += W[r, s, g] * X[s, g, c]
    else:
        with op.iterate([R, S, G, F], "SRSS") as (r, s, g, c):
            Y[r, g, c] += W[r, s, g] * X[s, g, c]
    return op, R, G, F, Y


def heads_blockmm() -> dsl.Operator:
    """``Y[r, g, c] = sum_s W[r, s, g] * X[s, g, c]``: multihead_spmm under other names, its
    loops over the features before the heads."""
    return _heads("heads_blockmm", "Y[r, g, c] = sum_s W[r, s, g] * X[s, g, c]", features_first=True)[0]


def heads_scaled_relu() -> dsl.Operator:
    """``Y = relu(0.5 * (W . X) + bias[g, c])``: a constant scale, a bias per (head, feature), ReLU."""
    op, R, G, F, Y = _heads("heads_scaled_relu", "Y[r, g, c] = relu(0.5 * sum_s W[r, s, g] X[s, g, c] + bias[g, c])")
    bias = op.dense_input("bias", (G, F))
    with op.iterate([R, G, F], "SSS") as (r, g, c):
        Y[r, g, c] = dsl.maximum(Y[r, g, c] * 0.5 + bias[g, c], 0.0)
    return op


def heads_row_bias() -> dsl.Operator:
    """``Y = (W . X) + bias[r, g]``: a bias per (row, head)."""
    op, R, G, F, Y = _heads("heads_row_bias", "Y[r, g, c] = sum_s W[r, s, g] X[s, g, c] + bias[r, g]")
    bias = op.dense_input("bias", (R, G))
    with op.iterate([R, G, F], "SSS") as (r, g, c):
        Y[r, g, c] = Y[r, g, c] + bias[r, g]
    return op


def heads_matrix_values() -> dsl.Operator:
    """The matrix itself carries the heads (``W[r, s, g]``, no separate pattern)."""
    return _heads("heads_matrix_values", "Y[r, g, c] = sum_s W[r, s, g] * X[s, g, c]", pattern=False)[0]


def heads_row_norm() -> dsl.Operator:
    """An epilogue that reads another element of Y (a sum over the heads): not element-wise, so
    the Tensor Core template leaves it to the CUDA-core one."""
    op, R, G, F, Y = _heads("heads_row_norm", "Y[r, g, c] = sum_s W X / (1 + sum_g' Y[r, g', c])")
    t = op.dense_temp("t", (R, F))
    with op.iterate([R, G, F], "SRS") as (r, g, c):
        t[r, c] += Y[r, g, c]
    with op.iterate([R, G, F], "SSS") as (r, g, c):
        Y[r, g, c] = Y[r, g, c] / (t[r, c] + 1.0)
    return op
