"""The lowering pipeline as named stages: their order, one dump per stage, entering the
pipeline after any stage with that stage's IR, and errors that name the stage."""
from __future__ import annotations

import os

import numpy as np
import pytest
import tvm

from sparsec import dsl, ops
from sparsec.formats import make_format
from sparsec.lower import STAGES, LowerContext, LoweringError, LoweringTypeError, lower, lower_flat, lower_program, run_stages
from sparsec.lower import pipeline
from sparsec.lower.bind import BoundOperator
from sparsec.lower.flatten import FlatProgram
from sparsec.lower.positions import PositionProgram

ORDER = ("bind", "positions", "flat", "script", "tir")


def _ctx(op="spmm", spec="csr", **kw):
    operator = ops.get(op) if isinstance(op, str) else op
    params = kw.pop("params", {"feat": 8} if isinstance(op, str) else {})
    return LowerContext(operator, make_format(spec), params, **kw)


def test_stages_are_an_ordered_dict_of_functions():
    assert tuple(STAGES) == ORDER
    assert all(callable(f) for f in STAGES.values())


def test_run_stages_returns_every_stage_in_order():
    results = run_stages(_ctx())
    assert tuple(results) == ORDER
    types = (BoundOperator, PositionProgram, FlatProgram, str, tvm.tirx.PrimFunc)
    for stage, want in zip(ORDER, types):
        assert isinstance(results[stage], want), stage
    assert tuple(run_stages(_ctx(), stop="flat")) == ORDER[:3]


def test_dump_writes_each_stage_as_produced(tmp_path):
    results = run_stages(_ctx("sddmm", "bsr:2x2", dump_ir=str(tmp_path)))
    assert sorted(os.listdir(tmp_path)) == sorted(f"sddmm.{s}.txt" for s in ORDER)
    assert (tmp_path / "sddmm.script.txt").read_text() == results["script"]
    assert (tmp_path / "sddmm.tir.txt").read_text() == results["tir"].script()
    assert "BoundOperator" in (tmp_path / "sddmm.bind.txt").read_text()


@pytest.mark.parametrize("start", ORDER)
@pytest.mark.parametrize("op, spec", [("spmm", "csr"), ("sddmm", "ell:4"), ("spmm", "hyb")])
def test_start_from_a_stage_reproduces_the_primfunc(op, spec, start):
    fmt = make_format(spec) if spec != "hyb" else _hyb_format()
    full = run_stages(LowerContext(ops.get(op), fmt, {"feat": 8}))
    func, flat = lower_program(ops.get(op), fmt, {"feat": 8}, start_from=(start, full[start]))
    tvm.ir.assert_structural_equal(func, full["tir"])
    # the flat program the schedules read is there too, lowered again when the IR given is later
    assert [b.name for b in flat.buffers] == [b.name for b in full["flat"].buffers]
    if start in ("bind", "positions", "flat"):
        assert flat is full["flat"] if start == "flat" else flat is not full["flat"]


def _hyb_format():
    import scipy.sparse as sp

    from sparsec.formats import convert

    m = sp.random(40, 30, 0.2, format="csr", random_state=np.random.default_rng(0), dtype=np.float32)
    return convert(m, "hyb").format


def test_start_from_an_edited_script_uses_it(tmp_path):
    """The point of entering at a stage: a dumped TVMScript, edited, lowers as edited."""
    lower(ops.get("spmm"), make_format("csr"), {"feat": 8}, dump_ir=str(tmp_path))
    script = (tmp_path / "spmm.script.txt").read_text()
    assert "T.float32(0.0)" in script
    edited = script.replace("T.float32(0.0)", "T.float32(1.0)")
    func = lower(ops.get("spmm"), make_format("csr"), {"feat": 8}, start_from=("script", edited))
    assert "T.float32(1.0)" in func.script() and "T.float32(0.0)" not in func.script()


def test_start_from_checks_its_argument():
    op, fmt = ops.get("spmm"), make_format("csr")
    with pytest.raises(ValueError, match=r"start_from's stage should name a lowering stage, one of \['bind'"):
        lower(op, fmt, {"feat": 8}, start_from=("tvmscript", "x"))
    with pytest.raises(TypeError, match=r"ir should be a FlatProgram \(what stage flat produces\), got str"):
        lower(op, fmt, {"feat": 8}, start_from=("flat", "x"))
    with pytest.raises(ValueError, match=r"start_from should be a \(stage, ir\) pair"):
        lower(op, fmt, {"feat": 8}, start_from="script")
    with pytest.raises(ValueError, match=r"stop should name a lowering stage"):
        run_stages(_ctx(), stop="ptx")


# ---------------------------------------------------------------- errors name their stage


def _clashing_axis_op():
    """An operator whose dense axis is named like CSR's column axis ``j``."""
    op = dsl.Operator("clash")
    R = op.dense_fixed("r")
    C = op.sparse_variable("c", parent=R)
    J = op.dense_fixed("j", extent=4)
    A = op.sparse_input("A", (R, C))
    B = op.dense_input("B", (C, J))
    Y = op.dense_output("Y", (R, J))
    with op.iterate([R, C, J], "SRS") as (r, c, j):
        Y[r, j] += A[r, c] * B[c, j]
    return op


def _transposed_output_op():
    """out[k, i] += ...: a reduction over several parts into an output indexed by rows last."""
    op = dsl.Operator("transposed")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    K = op.dense_fixed("k", extent=4)
    A = op.sparse_input("A", (I, J))
    B = op.dense_input("B", (J, K))
    O = op.dense_output("O", (K, I))
    with op.iterate([I, J, K], "SRS") as (i, j, k):
        O[k, i] += A[i, j] * B[j, k]
    return op


def _indptr_buffer_op():
    """A buffer named like the format's index array: the emitted script would shadow it."""
    op = dsl.Operator("shadow")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    A = op.sparse_input("A", (I, J))
    y = op.dense_output("indptr", (I,))
    with op.iterate([I, J], "SR") as (i, j):
        y[i] += A[i, j]
    return op


@pytest.mark.parametrize("make, fmt, stage, message", [
    (_clashing_axis_op, make_format("csr"), "bind", "operator axis 'j' clashes with an axis of format csr"),
    (_indptr_buffer_op, make_format("csr"), "script", r"buffer names clash with the format's index arrays"),
])
def test_a_stage_error_names_the_stage(make, fmt, stage, message, tmp_path):
    fmt = fmt or _hyb_format()
    with pytest.raises(LoweringError, match=rf"^stage {stage}: .*{message}") as err:
        lower(make(), fmt, {}, dump_ir=str(tmp_path))
    assert err.value.stage == stage and isinstance(err.value, ValueError)
    assert isinstance(err.value.__cause__, ValueError) and not isinstance(err.value.__cause__, LoweringError)
    # the stages before the failing one were dumped
    done = ORDER[:ORDER.index(stage)]
    assert sorted(os.listdir(tmp_path)) == sorted(f"{make().name}.{s}.txt" for s in done)


def test_a_reduction_over_parts_into_a_transposed_output_is_filled_first():
    """hyb's parts add into O[k, i]: the fill nest walks rows first whatever the output's axis order."""
    import scipy.sparse as sp

    import sparsec
    from sparsec import formats

    m = sp.random(50, 40, density=0.1, format="csr", random_state=3, dtype=np.float32)
    b = np.random.default_rng(0).standard_normal((40, 4)).astype(np.float32)
    A = formats.convert(m, "hyb:2:1/2/4")
    out = sparsec.compile(_transposed_output_op(), A, target="llvm")(A, b, poison=True)
    np.testing.assert_allclose(out, (m.astype(np.float64) @ b).T, rtol=1e-5, atol=1e-6)


def test_a_type_error_stays_a_type_error():
    """int4 values compiled as float32: stage flat refuses, still as a TypeError."""
    with pytest.raises(TypeError, match=r"^stage flat: the format stores int4 values") as err:
        lower(ops.get("spmm"), make_format("srbcrs:v8,int4"), {"feat": 8})
    assert isinstance(err.value, LoweringTypeError) and err.value.stage == "flat"


def test_tvm_rejecting_an_edited_script_names_stage_tir():
    script = run_stages(_ctx(), stop="script")["script"]
    bad = script.replace("T.axis.spatial(8, l_k)", "T.axis.spatial(True, l_k)")
    assert bad != script
    with pytest.raises(LoweringError, match=r"^stage tir: TVM rejects the TVMScript") as err:
        lower(ops.get("spmm"), make_format("csr"), {"feat": 8}, start_from=("script", bad))
    msg = str(err.value)
    assert "given with start_from" in msg and "T.axis.spatial(True, l_k)" in msg
    assert "bug" not in msg and len(msg.splitlines()) < 20 and "@T.prim_func" not in msg
    assert err.value.__cause__ is not None


def test_tvm_rejecting_emitted_script_says_how_to_report(monkeypatch, tmp_path):
    """A script sparsec emitted and TVM rejects: a short message with the stage, where the IR
    is dumped and how to report it -- not the script itself."""
    emit = STAGES["script"]
    monkeypatch.setitem(STAGES, "script", lambda flat, ctx: emit(flat, ctx).replace("T.int32()", "T.int33()"))
    with pytest.raises(LoweringError, match=r"^stage tir: TVM rejects the TVMScript") as err:
        lower(ops.get("spmm"), make_format("csr"), {"feat": 8})
    msg = str(err.value)
    assert "rerun with dump_ir=DIR" in msg and "please report" in msg and len(msg.splitlines()) < 20
    with pytest.raises(LoweringError, match=rf"{tmp_path}/spmm\.\*\.txt hold the IR of every stage"):
        lower(ops.get("spmm"), make_format("csr"), {"feat": 8}, dump_ir=str(tmp_path))
    assert "T.int33()" in (tmp_path / "spmm.script.txt").read_text()


def test_an_internal_error_keeps_its_type_with_a_note(monkeypatch):
    def broken(bound, ctx):
        raise KeyError("n_i")

    monkeypatch.setitem(STAGES, "positions", broken)
    with pytest.raises(KeyError) as err:
        lower(ops.get("spmm"), make_format("csr"), {"feat": 8})
    assert not isinstance(err.value, LoweringError)
    assert any("lowering stage 'positions' of spmm x csr" in n for n in err.value.__notes__)


def test_context_checks_parameters_before_any_stage(monkeypatch):
    calls = []
    monkeypatch.setitem(STAGES, "bind", lambda op, ctx: calls.append(op))
    with pytest.raises(ValueError, match=r"unknown compile parameter hid=3 for operator spmm"):
        run_stages(_ctx(params={"feat": 8, "hid": 3}))
    with pytest.raises(TypeError, match=r"fmt should be a Format or CompositeFormat, got str"):
        LowerContext(ops.get("spmm"), "csr", {"feat": 8})
    assert calls == []
    ctx = pipeline.LowerContext(ops.get("spmm"), make_format("csr"), {"feat": np.int64(8)}, dtype="float16")
    assert ctx.params == {"feat": 8} and type(ctx.params["feat"]) is int and ctx.dtype == "float16"


@pytest.mark.parametrize("op, spec, params", [("spmm", "csr", {"feat": 32}), ("sddmm", "hyb:2:1/2/4", {"feat": 16}),
                                              ("rgcn_bias", "csr", {"rel": 3, "fin": 16, "fout": 8})])
def test_flat_program_alone_is_the_one_the_full_lowering_returns(op, spec, params):
    """lower_flat (what the tuner reads templates from) stops before the TVMScript but gives
    the flat program lower_program returns beside the PrimFunc, fused fills included."""
    from sparsec.schedules.plan import templates

    _, full = lower_program(ops.get(op), make_format(spec), params, atomics=True)
    alone = lower_flat(ops.get(op), make_format(spec), params, atomics=True)
    assert [(n.name, n.template, n.prologue is not None) for n in alone.nests] == \
        [(n.name, n.template, n.prologue is not None) for n in full.nests]
    assert [u.transformation.name for u in templates(alone, "cuda")] == \
        [u.transformation.name for u in templates(full, "cuda")]
