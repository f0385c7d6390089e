"""Edge data, buffer dtypes and indirect reads (issue 22): several sparse inputs on one
structure, sparse buffers with trailing dense axes, W[E[i, j], f, g], checked against
independent float64 scipy/numpy references (tests/edge_ops.py) on NaN-poisoned outputs."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import sparsec
from sparsec import dsl
from sparsec.formats import EdgeValues, convert
from sparsec.reference import evaluate, max_rel_err

from edge_ops import (edge_matrix, gat_aggregate, ref_gat_aggregate, ref_rgcn, ref_rgcn_node_types,
                      ref_sddmm_multihead, ref_spmm_edge_only, ref_spmm_weighted, rgcn_homo, rgcn_node_types,
                      sddmm_multihead, spmm_edge_only, spmm_weighted)

RGCN = dict(rel=3, fin=4, fout=8)
FORMATS = ("csr", "bsr:2x2", "ell", "hyb:1:1/2/4", "bsr+csr:2x2,0.5")
TOL = 1e-5


def _inst(spec: str, seed: int = 0):
    return convert(edge_matrix(seed), spec)


def _rgcn_inputs(inst, seed: int = 0):
    rng = np.random.default_rng(seed)
    nnz = inst.to_scipy().nnz
    E = rng.integers(0, RGCN["rel"], nnz).astype(np.int32)
    W = rng.standard_normal((RGCN["rel"], RGCN["fin"], RGCN["fout"])).astype(np.float32)
    X = rng.standard_normal((inst.shape[1], RGCN["fin"])).astype(np.float32)
    return E, W, X


@pytest.fixture(scope="module")
def rgcn_kernels():
    return {spec: sparsec.compile(rgcn_homo(), _inst(spec), target="llvm", **RGCN) for spec in FORMATS}


@pytest.mark.parametrize("spec", FORMATS)
def test_rgcn_homo_matches_relation_loop(rgcn_kernels, spec):
    inst = _inst(spec)
    E, W, X = _rgcn_inputs(inst)
    ref = ref_rgcn(inst, E, W, X)
    k = rgcn_kernels[spec]
    assert [p.name for p in k.inputs] == ["E", "W", "X"]
    by_array = k(inst, E, W, X, poison=True)
    by_values = k(inst, inst.edge_values(E), W, X, poison=True)
    assert max_rel_err(by_array, ref) < TOL
    np.testing.assert_array_equal(by_array, by_values)
    assert max_rel_err(evaluate(rgcn_homo(), inst, E, W, X, params=RGCN), ref) < 1e-12


def test_edge_type_out_of_range_is_refused_before_launch(rgcn_kernels):
    inst = _inst("csr")
    E, W, X = _rgcn_inputs(inst)
    m = inst.to_scipy()
    E[4] = 3  # one past the last relation
    row = int(np.searchsorted(m.indptr, 4, side="right") - 1)
    where = rf"E at \({row}, {int(m.indices[4])}\) is 3, out of range for axis r of W \(extent 3\)"
    k = rgcn_kernels["csr"]
    with pytest.raises(ValueError, match=where):
        k(inst, E, W, X)
    with pytest.raises(ValueError, match=where):
        k(inst, inst.edge_values(E), W, X)
    E[4] = -1
    with pytest.raises(ValueError, match=r"E at .* is -1, out of range"):
        k(inst, E, W, X)


def test_edge_values_refused_on_another_matrix_or_shape(rgcn_kernels):
    inst, other = _inst("csr"), _inst("csr", seed=1)
    E, W, X = _rgcn_inputs(inst)
    k = rgcn_kernels["csr"]
    with pytest.raises(ValueError, match=r"E holds EdgeValues made for another matrix"):
        k(other, inst.edge_values(E), W, X)
    with pytest.raises(ValueError, match=r"E is edge data: it should have shape \(\d+,\)"):
        k(inst, E[:-1], W, X)
    with pytest.raises(TypeError, match=r"E should be int32, got int64"):
        k(inst, E.astype(np.int64), W, X)
    with pytest.raises(TypeError, match=r"E should be int32 edge values"):
        k(inst, inst.edge_values(E.astype(np.float32)), W, X)
    with pytest.raises(ValueError, match=r"edge values should have one value per entry"):
        inst.edge_values(np.zeros(3))
    with pytest.raises(ValueError, match=r"should have exactly the matrix's pattern"):
        inst.edge_values(sp.eye(9, 7, format="csr"))


def test_edge_values_layout_and_way_back():
    """Stored-slot layout with 0 at padding, and coordinate_values undoes it (a composite too)."""
    for spec in ("bsr:2x2", "hyb:1:1/2/4"):
        inst = _inst(spec)
        m = inst.to_scipy()
        x = np.arange(1, m.nnz + 1, dtype=np.float64)
        ev = inst.edge_values(x)
        assert isinstance(ev, EdgeValues) and ev.values.shape == (inst.stored,)
        np.testing.assert_array_equal(inst.to_scipy(ev.values).data, x)  # aligned with to_scipy's entries
        assert (ev.values[~inst.valid_slots()] == 0).all()
        np.testing.assert_array_equal(inst.coordinate_values(ev), x)
        assert ev.low is None  # floats carry no index range
        from_scipy = inst.edge_values(sp.csr_matrix((x, m.indices, m.indptr), shape=m.shape))
        np.testing.assert_array_equal(from_scipy.values, ev.values)


@pytest.mark.parametrize("spec", ("csr", "bsr:2x2"))
def test_spmm_with_a_second_float_sparse_input(spec):
    inst = _inst(spec)
    rng = np.random.default_rng(2)
    Wt = rng.standard_normal(inst.to_scipy().nnz).astype(np.float32)
    B = rng.standard_normal((inst.shape[1], 8)).astype(np.float32)
    k = sparsec.compile(spmm_weighted(), spec, target="llvm", feat=8)
    assert max_rel_err(k(inst, Wt, B, poison=True), ref_spmm_weighted(inst, Wt, B)) < TOL
    assert max_rel_err(evaluate(spmm_weighted(), inst, Wt, B, params={"feat": 8}),
                       ref_spmm_weighted(inst, Wt, B)) < 1e-12


def test_edge_data_outside_a_product_with_the_matrix_is_guarded():
    """C += Wt * B (no A factor) reads BSR's slot mask; C += A * Wt * B does not."""
    inst = _inst("bsr:2x2")
    rng = np.random.default_rng(3)
    Wt = rng.standard_normal(inst.to_scipy().nnz).astype(np.float32)
    B = rng.standard_normal((inst.shape[1], 4)).astype(np.float32)
    guarded = sparsec.compile(spmm_edge_only(), "bsr:2x2", target="llvm", feat=4)
    neutral = sparsec.compile(spmm_weighted(), "bsr:2x2", target="llvm", feat=4)
    mask = inst.format.slot_mask
    assert mask in [p.name for p in guarded.params] and mask not in [p.name for p in neutral.params]
    assert max_rel_err(guarded(inst, Wt, B, poison=True), ref_spmm_edge_only(inst, Wt, B)) < TOL


@pytest.mark.parametrize("spec", ("csr", "ell", "bsr:2x2"))
def test_multihead_sddmm_writes_one_score_per_entry_per_head(spec):
    inst = _inst(spec)
    rng = np.random.default_rng(4)
    Q = rng.standard_normal((inst.shape[0], 2, 4)).astype(np.float32)
    K = rng.standard_normal((inst.shape[1], 2, 4)).astype(np.float32)
    k = sparsec.compile(sddmm_multihead(), inst, target="llvm", heads=2, feat=4)
    S = k(inst, Q, K, poison=True)
    assert S.shape == (inst.stored, 2)
    assert (S[~inst.valid_slots()] == 0).all()  # padding slots hold 0
    ref = ref_sddmm_multihead(inst, Q, K)
    assert max_rel_err(inst.coordinate_values(S), ref) < TOL
    assert max_rel_err(inst.coordinate_values(evaluate(sddmm_multihead(), inst, Q, K, params=dict(heads=2, feat=4))),
                       ref) < 1e-12


@pytest.mark.parametrize("spec", ("csr", "hyb:1:1/2/4"))
def test_multihead_edge_values_as_a_trailing_axis(spec):
    inst = _inst(spec)
    rng = np.random.default_rng(5)
    L = rng.standard_normal((inst.to_scipy().nnz, 2)).astype(np.float32)
    X = rng.standard_normal((inst.shape[1], 2, 4)).astype(np.float32)
    k = sparsec.compile(gat_aggregate(), inst, target="llvm", heads=2, feat=4)
    ref = ref_gat_aggregate(inst, L, X)
    assert max_rel_err(k(inst, L, X, poison=True), ref) < TOL
    assert max_rel_err(k(inst, inst.edge_values(L), X, poison=True), ref) < TOL
    with pytest.raises(ValueError, match=r"L is edge data: it should have shape \(\d+, 2\)"):
        k(inst, L[:, :1], X)


def test_node_type_index_from_a_dense_int_input():
    inst = _inst("csr")
    rng = np.random.default_rng(6)
    NT = rng.integers(0, 3, inst.shape[1]).astype(np.int32)
    W = rng.standard_normal((3, 4, 8)).astype(np.float32)
    X = rng.standard_normal((inst.shape[1], 4)).astype(np.float32)
    k = sparsec.compile(rgcn_node_types(), "csr", target="llvm", **RGCN)
    assert max_rel_err(k(inst, NT, W, X, poison=True), ref_rgcn_node_types(inst, NT, W, X)) < TOL
    NT[2] = 7
    with pytest.raises(ValueError, match=r"NT at \[2\] is 7, out of range for axis r of W \(extent 3\)"):
        k(inst, NT, W, X)
    with pytest.raises(ValueError, match=r"NT holds 7, out of range for axis r of W"):
        evaluate(rgcn_node_types(), inst, NT, W, X, params=RGCN)


def test_declared_dtype_is_used_as_declared():
    """W declared float32 in a float64 kernel: its parameter, argument check and reads follow it."""
    op = dsl.Operator("spmm_w32")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    K = op.dense_fixed("k", extent=4)
    A = op.sparse_input("A", (I, J))
    B = op.dense_input("B", (J, K), dtype="float32")
    C = op.dense_output("C", (I, K))
    with op.iterate([I, J, K], "SRS") as (i, j, k):
        C[i, k] += A[i, j] * B[j, k]
    inst = convert(edge_matrix().astype(np.float64), "csr")
    kern = sparsec.compile(op, inst, target="llvm")
    assert {p.name: p.dtype for p in kern.params}["B"] == "float32"
    B64 = np.random.default_rng(7).standard_normal((inst.shape[1], 4))
    with pytest.raises(TypeError, match=r"B should be float32, got float64"):
        kern(inst, B64)
    B32 = B64.astype(np.float32)
    assert max_rel_err(kern(inst, B32, poison=True), inst.to_scipy() @ B32.astype(np.float64)) < 1e-12


def test_torch_edge_data_is_laid_out_by_torch():
    torch = pytest.importorskip("torch")
    inst = _inst("bsr:2x2")
    rng = np.random.default_rng(8)
    Wt = rng.standard_normal(inst.to_scipy().nnz).astype(np.float32)
    B = rng.standard_normal((inst.shape[1], 4)).astype(np.float32)
    k = sparsec.compile(spmm_weighted(), "bsr:2x2", target="llvm", feat=4)
    out = k(inst, torch.from_numpy(Wt), torch.from_numpy(B), poison=True)
    assert isinstance(out, torch.Tensor) and max_rel_err(out, ref_spmm_weighted(inst, Wt, B)) < TOL
    ev = inst.edge_values(torch.from_numpy(Wt))
    assert isinstance(ev.values, torch.Tensor)
    assert max_rel_err(inst.coordinate_values(ev), Wt) == 0.0


# ---- what the DSL refuses, and what it says to write instead ----------------------------------
def _base():
    op = dsl.Operator("t")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    F = op.dense_fixed("f", extent=4)
    R = op.dense_fixed("r", extent=3)
    return op, I, J, F, R


def test_refusals_name_the_construct_and_the_alternative():
    op, I, J, F, R = _base()
    A = op.sparse_input("A", (I, J))
    Ef = op.sparse_input("Ef", (I, J))
    E = op.sparse_input("E", (I, J), dtype="int32")
    W = op.dense_input("W", (R, F))
    Y = op.dense_output("Y", (I, F))
    tmp = op.dense_temp("tmp", (J,), dtype="int32")
    with pytest.raises(TypeError, match=r"indexed by a read of Ef, which is float \(by role\).*dtype='int32'"):
        with op.iterate([I, J, F], "SRS") as (i, j, f):
            Y[i, f] += W[Ef[i, j], f]
    with pytest.raises(ValueError, match=r"indexed by a read of tmp, a temp.*should come from an input"):
        with op.iterate([I, J, F], "SRS") as (i, j, f):
            Y[i, f] += W[tmp[j], f]
    op2, I2, J2, F2, R2 = _base()
    A2 = op2.sparse_input("A", (I2, J2), dtype="int32")
    W2 = op2.dense_input("W", (R2, F2))
    Y2 = op2.dense_output("Y", (I2, F2))
    with pytest.raises(ValueError, match=r"indexed by the matrix A \(the first sparse input\); declare the indices "
                                         r"as a further sparse input"):
        with op2.iterate([I2, J2, F2], "SRS") as (i, j, f):
            Y2[i, f] += W2[A2[i, j], f]
    with pytest.raises(IndexError, match=r"sparse buffer Ef is indexed by a read of E: .* index a dense buffer"):
        with op.iterate([I, J, F], "SRS") as (i, j, f):
            Y[i, f] += Ef[E[i, j], j]
    with pytest.raises(ValueError, match=r"Y is written through an indirect index \(a scatter\)"):
        with op.iterate([I, J, F], "SRS") as (i, j, f):
            Y[E[i, j], f] += A[i, j]
    with pytest.raises(TypeError, match=r"axis f of W is indexed with 2: index an axis with an iteration variable"):
        with op.iterate([I, J, F], "SRS") as (i, j, f):
            Y[i, f] += W[E[i, j], 2]


def test_declaration_refusals():
    op, I, J, F, R = _base()
    with pytest.raises(ValueError, match=r"an operator has one sparse structure, so a second sparse axis is not "
                                         r"supported. Per-entry values on the same pattern are further sparse inputs"):
        I2 = op.dense_fixed("i2")
        op.sparse_variable("j2", parent=I2)
    with pytest.raises(ValueError, match=r"sparse input L is the operator's first sparse input, the matrix.*declare "
                                         r"the matrix over \(i, j\) first"):
        op.sparse_input("L", (I, J, F))
    op.sparse_input("A", (I, J))
    with pytest.raises(ValueError, match=r"trailing axis j should be a dense axis with an extent"):
        op.sparse_output("S", (I, J, J))
    with pytest.raises(ValueError, match=r"sparse buffer S is declared over \['i', 'f'\]"):
        op.sparse_output("S", (I, F))
    with pytest.raises(ValueError, match=r"buffer X: dtype should be None .* got 'complex64'"):
        op.dense_input("X", (J, F), dtype="complex64")
    with pytest.raises(ValueError, match=r"has no sparse structure yet: declare its column axis first"):
        dsl.Operator("empty").structure()


# ---- CUDA: the new buffer kinds build by capability -------------------------------------------
def test_rgcn_homo_builds_for_cuda_and_nvcc_compiles_it():
    from nvcc_tools import nvcc_sources

    sources = {}
    for spec in ("csr", "bsr:2x2", "hyb:1:1/2/4"):
        k = sparsec.compile(rgcn_homo(), spec, target="cuda:sm_90a", rel=3, fin=8, fout=16)
        src = k.source()
        assert "E_ptr" in src and "W_ptr" in src
        sources[(spec, "sm_90a")] = src
    k = sparsec.compile(sddmm_multihead(), "csr", target="cuda:sm_90a", heads=2, feat=16)
    sources[("sddmm_multihead", "sm_90a")] = k.source()
    for key, (ok, output) in nvcc_sources(sources).items():
        assert ok, f"{key}: {output[-2000:]}"


def test_trailing_axis_sparse_output_on_row_lists_is_refused_on_cuda():
    """hyb's parts list their rows; S[i, j, h] there was wrong on the H200: refused by name."""
    with pytest.raises(ValueError, match=r"sparse output S has trailing axes \(h\).*compile it for csr"):
        sparsec.compile(sddmm_multihead(), "hyb:1:1/2/4", target="cuda:sm_90a", heads=2, feat=16)
    sparsec.compile(sddmm_multihead(), "hyb:1:1/2/4", target="llvm", heads=2, feat=16)  # the CPU is right


def test_exported_kernel_keeps_edge_inputs_and_index_checks(rgcn_kernels, tmp_path):
    inst = _inst("csr")
    E, W, X = _rgcn_inputs(inst)
    path = str(tmp_path / "rgcn.so")
    rgcn_kernels["csr"].export(path)
    loaded = sparsec.load(path)
    assert [p.name for p in loaded.inputs] == ["E", "W", "X"]
    assert max_rel_err(loaded(inst, inst.edge_values(E), W, X, poison=True), ref_rgcn(inst, E, W, X)) < TOL
    E[0] = 5
    with pytest.raises(ValueError, match=r"E at \(0, \d+\) is 5, out of range for axis r of W \(extent 3\)"):
        loaded(inst, E, W, X)
