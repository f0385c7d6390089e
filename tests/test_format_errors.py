"""Every bad input named in the validation spec: right exception type, useful message."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from sparsec.formats import as_csr, bsr, convert, csr, ell, make_format, module_for

F32 = np.float32


def raw(data, indices, indptr):
    return (np.asarray(data, F32), np.asarray(indices, np.int32), np.asarray(indptr, np.int32))


# ------------------------------------------------------------ column indices


def test_column_out_of_range_raw():
    t = raw([1, 2, 3, 4], [0, 1, 3, 7], [0, 1, 2, 4])
    with pytest.raises(ValueError, match=r"column index 7 in row 2 is out of range: should be in \[0, 5\)"):
        csr.from_matrix(t, shape=(3, 5))


def test_negative_column_raw():
    t = raw([1, 2], [0, -1], [0, 1, 2])
    with pytest.raises(ValueError, match=r"column index -1 in row 1 is out of range: should be in \[0, 5\)"):
        convert(t, "ell", shape=(2, 5))


def test_column_out_of_range_scipy():
    m = sp.csr_matrix((np.ones(2, F32), np.array([0, 1], np.int32), np.array([0, 1, 2], np.int32)), shape=(2, 5))
    m.indices[1] = 9  # corrupted after construction: scipy does not rescan
    with pytest.raises(ValueError, match=r"column index 9 in row 1 is out of range"):
        bsr.from_matrix(m, block=(2, 2))


def test_coo_index_out_of_range():
    with pytest.raises(ValueError, match=r"column index 5 in row 1 is out of range: should be in \[0, 5\)"):
        as_csr((np.ones(2, F32), (np.array([0, 1]), np.array([0, 5]))), shape=(2, 5))
    with pytest.raises(ValueError, match=r"row index 2 at position 1 is out of range: should be in \[0, 2\)"):
        as_csr((np.ones(2, F32), (np.array([0, 2]), np.array([0, 1]))), shape=(2, 5))


def test_unsorted_columns_are_canonicalised_not_rejected():
    inst = csr.from_matrix(raw([1, 2, 3], [3, 1, 0], [0, 3]), shape=(1, 4))
    assert inst.arrays["indices"].tolist() == [0, 1, 3] and inst.data.tolist() == [3, 2, 1]


def test_duplicate_columns_raw_rejected():
    t = raw([1, 2, 3, 4], [0, 2, 1, 1], [0, 2, 4])
    with pytest.raises(ValueError, match=r"row 1 should hold each column once, got column index 1 twice"):
        csr.from_matrix(t, shape=(2, 3))


def test_duplicate_columns_raw_rejected_even_when_unsorted():
    t = raw([1, 2, 3], [2, 0, 2], [0, 3])
    with pytest.raises(ValueError, match=r"row 0 should hold each column once"):
        ell.from_matrix(t, shape=(1, 3))


def test_duplicate_columns_scipy_summed():
    m = sp.csr_matrix((np.array([1, 2, 4], F32), np.array([1, 1, 0]), np.array([0, 2, 3])), shape=(2, 2))
    inst = csr.from_matrix(m)
    assert inst.nnz == 2 and inst.data.tolist() == [3, 4]


# ------------------------------------------------------------ indptr


@pytest.mark.parametrize("indptr, match", [
    ([0, 2, 1, 3], r"indptr should be non-decreasing, got indptr\[2\] = 1 < indptr\[1\] = 2 \(row 1"),
    ([0, 1, 3], r"indptr has 3 entries, should be rows \+ 1 = 4"),
    ([0, 1, 2, 3, 3], r"indptr has 5 entries, should be rows \+ 1 = 4"),
    ([1, 1, 2, 3], r"indptr should start at 0, got 1"),
    ([0, 1, 2, 2], r"indptr should end at nnz = len\(indices\) = 3, got 2"),
    ([0, 1, 2, 4], r"indptr should end at nnz = len\(indices\) = 3, got 4"),
])
def test_bad_indptr(indptr, match):
    with pytest.raises(ValueError, match=match):
        csr.from_matrix(raw([1, 2, 3], [0, 1, 2], indptr), shape=(3, 3))


def test_bad_indptr_scipy_csc():
    m = sp.csc_matrix((np.ones(2, F32), np.array([0, 1], np.int32), np.array([0, 1, 2], np.int32)), shape=(2, 2))
    m.indptr[1] = 3
    with pytest.raises(ValueError, match=r"indptr should be non-decreasing.*column 1"):
        csr.from_matrix(m)


# ------------------------------------------------------------ lengths and shapes


def test_data_indices_length_mismatch():
    t = (np.ones(4, F32), np.array([0, 1, 2], np.int32), np.array([0, 1, 3], np.int32))
    with pytest.raises(ValueError, match=r"data should have one value per entry of indices \(3\), got 4"):
        csr.from_matrix(t, shape=(2, 3))


def test_coo_length_mismatch():
    with pytest.raises(ValueError, match=r"col should have one entry per row index \(2\), got 3"):
        as_csr((np.ones(2, F32), (np.array([0, 1]), np.array([0, 1, 2]))), shape=(2, 3))
    with pytest.raises(ValueError, match=r"data should have one value per entry of row \(2\), got 1"):
        as_csr((np.ones(1, F32), (np.array([0, 1]), np.array([0, 1]))), shape=(2, 3))


def test_non_1d_arrays():
    with pytest.raises(ValueError, match=r"data should be 1-D, got shape \(1, 2\)"):
        csr.from_matrix((np.ones((1, 2), F32), np.array([0, 1]), np.array([0, 2])), shape=(1, 2))
    with pytest.raises(ValueError, match=r"a dense matrix should be 2-D, got shape \(3,\)"):
        csr.from_matrix(np.ones(3, F32))


@pytest.mark.parametrize("shape", [(-1, 5), (3, -2)])
def test_negative_shape(shape):
    with pytest.raises(ValueError, match=r"shape should be non-negative, got"):
        csr.from_matrix(raw([], [], [0]), shape=shape)


def test_bad_shape_forms():
    with pytest.raises(ValueError, match=r"shape should be a \(rows, cols\) pair, got \(1, 2, 3\)"):
        csr.from_matrix(raw([], [], [0, 0]), shape=(1, 2, 3))
    with pytest.raises(TypeError, match=r"shape should hold integers"):
        csr.from_matrix(raw([], [], [0, 0]), shape=(1.5, 2))


def test_tuple_needs_shape():
    with pytest.raises(ValueError, match=r"shape should be given with a tuple input"):
        csr.from_matrix(raw([1], [0], [0, 1]))


def test_shape_mismatch_with_matrix():
    with pytest.raises(ValueError, match=r"shape should match the matrix's shape \(2, 3\), got \(3, 3\)"):
        csr.from_matrix(np.ones((2, 3), F32), shape=(3, 3))


def test_unsupported_input_type():
    with pytest.raises(TypeError, match=r"matrix should be a scipy sparse matrix.*got list"):
        csr.from_matrix([[1.0, 2.0]])


# ------------------------------------------------------------ dtypes


@pytest.mark.parametrize("dtype", [np.complex64, np.int32, np.int64, np.bool_, object])
def test_unsupported_value_dtype(dtype):
    d = np.array([[1, 0], [0, 1]]).astype(dtype)
    with pytest.raises(TypeError, match=rf"value dtype should be one of float32, float64, float16, got {np.dtype(dtype).name}"):
        csr.from_matrix(d)


def test_int_scipy_values_rejected():
    m = sp.csr_matrix(np.array([[1, 0], [0, 2]], np.int64))
    with pytest.raises(TypeError, match="value dtype should be one of float32, float64, float16, got int64"):
        bsr.from_matrix(m, block=(2, 2))


def test_complex_rejected_even_with_dtype():
    m = sp.csr_matrix(np.array([[1j, 0], [0, 2]], np.complex128))
    with pytest.raises(TypeError, match="value dtype should be real"):
        csr.from_matrix(m, dtype=np.float32)


def test_unsupported_target_dtype():
    with pytest.raises(TypeError, match=r"dtype should be one of float32, float64, float16, got int8"):
        csr.from_matrix(np.eye(2, dtype=F32), dtype=np.int8)


def test_torch_unsupported_dtype():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match=r"value dtype should be one of .*got torch.int64"):
        csr.from_matrix(torch.eye(3, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"got torch.bfloat16"):
        csr.from_matrix(torch.eye(3, dtype=torch.bfloat16))
    assert csr.from_matrix(torch.eye(3, dtype=torch.bfloat16), dtype=np.float32).nnz == 3


def test_int64_indices_that_fit_are_accepted():
    t = (np.ones(2, F32), np.array([0, 4], np.int64), np.array([0, 1, 2], np.int64))
    inst = csr.from_matrix(t, shape=(2, 5))
    assert inst.arrays["indices"].dtype == np.int32 and inst.arrays["indptr"].dtype == np.int32


def test_int64_indices_that_do_not_fit_are_rejected():
    big = 2**31
    t = (np.ones(1, F32), np.array([big], np.int64), np.array([0, 1], np.int64))
    with pytest.raises(ValueError, match=r"index arrays need int64 \(nnz=1.*sparsec kernels do not support: indices are int32"):
        csr.from_matrix(t, shape=(1, big + 1))


@pytest.mark.parametrize("bad", ["indices", "indptr"])
def test_non_integer_index_dtype(bad):
    arrays = {"indices": np.array([0, 1]), "indptr": np.array([0, 1, 2])}
    arrays[bad] = arrays[bad].astype(np.float64)
    with pytest.raises(TypeError, match=rf"{bad} dtype should be an integer type \(int32 or int64\), got float64"):
        csr.from_matrix((np.ones(2, F32), arrays["indices"], arrays["indptr"]), shape=(2, 2))


# ------------------------------------------------------------ edge cases that must work


@pytest.mark.parametrize("shape", [(0, 0), (5, 0), (0, 5), (5, 7)])
@pytest.mark.parametrize("spec", ["csr", "bsr:4x4", "bsr:3x5", "ell", "ell:3"])
def test_empty_matrices(shape, spec):
    for src in (np.zeros(shape, F32), sp.csr_matrix(shape, dtype=F32),
                (np.zeros(0, F32), np.zeros(0, np.int32), np.zeros(shape[0] + 1, np.int32))):
        inst = convert(src, spec, shape=shape if isinstance(src, tuple) else None)
        module_for(inst.format).check(inst, full=True)
        assert inst.shape == shape and inst.nnz == 0
        if spec.startswith("bsr"):
            assert inst.stored == 0
        assert inst.to_scipy().shape == shape and inst.to_scipy().nnz == 0


def test_all_empty_rows_but_one_heavy():
    d = np.zeros((50, 40), F32)
    d[17] = np.arange(1, 41)
    d[3, 2] = -1
    for spec in ("csr", "bsr:4x4", "ell"):
        inst = convert(d, spec)
        np.testing.assert_array_equal(inst.to_scipy().toarray(), d)


def test_nan_and_inf_kept():
    t = raw([np.nan, np.inf, -np.inf], [0, 1, 2], [0, 3])
    for spec in ("csr", "bsr:2x2", "ell"):
        inst = convert(t, spec, shape=(1, 3))
        got = inst.to_scipy().toarray()[0]
        assert np.isnan(got[0]) and got[1] == np.inf and got[2] == -np.inf


# ------------------------------------------------------------ format parameters


def test_ell_row_too_long():
    d = np.zeros((20, 50), F32)
    d[17, :40] = 1
    with pytest.raises(ValueError, match=r"row 17 has 40 non-zeros, more than the ELL width 8; use a larger width"):
        ell.from_matrix(d, width=8)


@pytest.mark.parametrize("spec, match", [
    ("bsr:3by5", r"block should be RxC with positive integers, got '3by5'"),
    ("bsr:0x4", r"block should be RxC with positive integers, got '0x4'"),
    ("bsr:4", r"block should be RxC with positive integers, got '4'"),
    ("bsr", r"block should be RxC with positive integers, got none"),
    ("ell:abc", r"ELL width should be a positive integer, got 'abc'"),
    ("ell:0", r"ELL width should be a positive integer, got 0"),
    ("csr:4", r"csr takes no parameters"),
    ("coo", r"format family should be one of csr, bsr, ell, .*got 'coo'"),
    ("", r"format spec should be a string"),
])
def test_bad_specs(spec, match):
    with pytest.raises(ValueError, match=match):
        make_format(spec)


def test_bad_keyword_params():
    with pytest.raises(ValueError, match=r"block should be an \(r, c\) pair of positive integers, got \(0, 2\)"):
        make_format("bsr", block=(0, 2))
    with pytest.raises(ValueError, match=r"csr does not take parameters \['width'\]"):
        make_format("csr", width=3)
    with pytest.raises(ValueError, match=r"block should be given for bsr"):
        bsr.from_matrix(np.eye(2, dtype=F32))
    with pytest.raises(ValueError, match=r"ELL width should be a positive integer, got -1"):
        ell.from_matrix(np.eye(2, dtype=F32), width=-1)
