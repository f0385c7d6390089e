"""Dense iterations in an operator (no sparse structure: the row axis over 0..rows, the column
axis over 0..cols, dense axes) and their fusion: SpMM + bias + ReLU on every format family,
transform-then-aggregate (H = X @ W once per column, then SpMM of H), a row normalisation,
an in-place ReLU, a dense-only iteration; every kernel on NaN-poisoned outputs against a
float64 numpy formula written here (and ``reference.evaluate``); the CUDA launches they
compile to; the refusals that remain."""
from __future__ import annotations

import re

import numpy as np
import pytest
import scipy.sparse as sp

import sparsec
from sparsec import dsl, formats
from sparsec.lower import lower_program
from sparsec.reference import evaluate, max_rel_err
from tvm import s_tir, tirx

from dense_ops import dense_only, inplace_relu, l2_rows, row_normalised, spmm_bias_relu, transform_aggregate
from nvcc_tools import nvcc_sources

FEAT = 8
# one spec per format family; hyb twice: split rows (rows shared by parts) and disjoint rows
FAMILIES = ("csr", "bsr:2x2", "ell", "rell", "nm:2:4", "srbcrs:v4,float16", "hyb:1:1/2/4", "hyb:1:1/2/4/8/16",
            "bsr+csr:2x2,0.5")


def _matrix() -> sp.csr_matrix:
    """13 x 11: empty rows (3, 4), a long row (7), explicit zeros (row 0 holds only zeros)."""
    rng = np.random.default_rng(5)
    dense = np.where(rng.random((13, 11)) < 0.25, rng.uniform(-1.0, 1.0, (13, 11)), 0.0)
    dense[3] = dense[4] = dense[0] = 0
    dense[7] = rng.uniform(-1.0, 1.0, 11)
    dense[8:10, 2:4] = rng.uniform(0.1, 1.0, (2, 2))  # a full 2x2 block
    m = sp.coo_matrix(dense)
    data = np.concatenate([np.where(np.arange(m.nnz) % 5 == 0, 0.0, m.data), [0.0, 0.0]])
    r, c = np.concatenate([m.row, [0, 0]]), np.concatenate([m.col, [1, 6]])
    out = sp.csr_matrix((data, (r, c)), shape=(13, 11))
    out.sort_indices()
    return out


def instance(spec: str):
    m = _matrix()
    if spec.startswith("nm:"):
        from sparsec.formats import nm

        return formats.convert(nm.prune_stored(m.astype(np.float32), n=2, m=4), spec)
    if spec == "rell":
        from sparsec.formats import rell

        return rell.from_matrix(m.astype(np.float32))
    return formats.convert(m.astype(np.float32), spec)


def inputs(A, *shapes, seed=0):
    rng = np.random.default_rng(seed)
    dtype = np.float16 if A.value_dtype == "float16" else np.float32
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def logical(A) -> sp.csr_matrix:
    return A.to_scipy().astype(np.float64)


def tol(A) -> float:
    return 1e-2 if A.value_dtype == "float16" else 1e-5


# ---------------------------------------------------------------- correctness (llvm)
@pytest.mark.parametrize("spec", FAMILIES)
def test_spmm_bias_relu_every_family(spec):
    A = instance(spec)
    B, bias = inputs(A, (A.shape[1], FEAT), (FEAT,))
    op = spmm_bias_relu()
    out = sparsec.compile(op, A, feat=FEAT)(A, B, bias, poison=True)
    want = np.maximum(logical(A) @ B.astype(np.float64) + bias.astype(np.float64), 0.0)
    assert max_rel_err(out, want) <= tol(A)
    assert max_rel_err(evaluate(op, A, B, bias, params={"feat": FEAT}), want) <= 1e-12
    assert (np.asarray(out)[3] == np.maximum(bias, 0)).all()  # an empty row: relu(0 + bias)


@pytest.mark.parametrize("op_name", ("spmm_bias", "spmm_add"))
@pytest.mark.parametrize("spec", FAMILIES)
def test_library_added_term_every_family(spec, op_name):
    """ops.spmm_bias / spmm_add: the added term reaches every row, whether a part owns it
    (it starts from the term), parts share it (the fill stores the term) or no part covers it."""
    A = instance(spec)
    term_shape = (FEAT,) if op_name == "spmm_bias" else (A.shape[0], FEAT)
    B, term = inputs(A, (A.shape[1], FEAT), term_shape)
    out = sparsec.compile(op_name, A, feat=FEAT)(A, B, term, poison=True)
    want = logical(A) @ B.astype(np.float64) + term.astype(np.float64)
    assert max_rel_err(out, want) <= tol(A)


@pytest.mark.parametrize("spec", ("csr", "bsr:2x2", "hyb:1:1/2/4"))
def test_transform_then_aggregate(spec):
    A = instance(spec)
    X, W = inputs(A, (A.shape[1], 4), (4, FEAT))
    out = sparsec.compile(transform_aggregate(), A, fin=4, fout=FEAT)(A, X, W, poison=True)
    want = logical(A) @ (X.astype(np.float64) @ W.astype(np.float64))
    assert max_rel_err(out, want) <= tol(A)
    ref = evaluate(transform_aggregate(), A, X, W, params={"fin": 4, "fout": FEAT})
    assert max_rel_err(ref, want) <= 1e-12


def _block_names(stmt):
    """The names of the blocks under ``stmt`` (loops, sequences, blocks), outermost first."""
    if isinstance(stmt, s_tir.SBlockRealize):
        return [stmt.block.name_hint] + _block_names(stmt.block.body)
    if isinstance(stmt, tirx.For):
        return _block_names(stmt.body)
    if isinstance(stmt, tirx.SeqStmt):
        return [n for s in stmt.seq for n in _block_names(s)]
    return []


def _launch_blocks(func):
    """The block names under each top-level statement of the lowered PrimFunc, in order."""
    body = func.body.block.body
    return [_block_names(st) for st in (body.seq if isinstance(body, tirx.SeqStmt) else [body])]


def test_transform_stage_is_outside_the_per_entry_loop():
    """H = X @ W is its own loop nest over the columns (no row, no stored entry around it),
    before the SpMM that reads it: computed once per column, not once per non-zero."""
    func, prog = lower_program(transform_aggregate(), formats.make_format("csr"), {"fin": 4, "fout": FEAT})
    h, agg = prog.nests
    assert h.dense and [b.loop.name for blk in h.blocks for b in blk] == ["j", "f", "g"]
    assert not any(role in ("sparse", "block") for role in h.roles.values())
    assert h.blocks[0][0].extent.name == "cols"
    launches = _launch_blocks(func)
    assert launches.index(next(n for n in launches if "gcn_layer" in n)) == 0
    assert "gcn_layer1" not in launches[0] and "gcn_layer" in launches[0]
    assert "gcn_layer1" in launches[1] and "gcn_layer" not in launches[1]
    # and the H loop nest reads no index array
    script = func.script()
    h_part = script[:script.index('sblock("gcn_layer1_0")')]
    assert "indptr" not in h_part.split('sblock("gcn_layer_0")')[1]


@pytest.mark.parametrize("spec", ("csr", "bsr:2x2"))
def test_row_normalisation_epilogue(spec):
    A = instance(spec)
    (B,) = inputs(A, (A.shape[1], FEAT))
    out = sparsec.compile(row_normalised(), A, feat=FEAT)(A, B, poison=True)
    m = logical(A)
    with np.errstate(all="ignore"):
        want = (m @ B.astype(np.float64)) / np.asarray(m.sum(axis=1))  # empty rows: 0 / 0 = NaN
    assert np.isnan(want[3]).all()
    assert max_rel_err(out, want) <= tol(A)


@pytest.mark.parametrize("spec", ("csr", "ell"))
def test_inplace_relu(spec):
    op = inplace_relu()
    assert op.iterations[1].statement.reduce is None  # an assignment, not a max reduction
    A = instance(spec)
    (B,) = inputs(A, (A.shape[1], FEAT))
    out = sparsec.compile(op, A, feat=FEAT)(A, B, poison=True)
    assert max_rel_err(out, np.maximum(logical(A) @ B.astype(np.float64), 0.0)) <= 1e-5


def test_dense_only_iteration():
    A = instance("csr")
    B, W, s = inputs(A, (A.shape[1], FEAT), (4, FEAT), (4,))
    C, V = sparsec.compile(dense_only(), A, fin=4, fout=FEAT)(A, B, W, s, poison=True)
    assert max_rel_err(C, logical(A) @ B.astype(np.float64)) <= 1e-5
    assert max_rel_err(V, W.astype(np.float64) * s.astype(np.float64)[:, None]) <= 1e-6


def test_reduction_over_features_of_each_row():
    A = instance("bsr:2x2")
    (B,) = inputs(A, (A.shape[1], FEAT))
    out = sparsec.compile(l2_rows(), A, feat=FEAT)(A, B, poison=True)
    c = logical(A) @ B.astype(np.float64)
    want = c / np.sqrt((c * c).sum(axis=1, keepdims=True) + 1.0)
    assert max_rel_err(out, want) <= 1e-5
    assert max_rel_err(evaluate(l2_rows(), A, B, params={"feat": FEAT}), want) <= 1e-12


# ---------------------------------------------------------------- CUDA launches
def _kernels(src: str):
    """(name, body) of every __global__ definition."""
    heads = list(re.finditer(r"__global__ void __launch_bounds__\(\d+\) (\w+)\([^)]*\)\s*\{", src))
    return [(h.group(1), src[h.end():heads[n + 1].start() if n + 1 < len(heads) else len(src)])
            for n, h in enumerate(heads)]


def _epilogue_in(body: str) -> bool:
    return "bias_ptr" in body and "max(" in body


@pytest.fixture(scope="module")
def cuda_sources():
    out = {spec: sparsec.compile(spmm_bias_relu(), instance(spec), feat=FEAT, target="cuda:sm_90a").source()
           for spec in ("csr", "bsr:2x2", "ell", "hyb:1:1/2/4")}
    out.update({f"{op}/{spec}": sparsec.compile(op, instance(spec), feat=FEAT, target="cuda:sm_90a").source()
                for op in ("spmm_bias", "spmm_add") for spec in ("hyb:1:1/2/4", "bsr+csr:2x2,0.5")})
    return out


@pytest.mark.parametrize("spec", ("hyb:1:1/2/4", "bsr+csr:2x2,0.5"))
def test_cuda_added_term_has_no_pass_of_its_own(cuda_sources, spec):
    """The folded term: a fill that stores it, then the parts; no epilogue launch. On hyb the
    buckets that own their rows read the term too (they start from it)."""
    for op, term in (("spmm_bias", "b_ptr"), ("spmm_add", "R_ptr")):
        kernels = _kernels(cuda_sources[f"{op}/{spec}"])
        readers = [name for name, body in kernels if term in body]
        if spec.startswith("hyb"):
            assert len(kernels) == 2 and len(readers) == 2, [k for k, _ in kernels]
        else:  # bsr+csr: both parts add into the fill
            assert readers == [kernels[0][0]], [k for k, _ in kernels]


@pytest.mark.parametrize("spec", ("csr", "bsr:2x2", "ell"))
def test_cuda_spmm_bias_relu_is_one_launch(cuda_sources, spec):
    kernels = _kernels(cuda_sources[spec])
    assert len(kernels) == 1, [k for k, _ in kernels]
    assert _epilogue_in(kernels[0][1])


def test_cuda_epilogue_after_parts_that_share_rows(cuda_sources):
    """hyb with split rows: the parts add into C, so the epilogue is a launch of its own, last."""
    kernels = _kernels(cuda_sources["hyb:1:1/2/4"])
    assert len(kernels) >= 2
    assert [_epilogue_in(body) for _, body in kernels] == [False] * (len(kernels) - 1) + [True]


def test_cuda_epilogue_reaches_rows_that_no_part_holds():
    """hyb whose parts own their rows: the row-normalising epilogue moves into the parts' launch
    and into the fill, so an empty row gets 0 / deg = 0 / 0 = NaN as its reference does. TVM
    folds ``0.0f / x`` to 0, so the fill's 0 is given as bits (found on the H100: the empty
    rows were 0, the reference NaN)."""
    src = sparsec.compile(row_normalised(), instance("hyb:1:1/2/4/8/16/32/64/128/256/512/1024"), feat=FEAT,
                          target="cuda:sm_90a").source()
    kernels = _kernels(src)
    fills = [body for _, body in kernels if "C_ptr" in body and "B_ptr" not in body]
    assert fills and all("__int_as_float(0) / deg_ptr" in body for body in fills), [k for k, _ in kernels]
    ok, out = nvcc_sources({("rn", "sm_90a"): src})[("rn", "sm_90a")]
    assert ok, out[-2000:]


def test_cuda_sources_compile_with_nvcc(cuda_sources):
    results = nvcc_sources({(spec, "sm_90a"): src for spec, src in cuda_sources.items()})
    bad = {k: out[-2000:] for k, (ok, out) in results.items() if not ok}
    assert not bad, bad


# ---------------------------------------------------------------- refusals
def _structure():
    op = dsl.Operator("t")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    K = op.dense_fixed("k", extent=4)
    return op, I, J, K


def test_dense_iteration_cannot_read_the_sparse_input():
    op, I, J, K = _structure()
    A = op.sparse_input("A", (I, J))
    y = op.dense_output("y", (I,))
    with pytest.raises(ValueError, match=r"over \[i\] does not iterate the sparse structure \(i, j\).*sparse buffer "
                                         r"A\[i, j\].*iterate \[i, j, ...\] together"):
        with op.iterate([I], "S") as (i,):
            y[i] = A[i, dsl.IterVar(J)]


def test_dense_iteration_cannot_write_a_sparse_buffer():
    op, I, J, K = _structure()
    op.sparse_input("A", (I, J))
    O = op.sparse_output("O", (I, J))
    with pytest.raises(ValueError, match=r"cannot write the sparse buffer O\[i, j\]"):
        with op.iterate([I], "S") as (i,):
            O[i, dsl.IterVar(J)] = 1.0


def test_epilogue_reading_an_axis_it_does_not_iterate():
    """An epilogue over [i, k] sees no column coordinate: B[j, k] there is refused."""
    op, I, J, K = _structure()
    op.sparse_input("A", (I, J))
    B = op.dense_input("B", (J, K))
    C = op.dense_output("C", (I, K))
    with pytest.raises(ValueError, match=r"reads B\[j, k\], but axis j is not iterated here; add j"):
        with op.iterate([I, K], "SS") as (i, k):
            C[i, k] = C[i, k] + B[dsl.IterVar(J), k]


def test_sum_without_reduction_axis_says_what_to_write():
    op, I, J, K = _structure()
    op.sparse_input("A", (I, J))
    C = op.dense_output("C", (I, K))
    with pytest.raises(ValueError, match=r"no R axis; mark the reduced axis R, or write an in-place update as an "
                                         r"assignment \(X\[..\] = X\[..\] \+ e\)"):
        with op.iterate([I, K], "SS") as (i, k):
            C[i, k] += 1.0


def test_cuda_refuses_a_reduction_over_the_first_dense_axis():
    """A column sum over the rows, iterated rows first: on CUDA the first axis is spread over
    thread blocks, so it must be spatial (the CPU runs it serially)."""
    op, I, J, K = _structure()
    A = op.sparse_input("A", (I, J))
    B = op.dense_input("B", (J, K))
    C = op.dense_temp("C", (I, K))
    s = op.dense_output("s", (K,))
    with op.iterate([I, J, K], "SRS") as (i, j, k):
        C[i, k] += A[i, j] * B[j, k]
    with op.iterate([I, K], "RS") as (i, k):
        s[k] += C[i, k]
    A_ = instance("csr")
    (B_,) = inputs(A_, (A_.shape[1], 4))
    out = sparsec.compile(op, A_)(A_, B_, poison=True)
    assert max_rel_err(out, (logical(A_) @ B_.astype(np.float64)).sum(axis=0)) <= 1e-5
    with pytest.raises(ValueError, match=r"reduces over its first axis i.*iterate \[k, i, ...\] with the spatial "
                                         r"axis first"):
        sparsec.compile(op, "csr", target="cuda:sm_90a")


def test_dense_iteration_reads_through_an_indirect_index():
    """H[j, f] = W[T[j], f] (a weight per column type) over [J, F]: once an AttributeError in the
    DSL check; compiled, checked before launch like any indirect index, and evaluated."""
    import sparsec
    from sparsec import dsl, formats
    from sparsec.reference import evaluate

    op = dsl.Operator("per_type")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    F = op.dense_fixed("f", extent=3)
    R = op.dense_fixed("r", extent=4)
    op.sparse_input("A", (I, J))
    T_ = op.dense_input("Ty", (J,), dtype="int32")
    W = op.dense_input("W", (R, F))
    H = op.dense_output("H", (J, F))
    with op.iterate([J, F], "SS") as (j, f):
        H[j, f] = W[T_[j], f]
    rng = np.random.default_rng(0)
    A = formats.convert(sp.random(6, 9, density=0.3, format="csr", random_state=0, dtype=np.float32), "csr")
    ty = rng.integers(0, 4, 9).astype(np.int32)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    kern = sparsec.compile(op, A, target="llvm")
    np.testing.assert_array_equal(kern(A, ty, w, poison=True), w[ty])
    np.testing.assert_array_equal(evaluate(op, A, ty, w), w[ty].astype(np.float64))
    with pytest.raises(ValueError, match="Ty"):
        kern(A, np.full(9, 4, np.int32), w)
