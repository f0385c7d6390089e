"""The default-format rule (formats/choose.py): CSR for mesh-regular rows, and for
moderately skewed rows at wide features; hyb for skewed rows, narrow features and SDDMM."""
import numpy as np
import scipy.sparse as sp

from sparsec.formats.choose import default_format, row_stats


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
    assert default_format("sddmm", row_stats(_matrix(np.full(300, 4)))) == "hyb"  # mdual-like
    assert default_format("sddmm", row_stats(_matrix(_skewed()))) == "hyb"


def test_other_operators_and_empty_matrices_get_csr():
    lengths = np.full(500, 8)
    lengths[3] = 1500
    assert default_format("rowsum", row_stats(_matrix(lengths))) == "csr"
    assert default_format("spmm", row_stats(sp.csr_matrix((5, 5)))) == "csr"
    assert default_format("sddmm", row_stats(sp.csr_matrix((5, 5)))) == "csr"
