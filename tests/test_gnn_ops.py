"""The multi-head and graph-attention library operators (``ops.multihead_spmm``,
``multihead_sddmm``, ``gat``, ``edge_softmax``, GAT's backward operators ``gat_grad_rows`` and
``gat_grad_cols``): each against an independent float64 numpy
reference written here from its definition (and ``reference.evaluate``), on llvm, on several
format families, NaN-poisoned outputs, a matrix with an empty row, a long row and an explicit
zero, logits large enough to overflow exp without the max subtracted; the CUDA code each
generates for sm_90a (nvcc builds it; GAT's launches and thread mapping)."""
from __future__ import annotations

import re

import numpy as np
import pytest
import scipy.sparse as sp

import sparsec
from sparsec import ops
from sparsec.formats import convert
from sparsec.reference import evaluate, max_rel_err

from edge_ops import edge_matrix

H, F = 2, 4
PARAMS = dict(heads=H, feat=F)
FORMATS = ("csr", "bsr:2x2", "ell", "hyb:1:1/2/4")
TOL = 1e-5


def _entries(A):
    """(row, col, value) of each logical entry in canonical CSR order, float64."""
    m = A.to_scipy()
    return np.repeat(np.arange(m.shape[0]), np.diff(m.indptr)), m.indices.astype(np.int64), m.data.astype(np.float64)


def _alpha(A, el, er, slope):
    """softmax_j(leaky_relu(el[i] + er[j])) per entry and head, by an explicit loop over rows."""
    r, c, _ = _entries(A)
    e = el[r] + er[c]
    e = np.where(e > 0, e, slope * e)
    out = np.zeros_like(e)
    for i in np.unique(r):
        at = r == i
        w = np.exp(e[at] - e[at].max(axis=0))
        out[at] = w / w.sum(axis=0)
    return out


def ref_gat(A, el, er, Z, slope=ops.GAT_SLOPE):
    r, c, _ = _entries(A)
    out = np.zeros((A.shape[0],) + Z.shape[1:])
    np.add.at(out, r, _alpha(A, el, er, slope)[:, :, None] * Z[c])
    return out


def ref_multihead_spmm(A, P, B):
    r, c, _ = _entries(A)
    out = np.zeros((A.shape[0],) + B.shape[1:])
    np.add.at(out, r, P[:, :, None] * B[c])
    return out


def ref_multihead_sddmm(A, X, Y):
    r, c, v = _entries(A)
    return v[:, None] * np.einsum("ehk,ehk->eh", X[r], Y[c])


def _inputs(A, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    n, m = A.shape
    f32 = lambda *s: (scale * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
    return f32(n, H), f32(m, H), f32(m, H, F), f32(n, H, F), f32(A.to_scipy().nnz, H)


@pytest.mark.parametrize("spec", FORMATS)
def test_gnn_operators_match_their_definitions(spec):
    A = convert(edge_matrix(), spec)
    el, er, Z, X, P = (x.astype(np.float64) for x in _inputs(A))
    el32, er32, Z32, X32, P32 = _inputs(A)
    big_el, big_er = (x * 60 for x in (el32, er32))  # logits past exp's float32 range
    gat_k = sparsec.compile(ops.gat(), A, **PARAMS)
    for a, b in ((el32, er32), (big_el, big_er)):
        out = gat_k(A, a, b, Z32, poison=True)
        want = ref_gat(A, a.astype(np.float64), b.astype(np.float64), Z)
        assert max_rel_err(out, want) < TOL
        assert (out[3] == 0).all()  # the empty row
    assert max_rel_err(evaluate(ops.gat(), A, el32, er32, Z32, params=PARAMS), ref_gat(A, el, er, Z)) < 1e-12
    out = sparsec.compile(ops.multihead_spmm(), A, **PARAMS)(A, P32, Z32, poison=True)
    assert max_rel_err(out, ref_multihead_spmm(A, P, Z)) < TOL
    out = sparsec.compile(ops.multihead_sddmm(), A, **PARAMS)(A, X32, Z32, poison=True)
    assert out.shape == (A.stored, H)
    assert max_rel_err(A.coordinate_values(out), ref_multihead_sddmm(A, X, Z)) < TOL
    assert not out[~A.valid_slots()].any()  # padding slots hold 0
    alpha = sparsec.compile(ops.edge_softmax(), A, heads=H)(A, el32, er32, poison=True)
    assert max_rel_err(A.coordinate_values(alpha), _alpha(A, el, er, ops.GAT_SLOPE)) < TOL


def ref_gat_backward(A, el, er, Z, dO, slope=ops.GAT_SLOPE):
    """(mx, s, d_el, d_er, dZ) of GAT by the textbook softmax backward pass, per entry:
    de = alpha * (dalpha - sum_j alpha dalpha) * leaky_relu'(el[i] + er[j]), dalpha = dO[i] . Z[j]."""
    r, c, _ = _entries(A)
    n, m = A.shape
    x = el[r] + er[c]
    e = np.where(x > 0, x, slope * x)
    mx = np.full((n, H), -np.inf)
    np.maximum.at(mx, r, e)
    s = np.zeros((n, H))
    np.add.at(s, r, np.exp(e - mx[r]))
    alpha = _alpha(A, el, er, slope)
    dalpha = np.einsum("ehf,ehf->eh", dO[r], Z[c])
    row_dot = np.zeros((n, H))
    np.add.at(row_dot, r, alpha * dalpha)
    de = alpha * (dalpha - row_dot[r]) * np.where(x > 0, 1.0, slope)
    d_el, d_er, dZ = np.zeros((n, H)), np.zeros((m, H)), np.zeros((m, H, F))
    np.add.at(d_el, r, de)
    np.add.at(d_er, c, de)
    np.add.at(dZ, c, alpha[:, :, None] * dO[r])
    return mx, s, d_el, d_er, dZ


def _backward_matrix() -> sp.csr_matrix:
    """edge_matrix (an empty row, a long row, an explicit zero) with an empty last column: a row
    of A's transpose without entries too."""
    m = edge_matrix()
    out = sp.hstack([m, sp.csr_matrix((m.shape[0], 1), dtype=m.dtype)]).tocsr()
    out.sort_indices()
    return out


@pytest.mark.parametrize("spec", ("csr", "hyb:1:1/2/4"))  # hyb: the long row split, pieces added atomically
def test_gat_backward_operators_match_their_definitions(spec):
    m = _backward_matrix()
    A, At = convert(m, spec), convert(m.T.tocsr(), spec)
    rng = np.random.default_rng(4)
    el, er, Z, dO = (rng.standard_normal(shape).astype(np.float32)
                     for shape in ((9, H), (8, H), (8, H, F), (9, H, F)))
    el, er = el * 3, er * 3  # rows whose logits take both signs (one sign: d_el is 0 up to rounding)
    mx_r, s_r, d_el_r, d_er_r, dZ_r = ref_gat_backward(A, *(x.astype(np.float64) for x in (el, er, Z, dO)))
    O, mx, s = sparsec.compile(ops.gat(stats=True), A, **PARAMS)(A, el, er, Z, poison=True)
    assert max_rel_err(O, ref_gat(A, *(x.astype(np.float64) for x in (el, er, Z)))) < TOL
    full = np.isfinite(mx_r)
    assert max_rel_err(mx[full], mx_r[full]) < TOL and max_rel_err(s, s_r) < TOL
    assert (s[3] == 0).all()  # the empty row
    with np.errstate(divide="ignore"):
        lse = mx + np.log(s)  # what sparsec.torch_gnn passes
    args = (el, er, lse, Z, O, dO)
    d_el = sparsec.compile(ops.gat_grad_rows(), A, **PARAMS)(A, *args, poison=True)
    dZ, d_er = sparsec.compile(ops.gat_grad_cols(), At, **PARAMS)(At, *args, poison=True)
    assert max_rel_err(d_el, d_el_r) < TOL and max_rel_err(d_er, d_er_r) < TOL and max_rel_err(dZ, dZ_r) < TOL
    assert (d_el[3] == 0).all() and (dZ[7] == 0).all() and (d_er[7] == 0).all()  # rows without entries
    assert max_rel_err(evaluate(ops.gat_grad_rows(), A, *args, params=PARAMS), d_el_r) < TOL
    for got, want in zip(evaluate(ops.gat_grad_cols(), At, *args, params=PARAMS), (dZ_r, d_er_r)):
        assert max_rel_err(got, want) < TOL


def test_gat_slope_is_compile_time_and_checked():
    A = convert(edge_matrix(), "csr")
    el, er, Z, _, _ = _inputs(A, seed=1)
    op = ops.gat(0.05)
    assert op.name != ops.gat().name  # kernels are cached by name
    out = sparsec.compile(op, A, **PARAMS)(A, el, er, Z, poison=True)
    assert max_rel_err(out, ref_gat(A, *(x.astype(np.float64) for x in (el, er, Z)), slope=0.05)) < TOL
    with pytest.raises(ValueError, match=r"negative_slope should be in \[0, 1\]"):
        ops.gat(-0.5)


def test_gnn_operators_build_for_cuda_with_heads_and_features_over_threads():
    from nvcc_tools import nvcc_sources

    sources = {}
    for name, fn, params in (("gat", ops.gat, PARAMS), ("edge_softmax", ops.edge_softmax, dict(heads=H)),
                             ("multihead_spmm", ops.multihead_spmm, dict(heads=4, feat=16)),
                             ("multihead_sddmm", ops.multihead_sddmm, dict(heads=4, feat=16))):
        k = sparsec.compile(fn(), "csr", target="cuda:sm_90a", **params)
        sources[(name, "sm_90a")] = k.source()
    gat4 = sparsec.compile(ops.gat(), "csr", target="cuda:sm_90a", heads=4, feat=16).source()
    kernels = sorted(set(re.findall(r"__global__ void __launch_bounds__\(\d+\) (\w+)\(", gat4)))
    assert len(kernels) == 3  # row max, row sum, aggregation: three launches on CSR
    agg = gat4[gat4.rindex(kernels[-1] + "("):]
    # a row's 4 heads x 16 features over 16 threads: a float4 of Z each, its head threadIdx.x / 4
    assert "float4" in agg and "((int)threadIdx.x) >> 2" in agg and "((int)threadIdx.x) * 4" in agg
    sources[("gat_hyb", "sm_90a")] = sparsec.compile(ops.gat(), "hyb:1:1/2/4", target="cuda:sm_90a",
                                                     **PARAMS).source()
    # GAT's training operators: the forward pass with its statistics, the two backward ones;
    # launches per format (hyb: a zero-fill before each reduction whose split rows add atomically)
    launches = {"csr": (3, 2, 3), "hyb:1:1/2/4": (6, 3, 5)}
    for spec, want in launches.items():
        for op, n in zip((ops.gat(stats=True), ops.gat_grad_rows(), ops.gat_grad_cols()), want):
            src = sparsec.compile(op, spec, target="cuda:sm_90a", heads=4, feat=16).source()
            assert len(set(re.findall(r"__global__ void __launch_bounds__\(\d+\) (\w+)\(", src))) == n, (spec, op.name)
            assert ("atomicAdd" in src) == spec.startswith("hyb"), (spec, op.name)
            sources[(op.name, spec, "sm_90a")] = src
    for key, (ok, output) in nvcc_sources(sources).items():
        assert ok, f"{key}: {output[-2000:]}"
