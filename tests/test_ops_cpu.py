"""Library operators (SpMM, SDDMM) on the CPU (llvm) in every format, against the float64
references, on matrices of several structures; outputs are poisoned with NaN first so that
an element a kernel fails to write shows up."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import sparsec
from sparsec import reference
from sparsec.formats import convert

from conftest import SPECS, check, dense, make_matrix, seed_of, spec_case_params

FEATS = (1, 7, 16, 33)
TOL = {"float32": 1e-5, "float64": 1e-12}

_KERNELS: dict = {}


def kernel(op: str, A, feat: int):
    """One compiled kernel per (op, format, feat, dtype) for the whole module; an ELL
    instance's format carries its width, so ELL kernels are shared between equal widths."""
    key = (op, A.format.spec, feat, A.dtype.name)
    if key not in _KERNELS:
        _KERNELS[key] = sparsec.compile(op, A, feat=feat, target="llvm")
    return _KERNELS[key]


def run_op(op, A, feat, rng, dtype=np.float32, **kw):
    rows, cols = A.shape
    if op == "spmm":
        B = dense(rng, (cols, feat), dtype)
        return kernel(op, A, feat)(A, B, poison=True, **kw), reference.spmm(A, B)
    X, Y = dense(rng, (rows, feat), dtype), dense(rng, (cols, feat), dtype)
    return kernel(op, A, feat)(A, X, Y, poison=True, **kw), reference.sddmm(A, X, Y)


# ---------------------------------------------------------------- every op x format x matrix x feat


@pytest.mark.parametrize("feat", FEATS, ids=lambda f: f"feat{f}")
@pytest.mark.parametrize("spec, case", spec_case_params())
@pytest.mark.parametrize("op", ["spmm", "sddmm"])
def test_op_matches_reference(op, spec, case, feat):
    m = make_matrix(*case, seed=seed_of(op, spec, case, feat))
    A = convert(m, spec)
    rng = np.random.default_rng(seed_of("dense", op, spec, case, feat))
    out, ref = run_op(op, A, feat, rng)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    check(out, ref, TOL["float32"])
    if op == "sddmm":
        assert out.shape == (A.stored,)
        # padding slots (ELL's -1, BSR's slots past the edge) are written with 0
        assert np.all(out[~A.valid_slots()] == 0)


def test_sddmm_maps_back_to_scipy():
    """to_scipy(values) puts each SDDMM value at its coordinate: A .* (X @ Y.T)."""
    m = make_matrix("uniform", 37, 53, seed=11)
    rng = np.random.default_rng(12)
    for spec in SPECS:
        A = convert(m, spec)
        X, Y = dense(rng, (37, 7)), dense(rng, (53, 7))
        out = kernel("sddmm", A, 7)(A, X, Y, poison=True)
        want = m.astype(np.float64).multiply(X.astype(np.float64) @ Y.astype(np.float64).T).toarray()
        check(A.to_scipy(out).toarray(), want, 1e-5)


# ---------------------------------------------------------------- float64


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("op", ["spmm", "sddmm"])
def test_float64(op, spec):
    m = make_matrix("empty_rows", 101, 67, seed=seed_of("f64", op, spec), dtype=np.float64)
    A = convert(m, spec)
    assert A.dtype == np.float64
    out, ref = run_op(op, A, 7, np.random.default_rng(seed_of("f64d", op, spec)), dtype=np.float64)
    assert out.dtype == np.float64
    check(out, ref, TOL["float64"])


# ---------------------------------------------------------------- torch tensors


@pytest.mark.parametrize("spec", ["csr", "bsr:3x5", "ell"])
def test_torch_spmm_in_and_out(spec):
    torch = pytest.importorskip("torch")
    m = make_matrix("powerlaw", 129, 250, seed=seed_of("torch", spec))
    A = convert(m, spec)
    B = torch.randn(250, 16, dtype=torch.float32, generator=torch.Generator().manual_seed(3))
    k = kernel("spmm", A, 16)
    C = k(A, B, poison=True)
    assert isinstance(C, torch.Tensor) and C.dtype == torch.float32 and tuple(C.shape) == (129, 16)
    check(C.numpy(), reference.spmm(A, B.numpy()))

    out = torch.full((129, 16), float("nan"))
    ptr = out.data_ptr()
    res = k(A, B, out=out)
    assert res is out and out.data_ptr() == ptr, "out= should be written in place and returned"
    check(out.numpy(), reference.spmm(A, B.numpy()))


@pytest.mark.parametrize("spec", ["csr", "bsr:2x2", "ell"])
def test_torch_sddmm_in_and_out(spec):
    torch = pytest.importorskip("torch")
    m = make_matrix("uniform", 37, 53, seed=seed_of("torch-sddmm", spec))
    A = convert(m, spec)
    g = torch.Generator().manual_seed(4)
    X, Y = torch.randn(37, 33, generator=g), torch.randn(53, 33, generator=g)
    k = kernel("sddmm", A, 33)
    got = k(A, X, Y, poison=True)
    assert isinstance(got, torch.Tensor) and tuple(got.shape) == (A.stored,)
    ref = reference.sddmm(A, X.numpy(), Y.numpy())
    check(got.numpy(), ref)

    out = torch.full((A.stored,), float("nan"))
    res = k(A, X, Y, out=out)
    assert res is out
    check(out.numpy(), ref)


def test_numpy_out_written_in_place():
    m = make_matrix("uniform", 37, 53, seed=21)
    A = convert(m, "bsr:4x4")
    B = dense(np.random.default_rng(22), (53, 16))
    out = np.full((37, 16), np.nan, dtype=np.float32)
    res = kernel("spmm", A, 16)(A, B, out=out)
    assert res is out
    check(out, reference.spmm(A, B))


def test_torch_non_contiguous_input():
    """A transposed (non-contiguous) torch operand is accepted and read by coordinates."""
    torch = pytest.importorskip("torch")
    m = make_matrix("uniform", 37, 53, seed=23)
    A = convert(m, "csr")
    Bt = torch.randn(16, 53, generator=torch.Generator().manual_seed(5))
    B = Bt.t()
    assert not B.is_contiguous()
    C = kernel("spmm", A, 16)(A, B, poison=True)
    check(C.numpy(), reference.spmm(A, B.contiguous().numpy()))


# ---------------------------------------------------------------- NaN / Inf in the sparse values


def _with_specials(m: sp.csr_matrix, seed: int, nan=True, inf=True) -> sp.csr_matrix:
    """``m`` with two NaN, two +Inf and two -Inf stored values (those asked for)."""
    m = m.copy()
    rng = np.random.default_rng(seed)
    slots = rng.choice(m.nnz, size=6, replace=False)
    if nan:
        m.data[slots[:2]] = np.nan
    if inf:
        m.data[slots[2:4]] = np.inf
        m.data[slots[4:]] = -np.inf
    return m


def _same_specials(got, want):
    """NaN exactly where ``want`` has NaN, the same infinities, finite values close."""
    got = np.asarray(got, dtype=np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg="NaN positions differ from scipy")
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want), err_msg="+Inf positions differ from scipy")
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want), err_msg="-Inf positions differ from scipy")
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("spec", SPECS)
def test_nan_inf_propagate_spmm(spec):
    m = _with_specials(make_matrix("uniform", 37, 53, seed=31), seed=32)
    A = convert(m, spec)
    B = dense(np.random.default_rng(33), (53, 7))
    out = kernel("spmm", A, 7)(A, B, poison=True)
    want = m.astype(np.float64) @ B.astype(np.float64)  # scipy's result
    assert np.isnan(want).any() and np.isinf(want).any()  # the case is meaningful
    _same_specials(out, want)


def _sddmm_vs_scipy(spec, nan, inf):
    m = _with_specials(make_matrix("uniform", 37, 53, seed=34), seed=35, nan=nan, inf=inf)
    A = convert(m, spec)
    rng = np.random.default_rng(36)
    X, Y = dense(rng, (37, 7)), dense(rng, (53, 7))
    out = kernel("sddmm", A, 7)(A, X, Y, poison=True)
    # scipy: A .* (X @ Y) over A's stored entries, read at every stored slot's coordinate
    want = m.astype(np.float64).multiply(X.astype(np.float64) @ Y.astype(np.float64).T).tocsr()
    rows, cols = A.stored_coords()
    ok = rows >= 0
    want_at = np.asarray(want[rows[ok], cols[ok]]).ravel()
    assert (np.isnan(want_at).any() if nan else True) and (np.isinf(want_at).any() if inf else True)
    _same_specials(out[ok], want_at)
    assert np.all(out[~ok] == 0)


@pytest.mark.parametrize("spec", SPECS)
def test_nan_propagates_sddmm(spec):
    _sddmm_vs_scipy(spec, nan=True, inf=False)


@pytest.mark.parametrize("spec", SPECS)
def test_inf_propagates_sddmm(spec):
    _sddmm_vs_scipy(spec, nan=False, inf=True)


def test_inf_sddmm_matches_library_reference():
    """Infinite stored values give +-Inf like the float64 reference (A[i,j] * dot), not the NaN
    that folding A into each term of the dot product would give."""
    m = _with_specials(make_matrix("uniform", 37, 53, seed=34), seed=35, nan=False, inf=True)
    A = convert(m, "csr")
    rng = np.random.default_rng(36)
    X, Y = dense(rng, (37, 7)), dense(rng, (53, 7))
    out = kernel("sddmm", A, 7)(A, X, Y, poison=True)
    check(out, reference.sddmm(A, X, Y))
