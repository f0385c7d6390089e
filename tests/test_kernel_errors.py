"""Bad input at the kernel boundary (and at compile) raises a Python exception that names
the problem, before any generated code runs; degenerate matrices run correctly."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import sparsec
from sparsec import reference
from sparsec.formats import convert

from conftest import SPECS, check, dense, make_matrix

ROWS, COLS, FEAT = 37, 53, 16


@pytest.fixture(scope="module")
def m():
    return make_matrix("uniform", ROWS, COLS, seed=7)


@pytest.fixture(scope="module")
def A(m):
    return convert(m, "csr")


@pytest.fixture(scope="module")
def spmm(A):
    return sparsec.compile("spmm", A, feat=FEAT, target="llvm")


@pytest.fixture(scope="module")
def sddmm(A):
    return sparsec.compile("sddmm", A, feat=FEAT, target="llvm")


@pytest.fixture
def rng():
    return np.random.default_rng(8)


# ---------------------------------------------------------------- dense operands


@pytest.mark.parametrize("shape", [(COLS + 1, FEAT), (ROWS, FEAT), (COLS, FEAT + 1), (COLS,), (COLS, FEAT, 1)],
                         ids=["rows+1", "rows-of-A", "feat+1", "1d", "3d"])
def test_spmm_B_wrong_shape(spmm, A, rng, shape):
    with pytest.raises(ValueError, match=rf"spmm: B should have shape \({COLS}, {FEAT}\)"):
        spmm(A, dense(rng, shape))


def test_sddmm_X_wrong_shape(sddmm, A, rng):
    with pytest.raises(ValueError, match=rf"sddmm: X should have shape \({ROWS}, {FEAT}\)"):
        sddmm(A, dense(rng, (ROWS + 1, FEAT)), dense(rng, (COLS, FEAT)))


def test_sddmm_Y_wrong_shape(sddmm, A, rng):
    with pytest.raises(ValueError, match=rf"sddmm: Y should have shape \({COLS}, {FEAT}\)"):
        sddmm(A, dense(rng, (ROWS, FEAT)), dense(rng, (FEAT, COLS)))  # transposed Y


def test_sddmm_X_Y_swapped(sddmm, A, rng):
    with pytest.raises(ValueError, match=r"sddmm: X should have shape"):
        sddmm(A, dense(rng, (COLS, FEAT)), dense(rng, (ROWS, FEAT)))


def test_wrong_dtype_dense(spmm, A, rng):
    with pytest.raises(TypeError, match=r"spmm: B should be float32, got float64"):
        spmm(A, dense(rng, (COLS, FEAT), np.float64))


def test_wrong_dtype_torch(spmm, A):
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match=r"spmm: B should be float32, got float64"):
        spmm(A, torch.zeros(COLS, FEAT, dtype=torch.float64))


def test_dense_not_an_array(spmm, A):
    with pytest.raises((TypeError, ValueError), match=r"B should"):
        spmm(A, [[0.0] * FEAT] * COLS)


@pytest.mark.parametrize("n", [0, 2])
def test_spmm_wrong_number_of_dense_inputs(spmm, A, rng, n):
    with pytest.raises(TypeError, match=rf"spmm takes the sparse matrix and 1 dense inputs \(B\), got {n}"):
        spmm(A, *[dense(rng, (COLS, FEAT)) for _ in range(n)])


def test_sddmm_wrong_number_of_dense_inputs(sddmm, A, rng):
    with pytest.raises(TypeError, match=r"sddmm takes the sparse matrix and 2 dense inputs \(X, Y\), got 1"):
        sddmm(A, dense(rng, (ROWS, FEAT)))


# ---------------------------------------------------------------- the sparse operand


def test_other_format_than_compiled(spmm, m, rng):
    with pytest.raises(ValueError, match=r"compiled for format csr, got a matrix in bsr:2x2"):
        spmm(convert(m, "bsr:2x2"), dense(rng, (COLS, FEAT)))


def test_other_block_size_than_compiled(m, rng):
    k = sparsec.compile("spmm", "bsr:4x4", feat=FEAT, target="llvm")
    with pytest.raises(ValueError, match=r"compiled for format bsr:4x4, got a matrix in bsr:3x5"):
        k(convert(m, "bsr:3x5"), dense(rng, (COLS, FEAT)))


def test_other_ell_width_than_compiled(m, rng):
    A = convert(m, "ell")
    k = sparsec.compile("spmm", A, feat=FEAT, target="llvm")
    wider = convert(m, f"ell:{A.format.param('width') + 3}")
    with pytest.raises(ValueError, match=rf"compiled for format {A.format.spec}, got a matrix in {wider.format.spec}"):
        k(wider, dense(rng, (COLS, FEAT)))


def test_matrix_dtype_mismatch(spmm, m, rng):
    A64 = convert(m.astype(np.float64), "csr")
    with pytest.raises(TypeError, match=r"matrix values should be float32 for this kernel, got float64"):
        spmm(A64, dense(rng, (COLS, FEAT)))


def test_scipy_matrix_instead_of_instance(spmm, m, rng):
    with pytest.raises(TypeError, match=r"converted matrix \(sparsec\.formats\.convert\)"):
        spmm(m, dense(rng, (COLS, FEAT)))


def test_dense_numpy_matrix_instead_of_instance(spmm, m, rng):
    with pytest.raises(TypeError, match=r"convert"):
        spmm(m.toarray(), dense(rng, (COLS, FEAT)))


# ---------------------------------------------------------------- out=


@pytest.mark.parametrize("shape", [(ROWS, FEAT + 1), (ROWS + 1, FEAT), (FEAT, ROWS)], ids=["feat+1", "rows+1", "T"])
def test_out_wrong_shape(spmm, A, rng, shape):
    with pytest.raises(ValueError, match=rf"out C should be float32 with shape \({ROWS}, {FEAT}\)"):
        spmm(A, dense(rng, (COLS, FEAT)), out=np.zeros(shape, np.float32))


def test_out_wrong_dtype(spmm, A, rng):
    with pytest.raises(ValueError, match=r"out C should be float32 .* got float64"):
        spmm(A, dense(rng, (COLS, FEAT)), out=np.zeros((ROWS, FEAT), np.float64))


def test_sddmm_out_wrong_length(sddmm, A, rng):
    with pytest.raises(ValueError, match=rf"out C should be float32 with shape \({A.stored},\)"):
        sddmm(A, dense(rng, (ROWS, FEAT)), dense(rng, (COLS, FEAT)), out=np.zeros(A.stored + 1, np.float32))


def test_out_wrong_count(spmm, A, rng):
    out = np.zeros((ROWS, FEAT), np.float32)
    with pytest.raises(TypeError, match=r"out should hold 1 arrays, got 2"):
        spmm(A, dense(rng, (COLS, FEAT)), out=(out, out))


# ---------------------------------------------------------------- compile-time errors


def test_unsupported_dtype_at_compile():
    with pytest.raises(TypeError, match=r"dtype should be one of .*got int32"):
        sparsec.compile("spmm", "csr", feat=8, dtype="int32", target="llvm")


@pytest.mark.parametrize("target", ["cuda -arch=sm_80", "rocm", "cuda:sm80", "opencl"])
def test_bad_target_string(target):
    with pytest.raises(ValueError, match=r"target should be llvm, cuda, cuda:sm_80 or cuda:sm_90a"):
        sparsec.compile("spmm", "csr", feat=8, target=target)


def test_target_not_a_string():
    with pytest.raises(TypeError, match=r"target should be a string"):
        sparsec.compile("spmm", "csr", feat=8, target=80)


def test_ell_without_width_at_compile():
    with pytest.raises(ValueError, match=r"needs its width"):
        sparsec.compile("spmm", "ell", feat=8, target="llvm")


def test_scipy_matrix_as_compile_format(m):
    with pytest.raises(TypeError, match=r"fmt should be a format spec, Format or converted matrix"):
        sparsec.compile("spmm", m, feat=8, target="llvm")


# ---------------------------------------------------------------- degenerate matrices run


def _zero_params():
    out = []
    for spec in SPECS:
        for rows, label in ((ROWS, "nnz0"), (0, "0rows")):
            out.append(pytest.param(spec, rows, id=f"{spec}-{label}"))
    return out


@pytest.mark.parametrize("spec, rows", _zero_params())
def test_empty_matrix_spmm(spec, rows, rng):
    A = convert(sp.csr_matrix((rows, COLS), dtype=np.float32), spec)
    assert A.nnz == 0
    B = dense(rng, (COLS, FEAT))
    C = sparsec.compile("spmm", A, feat=FEAT, target="llvm")(A, B, poison=True)
    assert C.shape == (rows, FEAT)
    assert np.all(C == 0)
    check(C, reference.spmm(A, B))


@pytest.mark.parametrize("spec, rows", _zero_params())
def test_empty_matrix_sddmm(spec, rows, rng):
    A = convert(sp.csr_matrix((rows, COLS), dtype=np.float32), spec)
    X, Y = dense(rng, (rows, FEAT)), dense(rng, (COLS, FEAT))
    out = sparsec.compile("sddmm", A, feat=FEAT, target="llvm")(A, X, Y, poison=True)
    assert out.shape == (A.stored,)
    assert np.all(out == 0)


def test_empty_matrix_torch():
    """torch allocates its own (compact) empty tensors: the nnz=0 matrix runs with torch operands
    as long as the matrix's own arrays are not the problem (ELL pads to width 1)."""
    torch = pytest.importorskip("torch")
    A = convert(sp.csr_matrix((ROWS, COLS), dtype=np.float32), "ell")
    C = sparsec.compile("spmm", A, feat=FEAT, target="llvm")(A, torch.ones(COLS, FEAT), poison=True)
    assert isinstance(C, torch.Tensor) and bool((C == 0).all())
