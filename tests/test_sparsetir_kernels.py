"""SparseTIR's 19 test kernels (tests/sparsetir_ops.py) on llvm, each against its own float64
numpy/scipy reference on NaN-poisoned outputs, on a few format families chosen per kernel
(the GPU host runs every family: benchmarks/check_sparsetir_kernels.py); and each kernel's
CUDA source for sm_90a, compiled by nvcc.

The base matrix has empty rows, a long row, odd sizes and explicit zeros (CSF tensors, ragged
tensors and batches are derived from it). Kernels that need a DSL feature being added (edge
data, lookups, reductions over the row axis: ``SparseTIRKernel.needs``) are
``xfail(strict=True)``: they flip to failures, to be unmarked, when the feature lands."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import sparsec
from nvcc_tools import nvcc_sources
from sparsetir_ops import KERNELS, Problem, check, edge_case_matrix, instance

FEAT = 7  # odd: no vector width divides it
# per kernel, the families run here: csr plus the ones whose lowering differs most for it
# (padding inside blocks, padded ELL slots, split rows / column ranges of hyb, pruned N:M)
LLVM_FAMILIES = {
    "csrmm": ("csr", "bsr:3x5", "hyb:2:1/2/4", "nm:2:4"),
    "csrmm_dense_iter": ("csr", "bsr:3x5", "ell"),
    "segment_reduce": ("csr", "bsr:2x2", "ell"),
    "csr_reduce": ("csr", "hyb:1:1/2/4"),
    "bsrmm": ("bsr:2x2", "bsr+csr:4x4,0.3"),
    "ellmm": ("ell", "hyb:1:1/2/4"),
    "csr_element_wise": ("csr", "bsr:4x4", "ell"),
    "hyper_gnn": ("csr", "bsr:2x2"),
    "bmm": ("csr", "bsr:4x4"),
    "sddmm": ("csr", "bsr:2x2", "nm:2:4"),
    "fused_sddmm": ("csr", "hyb:2:1/2/4"),
    "square_sum": ("csr", "ell"),
    "square_sum_two_K": ("csr",),
    "fused_reduction_4d_2d": ("csr", "bsr:2x2"),
    "fused_reduction_4d_3d": ("csr", "hyb:1:1/2/4"),
    "rgcn_homo_forward": ("csr", "bsr:2x2"),
    "rgcn_hetero_forward": ("csr",),
    "sparse_softmax": ("csr", "bsr:3x5", "hyb:2:1/2/4"),
    "csr2bsr": ("bsr:2x2", "bsr:3x5"),
}


def _mark(name: str):
    needs = KERNELS[name].needs
    return [pytest.mark.xfail(strict=True, reason=f"needs {needs}")] if needs else []


CASES = [pytest.param(name, fam, id=f"{name}-{fam}", marks=_mark(name))
         for name, fams in LLVM_FAMILIES.items() for fam in fams]


def base_matrix(seed: int) -> sp.csr_matrix:
    return edge_case_matrix(37, 53, 0.08, seed)


def test_every_kernel_runs_here():
    assert set(LLVM_FAMILIES) == set(KERNELS) and len(KERNELS) == 19
    for name, fams in LLVM_FAMILIES.items():
        assert set(fams) <= set(KERNELS[name].families), name


@pytest.mark.parametrize("name, family", CASES)
def test_kernel_matches_float64_reference(name, family):
    k = KERNELS[name]
    p = k.inputs(np.random.default_rng(len(name) + len(family)), base_matrix(1), feat=FEAT)
    A, p = instance(p, family)
    kern = sparsec.compile(k.build(), A, target="llvm", **p.params)
    out = kern(A, *p.dense, poison=True)
    res = check(k, p, A, out)
    assert res["ok"], f"{name} on {family}: {res['why']}"


def test_inputs_have_the_edge_cases():
    """The base matrix: empty rows, a long row, explicit zeros, odd sizes; the derived
    structures keep empty rows (an empty segment, fibre or batch element)."""
    m = base_matrix(1)
    lengths = np.diff(m.indptr)
    assert m.shape == (37, 53) and (lengths == 0).sum() >= 2 and lengths.max() >= 26
    assert (m.data == 0).sum() >= 2 and m.has_canonical_format
    for name in ("square_sum", "fused_reduction_4d_2d", "fused_reduction_4d_3d", "bmm"):
        p = KERNELS[name].inputs(np.random.default_rng(0), m)
        assert (np.diff(p.matrix.indptr) == 0).any(), name
        assert p.matrix.has_canonical_format, name


def test_check_catches_wrong_outputs():
    """The comparison can fail: a perturbed dense output, a perturbed or shifted sparse output,
    a padding slot that is not 0, an unwritten (NaN) element."""
    m = base_matrix(2)
    spmm, ew = KERNELS["csrmm"], KERNELS["csr_element_wise"]
    p = spmm.inputs(np.random.default_rng(0), m, feat=FEAT)
    A, _ = instance(p, "csr")
    good = spmm.reference(p).astype(np.float32)
    assert check(spmm, p, A, good)["ok"]
    bad = good.copy()
    bad[7, 0] += 1e-2 * np.abs(good).max()
    assert not check(spmm, p, A, bad)["ok"]
    bad[7, 0] = np.nan
    assert not check(spmm, p, A, bad)["ok"]
    q = ew.inputs(np.random.default_rng(0), m)
    B, _ = instance(q, "bsr:2x2")
    slots = np.zeros(B.stored, np.float32)
    rows, cols = B.stored_coords()
    ok = rows >= 0
    ref = ew.reference(q)
    slots[ok] = np.asarray(ref[rows[ok], cols[ok]]).ravel()
    assert check(ew, q, B, slots)["ok"]
    padded = slots.copy()
    padded[np.flatnonzero(~ok)[0]] = 1.0
    assert "padding" in check(ew, q, B, padded)["why"]
    wrong = slots.copy()
    wrong[np.flatnonzero(ok & (slots != 0))[0]] *= 2
    assert not check(ew, q, B, wrong)["ok"]


def test_same_semantics_same_values():
    """csrmm, bsrmm and ellmm are C = A B in three storages; sddmm and fused_sddmm one SDDMM:
    each pair gives the same values on one matrix."""
    m = base_matrix(3)
    B = np.random.default_rng(0).standard_normal((m.shape[1], FEAT)).astype(np.float32)
    outs = []
    for name, fam in (("csrmm", "csr"), ("bsrmm", "bsr:2x2"), ("ellmm", "ell")):
        A, _ = instance(Problem(m, (B,), {"feat": FEAT}), fam)
        outs.append(sparsec.compile(KERNELS[name].build(), A, target="llvm", feat=FEAT)(A, B, poison=True))
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outs[2], outs[0], rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- CUDA: source + nvcc, csr

CUDA_CASES = [pytest.param(name, id=name, marks=_mark(name)) for name in KERNELS]


@pytest.fixture(scope="module")
def cuda_sources():
    """{name: CUDA source for sm_90a} of every kernel that builds (xfail ones are absent)."""
    out = {}
    for name, k in KERNELS.items():
        if k.needs:
            continue
        p = k.inputs(np.random.default_rng(0), base_matrix(1), feat=16)
        out[name] = sparsec.compile(k.build(), "csr", target="cuda:sm_90a", **p.params).source()
    return out


@pytest.fixture(scope="module")
def cuda_compiled(cuda_sources):
    return nvcc_sources({(name, "sm_90a"): src for name, src in cuda_sources.items()})


@pytest.mark.parametrize("name", CUDA_CASES)
def test_cuda_source_compiles_with_nvcc(name, cuda_compiled, cuda_sources):
    k = KERNELS[name]
    if k.needs:  # built here, so that the xfail flips when the feature lands
        p = k.inputs(np.random.default_rng(0), base_matrix(1), feat=16)
        src = sparsec.compile(k.build(), "csr", target="cuda:sm_90a", **p.params).source()
        ok, log = nvcc_sources({(name, "sm_90a"): src})[(name, "sm_90a")]
    else:
        src = cuda_sources[name]
        ok, log = cuda_compiled[(name, "sm_90a")]
    assert "__global__" in src and "threadIdx.x" in src
    assert ok, f"nvcc failed for {name}:\n{log[:2000]}"


def test_pending_kernels_inputs_and_references():
    """The kernels waiting for a feature have their inputs and references checked now: each
    reference against the operator's formula evaluated entry by entry on the problem it gets
    (the stacked relations of rgcn_hetero, the CSR value order of csr2bsr, ...)."""
    m = base_matrix(4)
    rng = np.random.default_rng(5)
    rows = np.repeat(np.arange(m.shape[0]), np.diff(m.indptr))

    p = KERNELS["csrmm_dense_iter"].inputs(rng, m, feat=FEAT)
    np.testing.assert_allclose(KERNELS["csrmm_dense_iter"].reference(p), m.toarray().astype(float) @ p.dense[0],
                               rtol=1e-12, atol=1e-12)

    p = KERNELS["hyper_gnn"].inputs(rng, m, feat=FEAT)
    X = p.dense[0].astype(float)
    want = np.zeros((m.shape[0], FEAT))
    for i, j in zip(rows, m.indices):  # Y[i] += sum over the rows i2 incident to column j
        want[i] += X[rows[m.indices == j]].sum(axis=0)
    np.testing.assert_allclose(KERNELS["hyper_gnn"].reference(p), want, rtol=1e-12, atol=1e-12)

    for name in ("rgcn_homo_forward", "rgcn_hetero_forward"):
        k = KERNELS[name]
        p = k.inputs(rng, m, feat=FEAT, rel=3)
        E, W, X = p.dense
        pm = p.matrix
        weights = pm.data.astype(float) if name == "rgcn_hetero_forward" else np.ones(pm.nnz)
        want = np.zeros((pm.shape[0], FEAT))
        for e, (i, c) in enumerate(zip(np.repeat(np.arange(pm.shape[0]), np.diff(pm.indptr)), pm.indices)):
            want[i] += weights[e] * (W[E[e]].astype(float) @ X[c].astype(float))
        np.testing.assert_allclose(k.reference(p), want, rtol=1e-10, atol=1e-10, err_msg=name)
        assert E.dtype == np.int32 and E.size == pm.nnz and E.min() >= 0 and E.max() < 3

    from sparsec import formats

    k = KERNELS["csr2bsr"]
    p = k.inputs(rng, m)
    for fam in ("bsr:2x2", "bsr:3x5"):
        A, _ = instance(p, fam)
        held = formats.convert(sp.csr_matrix((p.dense[0], m.indices, m.indptr), shape=m.shape), fam)
        assert np.array_equal(held.arrays["indices"], A.arrays["indices"])
        np.testing.assert_array_equal(k.layout_reference(p, A), held.data.astype(float))
        assert not np.array_equal(p.dense[0], m.data)  # V is not A: copying A would fail
