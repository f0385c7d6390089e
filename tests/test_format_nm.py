"""N:M structured sparsity: declaration, conversion, pruning, checks, and the 2:4 mma.sp layout."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings, strategies as st

from sparsec.formats import DenseFixed, SparseFixed, convert, make_format, module_for, nm, parse_spec

NMS = [(2, 4), (1, 4), (2, 8), (1, 8), (4, 16)]
VECS = [1, 2, 4]
SHAPES = [(37, 53), (5, 3), (16, 64), (0, 7), (9, 0), (1, 1)]


def random_nm(rows, cols, n, m, vec=1, seed=0, dtype=np.float64, fill=0.7, row_drop=0.2):
    """A dense N:M matrix: each window of each V-row vector keeps 0..N random columns
    (with probability 1 - fill none: all-empty windows), each row of a vector drops some of
    them (so rows of a vector differ), and ~10% of rows are empty."""
    rng = np.random.default_rng(seed)
    nv, nw = -(-rows // vec), -(-cols // m)
    score = rng.random((nv, nw, m))
    score[:, (np.arange(nw * m) >= cols).reshape(nw, m)] = -1
    k = rng.integers(0, n + 1, size=(nv, nw)) * (rng.random((nv, nw)) < fill)
    rank = np.argsort(np.argsort(-score, axis=-1, kind="stable"), axis=-1)
    keep = (rank < k[..., None]) & (score >= 0)
    full = np.broadcast_to(keep[:, None], (nv, vec, nw, m)).reshape(nv * vec, nw * m)[:rows, :cols]
    vals = rng.standard_normal((rows, cols))
    a = np.where(full & (rng.random((rows, cols)) >= row_drop), vals, 0.0)
    if rows:
        a[rng.random(rows) < 0.1] = 0
    return a.astype(dtype)


def window_counts(mask, m, vec=1):
    """Distinct kept columns per (row vector, window)."""
    rows, cols = mask.shape
    nv, nw = -(-rows // vec), -(-cols // m)
    pad = np.zeros((nv * vec, nw * m), bool)
    pad[:rows, :cols] = mask
    return pad.reshape(nv, vec, nw, m).any(axis=1).sum(axis=-1)


# ---------------------------------------------------------------- declaration


def test_axis_chain_element_wise():
    f = make_format("nm:2:4")
    assert f.axes == (DenseFixed("i", dim=0), DenseFixed("w", dim=1, scale=4, extent=None),
                      SparseFixed("s", dim=1, width=2, indices="indices"))
    assert f.params == (("n", 2), ("m", 4))
    assert f.runtime_extent_axes() == ("i", "w")
    assert f.index_array_names() == ("indices",)


def test_axis_chain_vector_wise():
    f = make_format("nm", n=2, m=8, vec=4)
    assert f.axes == (DenseFixed("io", dim=0, scale=4), DenseFixed("w", dim=1, scale=8, extent=None),
                      SparseFixed("s", dim=1, width=2, indices="indices"), DenseFixed("ii", dim=0, extent=4))
    assert f.params == (("n", 2), ("m", 8), ("vec", 4))
    assert f.runtime_extent_axes() == ("io", "w")


@pytest.mark.parametrize("text,want", [
    ("2:4", (2, 4, 1)), ("1:8", (1, 8, 1)), ("2:4:v4", (2, 4, 4)), ("1:8,v=4", (1, 8, 4)),
    ("4:16:vec=2", (4, 16, 2)), ("2,4,4", (2, 4, 4)), ("2:4:8", (2, 4, 8)), ("1:256", (1, 256, 1)),
])
def test_parse_spec(text, want):
    _, p = parse_spec("nm:" + text)
    assert (p["n"], p["m"], p["vec"]) == want
    f = make_format("nm:" + text)
    assert make_format(f.spec) == f  # the spec Format writes parses back


@pytest.mark.parametrize("spec,match", [
    ("nm:4:4", "1 <= N < M"), ("nm:0:4", "1 <= N < M"), ("nm:2:512", "at most 256"),
    ("nm:2:4:v3", "vec should be one of"), ("nm:2:4:x4", "vector size"), ("nm:2", "N:M"),
    ("nm:a:b", "N:M"), ("nm", "needs N and M"),
])
def test_bad_specs(spec, match):
    with pytest.raises(ValueError, match=match):
        make_format(spec)


def test_keyword_errors():
    with pytest.raises(ValueError, match="vec should be one of"):
        make_format("nm", n=1, m=4, vec=48)
    with pytest.raises(ValueError, match="integer"):
        make_format("nm", n=True, m=4)


# ---------------------------------------------------------------- conversion


@pytest.mark.parametrize("n,m", NMS)
@pytest.mark.parametrize("vec", VECS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_round_trip(n, m, vec, shape):
    a = random_nm(*shape, n, m, vec, seed=hash((n, m, vec, shape)) % 2**32)
    inst = nm.from_matrix(sp.csr_matrix(a), n=n, m=m, vec=vec)
    nm.check(inst, full=True)
    rows, cols = shape
    nv, nw = -(-rows // vec), -(-cols // m)
    assert inst.extents() == {("i" if vec == 1 else "io"): nv, "w": nw}
    assert inst.root_extent() == nv
    assert inst.arrays["indices"].size == nv * nw * n and inst.data.size == nv * nw * n * vec
    assert inst.nnz == np.count_nonzero(a)
    back = inst.to_scipy()
    np.testing.assert_array_equal(back.toarray(), a)
    back.eliminate_zeros()
    assert (back != sp.csr_matrix(a)).nnz == 0
    # every stored coordinate matches the flat position formula
    r, c = inst.stored_coords()
    idx = np.repeat(inst.arrays["indices"], vec)
    pos = np.arange(inst.data.size)
    slot = pos // vec
    want_r = (slot // (nw * n)) * vec + pos % vec
    want_c = (slot // n % nw) * m + idx
    ok = r >= 0
    np.testing.assert_array_equal(r[ok], want_r[ok])
    np.testing.assert_array_equal(c[ok], want_c[ok])
    # V > 1: a row of a vector lacking a column another row has is padding (the slot mask)
    padding = inst.arrays["valid"] == 0 if vec > 1 else np.zeros(ok.shape, bool)
    assert np.all((idx < 0) | (want_r >= rows) | padding | ok)
    assert int(ok.sum()) == inst.nnz
    # the same matrix through convert() with the spec text
    spec = f"nm:{n}:{m}" + (f":v{vec}" if vec > 1 else "")
    again = convert(a, spec)
    np.testing.assert_array_equal(again.arrays["indices"], inst.arrays["indices"])
    np.testing.assert_array_equal(again.data, inst.data)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_dtypes_and_inputs(dtype):
    import torch

    a = random_nm(29, 70, 2, 8, seed=3, dtype=dtype)
    for src in (a, sp.coo_matrix(a.astype(np.float64)), torch.from_numpy(a)):
        inst = convert(src, "nm:2:8", dtype=dtype)
        assert inst.dtype == dtype
        np.testing.assert_array_equal(inst.to_dense(), a)
    assert module_for(inst.format) is nm


def test_layout_by_hand():
    a = np.zeros((3, 10))
    a[0, [1, 3, 4, 9]] = [1, 2, 3, 4]
    a[2, [6]] = 5
    inst = nm.from_matrix(a, n=2, m=4)
    # 3 windows per row (the last holds columns 8, 9), 2 slots each
    assert inst.arrays["indices"].tolist() == [1, 3, 0, -1, 1, -1,
                                               -1, -1, -1, -1, -1, -1,
                                               -1, -1, 2, -1, -1, -1]
    assert inst.data.tolist() == [1, 2, 3, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0]
    v = nm.from_matrix(a, n=2, m=4, vec=2)
    # row vector 0 = rows 0, 1; vector 1 = row 2 and a padding row
    assert v.arrays["indices"].tolist() == [1, 3, 0, -1, 1, -1, -1, -1, 2, -1, -1, -1]
    assert v.data.reshape(-1, 2)[:6].tolist() == [[1, 0], [2, 0], [3, 0], [0, 0], [4, 0], [0, 0]]
    assert v.data.reshape(-1, 2)[8].tolist() == [5, 0]
    np.testing.assert_array_equal(v.to_dense(), a)


def test_explicit_zeros_are_entries():
    a = sp.csr_matrix((np.array([0.0, 1.0, 0.0]), np.array([0, 2, 5]), np.array([0, 3])), shape=(1, 8))
    inst = nm.from_matrix(a, n=2, m=4)
    assert inst.nnz == 3
    assert inst.to_scipy().nnz == 3
    with pytest.raises(ValueError, match="more than N=1"):
        nm.from_matrix(a, n=1, m=4)


def test_window_breaking_nm_raises():
    a = np.zeros((5, 16))
    a[3, [8, 9, 11]] = 1
    with pytest.raises(ValueError, match=r"row 3, columns 8\.\.11 hold 3 non-zeros, more than N=2 of every M=4"):
        nm.from_matrix(a, n=2, m=4)
    b = np.zeros((6, 10))
    b[4, 8] = b[5, 9] = 1  # the union over rows 4, 5 of the last, partial window is 2 columns
    nm.from_matrix(b, n=2, m=4, vec=2)
    with pytest.raises(ValueError, match=r"rows 4\.\.5, columns 8\.\.9 hold non-zeros in 2 distinct columns"):
        nm.from_matrix(b, n=1, m=4, vec=2)
    with pytest.raises(ValueError, match=r"rows 4\.\.5, columns 8\.\.9"):
        nm.from_matrix(b, n=1, m=4, vec=4)  # vector rows 4..7 clipped at the edge: 4..5


def test_check_catches_corruption():
    a = random_nm(8, 16, 2, 4, seed=1, fill=1.0, row_drop=0.0)
    inst = nm.from_matrix(a, n=2, m=4)
    bad = inst.with_data(inst.data)
    bad.arrays = dict(inst.arrays, indices=inst.arrays["indices"].copy())
    k = int(np.flatnonzero(bad.arrays["indices"] >= 0)[0])
    bad.arrays["indices"][k] = 4
    with pytest.raises(ValueError, match="offsets should be in"):
        nm.check(bad, full=True)
    bad.arrays["indices"][k] = -1
    bad._coords = None
    with pytest.raises(ValueError, match="should follow|should hold 0"):
        nm.check(bad, full=True)
    short = inst.with_data(inst.data)
    short.arrays = {"indices": inst.arrays["indices"][:-2].copy()}
    with pytest.raises(ValueError, match="indices has"):
        nm.check(short)
    past = nm.from_matrix(np.eye(2, 5), n=2, m=4)
    past.arrays = {"indices": past.arrays["indices"].copy()}
    past.arrays["indices"][3] = 2  # window 1 of row 0 covers column 4 only: offset 2 is column 6
    with pytest.raises(ValueError, match="inside the matrix"):
        nm.check(past, full=True)


# ---------------------------------------------------------------- pruning


def prune_reference(a, n, m, vec):
    """Per (row vector, window): the n columns of largest L1 score, lower column on ties;
    a column whose score is zero holds no entry and is never kept."""
    rows, cols = a.shape
    keep = np.zeros(a.shape, bool)
    for r0 in range(0, rows, vec):
        block = np.abs(a[r0:r0 + vec].astype(np.float64)).sum(axis=0)
        for c0 in range(0, cols, m):
            cs = list(range(c0, min(c0 + m, cols)))
            chosen = [c for c in sorted(cs, key=lambda c: (-block[c], c))[:n] if block[c] > 0]
            keep[r0:r0 + vec, chosen] = True
    return keep


@pytest.mark.parametrize("n,m", NMS)
@pytest.mark.parametrize("vec", VECS)
def test_prune_keeps_largest(n, m, vec):
    rng = np.random.default_rng(n * 100 + m * 10 + vec)
    a = rng.standard_normal((23, 45)).astype(np.float32)
    a[rng.random(a.shape) < 0.2] = 0
    a[3, :] = 0  # an all-zero row: keeps nothing
    a[5, 8:24] = 1.0  # ties: lower columns win
    inst, mask = nm.prune(a, n=n, m=m, vec=vec)
    nm.check(inst, full=True)
    np.testing.assert_array_equal(mask, prune_reference(a, n, m, vec))
    assert mask.shape == a.shape and mask.dtype == bool
    assert window_counts(mask, m, vec).max() <= n
    np.testing.assert_array_equal(inst.to_dense(), np.where(mask, a, 0))
    assert inst.nnz == int(mask.sum())
    # argsort reference for the element-wise case: the kept set beats every dropped entry
    if vec == 1:
        nw = -(-45 // m)
        pad = np.full((23, nw * m), -1.0)
        pad[:, :45] = np.abs(a)
        order = np.argsort(-pad.reshape(23, nw, m), axis=-1, kind="stable")[..., :n]
        ref = np.zeros((23, nw, m), bool)
        np.put_along_axis(ref, order, True, axis=-1)
        np.testing.assert_array_equal(mask, ref.reshape(23, -1)[:, :45] & (a != 0))
    # a pruned matrix is N:M: from_matrix accepts it (kept zeros drop out of the pattern)
    again = nm.from_matrix(np.where(mask, a, 0), n=n, m=m, vec=vec)
    np.testing.assert_array_equal(again.to_dense(), inst.to_dense())


def test_prune_inputs_and_nan():
    a = np.array([[0.5, -3.0, np.nan, 1.0, 2.0, -2.0, 0.0]], np.float64)
    inst, mask = nm.prune(sp.csr_matrix(a), n=2, m=4, dtype="float32")
    assert inst.dtype == np.float32
    assert mask.tolist() == [[False, True, True, False, True, True, False]]
    with pytest.raises(TypeError):
        nm.prune(np.ones((2, 4), np.int32), n=2, m=4)
    inst, mask = nm.prune(np.ones((2, 4), np.int32), n=1, m=4, dtype="float64")
    assert mask.tolist() == [[True, False, False, False]] * 2


# ---------------------------------------------------------------- stats


def test_stats():
    a = random_nm(40, 64, 2, 8, vec=4, seed=5, fill=1.0, row_drop=0.0)
    inst = nm.from_matrix(a, n=2, m=8)
    s = nm.stats(inst)
    assert s["sparsity"] == pytest.approx(0.75)
    assert (s["n"], s["m"], s["vec"], s["windows"]) == (2, 8, 1, 8)
    assert s["stored"] == 40 * 8 * 2
    assert s["nnz"] == np.count_nonzero(a)
    assert s["padding_ratio"] == pytest.approx(s["stored"] / s["nnz"])
    assert s["slot_fill"] == pytest.approx(s["nnz"] / s["stored"])
    np.testing.assert_allclose(s["row_len_mean"], np.count_nonzero(a, axis=1).mean())
    assert s["mma_layout"] is False
    sv = nm.stats(nm.from_matrix(a, n=2, m=8, vec=4))
    assert sv["vec"] == 4 and sv["stored"] == 10 * 8 * 2 * 4


# ---------------------------------------------------------------- properties


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(0, 40), cols=st.integers(0, 40), nm_=st.sampled_from(NMS),
       vec=st.sampled_from([1, 2, 4, 8]), seed=st.integers(0, 2**31 - 1),
       dtype=st.sampled_from([np.float16, np.float32, np.float64]))
def test_property_round_trip(rows, cols, nm_, vec, seed, dtype):
    n, m = nm_
    a = random_nm(rows, cols, n, m, vec, seed=seed, dtype=dtype)
    inst = nm.from_matrix(a, n=n, m=m, vec=vec)
    nm.check(inst, full=True)
    np.testing.assert_array_equal(inst.to_dense(), a)
    pruned, mask = nm.prune(np.random.default_rng(seed).standard_normal((rows, cols)), n=n, m=m, vec=vec)
    nm.check(pruned, full=True)
    assert window_counts(mask, m, vec).max(initial=0) <= n
    assert int(mask.sum()) == pruned.nnz


# ---------------------------------------------------------------- 2:4 hardware layout


def random_24(rows, cols, seed, dtype=np.float16):
    return random_nm(rows, cols, 2, 4, seed=seed, dtype=dtype, fill=0.9, row_drop=0.1)


def test_meta_offsets_match_torch():
    torch = pytest.importorskip("torch")
    from torch.sparse._semi_structured_conversions import _calculate_meta_reordering_scatter_offsets as ref

    for rows, ncols in [(32, 2), (32, 4), (64, 6), (96, 8)]:
        want = ref(rows, ncols, torch.int16, "cpu").numpy().reshape(rows, ncols)
        np.testing.assert_array_equal(nm._meta_offsets(rows, ncols), want)


@pytest.mark.parametrize("shape", [(32, 32), (32, 64), (64, 128), (96, 96)])
def test_mma_decode_encode(shape):
    for seed in range(3):
        a = random_24(*shape, seed)
        vals, meta = nm.encode_mma(a)
        assert vals.shape == (shape[0], shape[1] // 2) and vals.dtype == np.float16
        assert meta.shape == (shape[0], shape[1] // 16) and meta.dtype == np.int16
        np.testing.assert_array_equal(nm.decode_mma(vals, meta, shape).view(np.uint16), a.view(np.uint16))


@pytest.mark.parametrize("shape", [(32, 64), (64, 128), (128, 192)])
def test_mma_matches_torch(shape):
    torch = pytest.importorskip("torch")
    from torch.sparse._semi_structured_conversions import sparse_semi_structured_from_dense_cutlass as ref

    for seed in range(3):
        a = random_24(*shape, seed)
        a[0, :4] = [0, 0, 0, 0]  # every fewer-than-two pattern of one group
        a[1, :16] = [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1]
        inst = nm.from_matrix(a, n=2, m=4)
        assert nm.mma_skip_reason(inst) is None
        nm.check(inst, full=True)
        vals, meta = ref(torch.from_numpy(a))  # pure-torch code, runs on CPU
        np.testing.assert_array_equal(inst.arrays["mma_values"].view(np.uint16), vals.numpy().view(np.uint16))
        np.testing.assert_array_equal(inst.arrays["mma_meta"], meta.numpy())
        # the same for a pruned dense matrix (kept zeros included)
        d = np.random.default_rng(seed).standard_normal(shape).astype(np.float16)
        d[d.__abs__() < 0.3] = 0
        p, _ = nm.prune(d, n=2, m=4)
        vals, meta = ref(torch.from_numpy(p.to_dense()))
        np.testing.assert_array_equal(p.arrays["mma_values"].view(np.uint16), vals.numpy().view(np.uint16))
        np.testing.assert_array_equal(p.arrays["mma_meta"], meta.numpy())


def test_mma_skipped_when_not_applicable():
    a = random_24(64, 128, 0)
    assert "mma_meta" not in nm.from_matrix(a[:40], n=2, m=4).arrays  # rows not a multiple of 32
    assert "mma_meta" not in nm.from_matrix(a[:, :80], n=2, m=4).arrays  # cols not a multiple of 64
    assert "mma_meta" not in nm.from_matrix(a.astype(np.float32), n=2, m=4).arrays
    assert "mma_meta" not in nm.from_matrix(random_nm(64, 128, 2, 4, vec=2), n=2, m=4, vec=2).arrays
    assert "mma_meta" not in nm.from_matrix(random_nm(64, 128, 1, 4, dtype=np.float16), n=1, m=4).arrays
    assert "mma_meta" not in nm.from_matrix(random_nm(64, 128, 2, 8, dtype=np.float16), n=2, m=8).arrays
    assert "cols a multiple of 64" in nm.mma_skip_reason(nm.from_matrix(a[:, :80], n=2, m=4))
    with pytest.raises(ValueError, match="more than N=2"):
        nm.encode_mma(np.ones((32, 32), np.float16))
    with pytest.raises(ValueError, match="cols % 32"):
        nm.encode_mma(np.zeros((32, 48), np.float16))
    with pytest.raises(ValueError, match="rows % 32"):
        nm.encode_mma(np.zeros((16, 32), np.float16))


def test_mma_stale_arrays_detected():
    inst = nm.from_matrix(random_24(32, 64, 1), n=2, m=4)
    stale = inst.with_data(inst.data * 2)
    with pytest.raises(ValueError, match="stale"):
        nm.check(stale, full=True)
