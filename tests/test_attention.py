"""The ``attention`` library operator (SDDMM -> softmax -> SpMM in one call) and the
Longformer masks it runs on: float64 checks against dense masked softmax attention,
the CUDA lowering (compiled, not run), and the errors for operands that do not fit."""
from __future__ import annotations

import re

import numpy as np
import pytest
import scipy.sparse as sp

import sparsec
from sparsec import masks, reference
from sparsec.formats import convert

from conftest import check, seed_of

_KERNELS: dict = {}


def kernel(spec: str, feat: int, A=None):
    """The llvm attention kernel for a format and head dim, compiled once per test session."""
    key = (spec, feat)
    if key not in _KERNELS:
        _KERNELS[key] = sparsec.compile("attention", A if A is not None else spec, feat=feat, target="llvm")
    return _KERNELS[key]


def dense_pattern(length, window, global_tokens):
    """One head's mask, built the obvious way: |i - j| <= window, or i or j global."""
    i = np.arange(length)
    return (np.abs(i[:, None] - i[None, :]) <= window) | (i[:, None] < global_tokens) | (i[None, :] < global_tokens)


def masked_attention(Q, K, V, mask, scale):
    """float64 dense softmax(scale * Q K^T, masked) V, one row per query; 0 where a row attends nothing."""
    Q, K, V = (np.asarray(x, np.float64) for x in (Q, K, V))
    scores = np.where(mask, scale * (Q @ K.T), -np.inf)
    mx = scores.max(axis=1, keepdims=True)
    e = np.where(mask, np.exp(scores - np.where(np.isfinite(mx), mx, 0)), 0.0)
    sums = e.sum(axis=1, keepdims=True)
    return (e / np.where(sums > 0, sums, 1)) @ V


def inputs(rows, d, seed, spread=1.0):
    rng = np.random.default_rng(seed)
    return tuple((spread * rng.standard_normal((rows, d))).astype(np.float32) for _ in range(3))


# (length, window, global tokens, heads, head dim): odd lengths and dims that are no multiple
# of any tile, the diagonal alone, no global token, one, every position global, several heads
CASES = (
    (37, 3, 2, 1, 8),
    (50, 0, 0, 1, 8),
    (64, 4, 0, 2, 8),
    (33, 2, 1, 3, 8),
    (29, 40, 3, 2, 5),
    (41, 1, 41, 1, 5),
)


@pytest.mark.parametrize("length, window, g, heads, d", CASES,
                         ids=[f"L{c[0]}-w{c[1]}-g{c[2]}-h{c[3]}-d{c[4]}" for c in CASES])
def test_matches_dense_masked_attention(length, window, g, heads, d):
    m = masks.longformer(length, window, g, heads, value=1 / np.sqrt(d))
    scale = float(m.data[0])  # 1/sqrt(d) as the float32 mask holds it
    A = convert(m, "csr")
    Q, K, V = inputs(heads * length, d, seed_of("attention", length, window, g, heads, d))
    out = kernel("csr", d)(A, Q, K, V, poison=True)
    assert out.shape == (heads * length, d)
    pattern = dense_pattern(length, window, g)
    want = np.concatenate([masked_attention(Q[h * length:(h + 1) * length], K[h * length:(h + 1) * length],
                                            V[h * length:(h + 1) * length], pattern, scale) for h in range(heads)])
    check(out, want, 1e-5)
    check(reference.attention(A, Q, K, V), want, 1e-12)  # the library's reference (sparsec run --check) agrees


def test_large_scores_do_not_overflow():
    """Scores in the hundreds: exp would overflow float32 without the row max subtracted."""
    m = masks.longformer(40, 5, 2, 1, value=1.0)
    A = convert(m, "csr")
    Q, K, V = inputs(40, 8, seed=11, spread=8.0)
    want = masked_attention(Q, K, V, dense_pattern(40, 5, 2), 1.0)
    assert np.abs(np.asarray(Q, np.float64) @ K.T).max() > 200
    check(kernel("csr", 8)(A, Q, K, V, poison=True), want, 1e-5)


@pytest.mark.parametrize("spec", ["csr", "ell"])
def test_any_mask_with_empty_rows(spec):
    """An arbitrary pattern with per-entry scales and rows that attend nothing (their output
    is 0); ELL pads short rows, and padding slots must not take part in the softmax."""
    rng = np.random.default_rng(5)
    m = sp.random(45, 45, density=0.2, format="csr", random_state=rng, dtype=np.float64)
    m.data[:] = rng.uniform(0.1, 1.0, m.nnz)
    m = sp.csr_matrix(sp.diags((rng.random(45) > 0.2).astype(float)) @ m)
    m.eliminate_zeros()
    empty = np.diff(m.indptr) == 0
    assert empty.any() and not empty.all()
    A = convert(m.astype(np.float32), spec)
    Q, K, V = inputs(45, 6, seed=6)
    dense = m.toarray()
    want = np.zeros((45, 6))
    for i in np.flatnonzero(~empty):  # row by row: each entry has its own scale
        want[i] = _row_attention(Q[i], K, V, dense[i])
    out = kernel(A.format.spec, 6, A)(A, Q, K, V, poison=True)
    check(out, want, 1e-5)
    assert np.all(out[empty] == 0)


def _row_attention(q, K, V, row):
    """float64 attention of one query over the keys its mask row stores, scaled by the row's values."""
    keys = np.flatnonzero(row)
    s = row[keys] * (K[keys].astype(np.float64) @ q.astype(np.float64))
    p = np.exp(s - s.max())
    return (p / p.sum()) @ V[keys].astype(np.float64)


# ---------------------------------------------------------------- masks


@pytest.mark.parametrize("layout", masks.LAYOUTS)
@pytest.mark.parametrize("length, window, g, heads", [(37, 3, 2, 1), (10, 0, 0, 2), (9, 20, 9, 3), (33, 2, 1, 2)])
def test_longformer_mask(length, window, g, heads, layout):
    m = masks.longformer(length, window, g, heads, value=0.25, layout=layout)
    one, eye = dense_pattern(length, window, g), np.eye(heads, dtype=bool)
    # head-major: row h * L + i (block-diagonal); interleaved: row i * heads + h
    want = np.kron(eye, one) if layout == "head-major" else np.kron(one, eye)
    assert m.shape == (heads * length,) * 2
    assert np.array_equal(m.toarray() != 0, want)
    assert m.has_sorted_indices and m.dtype == np.float32 and np.all(m.data == 0.25)
    assert m.indices.dtype == np.int32 and m.indptr.dtype == np.int32


@pytest.mark.parametrize("kw, msg", [
    (dict(length=0, window=1), r"length should be an int >= 1, got 0"),
    (dict(length=8, window=-1), r"window should be an int >= 0, got -1"),
    (dict(length=8, window=1, global_tokens=9), r"global_tokens should be at most length \(8\), got 9"),
    (dict(length=8, window=1, heads=0), r"heads should be an int >= 1, got 0"),
    (dict(length=8, window=1.5), r"window should be an int >= 0, got 1.5"),
    (dict(length=8, window=1, value=float("nan")), r"value should be finite"),
])
def test_longformer_mask_errors(kw, msg):
    with pytest.raises(ValueError, match=msg):
        masks.longformer(**kw)


def test_fold_heads_errors():
    with pytest.raises(ValueError, match=r"mask should be square .* got \(3, 4\)"):
        masks.fold_heads(sp.csr_matrix((3, 4)), 2)
    with pytest.raises(ValueError, match=r"layout should be one of \('head-major', 'interleaved'\), got 'rows'"):
        masks.fold_heads(sp.identity(3, format="csr"), 2, "rows")


def test_interleaved_heads_give_the_same_attention():
    """The interleaved layout is a row and column permutation of the block-diagonal one: the
    same attention, with Q, K, V and O in (L, heads, d) order."""
    length, heads, d = 31, 3, 8
    Q, K, V = inputs(heads * length, d, seed=9)
    to_interleaved = np.arange(heads * length).reshape(heads, length).T.ravel()  # new row r holds old row
    outs = {}
    for layout in masks.LAYOUTS:
        A = convert(masks.longformer(length, 4, 2, heads, value=0.25, layout=layout), "csr")
        ins = (Q, K, V) if layout == "head-major" else tuple(x[to_interleaved] for x in (Q, K, V))
        outs[layout] = kernel("csr", d)(A, *ins, poison=True)
    check(outs["interleaved"], outs["head-major"][to_interleaved], 1e-6)


# ---------------------------------------------------------------- CUDA lowering (compiled, not run)


def test_cuda_lowering_is_four_kernels_on_the_mask():
    """One PrimFunc, four kernels launched back to back: SDDMM with the scale fused, row max,
    row sum of exp, SpMM with the probabilities made on the fly. The scores are a temp of one
    value per stored slot; no buffer is rows x cols."""
    k = sparsec.compile("attention", "csr", feat=64, target="cuda:sm_90a")
    src = k.source()
    kernels = re.findall(r'__global__ void __launch_bounds__\(\d+\) (\w+)\(([^)]*)\)\s*\{', src)
    assert [name for name, _ in kernels] == ["attention_kernel", "attention_kernel_1", "attention_kernel_2",
                                             "attention_kernel_3"]
    params = dict(kernels)
    assert "A_ptr" in params["attention_kernel"] and "S_ptr" in params["attention_kernel"]  # scale fused into SDDMM
    assert "mx_ptr" in params["attention_kernel_1"] and "s_ptr" not in params["attention_kernel_1"]
    assert "s_ptr" in params["attention_kernel_2"]
    assert "V_ptr" in params["attention_kernel_3"] and "O_ptr" in params["attention_kernel_3"]
    assert "expf" in src and "__shfl_down_sync" in src
    assert re.search(r"\*\(float4\*\)\(Kt_ptr", src) and re.search(r"\*\(float4\*\)\(V_ptr", src)  # vector gathers
    temps = {p.name: p for p in k.params if p.role == "temp"}
    assert temps["S"].sparse and temps["S"].shape == (None,)
    assert temps["mx"].shape == ("rows",) and temps["s"].shape == ("rows",)


# ---------------------------------------------------------------- errors


@pytest.fixture(scope="module")
def small():
    m = masks.longformer(20, 2, 1, 2, value=0.5)
    return convert(m, "csr"), inputs(40, 8, seed=3)


def test_bad_operands_are_named(small):
    A, (Q, K, V) = small
    k = kernel("csr", 8)
    with pytest.raises(ValueError, match=r"attention: Q should have shape \(40, 8\) .* got \(39, 8\)"):
        k(A, Q[:39], K, V)
    with pytest.raises(ValueError, match=r"attention: V should have shape \(40, 8\) .* got \(40, 4\)"):
        k(A, Q, K, V[:, :4])
    with pytest.raises(TypeError, match=r"attention: Kt should be float32, got float64"):
        k(A, Q, K.astype(np.float64), V)
    with pytest.raises(TypeError, match=r"takes the sparse matrix and 3 dense inputs \(Q, Kt, V\), got 2"):
        k(A, Q, K)
    with pytest.raises(ValueError, match=r"compiled for format csr, got a matrix in ell"):
        k(convert(A.to_scipy(), "ell"), Q, K, V)
