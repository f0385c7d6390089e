"""A composite's fill sets only the rows that no storing part writes (``lower.fill_rows``).

Checked on the CPU against scipy in float64 on NaN-poisoned outputs: a row the fill skipped
and no part wrote would stay NaN. The row list follows the compiled kernel's parts, so a
kernel that adds its widest bucket's rows atomically stays right on a matrix whose widest
bucket could have stored them."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import sparsec
from sparsec import ops
from sparsec.formats import convert
from sparsec.ir_attrs import fill_rows_name, fill_rows_parts
from sparsec.tc_operands import fill_rows

FEAT = 8


def skewed(n=240, seed=0, longest=150):
    """Empty rows (a fifth), short rows, and a few rows longer than hyb's widest bucket."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 6, n)
    lengths[rng.choice(n, n // 5, replace=False)] = 0
    lengths[rng.choice(np.flatnonzero(lengths), 3, replace=False)] = longest
    rows = np.repeat(np.arange(n), lengths)
    cols = np.concatenate([rng.choice(n, k, replace=False) for k in lengths])
    m = sp.csr_matrix((rng.standard_normal(rows.size).astype(np.float32), (rows, cols)), shape=(n, n))
    m.data[::7] = 0.0  # explicit zeros are entries
    return m


def listed_fill(kernel):
    names = [p.name for p in kernel.params if fill_rows_parts(p.name) is not None]
    return names[0] if names else None


def run(kernel, inst, *dense):
    out = kernel(inst, *dense, poison=True)
    return np.asarray(out["C"] if isinstance(out, dict) else out, dtype=np.float64)


def test_names_round_trip():
    assert fill_rows_parts(fill_rows_name((0, 2, 11))) == (0, 2, 11)
    assert fill_rows_parts("fill_rows_px") is None and fill_rows_parts("C") is None


def test_hyb_fills_empty_rows_and_the_added_bucket_only():
    m = skewed()
    inst = convert(m, "hyb:1:1/2/4/8/16")
    k = sparsec.compile("spmm", inst, target="llvm", feat=FEAT, knobs="default")
    name = listed_fill(k)
    assert name == fill_rows_name((0, 1, 2, 3))  # the widest bucket (split rows) adds: not listed
    rows = fill_rows(inst, fill_rows_parts(name))[name]
    lengths = np.diff(m.indptr)
    assert set(rows.tolist()) == set(np.flatnonzero((lengths == 0) | (lengths > 8)).tolist())
    B = np.random.default_rng(1).standard_normal((m.shape[1], FEAT)).astype(np.float32)
    np.testing.assert_allclose(run(k, inst, B), m.astype(np.float64) @ B.astype(np.float64), rtol=1e-5, atol=1e-5)


def test_a_kernel_that_adds_a_bucket_keeps_filling_it_on_a_matrix_that_could_store_it():
    with_split = convert(skewed(seed=2), "hyb:1:1/2/4/8")
    k = sparsec.compile("spmm", with_split, target="llvm", feat=FEAT, knobs="default")
    short = skewed(seed=3, longest=6)  # no row past the widest bucket: its part is unique here
    inst = convert(short, with_split.format.family_spec)
    name = listed_fill(k)
    assert 3 not in fill_rows_parts(name)
    B = np.random.default_rng(4).standard_normal((short.shape[1], FEAT)).astype(np.float32)
    np.testing.assert_allclose(run(k, inst, B), short.astype(np.float64) @ B.astype(np.float64),
                               rtol=1e-5, atol=1e-5)


def test_a_folded_bias_reaches_the_empty_rows():
    m = skewed(seed=5)
    inst = convert(m, "hyb:1:1/2/4/8")
    k = sparsec.compile(ops.spmm_bias(), inst, target="llvm", feat=FEAT)
    assert listed_fill(k) is not None
    rng = np.random.default_rng(6)
    B = rng.standard_normal((m.shape[1], FEAT)).astype(np.float32)
    b = rng.standard_normal(FEAT).astype(np.float32)
    want = m.astype(np.float64) @ B.astype(np.float64) + b.astype(np.float64)
    np.testing.assert_allclose(run(k, inst, B, b), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spec", ["hyb:2:1/2/4", "csr"])
def test_no_list_where_no_part_stores_or_no_composite(spec):
    inst = convert(skewed(seed=7), spec)
    k = sparsec.compile("spmm", inst, target="llvm", feat=FEAT, knobs="default")
    assert listed_fill(k) is None


def test_all_rows_stored_leaves_only_the_empty_rows():
    m = skewed(seed=8, longest=12)
    inst = convert(m, "hyb:1:1/2/4/8/16")
    k = sparsec.compile("spmm", inst, target="cuda:sm_90a", feat=FEAT, knobs="default")
    name = listed_fill(k)
    assert name == fill_rows_name(range(5))
    assert fill_rows(inst, fill_rows_parts(name))[name].tolist() == np.flatnonzero(np.diff(m.indptr) == 0).tolist()
    assert "C_ptr + ((" + name + "_ptr[" in k.source()  # the fill writes C at the listed rows


def test_a_matrix_without_parts_is_refused_by_name():
    with pytest.raises(ValueError, match="fill_rows_p0_1.*composite"):
        fill_rows(convert(skewed(), "csr"), (0, 1))


def test_sparsec_torch_hands_the_kernel_its_row_list():
    torch = pytest.importorskip("torch")
    import sparsec.torch as st

    m = skewed(seed=9)
    A = st.SparseTensor(m, "hyb:1:1/2/4/8")
    B = torch.randn(m.shape[1], FEAT, dtype=torch.float64).float().requires_grad_(True)
    C = st.spmm(A, B)
    want = m.astype(np.float64) @ B.detach().double().numpy()
    np.testing.assert_allclose(C.detach().double().numpy(), want, rtol=1e-5, atol=1e-5)
    C.sum().backward()
    np.testing.assert_allclose(B.grad.double().numpy(), m.T.astype(np.float64) @ np.ones((m.shape[0], FEAT)),
                               rtol=1e-5, atol=1e-5)


def test_an_empty_row_list_is_handed_over_too():
    """Every row stored (no empty row, no split row): the list is empty, and both the kernel's
    own call and sparsec.torch hand TVM a compact empty array."""
    n = 64
    m = sp.csr_matrix(np.eye(n, dtype=np.float32) + np.eye(n, k=1, dtype=np.float32))
    inst = convert(m, "hyb:1:1/2/4")
    k = sparsec.compile("spmm", inst, target="llvm", feat=FEAT, knobs="default")
    name = listed_fill(k)
    assert fill_rows(inst, fill_rows_parts(name))[name].size == 0
    B = np.random.default_rng(10).standard_normal((n, FEAT)).astype(np.float32)
    np.testing.assert_allclose(run(k, inst, B), m.astype(np.float64) @ B.astype(np.float64), rtol=1e-5, atol=1e-5)
    torch = pytest.importorskip("torch")
    import sparsec.torch as st

    got = st.spmm(st.SparseTensor(m, "hyb:1:1/2/4"), torch.from_numpy(B))
    np.testing.assert_allclose(got.double().numpy(), m.astype(np.float64) @ B.astype(np.float64), rtol=1e-5, atol=1e-5)


def test_sparsec_torch_frees_the_row_list_with_its_matrix():
    torch = pytest.importorskip("torch")
    import gc

    import sparsec.torch as st
    from sparsec import torch_launch

    A = st.SparseTensor(skewed(seed=11), "hyb:1:1/2/4/8")
    st.spmm(A, torch.randn(A.shape[1], FEAT))
    held = [slot for slot in torch_launch._PATTERN_ARRAYS if slot[0] == A.key]
    assert held
    del A
    gc.collect()
    assert not any(slot in torch_launch._PATTERN_ARRAYS for slot in held)
