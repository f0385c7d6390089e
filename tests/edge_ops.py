"""Operators with edge data and indirect reads, and independent float64 references (scipy
and numpy on the matrix's canonical CSR entries, not ``sparsec.reference``), for
tests/test_dsl_edge_data.py and benchmarks/check_edge_data.py.

Edge data arrives per entry of the matrix in canonical CSR order (``inst.to_scipy()``'s).
"""
import numpy as np
import scipy.sparse as sp

from sparsec import dsl


def rgcn_homo() -> dsl.Operator:
    """Y[i, g] = sum_{j, f} A[i, j] * W[E[i, j], f, g] * X[j, f]: relational GCN on a graph
    with an edge type per edge (SparseTIR's rgcn_homo_forward, with edge weights A)."""
    op = dsl.Operator("rgcn_homo", "Y[i, g] = sum_jf A[i, j] * W[E[i, j], f, g] * X[j, f]")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    R = op.dense_fixed("r", extent="rel")
    F = op.dense_fixed("f", extent="fin")
    G = op.dense_fixed("g", extent="fout")
    A = op.sparse_input("A", (I, J))
    E = op.sparse_input("E", (I, J), dtype="int32")
    W = op.dense_input("W", (R, F, G))
    X = op.dense_input("X", (J, F))
    Y = op.dense_output("Y", (I, G))
    with op.iterate([I, J, F, G], "SRRS") as (i, j, f, g):
        Y[i, g] += A[i, j] * W[E[i, j], f, g] * X[j, f]
    return op


def rgcn_node_types() -> dsl.Operator:
    """Y[i, g] = sum_{j, f} A[i, j] * W[NT[j], f, g] * X[j, f]: the weight by the source node's type."""
    op = dsl.Operator("rgcn_node_types", "Y[i, g] = sum_jf A[i, j] * W[NT[j], f, g] * X[j, f]")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    R = op.dense_fixed("r", extent="rel")
    F = op.dense_fixed("f", extent="fin")
    G = op.dense_fixed("g", extent="fout")
    A = op.sparse_input("A", (I, J))
    NT = op.dense_input("NT", (J,), dtype="int32")
    W = op.dense_input("W", (R, F, G))
    X = op.dense_input("X", (J, F))
    Y = op.dense_output("Y", (I, G))
    with op.iterate([I, J, F, G], "SRRS") as (i, j, f, g):
        Y[i, g] += A[i, j] * W[NT[j], f, g] * X[j, f]
    return op


def spmm_weighted() -> dsl.Operator:
    """C[i, k] = sum_j A[i, j] * Wt[i, j] * B[j, k]: SpMM with a second float edge value."""
    op = dsl.Operator("spmm_weighted", "C[i, k] = sum_j A[i, j] * Wt[i, j] * B[j, k]")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    K = op.dense_fixed("k", extent="feat")
    A = op.sparse_input("A", (I, J))
    Wt = op.sparse_input("Wt", (I, J))
    B = op.dense_input("B", (J, K))
    C = op.dense_output("C", (I, K))
    with op.iterate([I, J, K], "SRS") as (i, j, k):
        C[i, k] += A[i, j] * Wt[i, j] * B[j, k]
    return op


def spmm_edge_only() -> dsl.Operator:
    """C[i, k] = sum_j Wt[i, j] * B[j, k]: edge data read outside a product with the matrix
    (padding-guarded on formats with a slot mask)."""
    op = dsl.Operator("spmm_edge_only", "C[i, k] = sum_j Wt[i, j] * B[j, k]")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    K = op.dense_fixed("k", extent="feat")
    op.sparse_input("A", (I, J))
    Wt = op.sparse_input("Wt", (I, J))
    B = op.dense_input("B", (J, K))
    C = op.dense_output("C", (I, K))
    with op.iterate([I, J, K], "SRS") as (i, j, k):
        C[i, k] += Wt[i, j] * B[j, k]
    return op


def sddmm_multihead() -> dsl.Operator:
    """S[i, j, h] = sum_d Q[i, h, d] * K[j, h, d]: one score per stored entry per head."""
    op = dsl.Operator("sddmm_multihead", "S[i, j, h] = sum_d Q[i, h, d] * K[j, h, d]")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    H = op.dense_fixed("h", extent="heads")
    D = op.dense_fixed("d", extent="feat")
    op.sparse_input("A", (I, J))
    Q = op.dense_input("Q", (I, H, D))
    K = op.dense_input("K", (J, H, D))
    S = op.sparse_output("S", (I, J, H))
    with op.iterate([I, J, H, D], "SSSR") as (i, j, h, d):
        S[i, j, h] += Q[i, h, d] * K[j, h, d]
    return op


def gat_aggregate() -> dsl.Operator:
    """Y[i, h, f] = sum_j A[i, j] * L[i, j, h] * X[j, h, f]: multi-head edge values (attention
    weights per head) as a sparse input with a trailing axis."""
    op = dsl.Operator("gat_aggregate", "Y[i, h, f] = sum_j A[i, j] * L[i, j, h] * X[j, h, f]")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    H = op.dense_fixed("h", extent="heads")
    F = op.dense_fixed("f", extent="feat")
    A = op.sparse_input("A", (I, J))
    L = op.sparse_input("L", (I, J, H))
    X = op.dense_input("X", (J, H, F))
    Y = op.dense_output("Y", (I, H, F))
    with op.iterate([I, J, H, F], "SRSS") as (i, j, h, f):
        Y[i, h, f] += A[i, j] * L[i, j, h] * X[j, h, f]
    return op


# ---- independent float64 references (scipy / numpy on the canonical CSR entries) ----------------
def _csr(inst) -> sp.csr_matrix:
    return inst.to_scipy().astype(np.float64)


def ref_rgcn(inst, E, W, X):
    """sum over relations r of (A masked to the edges of type r) @ X @ W[r]."""
    m = _csr(inst)
    X, W = np.asarray(X, np.float64), np.asarray(W, np.float64)
    out = np.zeros((m.shape[0], W.shape[2]))
    for r in range(W.shape[0]):
        part = sp.csr_matrix((m.data * (np.asarray(E) == r), m.indices, m.indptr), shape=m.shape)
        out += (part @ X) @ W[r]
    return out


def ref_rgcn_node_types(inst, T, W, X):
    m = _csr(inst)
    X, W = np.asarray(X, np.float64), np.asarray(W, np.float64)
    out = np.zeros((m.shape[0], W.shape[2]))
    for r in range(W.shape[0]):
        out += (m @ (X * (np.asarray(T) == r)[:, None])) @ W[r]
    return out


def ref_spmm_weighted(inst, Wt, B):
    m = _csr(inst)
    return sp.csr_matrix((m.data * np.asarray(Wt, np.float64), m.indices, m.indptr), shape=m.shape) @ \
        np.asarray(B, np.float64)


def ref_spmm_edge_only(inst, Wt, B):
    m = _csr(inst)
    return sp.csr_matrix((np.asarray(Wt, np.float64), m.indices, m.indptr), shape=m.shape) @ np.asarray(B, np.float64)


def ref_sddmm_multihead(inst, Q, K):
    """(nnz, heads): per entry (r, c), Q[r, h, :] . K[c, h, :]."""
    m = _csr(inst)
    r = np.repeat(np.arange(m.shape[0]), np.diff(m.indptr))
    return np.einsum("ehd,ehd->eh", np.asarray(Q, np.float64)[r], np.asarray(K, np.float64)[m.indices])


def ref_gat_aggregate(inst, L, X):
    m = _csr(inst)
    L, X = np.asarray(L, np.float64), np.asarray(X, np.float64)
    return np.stack([sp.csr_matrix((m.data * L[:, h], m.indices, m.indptr), shape=m.shape) @ X[:, h, :]
                     for h in range(L.shape[1])], axis=1)


def edge_matrix(seed: int = 0) -> sp.csr_matrix:
    """A small matrix with an empty row, a long row, an explicit zero and odd sizes (9 x 7)."""
    rng = np.random.default_rng(seed)
    dense = (rng.random((9, 7)) < 0.3) * rng.standard_normal((9, 7))
    dense[3] = 0.0  # an empty row
    dense[5] = rng.standard_normal(7)  # a long (full) row
    dense[0, 6] = 0.0
    r, c = np.nonzero(dense)
    r, c = np.append(r, 0), np.append(c, 6)  # an explicit zero entry at (0, 6)
    m = sp.csr_matrix((dense[r, c].astype(np.float32), (r, c)), shape=dense.shape)
    m.sort_indices()
    assert m.nnz == len(r)
    return m
