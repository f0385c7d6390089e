"""Property tests (hypothesis) for every format and composition: random matrices with empty
rows, an optional dominant row and sizes off every tile; the round trip to scipy is exact, and
SpMM and SDDMM on the CPU match the float64 references (float32 within 1e-5 relative, float16
within 1e-2, int8/int4 exactly with integer accumulation). The test-only DSL operators rowsum
and row_softmax (reductions over several parts) run on the composites and on N:M.

Kernels are cached per (op, format spec, feat, value dtype) for the module: a composite's spec
lists its parts, so a matrix that splits differently compiles its own kernel."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings, strategies as st

import sparsec
from sparsec import reference
from sparsec.formats import convert, nm
from sparsec.formats.composite import CompositeInstance

from dsl_ops import TEST_OPS

# no size is a multiple of any tile the formats use (2, 3, 4, 5, 8, 16, 32)
SIZES = tuple(n for n in range(1, 71) if all(n % t for t in (2, 3, 4, 5)))
FEATS = (1, 5, 16)
TOL = {"float32": 1e-5, "float16": 1e-2}
# value ranges of the integer-valued matrices (zero excluded: no explicit zeros in the source)
INT_RANGE = {"int8": (-100, 100), "int4": (-8, 7)}

PROPS = settings(max_examples=10, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# name -> (values the source matrix holds, builder). A builder returns (instance, mask): mask is
# None when the instance holds exactly the source's entries, else N:M's dense bool mask of the
# entries prune kept (the expectation is then the masked source).
def _plain(spec, **kw):
    return lambda m: (convert(m, spec, **kw), None)


def _pruned(n, m_, vec=1):
    return lambda m: nm.prune(m, n=n, m=m_, vec=vec)


def _sr(vec, dtype):
    return lambda m: (convert(m, "srbcrs", vec=vec, dtype=dtype), None)


FORMATS = {
    "csr": ("float32", _plain("csr")),
    "bsr:3x5": ("float32", _plain("bsr:3x5")),
    "ell": ("float32", _plain("ell")),
    "hyb-auto": ("float32", _plain("hyb")),
    "hyb-3-1/2/4": ("float32", _plain("hyb", col_parts=3, buckets=(1, 2, 4))),
    "bsr+csr-4x4-0.3": ("float32", _plain("bsr+csr", block=(4, 4), block_fill=0.3)),
    "nm-2:4": ("float32", _pruned(2, 4)),
    "nm-1:8": ("float32", _pruned(1, 8)),
    "nm-2:4-v4": ("float32", _pruned(2, 4, 4)),
    "nm-4:16-v2": ("float32", _pruned(4, 16, 2)),
    "tiled:16x8": ("float32", _plain("tiled:16x8")),
}
for _v in (2, 4, 8):
    for _d in ("int8", "int4", "float16"):
        FORMATS[f"srbcrs-v{_v}-{_d}"] = (_d, _sr(_v, _d))

# formats whose to_scipy may hold explicit zeros (block slots, N:M kept zeros, SR-BCRS vectors)
PADDED = ("bsr", "nm", "srbcrs")


# ---------------------------------------------------------------- matrices


@st.composite
def matrices(draw, values: str = "float32") -> sp.csr_matrix:
    """A canonical float32 CSR matrix without explicit zeros: rows and columns off every tile,
    a random density, a fraction of rows emptied and optionally one dominant (full) row, longer
    than hyb's widest bucket when the columns allow. ``values``: float32 (standard normal),
    float16 (standard normal rounded to float16), int8 / int4 (non-zero integers in range)."""
    rows = draw(st.sampled_from(SIZES))
    cols = draw(st.sampled_from(SIZES))
    density = draw(st.sampled_from([0.0, 0.05, 0.2, 0.5]))
    empty_frac = draw(st.sampled_from([0.0, 0.3, 0.8]))
    dominant = draw(st.booleans())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    mask = rng.random((rows, cols)) < density
    mask[rng.random(rows) < empty_frac] = False
    if dominant:
        mask[rng.integers(rows)] = True
    if values in INT_RANGE:
        lo, hi = INT_RANGE[values]
        v = rng.integers(lo, hi, size=(rows, cols), endpoint=True)
        v[v == 0] = 1
    else:
        v = rng.standard_normal((rows, cols))
        if values == "float16":
            v = v.astype(np.float16)
            v[v == 0] = 1
    m = sp.csr_matrix(np.where(mask, v, 0).astype(np.float32))
    m.sort_indices()
    assert m.nnz == int(mask.sum())
    return m


# ---------------------------------------------------------------- kernels

_KERNELS: dict = {}


def kernel(op: str, A, feat=None):
    key = (op, A.format.spec, feat, A.value_dtype)
    if key not in _KERNELS:
        if op in TEST_OPS:
            _KERNELS[key] = sparsec.compile(TEST_OPS[op][0](), A, target="llvm")
        else:
            _KERNELS[key] = sparsec.compile(op, A, feat=feat, target="llvm")
    return _KERNELS[key]


def dense_like(rng, shape, dtype: str) -> np.ndarray:
    """A C-contiguous dense operand. Floating-point ones are views into a buffer whose
    ``shape[-1]`` elements before and after hold NaN, so a kernel reading out of bounds (a
    padding slot's index -1: ``B[-1, k]``, ``Y[-1, 0]``) yields NaN deterministically."""
    if dtype == "int8":
        return rng.integers(-128, 127, size=shape, endpoint=True).astype(np.int8)
    n, pad = int(np.prod(shape)), max(int(shape[-1]), 1)
    buf = np.full(n + 2 * pad, np.nan, dtype=dtype)
    x = buf[pad:pad + n].reshape(shape)
    x[...] = rng.standard_normal(shape)
    assert x.flags.c_contiguous
    return x


def assert_matches(out, ref, k, scale=None):
    """Exact for integer kernels (int32 out, float64 reference of integer inputs, exact at
    these sizes); otherwise no stray NaN and within the dtype's relative tolerance. ``scale``:
    the same operator on absolute values (sum |a| |b|), the size a float sum's rounding
    grows with when its terms cancel (a result of 0.034 from terms near 1)."""
    ds = k.dtypes
    out = np.asarray(out)
    assert out.shape == ref.shape
    assert out.dtype == np.dtype(ds.out)
    if ds.exact:
        assert np.all(np.abs(ref) < 2**31)
        assert np.array_equal(out.astype(np.int64), ref.astype(np.int64)), \
            f"integer result differs at {np.argwhere(out.astype(np.int64) != ref.astype(np.int64))[:5].tolist()}"
        return
    stray = np.isnan(out) & ~np.isnan(ref)
    assert not stray.any(), f"{int(stray.sum())} NaN outputs (unwritten, or an out-of-bounds read), first at {np.argwhere(stray)[0]}"
    err = reference.max_rel_err(out, ref)
    if scale is not None and err >= TOL[ds.out]:
        bound = max(float(np.max(np.abs(ref), initial=0)), float(np.max(np.abs(scale), initial=0)))
        err = float(np.max(np.abs(out.astype(np.float64) - ref), initial=0)) / bound if bound else err
    assert err < TOL[ds.out], f"max relative error {err:.3g} >= {TOL[ds.out]:g}"


def magnitude(inst):
    """``inst`` with |values|: the operand of an error bound (see ``assert_matches``)."""
    return inst.with_data(np.abs(inst.data))


def check_round_trip(name, inst, m, mask):
    """``inst.to_scipy()`` is the source (N:M: the kept entries) exactly: same values and, with
    explicit zeros dropped, the same entries; padded formats may keep in-block zeros only."""
    got = inst.to_scipy()
    assert got.shape == m.shape
    if mask is None:
        want = m
    else:
        assert mask.shape == m.shape and mask.dtype == bool
        want = sp.csr_matrix(np.where(mask, m.toarray(), 0).astype(m.dtype))
        # every stored entry lies in the mask, and at most n of every m columns are kept
        c = got.tocoo()
        assert mask[c.row, c.col].all()
        n_, m_, vec = (int(inst.format.param(k, 1)) for k in ("n", "m", "vec"))
        rows, cols = mask.shape
        pad = np.zeros((-(-rows // vec) * vec, -(-cols // m_) * m_), bool)
        pad[:rows, :cols] = mask
        union = pad.reshape(-1, vec, pad.shape[1] // m_, m_).any(axis=1)  # a vector's rows share columns
        assert union.sum(axis=-1).max(initial=0) <= n_
    vd = inst.value_dtype
    if vd in INT_RANGE:
        assert got.dtype == np.int8
    else:
        assert got.dtype == (np.float32 if vd in ("float16", "float32") else np.dtype(vd))
    np.testing.assert_array_equal(got.toarray().astype(np.float64), want.toarray().astype(np.float64))
    if not any(name.startswith(p) for p in PADDED):
        assert got.nnz == want.nnz and inst.nnz == want.nnz
        np.testing.assert_array_equal(got.indptr, want.indptr)
        np.testing.assert_array_equal(got.indices, want.indices)
    else:
        nz = got.copy()
        nz.eliminate_zeros()
        w = want.copy()
        w.eliminate_zeros()
        np.testing.assert_array_equal(nz.indptr, w.indptr)
        np.testing.assert_array_equal(nz.indices, w.indices)


# ---------------------------------------------------------------- every format: round trip, SpMM, SDDMM


@pytest.mark.parametrize("name", list(FORMATS))
@settings(PROPS, max_examples=25)
@given(data=st.data())
def test_round_trip(name, data):
    values, build = FORMATS[name]
    m = data.draw(matrices(values), label="matrix")
    inst, mask = build(m)
    assert inst.value_dtype == values
    check_round_trip(name, inst, m, mask)
    if name.startswith("hyb-3") and m.shape[1] >= 13 and (np.diff(m.indptr) == m.shape[1]).any():
        # a full row has more than 4 entries in its first column range: split, unique=False
        assert any(not p.format.param("unique") for p in inst.parts)


@pytest.mark.parametrize("name", list(FORMATS))
@PROPS
@given(data=st.data(), feat=st.sampled_from(FEATS), seed=st.integers(0, 2**32 - 1))
def test_spmm_sddmm(name, data, feat, seed):
    values, build = FORMATS[name]
    inst, _ = build(data.draw(matrices(values), label="matrix"))
    rng = np.random.default_rng(seed)
    rows, cols = inst.shape
    k = kernel("spmm", inst, feat)
    ds = k.dtypes
    assert ds.sparse == values
    B = dense_like(rng, (cols, feat), ds.dense)
    scale = None if k.dtypes.exact else reference.spmm(magnitude(inst), np.abs(B))
    assert_matches(k(inst, B, poison=True), reference.spmm(inst, B), k, scale)

    X, Y = dense_like(rng, (rows, feat), ds.dense), dense_like(rng, (cols, feat), ds.dense)
    k = kernel("sddmm", inst, feat)
    out = k(inst, X, Y, poison=True)
    assert out.shape == (inst.stored,)
    scale = None if k.dtypes.exact else reference.sddmm(magnitude(inst), np.abs(X), np.abs(Y))
    assert_matches(out, reference.sddmm(inst, X, Y), k, scale)
    assert np.all(out[~inst.valid_slots()] == 0)  # padding slots are written with 0


# ---------------------------------------------------------------- reductions over several parts


REDUCTION_FORMATS = ("hyb-auto", "hyb-3-1/2/4", "bsr+csr-4x4-0.3", "nm-2:4", "nm-2:4-v4")


@pytest.mark.parametrize("op", list(TEST_OPS))
@pytest.mark.parametrize("name", REDUCTION_FORMATS)
@PROPS
@given(m=matrices("float32"))
def test_dsl_reductions(op, name, m):
    """rowsum (a fill, then additions from every part) and row_softmax (a max reduction, a
    sum, then a sparse output; over a hyb instance with split rows the max runs over repeated
    rows, serially on the CPU)."""
    inst, _ = FORMATS[name][1](m)
    if isinstance(inst, CompositeInstance) and name.startswith("hyb"):
        assert len(inst.parts) >= 1
    out = kernel(op, inst)(inst, poison=True)
    ref = TEST_OPS[op][1](inst)
    out = np.asarray(out)
    assert out.shape == ref.shape and out.dtype == np.float32
    stray = np.isnan(out) & ~np.isnan(ref)
    assert not stray.any(), f"{int(stray.sum())} NaN outputs, first at {np.argwhere(stray)[0]}"
    if op == "rowsum":  # a sum that cancels: float32 rounding is bounded by the sum of magnitudes
        bound = float(np.max(TEST_OPS[op][1](magnitude(inst)), initial=0))
        err = float(np.max(np.abs(out.astype(np.float64) - ref), initial=0)) / bound if bound else 0.0
    else:
        err = reference.max_rel_err(out, ref)
    assert err < 1e-5, f"max relative error {err:.3g}"


def test_auto_hyb_split_row_every_op():
    """The automatic hyb split of a matrix with short rows and one full row: the full row is
    split over several ELL rows of the widest bucket (unique=False), and SpMM, SDDMM, rowsum and
    row_softmax (a max over repeated rows, serial on the CPU) all match the references.
    (Random matrices reach this case rarely: the automatic widest bucket follows the 99th
    percentile of the row lengths.)"""
    rng = np.random.default_rng(7)
    rows, cols = 211, 61  # > 100 non-empty rows: the 99th percentile is not the full row
    mask = rng.random((rows, cols)) < 0.04
    mask[rng.random(rows) < 0.3] = False
    mask[131] = True
    m = sp.csr_matrix(np.where(mask, rng.standard_normal((rows, cols)), 0).astype(np.float32))
    inst = convert(m, "hyb")
    widest = max(inst.format.param("buckets"))
    assert widest < cols
    dup = [p for p in inst.parts if not p.format.param("unique")]
    assert len(dup) == 1 and np.count_nonzero(dup[0].arrays["row_ids"] == 131) == -(-cols // widest)
    check_round_trip("hyb", inst, m, None)
    for feat in FEATS:
        B = dense_like(rng, (cols, feat), "float32")
        assert_matches(kernel("spmm", inst, feat)(inst, B, poison=True), reference.spmm(inst, B),
                       kernel("spmm", inst, feat))
        X, Y = dense_like(rng, (rows, feat), "float32"), dense_like(rng, (cols, feat), "float32")
        k = kernel("sddmm", inst, feat)
        assert_matches(k(inst, X, Y, poison=True), reference.sddmm(inst, X, Y), k)
    for op, (_, ref) in TEST_OPS.items():
        out = np.asarray(kernel(op, inst)(inst, poison=True))
        assert not np.isnan(out).any()
        assert reference.max_rel_err(out, ref(inst)) < 1e-5
