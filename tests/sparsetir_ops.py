"""SparseTIR's 19 test kernels (``sparse_tir_scripts.py``) as sparsec DSL operators.

Each kernel is a ``SparseTIRKernel``: a builder of the DSL operator, a float64 reference
written with numpy/scipy from what the kernel computes (never ``sparsec.reference.evaluate``),
an input generator and the format families it applies to. The semantics are SparseTIR's,
the scripts are not copied: where a kernel's structure has no sparsec axis yet (a CSF tensor,
ragged 4-d tensors, a batch of ragged matrices, a relation axis above the matrix), the
operator works on an honest flattening of that structure into one (row, column) pattern,
and the reference reads the original structure.

``needs`` names a DSL feature that is being added and without which the operator cannot be
built or compiled yet (the tests mark those cases ``xfail(strict=True)``):

  * ``NEEDS_EDGE_DATA`` -- buffer dtypes, several sparse inputs on one structure (edge data
    passed positionally among the dense inputs, one value per entry in canonical CSR order),
    indirect reads ``W[E[i, j], f, g]``;

Usage::

    k = KERNELS["csrmm"]
    p = k.inputs(np.random.default_rng(0), edge_case_matrix(37, 53, 0.08, 1), feat=7)
    A = instance(p, "bsr:2x2")[0]
    out = sparsec.compile(k.build(), A, target="llvm", **p.params)(A, *p.dense, poison=True)
    assert check(k, p, A, out)["ok"]
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Tuple

import numpy as np
import scipy.sparse as sp

from sparsec import dsl

NEEDS_EDGE_DATA = "edge data: buffer dtypes, several sparse inputs on one structure, indirect reads W[E[i, j], ..]"

ALL_FAMILIES = ("csr", "bsr:2x2", "bsr:4x4", "bsr:3x5", "ell", "hyb:1:1/2/4", "hyb:2:1/2/4",
                "bsr+csr:4x4,0.3", "nm:2:4")
# a lookup (A[i, jd]) needs one sorted column list per row: no composite, no N:M windows
LOOKUP_FAMILIES = ("csr", "bsr:2x2", "bsr:4x4", "bsr:3x5", "ell")
PATTERN_FAMILIES = tuple(f for f in ALL_FAMILIES if not f.startswith("nm"))  # derived patterns: never pruned


@dataclass
class Problem:
    """One random instance of a kernel: ``matrix`` is the operator's (row, column) pattern
    (canonical float32 CSR, explicit zeros are entries), ``dense`` the kernel's further inputs
    in the operator's order (edge data included, one value per entry of ``matrix``),
    ``params`` the compile-time extents and ``info`` what the reference needs beyond them
    (the original CSF / ragged / relational structure)."""

    matrix: sp.csr_matrix
    dense: Tuple[np.ndarray, ...]
    params: Dict[str, int]
    info: Dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class SparseTIRKernel:
    name: str
    build: Callable[[], dsl.Operator]
    reference: Callable[[Problem], object]  # a dense array, or canonical CSR on the pattern (sparse outputs)
    inputs: Callable[..., Problem]           # (rng, base matrix, feat=...) -> Problem
    families: Tuple[str, ...]
    needs: Optional[str] = None
    layout_reference: Optional[Callable[[Problem, object], Optional[np.ndarray]]] = None  # csr2bsr's slots


# ---------------------------------------------------------------------------------- matrices


def edge_case_matrix(rows: int, cols: int, density: float, seed: int) -> sp.csr_matrix:
    """float32 canonical CSR with two empty rows, one long row (every other column), every 6th
    entry an explicit zero and row 0 holding explicit zeros only; values of both signs."""
    rng = np.random.default_rng(seed)
    m = sp.random(rows, cols, density=density, format="lil", random_state=seed,
                  data_rvs=lambda n: rng.uniform(-1.0, 1.0, n))
    for r in (0, 3, 4):
        m[r, :] = 0
    long_row = min(7, rows - 1)
    m[long_row, ::2] = rng.uniform(0.1, 1.0, len(range(0, cols, 2)))
    c = m.tocoo()
    data = np.where(np.arange(c.nnz) % 6 == 0, 0.0, c.data)
    extra = [k for k in (1, 5) if k < cols]
    out = sp.csr_matrix((np.concatenate([data, np.zeros(len(extra))]).astype(np.float32),
                         (np.concatenate([c.row, np.zeros(len(extra), int)]), np.concatenate([c.col, extra]))),
                        shape=(rows, cols))
    out.sort_indices()
    return out


def _with_values(pattern: sp.csr_matrix, values) -> sp.csr_matrix:
    """``pattern``'s entries (explicit zeros kept) holding ``values`` (float64)."""
    out = sp.csr_matrix((np.asarray(values, np.float64), pattern.indices.copy(), pattern.indptr.copy()),
                        shape=pattern.shape)
    out.has_sorted_indices = True
    return out


def _rows_of(m: sp.csr_matrix) -> np.ndarray:
    return np.repeat(np.arange(m.shape[0]), np.diff(m.indptr))


def _normal(rng, shape) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _explicit_zeros(rng, n: int) -> np.ndarray:
    """n values of both signs, about every 5th an exact 0."""
    v = rng.uniform(-1.0, 1.0, n)
    v[rng.random(n) < 0.2] = 0.0
    return v.astype(np.float32)


def _matrix_inputs(*shapes):
    """A generator for kernels whose structure is the base matrix itself: dense inputs of
    ``shapes`` ("rows"/"cols"/"feat" per axis)."""

    def gen(rng, base: sp.csr_matrix, feat: int = 8) -> Problem:
        size = {"rows": base.shape[0], "cols": base.shape[1], "feat": feat}
        dense = tuple(_normal(rng, tuple(size[a] for a in s)) for s in shapes)
        params = {"feat": feat} if any("feat" in s for s in shapes) else {}
        return Problem(base, dense, params)

    return gen


# ---------------------------------------------------------------------------------- SpMM family


def _spmm_axes(op, col_kind="sparse_variable"):
    I = op.dense_fixed("i")
    J = op.sparse_fixed("j", parent=I, width=8) if col_kind == "sparse_fixed" else op.sparse_variable("j", parent=I)
    K = op.dense_fixed("k", extent="feat")
    return I, J, K


def csrmm() -> dsl.Operator:
    """SparseTIR ``csrmm``: C[i, k] = sum_j A[i, j] B[j, k], iterating (I, J, K) as "SRS"."""
    op = dsl.Operator("csrmm", "C[i, k] = sum_j A[i, j] * B[j, k]")
    I, J, K = _spmm_axes(op)
    A = op.sparse_input("A", (I, J))
    B = op.dense_input("B", (J, K))
    C = op.dense_output("C", (I, K))
    with op.iterate([I, J, K], "SRS") as (i, j, k):
        C[i, k] += A[i, j] * B[j, k]
    return op


def csrmm_dense_iter() -> dsl.Operator:
    """SparseTIR ``csrmm_dense_iter``: the same C = A B, but the reduction runs over the
    *detached* dense column axis (0..n), reading A at every column (SparseTIR: a binary search
    in row i; an absent column reads 0). Written the same way here: ``jd`` is a dense axis of
    extent n, and ``A[i, jd]`` is a lookup (``sparsec.lower.lookup``: a binary search over the
    row's sorted columns, on csr, ell and bsr). Its value is csrmm's."""
    op = dsl.Operator("csrmm_dense_iter", "C[i, k] = sum_{jd < n} A[i, jd] * B[jd, k]")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    Jd = op.dense_fixed("jd", extent="n")
    K = op.dense_fixed("k", extent="feat")
    A = op.sparse_input("A", (I, J))
    B = op.dense_input("B", (Jd, K))
    C = op.dense_output("C", (I, K))
    with op.iterate([I, Jd, K], "SRS") as (i, jd, k):
        C[i, k] += A[i, jd] * B[jd, k]
    return op


def bsrmm() -> dsl.Operator:
    """SparseTIR ``bsrmm``: C = A B on BSR blocks, its iteration (I, BI, BJ, F, J) = "SSRSR"
    reading A[i, j, bi, bj] * B[j, bj, f]. In sparsec the blocks belong to the format: the
    operator iterates (I, F, J) as "SSR" (the feature axis before the column axis, as in
    SparseTIR) and binding to ``bsr:RxC`` splits I and J into the block and in-block axes."""
    op = dsl.Operator("bsrmm", "C[i, f] = sum_j A[i, j] * B[j, f] (A in BSR blocks)")
    I, J, F = _spmm_axes(op)
    A = op.sparse_input("A", (I, J))
    B = op.dense_input("B", (J, F))
    C = op.dense_output("C", (I, F))
    with op.iterate([I, F, J], "SSR") as (i, f, j):
        C[i, f] += A[i, j] * B[j, f]
    return op


def ellmm() -> dsl.Operator:
    """SparseTIR ``ellmm``: C = A B with A's columns a ``sparse_fixed`` axis (ELL: a fixed
    number of column slots per row). SparseTIR's ELL holds blk x blk blocks; sparsec's ELL
    family holds scalars (a block-ELL family does not exist yet), so this is ELL with 1x1
    blocks: J is declared sparse_fixed (its default format is ELL) and bound to ell / hyb's
    ELL buckets."""
    op = dsl.Operator("ellmm", "C[i, f] = sum_j A[i, j] * B[j, f] (A in ELL)")
    I, J, F = _spmm_axes(op, "sparse_fixed")
    A = op.sparse_input("A", (I, J))
    B = op.dense_input("B", (J, F))
    C = op.dense_output("C", (I, F))
    with op.iterate([I, J, F], "SRS") as (i, j, f):
        C[i, f] += A[i, j] * B[j, f]
    return op


def spmm_reference(p: Problem) -> np.ndarray:
    return p.matrix.astype(np.float64) @ p.dense[0].astype(np.float64)


def dense_iter_reference(p: Problem) -> np.ndarray:
    """The dense iteration itself: every column of each row, 0 where A stores nothing."""
    B = p.dense[0].astype(np.float64)
    out = np.zeros((p.matrix.shape[0], B.shape[1]))
    step = max(1, (1 << 22) // max(1, p.matrix.shape[1]))
    for s in range(0, p.matrix.shape[0], step):
        out[s:s + step] = p.matrix[s:s + step].toarray().astype(np.float64) @ B
    return out


def _dense_iter_inputs(rng, base, feat: int = 8) -> Problem:
    return Problem(base, (_normal(rng, (base.shape[1], feat)),), {"feat": feat, "n": base.shape[1]})


# ---------------------------------------------------------------------------------- reductions


def _reduce_op(name: str, col_kind: str) -> dsl.Operator:
    op = dsl.Operator(name, "B[i] = sum_j A[i, j]")
    I = op.dense_fixed("i")
    J = getattr(op, col_kind)("j", parent=I)
    A = op.sparse_input("A", (I, J))
    B = op.dense_output("B", (I,))
    with op.iterate([I, J], "SR") as (i, j):
        B[i] += A[i, j]
    return op


def segment_reduce() -> dsl.Operator:
    """SparseTIR ``segment_reduce``: B[i] = sum of segment i, J a ``dense_variable`` (ragged)
    axis: positions, no column indices. Bound to any format, a segment is a row's entries."""
    return _reduce_op("segment_reduce", "dense_variable")


def csr_reduce() -> dsl.Operator:
    """SparseTIR ``csr_reduce``: B[i] = sum_j A[i, j] over the row's stored entries."""
    return _reduce_op("csr_reduce", "sparse_variable")


def segment_reference(p: Problem) -> np.ndarray:
    """Sums of the segments indptr[i]:indptr[i+1] (an empty segment sums to 0)."""
    m = p.matrix
    cums = np.concatenate([[0.0], np.cumsum(m.data.astype(np.float64))])
    return cums[m.indptr[1:]] - cums[m.indptr[:-1]]


def row_sum_reference(p: Problem) -> np.ndarray:
    m = p.matrix
    return np.bincount(_rows_of(m), weights=m.data.astype(np.float64), minlength=m.shape[0])


# ---------------------------------------------------------------------------------- element-wise


def csr_element_wise() -> dsl.Operator:
    """SparseTIR ``csr_element_wise``: B[i, j] = 2.5 A[i, j] on A's pattern (a sparse output)."""
    op = dsl.Operator("csr_element_wise", "B[i, j] = A[i, j] * 2.5")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    A = op.sparse_input("A", (I, J))
    B = op.sparse_output("B", (I, J))
    with op.iterate([I, J], "SS") as (i, j):
        B[i, j] = A[i, j] * 2.5
    return op


def element_wise_reference(p: Problem) -> sp.csr_matrix:
    return _with_values(p.matrix, p.matrix.data.astype(np.float64) * 2.5)


# ---------------------------------------------------------------------------------- SDDMM family


def _sddmm(name: str, doc: str) -> dsl.Operator:
    op = dsl.Operator(name, doc)
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    K = op.dense_fixed("k", extent="feat")
    X = op.dense_input("X", (I, K))
    Y = op.dense_input("Y", (J, K))
    C = op.sparse_output("C", (I, J))
    with op.iterate([I, J, K], "SSR") as (i, j, k):
        C[i, j] += X[i, k] * Y[j, k]
    return op


def sddmm() -> dsl.Operator:
    """SparseTIR ``sddmm``: C[i, j] = sum_k X[i, k] Y[j, k] at A's entries, (I, J, K) "SSR".
    Unlike sparsec's library SDDMM there is no scale by A's values (SparseTIR's A and B are the
    dense operands): the operator reads only A's pattern."""
    return _sddmm("sddmm", "C[i, j] = sum_k X[i, k] * Y[j, k] on A's pattern")


def fused_sddmm() -> dsl.Operator:
    """SparseTIR ``fused_sddmm``: sddmm iterated over ``T.fuse(I, J)`` (one loop over the
    entries). Fusing (i, j) is a schedule decision in sparsec, not part of the operator: the
    DSL statement is sddmm's, and the CUDA template (schedules/cuda_sddmm.py) assigns entries
    to lane groups whatever the row they belong to."""
    return _sddmm("fused_sddmm", "C[i, j] = sum_k X[i, k] * Y[j, k] over the fused (i, j) entries")


def sddmm_reference(p: Problem) -> sp.csr_matrix:
    m = p.matrix
    X, Y = (x.astype(np.float64) for x in p.dense)
    return _with_values(m, np.einsum("ek,ek->e", X[_rows_of(m)], Y[m.indices]))


# ---------------------------------------------------------------------------------- softmax


def sparse_softmax() -> dsl.Operator:
    """SparseTIR ``sparse_softmax``: per row, the max, the sum of exp(A - max), then the
    normalisation, as three iterations with two (I,) temporaries (SparseTIR nests them in an
    ``sp_iter([I])``). SparseTIR's last statement reads ``exp(A[i, j]) / sum`` (no ``- max``),
    which is the softmax times exp(max); the operator here is the softmax itself."""
    op = dsl.Operator("sparse_softmax", "B[i, j] = exp(A[i, j] - max_j A[i, :]) / sum_j exp(A[i, j] - max)")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    A = op.sparse_input("A", (I, J))
    B = op.sparse_output("B", (I, J))
    mx = op.dense_temp("mx", (I,))
    s = op.dense_temp("s", (I,))
    with op.iterate([I, J], "SR") as (i, j):
        mx[i] = dsl.maximum(mx[i], A[i, j])
    with op.iterate([I, J], "SR") as (i, j):
        s[i] += dsl.exp(A[i, j] - mx[i])
    with op.iterate([I, J], "SS") as (i, j):
        B[i, j] = dsl.exp(A[i, j] - mx[i]) / s[i]
    return op


def softmax_reference(p: Problem) -> sp.csr_matrix:
    m = p.matrix
    vals = m.data.astype(np.float64)
    out = np.empty_like(vals)
    for r in range(m.shape[0]):
        a, b = m.indptr[r], m.indptr[r + 1]
        if a < b:
            e = np.exp(vals[a:b] - vals[a:b].max())
            out[a:b] = e / e.sum()
    return _with_values(m, out)


# ---------------------------------------------------------------------------------- hyper_gnn


def hyper_gnn() -> dsl.Operator:
    """SparseTIR ``hyper_gnn``: Y[i, f] = sum_{j in row i of H} sum_{i' in column j of H}
    X[i', f], i.e. Y = H H^T X over the incidence pattern H (values unread). SparseTIR attaches
    H^T's structure under J (two structures). With one structure it is two iterations:
    Tj = H^T X, a reduction over the *row* axis into a column-indexed temp (every row adds
    into shared elements: a fill first, then atomics on CUDA), then Y = H Tj."""
    op = dsl.Operator("hyper_gnn", "Y[i, f] = sum_j H[i, j] sum_i' H[i', j] X[i', f] (pattern only)")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    F = op.dense_fixed("f", extent="feat")
    X = op.dense_input("X", (I, F))
    Tj = op.dense_temp("Tj", (J, F))
    Y = op.dense_output("Y", (I, F))
    with op.iterate([I, J, F], "RSS") as (i, j, f):
        Tj[j, f] += X[i, f]
    with op.iterate([I, J, F], "SRS") as (i, j, f):
        Y[i, f] += Tj[j, f]
    return op


def hyper_gnn_reference(p: Problem) -> np.ndarray:
    H = p.matrix.copy()
    H.data = np.ones(H.nnz)  # the incidence pattern: explicit zeros are incidences too
    X = p.dense[0].astype(np.float64)
    return H @ (H.T @ X)


# ---------------------------------------------------------------------------------- bmm


def bmm() -> dsl.Operator:
    """SparseTIR ``bmm``: Z[b, i, k] = sum_j X[b, i, j] Y[b, j, k] for a batch of dense
    matrices of ragged sizes (I, J, K dense_variable under the batch axis). Written on one
    structure: the batch's (i, k) output blocks are the diagonal blocks of a block-diagonal
    pattern (rows: the batch's i stacked, columns: its k stacked), and the reduction axis j is
    a dense feature axis of extent max_b J_b, X_b and Y_b^T zero-padded along it. Z is then an
    SDDMM without scale on that pattern, one value per (b, i, k) in Z's ragged order."""
    op = dsl.Operator("bmm", "Z[i, k] = sum_q X[i, q] * Yt[k, q] on the batch's diagonal blocks")
    I = op.dense_fixed("i")
    K = op.sparse_variable("k", parent=I)
    Q = op.dense_fixed("q", extent="maxj")  # SparseTIR's J (j is the format's column axis)
    X = op.dense_input("X", (I, Q))
    Yt = op.dense_input("Yt", (K, Q))
    Z = op.sparse_output("Z", (I, K))
    with op.iterate([I, K, Q], "SSR") as (i, k, q):
        Z[i, k] += X[i, q] * Yt[k, q]
    return op


def bmm_inputs(rng, base: sp.csr_matrix, feat: int = 8) -> Problem:
    """A batch of about rows/6 matrices: sizes 0..8 (a long one of 3*8 rows; empty ones: no
    rows, no columns, or no reduction length), values with explicit zeros."""
    nb = max(3, base.shape[0] // 6)
    ni, nj, nk = (rng.integers(0, 9, nb) for _ in range(3))
    ni[0], nk[1], nj[2] = 24, 0, 0
    Xs = [_explicit_zeros(rng, a * b).reshape(a, b) for a, b in zip(ni, nj)]
    Ys = [_explicit_zeros(rng, b * c).reshape(b, c) for b, c in zip(nj, nk)]
    maxj = max(1, int(nj.max()))
    rows, cols = int(ni.sum()), int(nk.sum())
    X = np.zeros((rows, maxj), np.float32)
    Yt = np.zeros((cols, maxj), np.float32)
    r_off = np.concatenate([[0], np.cumsum(ni)])
    c_off = np.concatenate([[0], np.cumsum(nk)])
    for b in range(nb):
        X[r_off[b]:r_off[b + 1], :nj[b]] = Xs[b]
        Yt[c_off[b]:c_off[b + 1], :nj[b]] = Ys[b].T
    # block-diagonal pattern: row r of element b holds columns c_off[b] .. c_off[b + 1] - 1
    batch_of_row = np.repeat(np.arange(nb), ni)
    row_len = nk[batch_of_row]
    indptr = np.concatenate([[0], np.cumsum(row_len)]).astype(np.int64)
    indices = (np.arange(indptr[-1]) - np.repeat(indptr[:-1], row_len) + np.repeat(c_off[batch_of_row], row_len))
    m = sp.csr_matrix((np.ones(indptr[-1], np.float32), indices.astype(np.int32), indptr), shape=(rows, cols))
    m.has_sorted_indices = True
    return Problem(m, (X, Yt), {"maxj": maxj}, {"X": Xs, "Y": Ys})


def bmm_reference(p: Problem) -> sp.csr_matrix:
    """Each batch element's product, its (i, k) values in the block-diagonal pattern's order
    (row by row: a row of batch element b holds Z_b[i, :])."""
    vals = [(x.astype(np.float64) @ y.astype(np.float64)).ravel() for x, y in zip(p.info["X"], p.info["Y"])]
    return _with_values(p.matrix, np.concatenate(vals) if vals else np.zeros(0))


# ---------------------------------------------------------------------------------- CSF sums


def _square_sum(name: str) -> dsl.Operator:
    op = dsl.Operator(name, "B[i] = sum_{j,k} A[i, j, k] (A: CSF flattened to (i, j*N2+k))")
    I = op.dense_fixed("i")
    JK = op.sparse_variable("jk", parent=I)
    A = op.sparse_input("A", (I, JK))
    B = op.dense_output("B", (I,))
    with op.iterate([I, JK], "SR") as (i, jk):
        B[i] += A[i, jk]
    return op


def square_sum() -> dsl.Operator:
    """SparseTIR ``square_sum`` (which sums, despite its name): B[i] = sum_{j, k} A[i, j, k] for
    a 3-level CSF tensor (I dense, J and K sparse_variable). Written on the CSF flattened to CSR
    over (i, j * N2 + k): the (j, k) fibres of row i are that row's entries, in CSF order."""
    return _square_sum("square_sum")


def square_sum_two_K() -> dsl.Operator:
    """SparseTIR ``square_sum_two_K``: square_sum iterating a second K axis (K1) whose indptr /
    indices equal A's own (K0): the value read at K1's coordinate is found in K0's fibre. With
    the two levels equal, the flattened operator is square_sum's; the reference walks K1 and
    looks each coordinate up in K0, as the script does."""
    return _square_sum("square_sum_two_K")


def csf_inputs(rng, base: sp.csr_matrix, feat: int = 8) -> Problem:
    """A 3-level CSF: (i, j) is ``base``'s pattern (empty rows, a long row); each (i, j) holds
    0..4 sorted k's out of N2 = 5 (a fibre of all 5 at the long row's first entry; empty
    fibres), values with explicit zeros."""
    n2 = 5
    nnz_j = base.nnz
    counts = rng.integers(0, 5, nnz_j)
    long_row = int(np.argmax(np.diff(base.indptr)))
    if base.indptr[long_row + 1] > base.indptr[long_row]:
        counts[base.indptr[long_row]] = n2
    indptr_k = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    indices_k = np.concatenate([np.sort(rng.choice(n2, c, replace=False)) for c in counts] or [np.zeros(0, int)])
    vals = _explicit_zeros(rng, int(indptr_k[-1]))
    # flattened: row i, column j * N2 + k, in CSF order (sorted: j sorted, then k)
    parent_j = np.repeat(np.arange(nnz_j), counts)
    cols = base.indices[parent_j].astype(np.int64) * n2 + indices_k
    rows_per = np.bincount(_rows_of(base)[parent_j], minlength=base.shape[0])
    indptr = np.concatenate([[0], np.cumsum(rows_per)])
    m = sp.csr_matrix((vals, cols.astype(np.int32), indptr), shape=(base.shape[0], base.shape[1] * n2))
    m.has_sorted_indices = True
    info = {"M": base.shape[0], "indptr_j": base.indptr.copy(), "indices_j": base.indices.copy(),
            "indptr_k": indptr_k, "indices_k": indices_k, "values": vals, "N2": n2}
    return Problem(m, (), {}, info)


def square_sum_reference(p: Problem) -> np.ndarray:
    """Walk the CSF levels: each k-entry's value goes to its j-entry's row."""
    f = p.info
    row_of_j = np.repeat(np.arange(f["M"]), np.diff(f["indptr_j"]))
    j_of_k = np.repeat(np.arange(len(f["indices_j"])), np.diff(f["indptr_k"]))
    return np.bincount(row_of_j[j_of_k], weights=f["values"].astype(np.float64), minlength=f["M"])


def square_sum_two_k_reference(p: Problem) -> np.ndarray:
    """Iterate K1 (a copy of K0's arrays); read A at the position of the same k in K0's fibre."""
    f = p.info
    indptr_k1, indices_k1 = f["indptr_k"].copy(), f["indices_k"].copy()
    j1 = np.repeat(np.arange(len(f["indices_j"])), np.diff(indptr_k1))
    key0 = np.repeat(np.arange(len(f["indices_j"])), np.diff(f["indptr_k"])) * f["N2"] + f["indices_k"]
    pos0 = np.searchsorted(key0, j1 * f["N2"] + indices_k1)  # K0's fibres are sorted: a binary search
    assert np.array_equal(key0[pos0], j1 * f["N2"] + indices_k1)
    row_of_j = np.repeat(np.arange(f["M"]), np.diff(f["indptr_j"]))
    return np.bincount(row_of_j[j1], weights=f["values"][pos0].astype(np.float64), minlength=f["M"])


# ---------------------------------------------------------------------------------- ragged 4-d


def _fused_reduction(name: str, doc: str) -> dsl.Operator:
    op = dsl.Operator(name, doc)
    P = op.dense_fixed("p")
    Q = op.dense_variable("q", parent=P)
    X = op.sparse_input("X", (P, Q))
    Y = op.dense_output("Y", (P,))
    with op.iterate([P, Q], "SR") as (p, q):
        Y[p] += X[p, q]
    return op


def fused_reduction_4d_2d() -> dsl.Operator:
    """SparseTIR ``fused_reduction_4d_2d``: Y[i, j] = sum_{k, l} X[i, j, k, l] for a ragged
    4-d X (J, K, L dense_variable), iterating ``T.fuse(I, J)``. Written on one structure: the
    fused (i, j) pairs are the rows p (Y's ragged storage order), and row p's ragged segment
    holds its (k, l) elements: a segment reduction over a dense_variable axis."""
    return _fused_reduction("fused_reduction_4d_2d", "Y[(i,j)] = sum_{k,l} X[i, j, k, l] (rows: fused (i, j))")


def fused_reduction_4d_3d() -> dsl.Operator:
    """SparseTIR ``fused_reduction_4d_3d``: Y[i, j, k] = sum_l X[i, j, k, l], iterating
    ``T.fuse(I, J, K)``: rows are the fused (i, j, k) triples, segments their l elements."""
    return _fused_reduction("fused_reduction_4d_3d", "Y[(i,j,k)] = sum_l X[i, j, k, l] (rows: fused (i, j, k))")


def _ragged_4d(rng, base: sp.csr_matrix) -> dict:
    """I = base's rows, J per i = base's row lengths (empty rows, a long row), K per (i, j) in
    0..3, L per (i, j, k) in 0..4 (one of 40), values with explicit zeros."""
    len_j = np.diff(base.indptr)
    len_k = rng.integers(0, 4, int(len_j.sum()))  # one per (i, j) pair
    len_l = rng.integers(0, 5, int(len_k.sum()))  # one per (i, j, k) triple
    if len_l.size:
        len_l[rng.integers(len_l.size)] = 40
    return {"n": base.shape[0], "len_j": len_j, "len_k": len_k, "len_l": len_l,
            "values": _explicit_zeros(rng, int(len_l.sum()))}


def _pair_of_element(r: dict) -> np.ndarray:
    """The (i, j) pair (its position among all pairs) of every l element: l -> its (i, j, k)
    triple -> that triple's pair."""
    triple = np.repeat(np.arange(r["len_l"].size), r["len_l"])
    pair_of_triple = np.repeat(np.arange(r["len_k"].size), r["len_k"])
    return pair_of_triple[triple]


def _segments_matrix(seg_lengths: np.ndarray, values: np.ndarray) -> sp.csr_matrix:
    """Rows = segments, row p's entries = its elements at columns 0..len-1."""
    indptr = np.concatenate([[0], np.cumsum(seg_lengths)]).astype(np.int64)
    cols = np.arange(indptr[-1]) - np.repeat(indptr[:-1], seg_lengths)
    width = max(1, int(seg_lengths.max()) if seg_lengths.size else 1)
    m = sp.csr_matrix((values, cols.astype(np.int32), indptr), shape=(len(seg_lengths), width))
    m.has_sorted_indices = True
    return m


def reduction_4d_2d_inputs(rng, base, feat: int = 8) -> Problem:
    r = _ragged_4d(rng, base)
    per_ij = np.bincount(_pair_of_element(r), minlength=r["len_k"].size)  # elements of each (i, j)
    return Problem(_segments_matrix(per_ij, r["values"]), (), {}, r)


def reduction_4d_3d_inputs(rng, base, feat: int = 8) -> Problem:
    r = _ragged_4d(rng, base)
    return Problem(_segments_matrix(r["len_l"], r["values"]), (), {}, r)


def reduction_4d_2d_reference(p: Problem) -> np.ndarray:
    """Walk the levels L -> K -> J: each element's value goes to its (i, j) pair."""
    r = p.info
    return np.bincount(_pair_of_element(r), weights=r["values"].astype(np.float64), minlength=r["len_k"].size)


def reduction_4d_3d_reference(p: Problem) -> np.ndarray:
    r = p.info
    triple = np.repeat(np.arange(r["len_l"].size), r["len_l"])
    return np.bincount(triple, weights=r["values"].astype(np.float64), minlength=r["len_l"].size)


# ---------------------------------------------------------------------------------- RGCN


def rgcn_homo_forward() -> dsl.Operator:
    """SparseTIR ``rgcn_homo_forward``: Y[i, fo] = sum_j sum_fi W[E[i, j], fo, fi] X[j, fi],
    E the int32 edge type of each entry, iterating (I, FO, J, FI) as "SSRR". A is the graph
    (its values are not read, as in SparseTIR); E is edge data on A's structure, passed after
    the matrix in declaration order: kernel(A, E, W, X). ``NEEDS_EDGE_DATA``."""
    op = dsl.Operator("rgcn_homo_forward", "Y[i, fo] = sum_{j, fi} W[E[i, j], fo, fi] * X[j, fi]")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    R = op.dense_fixed("r", extent="rel")
    FO = op.dense_fixed("fo", extent="feat")
    FI = op.dense_fixed("fi", extent="feat")
    op.sparse_input("A", (I, J))
    E = op.sparse_input("E", (I, J), dtype="int32")
    W = op.dense_input("W", (R, FO, FI))
    X = op.dense_input("X", (J, FI))
    Y = op.dense_output("Y", (I, FO))
    with op.iterate([I, FO, J, FI], "SSRR") as (i, fo, j, fi):
        Y[i, fo] += W[E[i, j], fo, fi] * X[j, fi]
    return op


def rgcn_homo_inputs(rng, base, feat: int = 8, rel: int = 3) -> Problem:
    E = rng.integers(0, rel, base.nnz).astype(np.int32)  # canonical CSR order (explicit zeros are edges)
    W = _normal(rng, (rel, feat, feat))
    X = _normal(rng, (base.shape[1], feat))
    return Problem(base, (E, W, X), {"rel": rel, "feat": feat})


def rgcn_homo_reference(p: Problem) -> np.ndarray:
    E, W, X = p.dense
    m = p.matrix
    rows, cols = _rows_of(m), m.indices
    out = np.zeros((m.shape[0], W.shape[1]))
    for r in range(W.shape[0]):  # one relation at a time: its edges' messages W_r X_j
        sel = E == r
        msg = X[cols[sel]].astype(np.float64) @ W[r].astype(np.float64).T
        np.add.at(out, rows[sel], msg)
    return out


def rgcn_hetero_forward() -> dsl.Operator:
    """SparseTIR ``rgcn_hetero_forward``: Y[i, fo] = sum_r sum_{j} A[r, i, j] sum_fi W[r, fo, fi]
    X[j, fi], A with a leading relation axis (R dense, I and J sparse_variable). An (i, j) may
    be an edge of several relations, so a homogeneous graph with one type per edge does not
    hold it; stacking the relations along the columns does: Â[i, r*n + j] = A[r, i, j], E the
    relation of each entry (c // n) and Xs = X repeated per relation (Xs[r*n + j] = X[j]).
    Then it is rgcn_homo with A's values as weights. ``NEEDS_EDGE_DATA``."""
    op = dsl.Operator("rgcn_hetero_forward", "Y[i, fo] = sum_{c, fi} A[i, c] * W[E[i, c], fo, fi] * Xs[c, fi]")
    I = op.dense_fixed("i")
    C = op.sparse_variable("c", parent=I)
    R = op.dense_fixed("r", extent="rel")
    FO = op.dense_fixed("fo", extent="feat")
    FI = op.dense_fixed("fi", extent="feat")
    A = op.sparse_input("A", (I, C))
    E = op.sparse_input("E", (I, C), dtype="int32")
    W = op.dense_input("W", (R, FO, FI))
    Xs = op.dense_input("Xs", (C, FI))
    Y = op.dense_output("Y", (I, FO))
    with op.iterate([FO, I, C, FI], "SSRR") as (fo, i, c, fi):
        Y[i, fo] += A[i, c] * W[E[i, c], fo, fi] * Xs[c, fi]
    return op


def rgcn_hetero_inputs(rng, base, feat: int = 8, rel: int = 3) -> Problem:
    """``rel`` relations over base's rows and columns, each a random half of base's entries
    (so pairs repeat across relations) with its own values."""
    m, n = base.shape
    rels = []
    for _ in range(rel):
        keep = rng.random(base.nnz) < 0.5
        c = base.tocoo()
        rels.append(sp.csr_matrix((_explicit_zeros(rng, int(keep.sum())), (c.row[keep], c.col[keep])), shape=(m, n)))
    for a in rels:
        a.sort_indices()
    stacked = sp.csr_matrix(sp.hstack(rels, format="csr", dtype=np.float32))
    stacked.sort_indices()
    E = (stacked.indices // max(n, 1)).astype(np.int32)
    W = _normal(rng, (rel, feat, feat))
    X = _normal(rng, (n, feat))
    return Problem(stacked, (E, W, np.tile(X, (rel, 1))), {"rel": rel, "feat": feat}, {"A": rels, "X": X})


def rgcn_hetero_reference(p: Problem) -> np.ndarray:
    """sum_r A_r X W_r^T, each relation's matrix on its own."""
    W, X = p.dense[1].astype(np.float64), p.info["X"].astype(np.float64)
    return sum(a.astype(np.float64) @ (X @ W[r].T) for r, a in enumerate(p.info["A"]))


# ---------------------------------------------------------------------------------- csr2bsr


def csr2bsr() -> dsl.Operator:
    """SparseTIR ``csr2bsr``: B[i // b, j // b, i % b, j % b] = A[i, j], A's CSR values moved
    into a BSR layout. In sparsec the operator is bound to the BSR structure and takes the CSR
    value array as edge data (one value per entry in canonical CSR order): the kernel writes
    each value into its BSR slot (0 at the blocks' padding). ``NEEDS_EDGE_DATA``."""
    op = dsl.Operator("csr2bsr", "B[i, j] = V[i, j], V in CSR order, B in the bound (BSR) layout")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    op.sparse_input("A", (I, J))
    V = op.sparse_input("V", (I, J))
    B = op.sparse_output("B", (I, J))
    with op.iterate([I, J], "SS") as (i, j):
        B[i, j] = V[i, j]
    return op


def csr2bsr_inputs(rng, base, feat: int = 8) -> Problem:
    """V: fresh values for base's entries (not A's: a kernel copying A would be caught)."""
    return Problem(base, (_explicit_zeros(rng, base.nnz),), {})


def csr2bsr_reference(p: Problem) -> sp.csr_matrix:
    return _with_values(p.matrix, p.dense[0].astype(np.float64))


def bsr_layout_reference(p: Problem, inst) -> Optional[np.ndarray]:
    """The slots of scipy's own BSR conversion (the shape padded to whole blocks, block
    columns sorted): what the kernel's output array must be, slot for slot; None when the
    instance is not a plain BSR."""
    if inst.format.name != "bsr":
        return None
    r, c = inst.format.param("block")
    rows, cols = p.matrix.shape
    padded = sp.csr_matrix((p.dense[0].astype(np.float64), p.matrix.indices, p.matrix.indptr), shape=p.matrix.shape)
    padded.resize((-(-rows // r) * r, -(-cols // c) * c))
    b = padded.tobsr(blocksize=(r, c))
    b.sort_indices()
    return b.data.ravel()


# ---------------------------------------------------------------------------------- the table

KERNELS: Dict[str, SparseTIRKernel] = {k.name: k for k in (
    SparseTIRKernel("csrmm", csrmm, spmm_reference, _matrix_inputs(("cols", "feat")), ALL_FAMILIES),
    SparseTIRKernel("csrmm_dense_iter", csrmm_dense_iter, dense_iter_reference, _dense_iter_inputs, LOOKUP_FAMILIES),
    SparseTIRKernel("segment_reduce", segment_reduce, segment_reference, _matrix_inputs(), ALL_FAMILIES),
    SparseTIRKernel("csr_reduce", csr_reduce, row_sum_reference, _matrix_inputs(), ALL_FAMILIES),
    SparseTIRKernel("bsrmm", bsrmm, spmm_reference, _matrix_inputs(("cols", "feat")),
                    ("bsr:2x2", "bsr:4x4", "bsr+csr:4x4,0.3")),
    SparseTIRKernel("ellmm", ellmm, spmm_reference, _matrix_inputs(("cols", "feat")),
                    ("ell", "hyb:1:1/2/4", "hyb:2:1/2/4")),
    SparseTIRKernel("csr_element_wise", csr_element_wise, element_wise_reference, _matrix_inputs(), ALL_FAMILIES),
    SparseTIRKernel("hyper_gnn", hyper_gnn, hyper_gnn_reference, _matrix_inputs(("rows", "feat")), PATTERN_FAMILIES),
    SparseTIRKernel("bmm", bmm, bmm_reference, bmm_inputs, PATTERN_FAMILIES),
    SparseTIRKernel("sddmm", sddmm, sddmm_reference, _matrix_inputs(("rows", "feat"), ("cols", "feat")),
                    ALL_FAMILIES),
    SparseTIRKernel("fused_sddmm", fused_sddmm, sddmm_reference, _matrix_inputs(("rows", "feat"), ("cols", "feat")),
                    ALL_FAMILIES),
    SparseTIRKernel("square_sum", square_sum, square_sum_reference, csf_inputs, PATTERN_FAMILIES),
    SparseTIRKernel("square_sum_two_K", square_sum_two_K, square_sum_two_k_reference, csf_inputs, PATTERN_FAMILIES),
    SparseTIRKernel("fused_reduction_4d_2d", fused_reduction_4d_2d, reduction_4d_2d_reference,
                    reduction_4d_2d_inputs, PATTERN_FAMILIES),
    SparseTIRKernel("fused_reduction_4d_3d", fused_reduction_4d_3d, reduction_4d_3d_reference,
                    reduction_4d_3d_inputs, PATTERN_FAMILIES),
    SparseTIRKernel("rgcn_homo_forward", rgcn_homo_forward, rgcn_homo_reference, rgcn_homo_inputs, PATTERN_FAMILIES),
    SparseTIRKernel("rgcn_hetero_forward", rgcn_hetero_forward, rgcn_hetero_reference, rgcn_hetero_inputs,
                    PATTERN_FAMILIES),
    SparseTIRKernel("sparse_softmax", sparse_softmax, softmax_reference, _matrix_inputs(), ALL_FAMILIES),
    SparseTIRKernel("csr2bsr", csr2bsr, csr2bsr_reference, csr2bsr_inputs, ("bsr:2x2", "bsr:4x4", "bsr:3x5"),
                    layout_reference=bsr_layout_reference),
)}


# ---------------------------------------------------------------------------------- running one case


def instance(p: Problem, family: str):
    """(the problem's matrix in ``family``, the problem it now holds): N:M prunes the matrix
    first (only kernels whose structure is the matrix itself list nm), and its edge data / dense
    inputs do not depend on which entries are kept."""
    from sparsec import formats
    from sparsec.formats import nm

    if family.startswith("nm:"):
        n, mw, *v = (int(x.strip("v")) for x in family[3:].split(":"))
        pruned = nm.prune_stored(p.matrix, n=n, m=mw, vec=v[0] if v else 1)
        pruned.sort_indices()
        p = dataclasses.replace(p, matrix=pruned)
        return formats.convert(pruned, family), p
    return formats.convert(p.matrix, family), p


def check(kernel: SparseTIRKernel, p: Problem, inst, out, tol: float = 1e-4) -> dict:
    """Compare a kernel's output with the float64 reference: a dense output as an array; a
    sparse output on the matrix's coordinates (the canonical CSR it holds, pattern first), and
    every padding slot 0; csr2bsr's output also slot by slot against scipy's BSR layout.
    Returns {"ok", "err", "why"}."""
    from sparsec.reference import max_rel_err

    ref = kernel.reference(p)
    out = np.asarray(out[0] if isinstance(out, tuple) else out)
    if not sp.issparse(ref):
        err = max_rel_err(out.astype(np.float64), np.asarray(ref, np.float64))
        return {"ok": bool(err <= tol), "err": err, "why": "" if err <= tol else f"rel err {err:.2e}"}
    flat = out.reshape(-1).astype(np.float64)
    got = inst.to_scipy(flat).tocsr()
    got.sort_indices()
    if not (np.array_equal(got.indptr, ref.indptr) and np.array_equal(got.indices, ref.indices)):
        return {"ok": False, "err": float("inf"), "why": "the output's coordinates differ from the pattern"}
    pad = ~inst.valid_slots()
    if np.any(flat[pad] != 0):
        return {"ok": False, "err": float("inf"), "why": f"{int(np.sum(flat[pad] != 0))} padding slots are not 0"}
    err = max_rel_err(got.data, ref.data)
    if kernel.layout_reference is not None:
        layout = kernel.layout_reference(p, inst)
        if layout is not None and not (layout.shape == flat.shape and np.array_equal(layout, flat)):
            return {"ok": False, "err": float("inf"), "why": "the slots differ from scipy's BSR layout"}
    return {"ok": bool(err <= tol), "err": err, "why": "" if err <= tol else f"rel err {err:.2e}"}
