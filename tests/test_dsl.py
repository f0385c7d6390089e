"""The DSL beyond the library operators (test-only rowsum and row_softmax in every format),
its error messages, the dumped lowering stages, and the schedulability of emitted TIR."""
from __future__ import annotations

import os

import numpy as np
import scipy.sparse as sp
import pytest
import tvm

import sparsec
from sparsec import dsl
from sparsec.formats import convert, make_format

from conftest import case_id, check, make_matrix, seed_of
from dsl_ops import TEST_OPS

DSL_SPECS = ("csr", "bsr:2x2", "bsr:3x5", "bsr:16x16", "ell")
DSL_CASES = (("empty_rows", 101, 67), ("powerlaw", 129, 250), ("one_huge_row", 37, 53), ("empty", 37, 53))

_KERNELS: dict = {}


def kernel(name: str, A):
    key = (name, A.format.spec)
    if key not in _KERNELS:
        _KERNELS[key] = sparsec.compile(TEST_OPS[name][0](), A, target="llvm")
    return _KERNELS[key]


def _params():
    out = []
    for name in TEST_OPS:
        for spec in DSL_SPECS:
            for case in DSL_CASES:
                out.append(pytest.param(name, spec, case, id=f"{name}-{spec}-{case_id(case)}"))
    return out


@pytest.mark.parametrize("name, spec, case", _params())
def test_test_ops_match_reference(name, spec, case):
    m = make_matrix(*case, seed=seed_of(name, spec, case))
    if case[0] == "empty_rows":
        assert (np.diff(m.indptr) == 0).any()
    A = convert(m, spec)
    out = kernel(name, A)(A, poison=True)
    ref = TEST_OPS[name][1](A)
    check(out, ref, 1e-5)
    if name == "rowsum":
        assert out.shape == (A.shape[0],)
        assert np.all(out[np.diff(m.indptr) == 0] == 0), "empty rows should sum to 0"
    else:
        assert out.shape == (A.stored,)
        assert np.all(out[~A.valid_slots()] == 0), "padding slots should hold 0"


def test_row_softmax_rows_sum_to_one():
    m = make_matrix("empty_rows", 101, 67, seed=3)
    A = convert(m, "csr")
    out = kernel("row_softmax", A)(A, poison=True)
    sums = np.asarray(A.to_scipy(out).sum(axis=1)).ravel()
    nonempty = np.diff(m.indptr) > 0
    np.testing.assert_allclose(sums[nonempty], 1.0, rtol=1e-5)
    assert np.all(sums[~nonempty] == 0)


def test_rowsum_float64():
    m = make_matrix("powerlaw", 129, 250, seed=4, dtype=np.float64)
    A = convert(m, "bsr:3x5")
    k = sparsec.compile(TEST_OPS["rowsum"][0](), A, target="llvm")
    assert k.dtype == "float64"
    check(k(A, poison=True), TEST_OPS["rowsum"][1](A), 1e-12)


# ---------------------------------------------------------------- DSL errors


def _structure(name="t"):
    op = dsl.Operator(name)
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    return op, I, J


def test_wrong_number_of_indices():
    op, I, J = _structure()
    A = op.sparse_input("A", (I, J))
    y = op.dense_output("y", (I,))
    with pytest.raises(IndexError, match=r"buffer y has 1 axes, indexed with 2"):
        with op.iterate([I, J], "SR") as (i, j):
            y[i, j] += A[i, j]


def test_sparse_buffer_indexed_by_wrong_axis():
    op, I, J = _structure()
    K = op.dense_fixed("k", extent=4)
    A = op.sparse_input("A", (I, J))
    C = op.dense_output("C", (I, K))
    with pytest.raises(IndexError, match=r"sparse buffer A is indexed by k for its axis i: index it by its own axes "
                                         r"\['i', 'j'\]"):
        with op.iterate([I, J, K], "SRS") as (i, j, k):
            C[i, k] += A[k, j]


def test_reduction_with_plain_assignment():
    op, I, J = _structure()
    A = op.sparse_input("A", (I, J))
    y = op.dense_output("y", (I,))
    with pytest.raises(ValueError, match=r"reduces over \['j'\] but the statement is a plain assignment"):
        with op.iterate([I, J], "SR") as (i, j):
            y[i] = A[i, j]


def test_writing_an_input():
    op, I, J = _structure()
    A = op.sparse_input("A", (I, J))
    op.sparse_output("O", (I, J))
    with pytest.raises(ValueError, match=r"writes A, an input; write an output or a temporary instead"):
        with op.iterate([I, J], "SS") as (i, j):
            A[i, j] = A[i, j] * 2.0


def test_iteration_without_statement():
    op, I, J = _structure()
    op.sparse_input("A", (I, J))
    with pytest.raises(ValueError, match=r"iteration t has no statement"):
        with op.iterate([I, J], "SS"):
            pass
    assert op.iterations == []


def test_two_statements_in_one_iteration():
    op, I, J = _structure()
    A = op.sparse_input("A", (I, J))
    O = op.sparse_output("O", (I, J))
    with pytest.raises(ValueError, match=r"already has a statement"):
        with op.iterate([I, J], "SS") as (i, j):
            O[i, j] = A[i, j]
            O[i, j] = A[i, j] * 2.0


def test_two_sparse_inputs():
    """The first sparse input is the matrix; a further one is edge data on its pattern."""
    op, I, J = _structure()
    A = op.sparse_input("A", (I, J))
    B = op.sparse_input("B", (I, J))
    assert op.matrix() is A and op.edge_inputs() == [B] and op.call_inputs() == [B]


def test_duplicate_axis_name():
    op, I, J = _structure()
    with pytest.raises(ValueError, match=r"axis name 'j' is used twice"):
        op.dense_fixed("j", extent=8)


def test_duplicate_buffer_name():
    op, I, J = _structure()
    op.sparse_input("A", (I, J))
    with pytest.raises(ValueError, match=r"buffer name 'A' is used twice"):
        op.dense_output("A", (I,))


@pytest.mark.parametrize("kinds", ["S", "SRS", "SX", ""], ids=["short", "long", "bad-letter", "empty"])
def test_kinds_of_wrong_length_or_letters(kinds):
    op, I, J = _structure()
    op.sparse_input("A", (I, J))
    with pytest.raises(ValueError, match=r"kinds should be one S or R per axis \(2 axes\)"):
        with op.iterate([I, J], kinds):
            pass


def test_child_axis_without_parent_cannot_read_entries():
    """The column axis alone is a dense loop over 0..cols: it has no stored entry to read."""
    op, I, J = _structure()
    A = op.sparse_input("A", (I, J))
    y = op.dense_output("y", (J,))
    with pytest.raises(ValueError, match=r"does not iterate the sparse structure \(i, j\).*iterate \[i, j, ...\]"):
        with op.iterate([J], "S") as (j,):
            y[j] = A[dsl.IterVar(I), j]


def test_reduction_output_indexed_by_reduction_axis():
    op, I, J = _structure()
    A = op.sparse_input("A", (I, J))
    O = op.sparse_output("O", (I, J))
    with pytest.raises(ValueError, match=r"indexed by the reduction axis j of iteration t; mark j S"):
        with op.iterate([I, J], "SR") as (i, j):
            O[i, j] += A[i, j]


def test_statement_outside_iteration():
    op, I, J = _structure()
    y = op.dense_output("y", (I,))
    with pytest.raises(RuntimeError, match=r"inside `with op.iterate"):
        y[dsl.IterVar(I)] = 1.0


def test_expression_has_no_truth_value():
    op, I, J = _structure()
    A = op.sparse_input("A", (I, J))
    O = op.sparse_output("O", (I, J))
    with pytest.raises(TypeError, match=r"select"):
        with op.iterate([I, J], "SS") as (i, j):
            O[i, j] = A[i, j] if A[i, j] else 0.0


def test_missing_compile_time_param():
    with pytest.raises(ValueError, match=r"feat"):
        sparsec.compile("spmm", "csr", target="llvm")


@pytest.mark.parametrize("feat", [0, -3, 2.5, True, np.True_, "64", None],
                         ids=["zero", "negative", "float", "bool", "numpy-bool", "str", "none"])
def test_bad_compile_time_param(feat):
    """Each is refused up front, naming the parameter (``feat=True`` once reached TVM as a
    bool extent and came back as a page of TVMScript labelled a sparsec bug)."""
    with pytest.raises(ValueError, match=r"feat should be a positive int") as err:
        sparsec.compile("spmm", "csr", feat=feat, target="llvm")
    assert "bug" not in str(err.value) and "T.prim_func" not in str(err.value)


def test_numpy_int_compile_time_param():
    k = sparsec.compile("spmm", "csr", feat=np.int64(8), target="llvm")
    assert [p.shape for p in k.params if p.name == "B"] == [("cols", 8)]


@pytest.mark.parametrize("op, extra", [("spmm", {"hid": 3}), ("sddmm", {"feta": 8, "heads": 2})])
def test_unknown_compile_time_param(op, extra):
    with pytest.raises(ValueError, match=r"unknown compile parameters? .*for operator " + op) as err:
        sparsec.compile(op, "csr", feat=8, target="llvm", **extra)
    msg = str(err.value)
    assert all(f"{k}={v}" in msg for k, v in extra.items()) and "['feat']" in msg


def test_unknown_compile_time_param_for_op_without_params():
    op = TEST_OPS["row_softmax"][0]()
    with pytest.raises(ValueError, match=r"unknown compile parameter feat=8 .* parameters are \[\]"):
        sparsec.compile(op, "csr", feat=8, target="llvm")


def test_unknown_library_op():
    with pytest.raises(ValueError, match=r"operator should be one of \[.*'attention'.*'spmm'.*'spmm_bias'.*\]"):
        sparsec.compile("spmv", "csr", feat=8)


def _scaled_rowsum() -> dsl.Operator:
    """y[i] = sum_j E[i, j] with E[i, j] = exp(A[i, j]) held in a sparse temp."""
    op = dsl.Operator("exp_rowsum")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    A = op.sparse_input("A", (I, J))
    E = op.sparse_temp("E", (I, J))
    y = op.dense_output("y", (I,))
    with op.iterate([I, J], "SS") as (i, j):
        E[i, j] = dsl.exp(A[i, j])
    with op.iterate([I, J], "SR") as (i, j):
        y[i] += E[i, j]
    return op


@pytest.mark.parametrize("spec", ["csr", "bsr:3x5", "ell"])
def test_sparse_temp(spec):
    """A sparse temp holds one value per stored slot (not rows x cols): the kernel allocates it
    poisoned with NaN, so a slot read before it is written would show in the result."""
    m = make_matrix("empty_rows", 101, 67, seed=seed_of("sparse_temp", spec))
    A = convert(m, spec)
    k = sparsec.compile(_scaled_rowsum(), A, target="llvm")
    temp, = [p for p in k.params if p.role == "temp"]
    assert (temp.name, temp.sparse, temp.shape) == ("E", True, (None,))  # None: one per stored slot
    valid = A.valid_slots()
    rows, _ = A.stored_coords()
    want = np.bincount(rows[valid], weights=np.exp(A.slot_values()[valid].astype(np.float64)), minlength=101)
    check(k(A, poison=True), want, 1e-5)


def test_sparse_temp_off_the_structure():
    op, I, J = _structure()
    K = op.dense_fixed("k", extent=4)
    with pytest.raises(ValueError, match=r"sparse buffer E is declared over \['i', 'k'\]: a sparse buffer lives on "
                                         r"the operator's sparse structure \(i, j\), optionally followed by dense axes"):
        op.sparse_temp("E", (I, K))


@pytest.mark.parametrize("name", ["T", "rows", "n_i", "v_j", "fill_rows_p0_1"])
def test_reserved_buffer_name(name):
    op, I, J = _structure()
    with pytest.raises(ValueError, match=rf"buffer name '{name}' is reserved"):
        op.dense_output(name, (I,))


# ---------------------------------------------------------------- dumped stages, schedulable TIR


def test_dump_ir_writes_every_stage(tmp_path):
    d = tmp_path / "ir"
    sparsec.compile("spmm", "bsr:3x5", feat=8, target="llvm", dump_ir=str(d))
    for stage in ("bind", "positions", "flat", "script", "tir"):
        f = d / f"spmm.{stage}.txt"
        assert f.is_file(), f"missing {f.name}"
        assert f.stat().st_size > 0, f"{f.name} is empty"
    assert "@T.prim_func" in (d / "spmm.script.txt").read_text()
    # the dumped TVMScript parses back into a PrimFunc
    assert isinstance(tvm.script.from_source((d / "spmm.script.txt").read_text()), tvm.tirx.PrimFunc)


def test_dump_ir_for_dsl_op(tmp_path):
    sparsec.compile(TEST_OPS["row_softmax"][0](), "csr", target="llvm", dump_ir=str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == sorted(f"row_softmax.{s}.txt"
                                                  for s in ("bind", "positions", "flat", "script", "tir"))


@pytest.mark.parametrize("spec", ["csr", "bsr:2x2", "bsr:3x5", "ell:4"])
@pytest.mark.parametrize("op", ["spmm", "sddmm"])
def test_emitted_tir_is_schedulable(op, spec):
    from sparsec import ops

    f = sparsec.lower.lower(ops.get(op), make_format(spec), {"feat": 8})
    assert isinstance(f, tvm.tirx.PrimFunc)
    sch = tvm.s_tir.Schedule(f, enable_check=False)
    blk = sch.get_sblock(op)
    loops = sch.get_loops(blk)
    assert len(loops) >= 2
    # a basic transformation applies to the statement's innermost (feature) loop
    sch.split(loops[-1], [None, 4])


def test_test_op_tir_is_schedulable():
    op = TEST_OPS["row_softmax"][0]()
    f = sparsec.lower.lower(op, make_format("csr"), {})
    sch = tvm.s_tir.Schedule(f, enable_check=False)
    # three iterations -> three statement blocks, named after the operator
    for name in ("row_softmax", "row_softmax1", "row_softmax2"):
        sch.get_sblock(name)


def _rowsum_over(kind: str, **kw) -> dsl.Operator:
    op = dsl.Operator(f"rowsum_{kind}")
    I = op.dense_fixed("i")
    J = getattr(op, kind)("j", parent=I, **kw)
    A = op.sparse_input("A", (I, J))
    y = op.dense_output("y", (I,))
    with op.iterate([I, J], "SR") as (i, j):
        y[i] += A[i, j]
    return op


@pytest.mark.parametrize("kind, kw, default", [("sparse_variable", {}, "csr"), ("sparse_fixed", {"width": 6}, "ell:6"),
                                              ("dense_variable", {}, None)])
@pytest.mark.parametrize("spec", ["csr", "bsr:3x5", "ell"])
def test_every_axis_kind_binds_to_every_format(kind, kw, default, spec):
    """The declared kinds are the coordinate space (and the default format); binding to a
    format replaces them, so an operator written over any kind runs on every format."""
    op = _rowsum_over(kind, **kw)
    if default is None:
        with pytest.raises(ValueError, match="has no default matrix format"):
            op.default_format()
    else:
        assert op.default_format() == default
    m = make_matrix("powerlaw", 37, 53, seed=seed_of(f"{kind}-{spec}"))
    A = convert(m, spec)
    y = sparsec.compile(op, A)(A, poison=True)
    check(y, np.asarray(m.astype(np.float64).sum(axis=1)).ravel(), 1e-5)


def test_axis_kinds_are_the_formats_kinds():
    """One vocabulary: the DSL's axis kinds are the format axis classes, named the same way in
    reprs and messages as in ``sparsec inspect``."""
    from sparsec import formats

    op = dsl.Operator("kinds")
    I = op.dense_fixed("i")
    axes = [I, op.sparse_variable("j", parent=I), op.dense_fixed("k", extent=4)]
    assert [a.kind for a in axes] == [formats.DenseFixed, formats.SparseVariable, formats.DenseFixed]
    assert repr(axes[1]) == "SparseVariable(j)"
    assert dsl.AXIS_KINDS is formats.AXIS_KINDS
    op2 = dsl.Operator("ragged")
    I2 = op2.dense_fixed("i")
    assert op2.dense_variable("j", parent=I2).kind is formats.DenseVariable
    with pytest.raises(ValueError, match=r"declares j as DenseVariable, which has no default matrix format"):
        op2.default_format()
    op3 = dsl.Operator("ell")
    assert op3.sparse_fixed("j", parent=op3.dense_fixed("i"), width=3).kind is formats.SparseFixed
    with pytest.raises(ValueError, match=r"kind should be one of \['DenseFixed', 'DenseVariable', 'SparseFixed', "
                                         r"'SparseVariable'\], got 'dense_fixed'"):
        dsl.Axis("x", "dense_fixed")


def test_default_format_from_declared_kinds():
    rng = np.random.default_rng(7)
    lens = rng.integers(0, 7, 37)  # at most 6 entries a row: fits ELL of width 6
    rows = np.repeat(np.arange(37), lens)
    cols = np.concatenate([rng.choice(53, n, replace=False) for n in lens])
    m = sp.csr_matrix((rng.standard_normal(rows.size).astype(np.float32), (rows, cols)), shape=(37, 53))
    op = _rowsum_over("sparse_fixed", width=6)
    k = sparsec.compile(op)  # no format given: ELL of the declared width
    assert k.format_spec == "ell:6"
    A = convert(m, "ell:6")
    check(k(A, poison=True), np.asarray(m.astype(np.float64).sum(axis=1)).ravel(), 1e-5)
    with pytest.raises(ValueError, match="compiled for format ell:6"):
        k(convert(m, "ell:7"))


@pytest.mark.parametrize("spec", ["csr", "bsr:3x5", "ell"])
def test_select_and_less(spec):
    """Conditions: the sum of each row's positive entries, written with select(less(...))."""
    op = dsl.Operator("posrowsum")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    A = op.sparse_input("A", (I, J))
    y = op.dense_output("y", (I,))
    with op.iterate([I, J], "SR") as (i, j):
        y[i] += dsl.select(dsl.less(A[i, j], 0.0), 0.0, A[i, j])
    m = make_matrix("powerlaw", 37, 53, seed=seed_of("select", spec))
    inst = convert(m, spec)
    want = np.asarray(m.maximum(0).astype(np.float64).sum(axis=1)).ravel()
    check(sparsec.compile(op, inst)(inst, poison=True), want, 1e-5)
