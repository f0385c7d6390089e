"""SR-BCRS (Magicube's strided row-major BCRS): layout, int4 packing and shuffle, round trips, errors."""
from __future__ import annotations


import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings, strategies as st

from sparsec.formats import DenseFixed, FormatInstance, SparseVariable, convert, families, make_format
from sparsec.formats import srbcrs
from sparsec.formats.srbcrs import quantize, unpack_values

DTYPES = ("int8", "int4", "float16")
VECS = (2, 4, 8)
STRIDE = {"int8": 16, "float16": 16, "int4": 32}
RANGE = {"int8": (-128, 127), "int4": (-8, 7), "float16": (-1000, 1000)}


# ---------------------------------------------------------------- helpers


def scipy_from_instance(inst: FormatInstance) -> sp.csr_matrix:
    """The matrix from ``stored_coords`` + ``unpack_values`` (independent of base.to_scipy)."""
    rows, cols = inst.stored_coords()
    vals = unpack_values(inst)
    assert rows.size == cols.size == vals.size == inst.stored
    ok = rows >= 0
    return sp.csr_matrix((vals[ok].astype(np.float64), (rows[ok], cols[ok])), shape=inst.shape)


def reference(a: np.ndarray, V: int, dtype: str):
    """Magicube's host-side build (spmm_benchmark.cpp), written with plain loops:
    (indptr, indices, row_offsets, data). ``a`` is dense without explicit zeros."""
    S = STRIDE[dtype]
    M, N = a.shape
    mv = -(-M // V)
    indptr, ro, idx, vecs = [0], [], [], []
    for g in range(mv):
        block = a[g * V:(g + 1) * V]
        cols = sorted(set(np.nonzero(block)[1].tolist()))
        n = len(cols)
        pad = -(-n // S) * S
        ro += [indptr[-1], indptr[-1] + n]
        cs = cols + [-1] * (pad - n)
        if dtype == "int4":  # aligned_col_indices_shuffle[i*8 + (j%2)*4 + j/2] = aligned_col_indices[i*8 + j]
            sh = [None] * pad
            for i in range(pad // 8):
                for j in range(8):
                    sh[i * 8 + (j % 2) * 4 + j // 2] = cs[i * 8 + j]
            cs = sh
        for c in cs:
            idx.append(c)
            vecs.append([a[g * V + ii, c] if c >= 0 and g * V + ii < M else 0 for ii in range(V)])
        indptr.append(indptr[-1] + pad)
    out = []
    for k in range(len(vecs) // S):  # dst[v*stride + j] = src[j*V + v] per chunk
        for ii in range(V):
            for j in range(S):
                out.append(vecs[k * S + j][ii])
    if dtype == "int4":
        data = np.array([(int(out[2 * i]) & 15) | ((int(out[2 * i + 1]) & 15) << 4) for i in range(len(out) // 2)],
                        dtype=np.uint8).view(np.int8)
    else:
        data = np.array(out, dtype=np.int8 if dtype == "int8" else np.float16)
    return (np.array(indptr, np.int32), np.array(idx, np.int32).reshape(-1), np.array(ro, np.int32).reshape(-1),
            data)


def int_matrix(m, n, density, seed, lo=-8, hi=7, empty_rows=0.0):
    rng = np.random.default_rng(seed)
    a = rng.integers(lo, hi + 1, size=(m, n)).astype(np.float64)
    a[a == 0] = 1
    a *= rng.random((m, n)) < density
    if empty_rows and m:
        a[rng.random(m) < empty_rows] = 0
    return a


def empty_vector_rows(m, n, seed):
    """Rows 8..23 (whole vector rows for V = 2, 4, 8) and every third row empty."""
    a = int_matrix(m, n, 0.3, seed)
    a[8:24] = 0
    a[::3] = 0
    return a


def dominant_row(m, n, seed):
    rng = np.random.default_rng(seed)
    a = np.zeros((m, n))
    a[3] = rng.integers(1, 8, size=n)
    a[m - 1, 0] = -5
    return a


MATRICES = {
    "random_37x53": lambda: int_matrix(37, 53, 0.15, 1),
    "empty_rows_101x67": lambda: int_matrix(101, 67, 0.1, 2, empty_rows=0.4),
    "empty_vector_rows_43x71": lambda: empty_vector_rows(43, 71, 3),
    "dominant_row_9x200": lambda: dominant_row(9, 200, 4),
    "dense_13x45": lambda: int_matrix(13, 45, 1.0, 5),
    "empty_0x0": lambda: np.zeros((0, 0)),
    "empty_5x0": lambda: np.zeros((5, 0)),
    "empty_0x5": lambda: np.zeros((0, 5)),
    "nnz0_5x7": lambda: np.zeros((5, 7)),
}


def assert_layout(inst, a, V, dtype):
    srbcrs.check(inst, full=True)
    indptr, indices, ro, data = reference(a, V, dtype)
    np.testing.assert_array_equal(inst.arrays["indptr"], indptr)
    np.testing.assert_array_equal(inst.arrays["indices"], indices)
    np.testing.assert_array_equal(inst.arrays["row_offsets"], ro)
    assert inst.data.dtype == data.dtype
    np.testing.assert_array_equal(inst.data, data)
    np.testing.assert_array_equal(scipy_from_instance(inst).toarray(), a)


# ---------------------------------------------------------------- declaration and specs


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("V", VECS)
def test_declaration(V, dtype):
    f = make_format(f"srbcrs:v{V},{dtype}")
    assert f.axes == (DenseFixed("io", dim=0, scale=V),
                      SparseVariable("j", dim=1, indptr="indptr", indices="indices", padded=True),
                      DenseFixed("ii", dim=0, extent=V))
    assert f.params == (("vec", V), ("dtype", dtype))
    assert f.value_chunk == STRIDE[dtype]
    assert f.value_bits == (4 if dtype == "int4" else 0)
    assert f.runtime_extent_axes() == ("io",)
    assert f.index_array_names() == ("indptr", "indices")
    assert f.spec == f"srbcrs:{V},{dtype}"
    assert make_format(f.spec) == f == make_format("srbcrs", vec=V, dtype=dtype) == srbcrs.declare(V, dtype)
    assert make_format(f"srbcrs:{dtype},v{V}") == f
    assert make_format(f"srbcrs:v{V}", dtype=dtype) == f
    assert srbcrs.stride_of(dtype) == STRIDE[dtype]


def test_registry_and_aliases():
    assert "srbcrs" in [n for n, _ in families()]
    assert make_format("SRBCRS: V8 , FP16") == make_format("srbcrs:v8,float16")
    assert make_format("srbcrs:v4,i4") == make_format("srbcrs:4,int4")
    assert srbcrs.parse_spec(None) == {"vec": None, "dtype": None}
    assert srbcrs.parse_spec("v2") == {"vec": 2, "dtype": None}
    assert srbcrs.declare(np.int64(8), np.int8).params == (("vec", 8), ("dtype", "int8"))


@pytest.mark.parametrize("spec, match", [
    ("srbcrs:v3,int8", "vec"), ("srbcrs:v16,int8", "vec"), ("srbcrs:v8,int16", "should be"),
    ("srbcrs:v8,float32", "should be"), ("srbcrs:v8,v4", "once"), ("srbcrs:int8,int4", "once"),
    ("srbcrs", "vec"), ("srbcrs:v8", "dtype"), ("srbcrs:int8", "vec"),
])
def test_bad_specs(spec, match):
    with pytest.raises(ValueError, match=match):
        make_format(spec)


def test_bad_params():
    for vec in (3, 0, 16, True, 2.0, "8", None):
        with pytest.raises(ValueError, match="vec"):
            srbcrs.declare(vec, "int8")
    for dtype in ("float32", np.float32, "int16", "bfloat16", None, 8):
        with pytest.raises(ValueError, match="dtype"):
            srbcrs.declare(8, dtype)
    a = int_matrix(10, 10, 0.3, 0)
    with pytest.raises(ValueError, match="dtype"):
        srbcrs.from_matrix(a, vec=8)  # dtype is required
    with pytest.raises(ValueError, match="vec"):
        srbcrs.from_matrix(a, dtype="int8")
    with pytest.raises(ValueError, match="vec"):
        srbcrs.from_matrix(a, vec=5, dtype="int8")
    with pytest.raises(ValueError, match="does not take"):
        make_format("srbcrs:v8,int8", width=3)


# ---------------------------------------------------------------- round trips and layout


@pytest.mark.parametrize("name", sorted(MATRICES))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("V", VECS)
def test_round_trip(V, dtype, name):
    a = MATRICES[name]()
    inst = convert(sp.csr_matrix(a), f"srbcrs:v{V},{dtype}")
    assert inst.shape == a.shape and inst.nnz == np.count_nonzero(a)
    assert inst.value_dtype == dtype
    assert inst.root_extent() == -(-a.shape[0] // V)
    assert inst.extents() == {"io": -(-a.shape[0] // V)}
    assert inst.stored == inst.arrays["indices"].size * V
    assert_layout(inst, a, V, dtype)
    # base's to_scipy: directly for int8/float16, with unpacked values for int4
    vals = unpack_values(inst)
    assert vals.dtype == (np.float16 if dtype == "float16" else np.int8) and vals.size == inst.stored
    m = inst.to_scipy(vals) if dtype == "int4" else inst.to_scipy()
    np.testing.assert_array_equal(m.toarray(), a)


@pytest.mark.parametrize("dtype", DTYPES)
def test_input_kinds(dtype):
    a = int_matrix(21, 34, 0.2, 7)
    fmt = make_format("srbcrs", vec=4, dtype=dtype)
    ref = convert(a, fmt)
    for m in (a.astype(np.int8), a.astype(np.float32), sp.coo_matrix(a), sp.csc_matrix(a.astype(np.int16))):
        inst = convert(m, fmt)
        np.testing.assert_array_equal(inst.data, ref.data)
        np.testing.assert_array_equal(inst.arrays["indices"], ref.arrays["indices"])
    r, c = np.nonzero(a)
    inst = srbcrs.from_matrix((a[r, c], (r, c)), vec=4, dtype=dtype, shape=a.shape)
    np.testing.assert_array_equal(inst.data, ref.data)


def test_padding_and_row_offsets():
    # V=4: vector row 0 (rows 0-3) holds 17 distinct columns, vector row 1 (rows 4-7) is empty,
    # vector row 2 (rows 8-9, rows 10-11 past the edge) holds 3
    a = np.zeros((10, 40))
    a[0, 0:10] = 1
    a[2, 5:17] = 2  # union with row 0: columns 0..16
    a[9, [3, 30, 39]] = -1
    for dtype, S in (("int8", 16), ("float16", 16), ("int4", 32)):
        inst = srbcrs.from_matrix(a, vec=4, dtype=dtype)
        indptr, ro = inst.arrays["indptr"], inst.arrays["row_offsets"]
        pad = 32  # 17 columns -> 2 strides of 16, or 1 of 32
        np.testing.assert_array_equal(indptr, [0, pad, pad, pad + S])
        np.testing.assert_array_equal(ro, [0, 17, pad, pad, pad, pad + 3])
        srt = srbcrs._sorted_indices(inst.arrays["indices"], dtype)
        np.testing.assert_array_equal(srt[:17], np.arange(17))
        assert np.all(srt[17:pad] == -1)
        np.testing.assert_array_equal(srt[pad:pad + 3], [3, 30, 39])
        assert np.all(srt[pad + 3:] == -1)
        assert indptr.dtype == ro.dtype == inst.arrays["indices"].dtype == np.int32
        rows, cols = inst.stored_coords()
        vals = unpack_values(inst)
        assert np.all(vals[rows < 0] == 0) and np.all(cols[rows < 0] == -1)
        assert not np.any(rows >= 10)  # rows 10, 11 are past the edge
        st_ = srbcrs.stats(inst)
        assert st_["stride"] == S and st_["V"] == 4 and st_["slots"] == pad + S and st_["column_vectors"] == 20
        assert st_["padding_ratio"] == pytest.approx(inst.stored / 25) and st_["stored"] == (pad + S) * 4
        assert st_["bytes"] == sum(x.nbytes for x in inst.arrays.values()) + inst.data.nbytes
        assert st_["row_len_max"] == 12 and st_["nnz"] == 25
    np.testing.assert_array_equal(np.diff(inst.arrays["indptr"]) % 32, 0)


def test_value_layout_by_hand():
    # V=2, int8: one vector row (rows 0, 1) with 20 column vectors -> 2 chunks of 16 slots
    a = np.zeros((2, 25))
    cols = np.arange(20) + 5  # columns 5..24, slot p holds column p + 5
    a[0, cols] = np.arange(1, 21)
    a[1, cols] = -np.arange(1, 21)
    inst = srbcrs.from_matrix(a, vec=2, dtype="int8")
    S, V = 16, 2
    assert inst.data.size == 32 * V
    for p, ii in ((0, 0), (0, 1), (3, 1), (15, 0), (15, 1), (16, 0), (16, 1), (19, 1), (20, 0), (31, 1)):
        pos = (p // S) * (S * V) + ii * S + p % S
        want = 0 if p >= 20 else a[ii, p + 5]
        assert inst.data[pos] == want, (p, ii, pos)
    # by hand: chunk 0 row 0, chunk 0 row 1, chunk 1 row 0, chunk 1 row 1
    np.testing.assert_array_equal(inst.data[:16], np.arange(1, 17))
    np.testing.assert_array_equal(inst.data[16:32], -np.arange(1, 17))
    np.testing.assert_array_equal(inst.data[32:36], [17, 18, 19, 20])
    np.testing.assert_array_equal(inst.data[36:48], 0)
    np.testing.assert_array_equal(inst.data[48:52], [-17, -18, -19, -20])
    rows, c = inst.stored_coords()
    np.testing.assert_array_equal(rows[:32], [0] * 16 + [1] * 16)
    np.testing.assert_array_equal(c[32:40], [21, 22, 23, 24, -1, -1, -1, -1])
    # float16, V=8: the value of (slot 17, row 5) sits at 1 * 128 + 5 * 16 + 1
    b = np.zeros((8, 30))
    b[:, :18] = np.arange(8)[:, None] * 100 + np.arange(18)[None, :] + 1
    f = srbcrs.from_matrix(b, vec=8, dtype="float16")
    assert f.data[128 + 5 * 16 + 1] == 518 and f.data[0 * 128 + 7 * 16 + 3] == 704


def test_int4_nibbles_and_shuffle():
    # V=2: row 0 holds 1..7, -8 at columns 0..7 (and 9 more columns), row 1 holds -1..-7, 7
    a = np.zeros((2, 40))
    a[0, :8] = [1, 2, 3, 4, 5, 6, 7, -8]
    a[1, :8] = [-1, -2, -3, -4, -5, -6, -7, 7]
    a[0, [10, 11, 20]] = [3, -3, 6]
    inst = srbcrs.from_matrix(a, vec=2, dtype="int4")
    assert inst.data.dtype == np.int8 and inst.data.size == 32 * 2 // 2 and inst.stored == 64
    idx = inst.arrays["indices"]
    # sorted group 0 is columns 0..7 -> stored 0,2,4,6,1,3,5,7; group 1 is 10, 11, 20, -1 x 5
    np.testing.assert_array_equal(idx[:8], [0, 2, 4, 6, 1, 3, 5, 7])
    np.testing.assert_array_equal(idx[8:16], [10, 20, -1, -1, 11, -1, -1, -1])
    assert np.all(idx[16:] == -1)
    np.testing.assert_array_equal(srbcrs.SHUFFLE_DEST, [0, 4, 1, 5, 2, 6, 3, 7])
    vals = unpack_values(inst)
    np.testing.assert_array_equal(vals[:8], a[0, idx[:8]])  # values follow their columns
    np.testing.assert_array_equal(vals[32:40], a[1, idx[:8]])
    u = inst.data.view(np.uint8)
    # byte 0: slot 0 (column 0, value 1) low nibble, slot 1 (column 2, value 3) high nibble
    assert u[0] == (1 | (3 << 4))
    # byte 3: slot 6 (column 5, value 6) low, slot 7 (column 7, value -8 = 0x8) high
    assert u[3] == (6 | (0x8 << 4))
    # row 1 starts at value slot 32 = byte 16: columns 0 and 2 hold -1 (0xF) and -3 (0xD)
    assert u[16] == (0xF | (0xD << 4))
    assert u[19] == (0xA | (0x7 << 4))  # -6 = 0xA at column 5, 7 at column 7
    # slots 8, 9 of row 0: columns 10 (3) and 20 (6)
    assert u[4] == (3 | (6 << 4))
    # the packing inverts exactly over every byte
    allv = np.arange(-8, 8, dtype=np.int8)
    pairs = np.stack(np.meshgrid(allv, allv), -1).reshape(-1)
    np.testing.assert_array_equal(srbcrs._unpack_int4(srbcrs._pack_int4(pairs)), pairs)
    assert len(set(srbcrs._pack_int4(pairs).view(np.uint8).tolist())) == 256


# ---------------------------------------------------------------- errors


def test_value_errors():
    a = int_matrix(12, 9, 0.5, 3)
    r, c = np.argwhere(a != 0)[2]
    b = a.copy()
    b[r, c] = 2.5
    msg = rf"int8 values should be integers in \[-128, 127\], got 2.5 at \(row {r}, col {c}\).*quantize"
    with pytest.raises(ValueError, match=msg):
        srbcrs.from_matrix(b, vec=4, dtype="int8")
    b[r, c] = 200
    with pytest.raises(ValueError, match="got 200.0.*quantize"):
        srbcrs.from_matrix(b, vec=4, dtype="int8")
    b[r, c] = 8
    srbcrs.from_matrix(b, vec=4, dtype="int8")
    with pytest.raises(ValueError, match=r"int4 values should be integers in \[-8, 7\], got 8.0.*bits=4"):
        srbcrs.from_matrix(b, vec=4, dtype="int4")
    b[r, c] = np.nan
    with pytest.raises(ValueError, match="got nan"):
        srbcrs.from_matrix(b, vec=4, dtype="int8")
    # float16 keeps NaN, refuses overflow
    assert np.isnan(srbcrs.from_matrix(b, vec=4, dtype="float16").to_dense()[r, c])
    b[r, c] = 1e6
    with pytest.raises(ValueError, match="float16"):
        srbcrs.from_matrix(b, vec=4, dtype="float16")
    with pytest.raises(ValueError, match="shape"):
        srbcrs.from_matrix(a, vec=4, dtype="int8", shape=(3, 3))


def test_check_catches_corruption():
    a = int_matrix(30, 50, 0.2, 9)
    for dtype in DTYPES:
        inst = srbcrs.from_matrix(a, vec=4, dtype=dtype)
        srbcrs.check(inst, full=True)

        def expect(fn, match, full=True):
            arrays = {k: v.copy() for k, v in inst.arrays.items()}
            data = fn(arrays, inst.data.copy())
            bad = FormatInstance(inst.format, inst.shape, arrays, data, inst.nnz)
            with pytest.raises((ValueError, TypeError), match=match):
                srbcrs.check(bad, full=full)

        def set_idx(k, v):
            def f(arrays, data):
                arrays["indices"][k] = v
                return data
            return f

        S = STRIDE[dtype]
        srt = srbcrs._sorted_indices(inst.arrays["indices"], dtype)
        true0 = int(inst.arrays["row_offsets"][1])
        pad_slot = true0 if dtype != "int4" else int(np.flatnonzero(inst.arrays["indices"][:S] == -1)[0])
        expect(set_idx(pad_slot, 3), "padding slots should hold column index -1")
        expect(set_idx(0, 50), "out of range")
        expect(set_idx(0, -1), "-1|out of range")
        real = int(np.flatnonzero(srt[:S] >= 0)[1])
        pos = real if dtype != "int4" else int(srbcrs.SHUFFLE_DEST[real])
        expect(set_idx(pos, int(srt[0])), "strictly increasing")
        expect(lambda ar, d: d.astype(np.float32), "value dtype should be one of")
        expect(lambda ar, d: d[:-2], "data should have", full=False)
        expect(lambda ar, d: (ar.__setitem__("row_offsets", ar["row_offsets"][:-1]), d)[1], "row_offsets has",
               full=False)
        expect(lambda ar, d: (ar.__setitem__("indptr", ar["indptr"].astype(np.int64)), d)[1], "int32", full=False)
        expect(lambda ar, d: (ar.pop("row_offsets"), d)[1], "row_offsets", full=False)
        ro_bad = lambda ar, d: (ar["row_offsets"].__setitem__(1, true0 + S), d)[1]  # noqa: E731
        expect(ro_bad, "true count")

        def nonzero_padding(arrays, data):
            rows, _ = inst.stored_coords()
            k = int(np.flatnonzero(rows < 0)[0])
            if dtype == "int4":
                data.view(np.uint8)[k // 2] |= np.uint8(1 << (4 * (k % 2)))
            else:
                data[k] = 1
            return data
        expect(nonzero_padding, "should hold 0")


def test_large_conversion_round_trips():
    """A 20000 x 3000 matrix (300k entries) converts exactly for every precision (its speed is
    measured by benchmarks/time_hyb_conversion.py-style scripts, not asserted in a test)."""
    a = sp.random(20000, 3000, density=0.005, format="csr", random_state=np.random.default_rng(0),
                  data_rvs=lambda n: np.random.default_rng(1).integers(-7, 8, n).astype(np.float64))
    a.data[a.data == 0] = 1
    for dtype in DTYPES:
        inst = srbcrs.from_matrix(a, vec=8, dtype=dtype)
        assert (scipy_from_instance(inst) != a).nnz == 0


# ---------------------------------------------------------------- quantize


def test_quantize():
    rng = np.random.default_rng(0)
    a = sp.random(40, 60, density=0.2, format="csr", random_state=rng, data_rvs=rng.standard_normal)
    for bits, dtype in ((8, "int8"), (4, "int4")):
        q, scale = quantize(a, bits)
        qmax = 2 ** (bits - 1) - 1
        assert isinstance(scale, float) and scale == pytest.approx(np.abs(a.data).max() / qmax)
        assert q.dtype == np.float32 and np.all(q.data == np.rint(q.data)) and np.abs(q.data).max() == qmax
        np.testing.assert_array_equal(q.indptr, a.indptr)  # pattern kept (explicit zeros too)
        np.testing.assert_array_equal(q.indices, a.indices)
        assert np.abs(q.toarray() * scale - a.toarray()).max() <= scale / 2 + 1e-12
        inst = convert(q, f"srbcrs:v4,{dtype}")
        np.testing.assert_array_equal(scipy_from_instance(inst).toarray(), q.toarray())
    q, scale = quantize(np.array([[0.0, 3.0], [-1.5, 0.0]]), 8)
    assert scale == 3.0 / 127
    np.testing.assert_array_equal(q.toarray(), [[0, 127], [-64, 0]])  # -63.5 rounds to even
    q, scale = quantize(sp.csr_matrix((3, 3)), 4)
    assert scale == 1.0 and q.nnz == 0
    for bits in (1, 17, 4.0, True):
        with pytest.raises(ValueError, match="bits"):
            quantize(a, bits)
    with pytest.raises(ValueError, match="finite"):
        quantize(np.array([[np.inf, 1.0]]), 8)


# ---------------------------------------------------------------- properties


@st.composite
def int_matrices(draw):
    m = draw(st.integers(0, 40))
    n = draw(st.integers(0, 70))
    density = draw(st.sampled_from([0.0, 0.05, 0.2, 0.6, 1.0]))
    seed = draw(st.integers(0, 2 ** 31))
    a = int_matrix(m, n, density, seed)
    if m and draw(st.booleans()):  # one dominant row
        a[draw(st.integers(0, m - 1))] = np.random.default_rng(seed).integers(1, 8, size=n)
    return a


@settings(max_examples=25, deadline=None)
@given(int_matrices(), st.sampled_from(VECS), st.sampled_from(DTYPES))
def test_property_matches_magicube_reference(a, V, dtype):
    inst = srbcrs.from_matrix(a, vec=V, dtype=dtype)
    assert_layout(inst, a, V, dtype)
    S = STRIDE[dtype]
    assert np.all(inst.arrays["indptr"] % S == 0)
    rows, cols = inst.stored_coords()
    assert np.all((rows >= 0) == (cols >= 0))
    ok = rows >= 0
    assert len(set(zip(rows[ok].tolist(), cols[ok].tolist()))) == int(ok.sum())  # no coordinate twice


@settings(max_examples=25, deadline=None)
@given(int_matrices(), st.sampled_from(VECS), st.sampled_from(DTYPES), st.integers(0, 2 ** 31))
def test_property_values_follow_coordinates(a, V, dtype, seed):
    """Each stored value equals the matrix entry at its stored coordinates (any value order)."""
    rng = np.random.default_rng(seed)
    lo, hi = RANGE[dtype]
    b = np.where(a != 0, rng.integers(lo, hi + 1, size=a.shape), 0).astype(np.float64)
    inst = srbcrs.from_matrix(sp.csr_matrix(b), vec=V, dtype=dtype)
    rows, cols = inst.stored_coords()
    vals = unpack_values(inst).astype(np.float64)
    ok = rows >= 0
    np.testing.assert_array_equal(vals[ok], b[rows[ok], cols[ok]])
    assert np.all(vals[~ok] == 0)
    assert inst.nnz == np.count_nonzero(b)
