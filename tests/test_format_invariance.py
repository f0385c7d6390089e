"""Format invariance: an operator's value is defined on the matrix's coordinates, so every
format family that accepts a matrix gives the CSR result (within the dtype's tolerance), on
NaN-poisoned outputs, for linear and non-linear operators alike -- library SpMM, SDDMM and
attention, and user-written row softmax, row max, row-normalised SpMM, edge softmax and edge
softmax -> SpMM (tests/dsl_ops.py). Each result is also checked against the float64
reference on the logical pattern (``sparsec.reference.evaluate``), slot by slot for sparse
outputs (0 at padding).

The matrices have empty rows, one long row (split in hyb's widest bucket), explicit zeros
(entries of the matrix: a stored 0.0 takes part in a softmax) and odd sizes. Kernels are
compiled once per (operator, format spec) and reused for every matrix in that spec.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest
import scipy.sparse as sp

import sparsec
from dsl_ops import NONLINEAR_OPS, row_softmax, rownorm_spmm
from sparsec import formats, ops, reference
from sparsec.formats import nm, rell

FEAT = 8
LIBRARY_OPS = ("spmm", "sddmm", "attention")
OPS = LIBRARY_OPS + tuple(NONLINEAR_OPS)
# family label -> how to store a matrix in it (nm: the matrix pruned to fit first)
FAMILIES = {
    "csr": "csr",
    "bsr:2x2": "bsr:2x2",
    "bsr:4x4": "bsr:4x4",
    "bsr:2x8": "bsr:2x8",
    "ell": "ell",
    "rell": "rell",
    "hyb:1:1/2/4": "hyb:1:1/2/4",  # one column range: the long row is split (rows repeat)
    "hyb:2:1/2/4": "hyb:2:1/2/4",  # two column ranges: parts add into a filled output
    "bsr+csr:4x4,0.3": "bsr+csr:4x4,0.3",
    "nm:2:4": "nm:2:4",
    "nm:2:4:v2": "nm:2:4:v2",
    "srbcrs:v4,float16": "srbcrs:v4,float16",
    "tiled:8x16": "tiled:8x16",  # tile columns above a tile's rows: the output filled first
}
MATRICES = ("edge_cases_37x53", "blocky_21x19")


def _matrix(name: str) -> sp.csr_matrix:
    """float32 CSR with empty rows, a long row and explicit zeros (a whole row of them too)."""
    rng = np.random.default_rng(7 if name.startswith("edge") else 8)
    rows, cols = (37, 53) if name.startswith("edge") else (21, 19)
    dense = np.where(rng.random((rows, cols)) < (0.08 if rows == 37 else 0.2), rng.uniform(0.1, 1.0, (rows, cols)), 0)
    dense[3] = dense[4] = 0                       # empty rows
    dense[7, ::2] = rng.uniform(0.1, 1.0, dense[7, ::2].shape)  # one long row
    if rows == 21:
        dense[8:12, 4:8] = rng.uniform(0.1, 1.0, (4, 4))  # a full block
    dense[0] = 0
    m = sp.coo_matrix(dense)
    # explicit zeros are entries: every 6th entry, and row 0 holds two zeros only
    data = np.concatenate([np.where(np.arange(m.nnz) % 6 == 0, 0.0, m.data), [0.0, 0.0]])
    r, c = np.concatenate([m.row, [0, 0]]), np.concatenate([m.col, [1, 5]])
    out = sp.csr_matrix((data.astype(np.float32), (r, c)), shape=(rows, cols))
    out.sort_indices()
    return out


@functools.lru_cache(maxsize=None)
def instance(family: str, matrix: str):
    m = _matrix(matrix)
    spec = FAMILIES[family]
    if spec.startswith("nm:"):
        n, mw, *v = (int(x.strip("v")) for x in spec[3:].split(":"))
        return formats.convert(nm.prune_stored(m, n=n, m=mw, vec=v[0] if v else 1), spec)
    if spec == "rell":
        return rell.from_matrix(m)
    return formats.convert(m, spec)


def _operator(name: str):
    return ops.get(name) if name in LIBRARY_OPS else NONLINEAR_OPS[name][0]()


_KERNELS: dict = {}


def kernel(op_name: str, A):
    """The kernel for ``A``'s format spec and dtype: every matrix in that spec reuses it."""
    key = (op_name, A.format.spec, A.value_dtype)
    if key not in _KERNELS:
        op = _operator(op_name)
        _KERNELS[key] = sparsec.compile(op, A, target="llvm", **({"feat": FEAT} if op.params() else {}))
    return _KERNELS[key]


def dense_inputs(op, A, dtype: str, seed: int):
    rng = np.random.default_rng(seed)
    row, col = op.structure()
    out = []
    for b in op.inputs():
        if not b.sparse:
            shape = tuple(A.shape[0] if a is row else A.shape[1] if a is col else FEAT for a in b.axes)
            out.append(rng.standard_normal(shape).astype(dtype))
    return out


def run(op_name: str, family: str, matrix: str, A=None):
    """(the kernel's outputs, the float64 logical reference, the instance ``A``, by default the
    matrix in the family)."""
    A = instance(family, matrix) if A is None else A
    k = kernel(op_name, A)
    op = _operator(op_name)
    dense = dense_inputs(op, A, k.dtypes.dense, seed=len(op_name) + len(matrix))
    out = k(A, *dense, poison=True)
    ref = reference.evaluate(op, A, *dense, params={"feat": FEAT} if op.params() else {}, dtype=k.dtypes.out)
    return np.asarray(out, dtype=np.float64), ref, A


def rel_err(out, ref) -> float:
    """max_rel_err, with the max identity (a row with no entries: the dtype's lowest value)
    required exactly and left out of the scale."""
    extreme = np.abs(ref) >= np.finfo(np.float32).max
    if np.any(out[extreme] != ref[extreme]):
        return float("inf")
    return reference.max_rel_err(np.where(extreme, 0, out), np.where(extreme, 0, ref))


def logical(A, out, op_name: str):
    """A result as a dense array on the matrix's coordinates (sparse outputs: per stored slot ->
    the matrix they hold), comparable across formats."""
    if _operator(op_name).outputs()[0].sparse:
        m = A.to_scipy(out)  # padding dropped
        pattern = A.to_scipy()
        return np.asarray(m.toarray(), dtype=np.float64), pattern
    return out, None


@pytest.mark.parametrize("matrix", MATRICES)
@pytest.mark.parametrize("op_name", OPS)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_matches_csr_and_logical_reference(family, op_name, matrix):
    out, ref, A = run(op_name, family, matrix)
    tol = reference.TOLERANCE[A.value_dtype] * 10  # several dependent reductions
    assert rel_err(out, ref) <= tol, f"{op_name} on {family} ({matrix}) vs the float64 logical reference"
    # CSR of the same logical matrix (nm's is the pruned one)
    csr_out, _, C = run(op_name, "csr", matrix, formats.convert(A.to_scipy(), "csr", dtype=A.value_dtype))
    mine, pattern = logical(A, out, op_name)
    theirs, csr_pattern = logical(C, csr_out, op_name)
    if pattern is not None:  # the same coordinates (explicit zeros included) whatever the format
        assert np.array_equal(pattern.indptr, csr_pattern.indptr) and np.array_equal(pattern.indices,
                                                                                    csr_pattern.indices)
    assert rel_err(mine, theirs) <= tol, f"{op_name} on {family} ({matrix}) differs from csr"


# ---------------------------------------------------------------- the cases of the issue


def test_rownorm_spmm_on_bsr_has_no_nan_in_empty_rows():
    """Empty rows sharing a block row with stored entries: the implicit zeros of the block would
    give 0 / 0 = NaN; they are padding, so the row is 0 as in scipy."""
    out, ref, A = run("rownorm_spmm", "bsr:4x4", "edge_cases_37x53")
    assert not np.isnan(out[3:5]).any() and np.all(out[3:5] == 0)
    assert rel_err(out, ref) <= 1e-5


def test_explicit_zero_counts_in_a_softmax():
    """A stored 0.0 is an entry: it takes a share of its row's softmax in every format."""
    m = sp.csr_matrix((np.array([0.0, 1.0, 2.0], np.float32), ([1, 1, 2], [0, 3, 2])), shape=(5, 6))
    expect = np.exp([0.0, 1.0]) / np.exp([0.0, 1.0]).sum()
    for spec in ("csr", "bsr:4x4", "bsr:2x8", "ell", "hyb:1:1/2"):
        A = formats.convert(m, spec)
        out = sparsec.compile(row_softmax(), A, target="llvm")(A, poison=True)
        got = A.to_scipy(out).toarray()
        np.testing.assert_allclose(got[1, [0, 3]], expect, rtol=1e-6, err_msg=spec)
        np.testing.assert_allclose(got[2, 2], 1.0, rtol=1e-6, err_msg=spec)


def test_padded_slots_of_sparse_outputs_are_zero():
    """A guarded write of a sparse output stores 0 in a padded slot (deterministic outputs)."""
    out, _, A = run("edge_softmax", "bsr:4x4", "edge_cases_37x53")
    pad = ~A.valid_slots()
    assert pad.any() and np.all(out[pad] == 0)


def test_linear_statements_read_no_slot_mask():
    """SpMM and SDDMM keep their unguarded fast path: their kernels take no slot mask."""
    A = instance("bsr:4x4", "edge_cases_37x53")
    for op_name in ("spmm", "sddmm"):
        names = [p.name for p in kernel(op_name, A).params]
        assert "valid" not in names, op_name
    assert "valid" in [p.name for p in kernel("attention", A).params]
    csr = instance("csr", "edge_cases_37x53")
    assert all(p.dtype != "uint8" for p in kernel("attention", csr).params)


def test_instance_built_without_a_mask_treats_every_slot_as_an_entry():
    """A hand-built BSR instance without the mask array: every in-range slot is a coordinate
    (the kernel gets an all-ones mask), consistent with its to_scipy."""
    A = instance("bsr:4x4", "edge_cases_37x53")
    bare = formats.FormatInstance(A.format, A.shape, {k: v for k, v in A.arrays.items() if k != "valid"},
                                  A.data, A.nnz)
    assert bare.to_scipy().nnz > A.to_scipy().nnz
    B = np.random.default_rng(0).standard_normal((A.shape[1], FEAT)).astype(np.float32)
    out = kernel("rownorm_spmm", A)(bare, B, poison=True)
    ref = reference.evaluate(rownorm_spmm(), bare, B, params={"feat": FEAT})
    assert rel_err(np.asarray(out, np.float64), ref) <= 1e-5


def test_slot_mask_is_checked():
    A = instance("bsr:2x2", "edge_cases_37x53")
    bad = formats.FormatInstance(A.format, A.shape, {**A.arrays, "valid": A.arrays["valid"][:-1]}, A.data, A.nnz)
    with pytest.raises(ValueError, match="slot mask"):
        formats.module_for(bad.format).check(bad)


def test_padding_neutral_statements():
    """lower.padding: the linear statements (a sum or sparse assignment with A as a factor, and
    SDDMM's dot before its scale by A) stay unguarded; max, exp, division, sparse temps are not."""
    from dsl_ops import edge_softmax
    from sparsec.lower.padding import neutral_iterations

    def names(op):
        return [it.name in neutral_iterations(op) for it in op.iterations]

    assert names(ops.spmm()) == [True]
    assert names(ops.sddmm()) == [True, True]
    assert names(ops.attention()) == [True, True, False, False, False]
    assert names(rownorm_spmm()) == [True, False]
    assert names(edge_softmax()) == [False, False, False, False]  # no rescale by A: the dot is guarded


@pytest.mark.parametrize("kind", ["max", "min"])
def test_float_atomic_max_min_from_integer_atomics(kind):
    """The bit trick of schedules.atomics, replayed in numpy: an integer max/min on the bits,
    chosen by the value's sign bit, gives the float max/min from the identity, -0.0 included."""
    rng = np.random.default_rng(3)
    vals = np.concatenate([rng.standard_normal(200), [0.0, -0.0, 1e-40, -1e-40, 3e38, -3e38]]).astype(np.float32)
    for order in (vals, vals[::-1], rng.permutation(vals)):
        cell = np.array([np.finfo(np.float32).min if kind == "max" else np.finfo(np.float32).max], np.float32)
        as_int, as_uint = cell.view(np.int32), cell.view(np.uint32)
        for v in order:
            bits = np.array([v], np.float32).view(np.int32)[0]
            ubits = np.array([v], np.float32).view(np.uint32)[0]
            if bits >= 0:
                as_int[0] = max(as_int[0], bits) if kind == "max" else min(as_int[0], bits)
            else:
                as_uint[0] = min(as_uint[0], ubits) if kind == "max" else max(as_uint[0], ubits)
        assert cell[0] == (order.max() if kind == "max" else order.min())
    neg_zero = np.array([np.finfo(np.float32).min], np.float32)
    neg_zero.view(np.uint32)[0] = min(neg_zero.view(np.uint32)[0], np.array([-0.0], np.float32).view(np.uint32)[0])
    assert neg_zero[0] == 0.0 and np.signbit(neg_zero[0])  # max(-FLT_MAX, -0.0) is -0.0
