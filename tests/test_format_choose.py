"""The default-format rule (formats/choose.py): CSR for mesh-regular rows, and for
moderately skewed rows at wide features; hyb for skewed rows, narrow features and SDDMM.
Also: the one row-statistics implementation (formats.stats) and the one canonical CSR
(formats.convert.canonical_csr) give the numbers and record signatures they gave before."""
import numpy as np
import pytest
import scipy.sparse as sp

from sparsec.formats.choose import SDDMM_HYB, default_format, row_stats


def _matrix(lengths, n=2000, seed=0):
    rng = np.random.default_rng(seed)
    rows = np.repeat(np.arange(len(lengths)), lengths)
    cols = np.concatenate([rng.choice(n, k, replace=False) for k in lengths])
    return sp.csr_matrix((np.ones(rows.size, np.float32), (rows, cols)), shape=(len(lengths), n))


def _skewed(seed=3):
    """Row lengths with a coefficient of variation near 1 and no row over 300."""
    return np.minimum(np.random.default_rng(seed).exponential(8, 800).astype(int) + 1, 250)


def test_mesh_rows_get_csr_at_every_width():
    m = _matrix(np.full(500, 8))
    assert row_stats(m)["row_len_cv"] == 0
    for feat in (32, 128, 512, None):
        assert default_format("spmm", row_stats(m), feat) == "csr"


def test_moderate_skew_depends_on_the_feature_width():
    s = row_stats(_matrix(_skewed()))
    assert 0.5 < s["row_len_cv"] <= 1.5 and s["row_len_max"] <= 300
    assert default_format("spmm", s, 32) == "hyb"
    assert default_format("spmm", s, 64) == "hyb"
    assert default_format("spmm", s, 128) == "csr"
    assert default_format("spmm", s) == "csr"


def test_one_long_row_gets_hyb():
    lengths = np.full(500, 8)
    lengths[3] = 1500
    assert default_format("spmm", row_stats(_matrix(lengths)), 512) == "hyb"


def test_power_law_rows_get_hyb():
    lengths = np.minimum((np.random.default_rng(1).pareto(1.2, 800) * 3).astype(int) + 1, 1800)
    s = row_stats(_matrix(lengths))
    assert s["row_len_cv"] > 1.5
    assert default_format("spmm", s, 256) == "hyb"


def test_sddmm_takes_csr_only_on_long_mesh_rows():
    assert default_format("sddmm", row_stats(_matrix(np.full(300, 12)))) == "csr"
    assert default_format("sddmm", row_stats(_matrix(np.full(300, 4)))) == SDDMM_HYB  # mdual-like
    assert default_format("sddmm", row_stats(_matrix(_skewed()))) == SDDMM_HYB


def test_sddmm_hyb_cuts_rows_in_pieces_of_four_and_keeps_every_entry():
    """The SDDMM default's hyb: every row piece holds at most four entries (an entry is its
    own output, so a cut row needs no atomics), the matrix unchanged; the tuner's untuned
    candidate is the same format."""
    from sparsec import formats
    from sparsec.formats import hyb
    from sparsec.tune.space import Space

    m = _matrix(_skewed())
    inst = formats.convert(m, default_format("sddmm", row_stats(m)))
    assert inst.format.name == "hyb"
    assert max(hyb.parse_spec(inst.format.spec.partition(":")[2])["buckets"]) == 4
    np.testing.assert_array_equal(inst.to_scipy().toarray(), m.toarray())
    d = Space("sddmm", m, 32).default
    assert d["format"] == "hyb" and d["format_knobs"]["buckets"] == "1/2/4"


def test_other_operators_and_empty_matrices_get_csr():
    lengths = np.full(500, 8)
    lengths[3] = 1500
    assert default_format("rowsum", row_stats(_matrix(lengths))) == "csr"
    assert default_format("spmm", row_stats(sp.csr_matrix((5, 5)))) == "csr"
    assert default_format("sddmm", row_stats(sp.csr_matrix((5, 5)))) == "csr"


# ------------------------------------------------- one row-statistics function, one canonical CSR


def _seven_by_nine(dtype=np.float32):
    """7 x 9, rows of 5, 5, 5, 5, 0, 4, 5 entries (29 in all), values in -5..1."""
    d = ((np.arange(63).reshape(7, 9) * 7) % 11 - 5).astype(dtype)
    d[d > 1] = 0
    d[4] = 0
    return d


# computed by the separate implementations these replaced (formats.choose.row_stats,
# tune.signature.matrix_stats and matrix_signature before they shared formats.stats and
# formats.convert.canonical_csr): the numbers and the record signatures must not move
BEFORE = {"rows": 7, "cols": 9, "nnz": 29, "density": 0.4603174603174603, "row_len_mean": 4.142857142857143,
          "row_len_p50": 5.0, "row_len_p90": 5.0, "row_len_p99": 5.0, "row_len_max": 5.0,
          "row_len_cv": 0.41665675771015764, "empty_row_frac": 0.14285714285714285,
          "col_span_mean": 0.8703703703703703, "block_fill_4": 0.3625, "block_fill_16": 0.11328125,
          "block_fill_32": 0.0283203125}
SIGNATURES = {"seven_by_nine": "m-90f343891d2cdc78", "uniform-37x53": "m-0a328c106d498270",
              "powerlaw-129x250": "m-4393dcc10a36435f", "empty-7x5": "m-791232d8706983a8"}


@pytest.mark.parametrize("make", [lambda: sp.csr_matrix(_seven_by_nine()),
                                  lambda: sp.coo_matrix(_seven_by_nine(np.float64)),
                                  lambda: sp.csr_matrix(_seven_by_nine().astype(np.int64)),
                                  lambda: _seven_by_nine()],
                         ids=["csr-f32", "coo-f64", "csr-int64", "dense"])
def test_stats_and_signature_as_before(make):
    from sparsec.formats.stats import matrix_stats as formats_matrix_stats
    from sparsec.tune.signature import matrix_signature, matrix_stats

    assert matrix_stats is formats_matrix_stats  # one implementation, still importable from the tuner
    m = make()
    s = matrix_stats(m)
    assert s == BEFORE and list(s) == list(BEFORE)
    assert all(type(v) is type(BEFORE[k]) for k, v in s.items())  # JSON-ready plain ints and floats
    assert row_stats(m) == {k: BEFORE[k] for k in list(BEFORE)[:11]}
    assert matrix_signature(m) == SIGNATURES["seven_by_nine"]


def test_signatures_of_test_matrices_as_before():
    from conftest import make_matrix
    from sparsec.tune.signature import matrix_signature

    assert matrix_signature(make_matrix("uniform", 37, 53, seed=3)) == SIGNATURES["uniform-37x53"]
    assert matrix_signature(make_matrix("powerlaw", 129, 250, seed=3)) == SIGNATURES["powerlaw-129x250"]
    assert matrix_signature(sp.csr_matrix((7, 5))) == SIGNATURES["empty-7x5"]


@pytest.mark.parametrize("spec", ["csr", "ell", "bsr:3x5", "hyb", "rell"])
def test_format_stats_share_the_row_statistics(spec):
    """A converted matrix's row_len_* numbers are the source matrix's row_stats."""
    from conftest import make_matrix
    from sparsec.formats import convert, module_for

    m = make_matrix("powerlaw", 129, 250, seed=3)
    inst = convert(m, spec)
    s, r = module_for(inst.format).stats(inst), row_stats(m)
    for key in ("row_len_mean", "row_len_max", "row_len_cv", "nnz", "rows", "cols", "density"):
        assert s[key] == pytest.approx(r[key], rel=1e-12), key
    q = np.quantile(np.diff(m.indptr), [0.5, 0.9, 0.99])
    assert (s["row_len_p50"], s["row_len_p90"], s["row_len_p99"]) == tuple(float(v) for v in q)


def test_one_canonical_csr():
    from sparsec.formats import as_csr
    from sparsec.formats.convert import Canonical, canonical_csr
    from sparsec.tune.features import MatrixContext
    from sparsec.tune import signature

    d = _seven_by_nine()
    unsorted = sp.csr_matrix(d)
    order = np.concatenate([np.arange(unsorted.indptr[i], unsorted.indptr[i + 1])[::-1] for i in range(7)])
    unsorted = sp.csr_matrix((unsorted.data[order], unsorted.indices[order], unsorted.indptr), shape=(7, 9))
    c = canonical_csr(unsorted)
    assert isinstance(c, Canonical) and canonical_csr(c) is c
    s = c.scipy()
    assert s.has_canonical_format and s.indices.dtype == np.int32 and np.array_equal(s.toarray(), d)
    assert (as_csr(unsorted) != s).nnz == 0 and np.array_equal(as_csr(unsorted).indices, s.indices)
    assert (MatrixContext(unsorted).csr != s).nnz == 0  # the tuner's matrix is the same canonical CSR
    assert getattr(signature, "canonical_csr", canonical_csr) is canonical_csr  # no second one
    half = canonical_csr(sp.csr_matrix(d), dtype=np.float16)
    assert half.data.dtype == np.float16 and half.scipy().dtype == np.float32
    with pytest.raises(ValueError, match=r"shape should match the matrix's shape \(7, 9\)"):
        canonical_csr(c, shape=(9, 7))
    assert canonical_csr(c, dtype=np.float64).data.dtype == np.float64


def test_statistics_read_integer_matrices_that_conversion_refuses():
    from sparsec.formats.convert import canonical_csr

    ints = sp.csr_matrix(_seven_by_nine().astype(np.int32))
    with pytest.raises(TypeError, match="value dtype should be one of"):
        canonical_csr(ints)
    assert canonical_csr(ints, any_real=True).data.dtype == np.float64
    assert row_stats(ints)["row_len_cv"] == BEFORE["row_len_cv"]


@pytest.mark.parametrize("shape, density", [((1001, 999), 0.05), ((5, 3), 0.5), ((0, 7), 0.0), ((3000, 17), 0.2),
                                            ((64, 4096), 0.01)])
def test_block_counts_match_a_count_by_hand(shape, density):
    """formats.stats.block_counts (scipy's csr_count_blocks) counts the distinct b x b blocks
    holding an entry, explicit zeros included and edge blocks whole, as the sorting way and
    a count of distinct (row // b, col // b) pairs do."""
    from sparsec.formats.stats import _block_counts_by_coarsening, block_counts

    m = sp.random(*shape, density=density, format="csr", random_state=4) if shape[0] else sp.csr_matrix(shape)
    if m.nnz:
        m.data[::3] = 0.0  # explicit zeros still occupy their blocks
    m.sum_duplicates()
    sizes = (2, 4, 8, 16, 32)
    got = block_counts(m.indptr, m.indices, m.shape[1], sizes)
    coo = m.tocoo()
    assert got == {b: len(set(zip((coo.row // b).tolist(), (coo.col // b).tolist()))) for b in sizes}
    assert got == _block_counts_by_coarsening(m.indptr, m.indices, m.shape[1], sizes)
