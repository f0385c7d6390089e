"""Lookups: a sparse buffer read at a dense column axis (``A[i, jd]``: its value where (i, jd)
is an entry, else 0), lowered to a binary search over the row's sorted columns on csr, ell
and bsr, checked on llvm against a numpy reference built from the dense matrix and against
``sparsec.reference.evaluate``, on NaN-poisoned outputs; refused by name elsewhere."""
from __future__ import annotations

import re

import numpy as np
import pytest
import scipy.sparse as sp

import sparsec
from sparsec import dsl, formats
from sparsec.reference import evaluate

FAMILIES = ("csr", "ell", "bsr:2x3")


def matrix(rows=23, cols=19, seed=3) -> sp.csr_matrix:
    """Empty rows (0 and 5), a full row (7: every column), explicit zeros, odd sizes."""
    rng = np.random.default_rng(seed)
    dense = np.where(rng.random((rows, cols)) < 0.2, rng.standard_normal((rows, cols)), 0.0).astype(np.float32)
    dense[[0, 5]] = 0
    dense[7] = rng.standard_normal(cols).astype(np.float32)
    m = sp.csr_matrix(dense)
    r, c = 3, int(np.flatnonzero(dense[3] == 0)[0])  # explicit zeros: entries whose value is 0
    m = sp.csr_matrix((np.r_[m.data, 0, 0].astype(np.float32), np.r_[m.indices, c, 4],
                       np.r_[m.indptr[:r + 1], m.indptr[r + 1:] + 1].copy()), shape=m.shape)
    m = sp.csr_matrix((m.data, m.indices, m.indptr), shape=m.shape)
    m.sum_duplicates()
    return m


def dense_iter_spmm() -> dsl.Operator:
    """C[i, k] = sum over jd < n of A[i, jd] * B[jd, k] (n may differ from the column count)."""
    op = dsl.Operator("lookup_spmm")
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


def edge_lookup() -> dsl.Operator:
    """Edge data with a trailing axis read by lookup: Y[i, h] = sum_jd (L[i, jd, h] + 1) * x[jd]
    (the + 1 makes an absent entry, read as 0, differ from skipping it)."""
    op = dsl.Operator("lookup_edge")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    Jd = op.dense_fixed("jd", extent=19)
    H = op.dense_fixed("h", extent=2)
    op.sparse_input("A", (I, J))
    L = op.sparse_input("L", (I, J, H))
    x = op.dense_input("x", (Jd,))
    Y = op.dense_output("Y", (I, H))
    with op.iterate([I, H, Jd], "SSR") as (i, h, jd):
        Y[i, h] += (L[i, jd, h] + 1.0) * x[jd]
    return op


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("n", [19, 11, 26])  # all columns; fewer; more than the matrix has (absent: 0)
def test_lookup_spmm_matches_dense_reference(family, n):
    m = matrix()
    rng = np.random.default_rng(n)
    B = rng.standard_normal((n, 5)).astype(np.float32)
    A = formats.convert(m, family)
    out = sparsec.compile(dense_iter_spmm(), A, target="llvm", feat=5, n=n)(A, B, poison=True)
    dense = np.zeros((m.shape[0], n))
    width = min(n, m.shape[1])
    dense[:, :width] = m.toarray()[:, :width]
    want = dense @ B.astype(np.float64)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(evaluate(dense_iter_spmm(), A, B, params={"feat": 5, "n": n}), want,
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("family", ("csr", "bsr:2x3"))
def test_lookup_of_edge_data_with_a_trailing_axis(family):
    m = matrix()
    rng = np.random.default_rng(0)
    L = rng.standard_normal((m.nnz, 2)).astype(np.float32)
    x = rng.standard_normal(19).astype(np.float32)
    A = formats.convert(m, family)
    out = sparsec.compile(edge_lookup(), A, target="llvm")(A, A.edge_values(L), x, poison=True)
    want = np.zeros((m.shape[0], 2))
    for h in range(2):
        dense = sp.csr_matrix((L[:, h].astype(np.float64), m.indices, m.indptr), shape=m.shape).toarray()
        want[:, h] = (dense + 1.0) @ x.astype(np.float64)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(evaluate(edge_lookup(), A, L, x), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("family, fragment", [
    ("hyb:1:1/2/4", "composite format hyb"),
    ("bsr+csr:4x4,0.3", "composite format bsr+csr"),
    ("nm:2:4", "format nm"),
])
def test_lookup_refused_on_formats_without_sorted_rows(family, fragment):
    with pytest.raises(ValueError, match=re.escape(fragment)) as e:
        sparsec.compile(dense_iter_spmm(), family, target="llvm", feat=5, n=19)
    assert "A[i, jd]" in str(e.value) and "csr, ell or bsr" in str(e.value)


def test_lookup_cuda_source_compiles():
    from nvcc_tools import nvcc_sources

    srcs = {(fam, "sm_90a"): sparsec.compile(dense_iter_spmm(), fam, target="cuda:sm_90a", feat=16, n=40).source()
            for fam in ("csr", "ell:8", "bsr:4x4")}
    for key, (ok, log) in nvcc_sources(srcs).items():
        assert ok, f"{key}: {log[:2000]}"
