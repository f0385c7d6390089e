"""Round trips and structure of CSR / BSR / ELL instances built from every input kind."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings, strategies as st

from sparsec.formats.convert import canonical_csr
from sparsec.formats import (DenseFixed, Format, FormatInstance, SparseFixed, SparseVariable, as_csr, bsr,
                             convert, csr, ell, families, make_format, module_for)

SPECS = ["csr", "bsr:2x2", "bsr:4x4", "bsr:16x16", "bsr:3x5", "ell"]


# ---------------------------------------------------------------- matrices


def random_csr(m, n, density=0.1, seed=0, dtype=np.float32, empty_rows=0.0):
    rng = np.random.default_rng(seed)
    a = sp.random(m, n, density=density, format="csr", dtype=dtype, random_state=rng)
    if empty_rows and m:
        a = sp.diags((rng.random(m) >= empty_rows).astype(dtype)) @ a
        a.eliminate_zeros()
    return sp.csr_matrix(a)


def power_law(m, n, seed=0):
    """Row lengths ~ Zipf: a few very long rows, many short or empty ones."""
    rng = np.random.default_rng(seed)
    lengths = np.minimum(rng.zipf(1.6, size=m) - 1, n)
    rows = np.repeat(np.arange(m), lengths)
    cols = np.concatenate([rng.choice(n, size=k, replace=False) for k in lengths]) if lengths.sum() else np.zeros(0, int)
    return sp.csr_matrix((rng.standard_normal(rows.size).astype(np.float32), (rows, cols)), shape=(m, n))


def one_heavy_row(m, n, seed=0):
    """Row 3 holds almost every non-zero."""
    rng = np.random.default_rng(seed)
    a = sp.lil_matrix((m, n), dtype=np.float64)
    a[3, :] = rng.standard_normal(n)
    a[m - 1, 0] = 1.5
    return sp.csr_matrix(a)


MATRICES = {
    "random_37x53": lambda: random_csr(37, 53, 0.15, 1),
    "random_101x67_empty_rows": lambda: random_csr(101, 67, 0.05, 2, empty_rows=0.4),
    "float64_64x64": lambda: random_csr(64, 64, 0.2, 3, dtype=np.float64),
    "power_law_120x90": lambda: power_law(120, 90, 4),
    "one_heavy_row_9x200": lambda: one_heavy_row(9, 200),
    "empty_0x0": lambda: sp.csr_matrix((0, 0), dtype=np.float32),
    "empty_5x0": lambda: sp.csr_matrix((5, 0), dtype=np.float32),
    "empty_0x5": lambda: sp.csr_matrix((0, 5), dtype=np.float32),
    "nnz0_5x7": lambda: sp.csr_matrix((5, 7), dtype=np.float32),
    "float16_13x17": lambda: random_csr(13, 17, 0.3, 5).toarray().astype(np.float16),
}


def dense_of(inst: FormatInstance) -> np.ndarray:
    return inst.to_scipy().toarray()


def assert_instance_matches(inst: FormatInstance, ref: sp.csr_matrix):
    """Exact round trip, plus stored_coords consistent with data."""
    assert inst.dtype == canonical_csr(ref).data.dtype
    ref = as_csr(ref)  # float16 comes back as float32 (scipy has no float16), as to_scipy does
    mod = module_for(inst.format)
    mod.check(inst, full=True)
    assert inst.shape == ref.shape
    assert inst.nnz == ref.nnz
    for name in inst.format.index_array_names():
        a = inst.arrays[name]
        assert a.dtype == np.int32 and a.ndim == 1 and a.flags.c_contiguous
    assert inst.data.ndim == 1 and inst.data.flags.c_contiguous
    back = inst.to_scipy()
    if inst.format.name == "bsr":
        # explicit zeros inside blocks are stored; the dense matrix is what must match
        np.testing.assert_array_equal(back.toarray(), ref.toarray())
    else:
        np.testing.assert_array_equal(back.indptr, ref.indptr)
        np.testing.assert_array_equal(back.indices, ref.indices)
        np.testing.assert_array_equal(back.data, ref.data)
    rows, cols = inst.stored_coords()
    assert rows.shape == cols.shape == inst.data.shape
    assert rows.dtype == cols.dtype == np.int64
    ok = rows >= 0
    np.testing.assert_array_equal(ok, cols >= 0)
    assert np.all(inst.data[~ok] == 0)
    assert np.all(rows[ok] < ref.shape[0]) and np.all(cols[ok] < ref.shape[1])
    lin = rows[ok] * max(ref.shape[1], 1) + cols[ok]
    assert np.unique(lin).size == lin.size, "a coordinate is stored twice"
    np.testing.assert_array_equal(inst.data[ok], ref.toarray()[rows[ok], cols[ok]])
    # every source entry has a slot
    rr, cc = ref.nonzero()
    held = set(zip(rows[ok].tolist(), cols[ok].tolist()))
    assert all((r, c) in held for r, c in zip(rr.tolist(), cc.tolist()))


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("name", list(MATRICES))
def test_round_trip(spec, name):
    a = MATRICES[name]()
    inst = convert(a, spec)
    assert_instance_matches(inst, a)
    assert inst.conversion_s >= 0


@pytest.mark.parametrize("kind", ["csr", "csc", "coo", "bsr", "lil", "dok", "csr_array", "coo_array"])
def test_scipy_inputs(kind):
    a = random_csr(37, 53, 0.2, 7)
    src = {"csr_array": lambda: sp.csr_array(a), "coo_array": lambda: sp.coo_array(a)}.get(kind, lambda: a.asformat(kind))()
    for spec in ("csr", "bsr:3x5", "ell"):
        assert_instance_matches(convert(src, spec), a)


def test_numpy_dense_input_keeps_nan_inf():
    rng = np.random.default_rng(0)
    d = rng.standard_normal((23, 31)) * (rng.random((23, 31)) < 0.2)
    d[2, 3], d[4, 5], d[0, 30] = np.nan, np.inf, -np.inf
    for spec in SPECS:
        inst = convert(d, spec)
        np.testing.assert_array_equal(dense_of(inst), d)
        assert inst.nnz == np.count_nonzero(d)


def test_tuple_inputs():
    a = random_csr(41, 29, 0.2, 8)
    inst = convert((a.data, a.indices, a.indptr), "csr", shape=a.shape)
    assert_instance_matches(inst, a)
    c = a.tocoo()
    inst = convert((c.data, (c.row, c.col)), "bsr:4x4", shape=a.shape)
    assert_instance_matches(inst, a)


def test_result_does_not_alias_input():
    a = random_csr(10, 10, 0.3, 9)
    inst = csr.from_matrix(a)
    inst.arrays["indices"][:] = 0
    inst.data[:] = 7
    assert a.indices.max() > 0 and not np.any(a.data == 7)


def test_explicit_zeros_are_kept():
    a = sp.csr_matrix((np.array([0.0, 2.0, 0.0], np.float32), np.array([1, 3, 0]), np.array([0, 2, 2, 3])),
                      shape=(3, 4))
    for spec in ("csr", "ell"):
        inst = convert(a, spec)
        assert inst.nnz == 3
        assert inst.to_scipy().nnz == 3
    assert convert(a, "bsr:2x2").nnz == 3


def test_unsorted_scipy_and_tuple_are_sorted():
    data = np.array([3.0, 1.0, 2.0, 5.0], np.float32)
    indices = np.array([4, 0, 2, 1], np.int32)
    indptr = np.array([0, 3, 3, 4], np.int32)
    want = np.zeros((3, 5), np.float32)
    want[0, 4], want[0, 0], want[0, 2], want[2, 1] = 3, 1, 2, 5
    m = sp.csr_matrix((data, indices, indptr), shape=(3, 5))
    m.has_sorted_indices = False
    for src, kw in ((m, {}), ((data, indices, indptr), {"shape": (3, 5)})):
        inst = csr.from_matrix(src, **kw)
        np.testing.assert_array_equal(inst.arrays["indices"], [0, 2, 4, 1])
        np.testing.assert_array_equal(inst.data, [1, 2, 3, 5])
        csr.check(inst, full=True)
        np.testing.assert_array_equal(dense_of(inst), want)
    np.testing.assert_array_equal(indices, [4, 0, 2, 1])  # the caller's arrays are untouched


def test_scipy_duplicates_are_summed():
    data = np.array([1.0, 2.0, 4.0], np.float64)
    m = sp.csr_matrix((data, np.array([2, 2, 0]), np.array([0, 2, 3])), shape=(2, 3))
    inst = csr.from_matrix(m)
    assert inst.nnz == 2
    np.testing.assert_array_equal(dense_of(inst), [[0, 0, 3], [4, 0, 0]])
    c = sp.coo_matrix((data, (np.array([1, 1, 0]), np.array([0, 0, 2]))), shape=(2, 3))
    np.testing.assert_array_equal(dense_of(csr.from_matrix(c)), [[0, 0, 4], [3, 0, 0]])


def test_int64_indices_are_downcast():
    a = random_csr(20, 30, 0.2, 10)
    inst = csr.from_matrix((a.data, a.indices.astype(np.int64), a.indptr.astype(np.int64)), shape=a.shape)
    assert inst.arrays["indptr"].dtype == np.int32 and inst.arrays["indices"].dtype == np.int32
    assert_instance_matches(inst, a)


def test_dtype_argument_casts():
    a = random_csr(20, 30, 0.2, 11, dtype=np.float64)
    inst = ell.from_matrix(a, dtype=np.float32)
    assert inst.dtype == np.float32
    ints = sp.csr_matrix(np.array([[0, 2], [3, 0]], np.int64))
    np.testing.assert_array_equal(dense_of(csr.from_matrix(ints, dtype="float64")), [[0, 2], [3, 0]])


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_torch_inputs():
    torch = pytest.importorskip("torch")
    a = random_csr(37, 53, 0.15, 12)
    d = torch.from_numpy(a.toarray())
    for t in (d, d.to_sparse_coo(), d.to_sparse_csr(), d.t().contiguous().t(), d.requires_grad_(False)):
        for spec in ("csr", "bsr:4x4", "ell"):
            assert_instance_matches(convert(t, spec), a)
    # uncoalesced COO duplicates are summed, like torch's coalesce()
    t = torch.sparse_coo_tensor(torch.tensor([[0, 0, 1], [1, 1, 0]]), torch.tensor([1.0, 2.0, 4.0]), (2, 2))
    np.testing.assert_array_equal(dense_of(csr.from_matrix(t)), [[0, 3], [4, 0]])


def test_ell_width_and_padding():
    a = sp.csr_matrix(np.array([[1, 0, 2, 0], [0, 0, 0, 0], [0, 3, 0, 0]], np.float32))
    inst = ell.from_matrix(a)
    assert inst.format.param("width") == 2 and inst.format.spec == "ell:2"
    np.testing.assert_array_equal(inst.arrays["indices"], [0, 2, -1, -1, 1, -1])
    np.testing.assert_array_equal(inst.data, [1, 2, 0, 0, 3, 0])
    wide = ell.from_matrix(a, width=5)
    assert wide.stored == 15 and wide.stored_coords()[0].tolist()[:6] == [0, 0, -1, -1, -1, -1]
    assert ell.from_matrix(sp.csr_matrix((4, 4), dtype=np.float32)).format.param("width") == 1


def test_bsr_layout_and_edges():
    d = np.arange(1, 7 * 8 + 1, dtype=np.float32).reshape(7, 8) * (np.arange(8) % 3 == 0)
    inst = bsr.from_matrix(d, block=(3, 5))
    assert inst.root_extent() == 3  # ceil(7 / 3)
    ip, ix = inst.arrays["indptr"], inst.arrays["indices"]
    assert ip.tolist() == [0, 2, 4, 6] and ix.tolist() == [0, 1, 0, 1, 0, 1]
    blocks = inst.data.reshape(-1, 3, 5)
    np.testing.assert_array_equal(blocks[0], d[0:3, 0:5])
    np.testing.assert_array_equal(blocks[5][:1, :3], d[6:7, 5:8])
    assert np.all(blocks[5][1:] == 0) and np.all(blocks[5][:, 3:] == 0)
    rows, cols = inst.stored_coords()
    assert rows.reshape(-1, 3, 5)[5, 1, 0] == -1 and cols.reshape(-1, 3, 5)[5, 0, 4] == -1
    assert inst.nnz == np.count_nonzero(d)


def test_declarations():
    f = csr.declare()
    assert f.axes == (DenseFixed("i", dim=0), SparseVariable("j", dim=1, indptr="indptr", indices="indices"))
    assert f.params == () and f.index_array_names() == ("indptr", "indices")
    b = bsr.declare((3, 5))
    assert [a.kind for a in b.axes] == ["DenseFixed", "SparseVariable", "DenseFixed", "DenseFixed"]
    assert (b.axes[0].scale, b.axes[1].scale, b.axes[2].extent, b.axes[3].extent) == (3, 5, 3, 5)
    assert b.params == (("block", (3, 5)),) and b.spec == "bsr:3x5"
    e = ell.declare(8)
    assert e.axes[1] == SparseFixed("j", dim=1, width=8, indices="indices") and e.params == (("width", 8),)
    assert e.index_array_names() == ("indices",)


def test_registry():
    assert [n for n, _ in families()][:3] == ["csr", "bsr", "ell"]
    assert make_format("csr") == csr.declare()
    assert make_format("bsr:4x4") == bsr.declare((4, 4))
    assert make_format("bsr:3x5") == make_format("bsr", block=(3, 5)) == bsr.declare((3, 5))
    assert make_format("ell:8") == make_format("ell", width=8) == ell.declare(8)
    assert make_format("ell").spec == "ell"
    assert isinstance(make_format(" BSR:2X2 "), Format)
    for spec in ("csr", "bsr:4x4", "ell:8"):
        assert make_format(make_format(spec).spec) == make_format(spec)
    assert module_for(make_format("ell:3")) is ell and module_for("bsr") is bsr
    a = random_csr(10, 10, 0.3, 13)
    assert convert(a, make_format("bsr:2x3")).format == bsr.declare((2, 3))
    assert convert(a, "ell:9").format.param("width") == 9


def test_stats():
    a = power_law(200, 100, 14)
    for spec in SPECS:
        inst = convert(a, spec)
        s = module_for(inst.format).stats(inst)
        assert (s["rows"], s["cols"], s["nnz"], s["stored"]) == (200, 100, a.nnz, inst.stored)
        assert s["padding_ratio"] == pytest.approx(inst.stored / a.nnz)
        lengths = np.diff(a.indptr)
        assert s["row_len_max"] == lengths.max() and s["row_len_mean"] == pytest.approx(lengths.mean())
        assert s["row_len_p50"] <= s["row_len_p90"] <= s["row_len_p99"] <= s["row_len_max"]
        assert s["row_len_cv"] == pytest.approx(lengths.std() / lengths.mean())
        assert s["bytes"] == sum(x.nbytes for x in inst.arrays.values()) + inst.data.nbytes
    s = csr.stats(csr.from_matrix(sp.csr_matrix((0, 0), dtype=np.float32)))
    assert s["padding_ratio"] == 1.0 and s["row_len_max"] == 0


def test_check_catches_corrupted_instances():
    inst = csr.from_matrix(random_csr(4, 6, 0.5, 15))
    bad = FormatInstance(inst.format, inst.shape, {"indptr": inst.arrays["indptr"][:-1],
                                                   "indices": inst.arrays["indices"]}, inst.data, inst.nnz)
    with pytest.raises(ValueError, match=r"indptr has 4 entries, should be rows \+ 1 = 5"):
        csr.check(bad)
    bad = FormatInstance(inst.format, inst.shape, {"indptr": inst.arrays["indptr"].astype(np.int64),
                                                   "indices": inst.arrays["indices"]}, inst.data, inst.nnz)
    with pytest.raises(ValueError, match="indptr should be a contiguous 1-D int32 array, got int64"):
        csr.check(bad)
    with pytest.raises(ValueError, match="arrays should contain 'indices'"):
        csr.check(FormatInstance(inst.format, inst.shape, {"indptr": inst.arrays["indptr"]}, inst.data, inst.nnz))
    idx = inst.arrays["indices"].copy()
    idx[0] = 6
    bad = FormatInstance(inst.format, inst.shape, {"indptr": inst.arrays["indptr"], "indices": idx}, inst.data, inst.nnz)
    csr.check(bad)  # O(1) check does not scan
    with pytest.raises(ValueError, match=r"column index 6 in row 0 is out of range: should be in \[0, 6\)"):
        csr.check(bad, full=True)
    e = ell.from_matrix(random_csr(4, 6, 0.5, 15))
    idx = e.arrays["indices"].copy()
    idx[0] = -5
    with pytest.raises(ValueError, match="column index -5 in row 0"):
        ell.check(FormatInstance(e.format, e.shape, {"indices": idx}, e.data, e.nnz), full=True)
    b = bsr.from_matrix(random_csr(5, 7, 0.5, 15), block=(2, 2))
    with pytest.raises(ValueError, match="data should have blocks"):
        bsr.check(FormatInstance(b.format, b.shape, b.arrays, b.data[:-1].copy(), b.nnz))


def test_large_conversion_round_trips():
    """A 20000 x 20000 matrix with 400k non-zeros converts exactly and records its conversion time."""
    a = random_csr(20000, 20000, 0.001, 16)
    for spec in ("csr", "bsr:4x4", "ell"):
        inst = convert(a, spec)
        assert inst.conversion_s > 0
        assert (inst.to_scipy() != a).nnz == 0


# ---------------------------------------------------------------- properties


@st.composite
def matrices(draw):
    m = draw(st.integers(0, 40))
    n = draw(st.integers(0, 40))
    density = draw(st.sampled_from([0.0, 0.05, 0.3, 1.0]))
    seed = draw(st.integers(0, 2**31 - 1))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    return random_csr(m, n, density, seed, dtype=dtype)


@settings(max_examples=30, deadline=None)
@given(a=matrices(), r=st.integers(1, 7), c=st.integers(1, 7))
def test_property_bsr_round_trip(a, r, c):
    assert_instance_matches(bsr.from_matrix(a, block=(r, c)), a)


@settings(max_examples=30, deadline=None)
@given(a=matrices(), extra=st.integers(0, 3))
def test_property_csr_ell_round_trip(a, extra):
    assert_instance_matches(csr.from_matrix(a), a)
    w = int(np.diff(a.indptr).max(initial=0)) + extra
    assert_instance_matches(ell.from_matrix(a, width=w) if w else ell.from_matrix(a), a)


@settings(max_examples=30, deadline=None)
@given(a=matrices(), seed=st.integers(0, 2**31 - 1))
def test_property_shuffled_coo_matches(a, seed):
    """Any entry order of the same COO entries gives the same canonical CSR."""
    c = a.tocoo()
    p = np.random.default_rng(seed).permutation(c.nnz)
    got = as_csr((c.data[p], (c.row[p], c.col[p])), shape=a.shape)
    want = as_csr(a)
    np.testing.assert_array_equal(got.indptr, want.indptr)
    np.testing.assert_array_equal(got.indices, want.indices)
    np.testing.assert_array_equal(got.data, want.data)


@pytest.mark.parametrize("spec", ["csr", "bsr:3x5", "ell"])
def test_back_to_numpy_and_torch(spec):
    """Conversions go both ways: a converted matrix comes back as numpy dense and as torch
    dense, CSR and COO tensors with the same entries."""
    torch = pytest.importorskip("torch")
    m = sp.random(37, 53, density=0.1, format="csr", dtype=np.float32, random_state=3)
    inst = convert(m, spec)
    dense = m.toarray()
    np.testing.assert_array_equal(inst.to_dense(), dense)
    assert inst.to_dense().dtype == np.float32
    for layout in ("dense", "csr", "coo"):
        t = inst.to_torch(layout)
        got = t if layout == "dense" else t.to_dense()
        np.testing.assert_array_equal(got.numpy(), dense)
    with pytest.raises(ValueError, match="layout should be"):
        inst.to_torch("bsr")
