"""The default-format rule: CSR for regular rows, hyb for skewed ones (formats/choose.py)."""
import numpy as np
import scipy.sparse as sp

from sparsec.formats.choose import default_format, row_stats


def _matrix(lengths, n=2000, seed=0):
    rng = np.random.default_rng(seed)
    rows = np.repeat(np.arange(len(lengths)), lengths)
    cols = np.concatenate([rng.choice(n, k, replace=False) for k in lengths])
    return sp.csr_matrix((np.ones(rows.size, np.float32), (rows, cols)), shape=(len(lengths), n))


def test_regular_rows_get_csr():
    m = _matrix(np.full(500, 8))
    assert row_stats(m)["row_len_cv"] == 0
    assert default_format("spmm", row_stats(m)) == "csr"


def test_one_long_row_gets_hyb():
    lengths = np.full(500, 8)
    lengths[3] = 1500
    assert default_format("spmm", row_stats(_matrix(lengths))) == "hyb"


def test_power_law_rows_get_hyb():
    lengths = np.minimum((np.random.default_rng(1).pareto(1.2, 800) * 3).astype(int) + 1, 1800)
    s = row_stats(_matrix(lengths))
    assert s["row_len_cv"] > 1.5
    assert default_format("spmm", s) == "hyb"


def test_sddmm_follows_the_same_rule_and_empty_matrices_get_csr():
    assert default_format("sddmm", row_stats(_matrix(np.full(10, 3)))) == "csr"
    lengths = np.full(500, 8)
    lengths[3] = 1500
    assert default_format("sddmm", row_stats(_matrix(lengths))) == "hyb"
    assert default_format("rowsum", row_stats(_matrix(lengths))) == "csr"
    assert default_format("spmm", row_stats(sp.csr_matrix((5, 5)))) == "csr"
