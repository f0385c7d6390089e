"""Knobs declared once (sparsec.schedules.knobs): the default schedules reject unknown and
inapplicable knobs, naming them and the valid set; Kernel.knobs lists only the knobs that
took effect; the tuner's space and the cost model's features derive from the declarations,
so a knob declared in a template alone is searched and featurized; the Tensor Core template
recognises block SpMM by program structure, not by name. No GPU: CUDA is generated only."""
import json
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

import sparsec
from sparsec.dsl import Operator
from sparsec.formats import make_format
from sparsec.lower import lower_program
from sparsec.schedules import Knob, tensorcore
from sparsec.schedules.knobs import Transformation, check_applicable, transformation

CUDA = "cuda:sm_90a"


# ---------------------------------------------------------------- validation and Kernel.knobs


@pytest.mark.parametrize("target", ["llvm", CUDA])
def test_unknown_knob_is_named_with_the_valid_set(target):
    with pytest.raises(ValueError, match=r"unknown knob \['bogus'\].*the knobs that apply here") as e:
        sparsec.compile("spmm", "csr", feat=16, target=target, knobs={"bogus": 1})
    valid = "['parallel']" if target == "llvm" else "['feat_tiles', 'rows_per_block', 'unroll', 'vec']"
    assert valid in str(e.value)


@pytest.mark.parametrize("target, knobs, bad", [
    ("llvm", {"rows_per_block": 2}, "rows_per_block"),       # a CUDA knob on the CPU
    (CUDA, {"parallel": False}, "parallel"),                # a CPU knob on CUDA
    (CUDA, {"slots_per_block": 128}, "slots_per_block"),    # fixed-width rows only; CSR's are not
    (CUDA, {"lanes": 8, "vec": 2}, "lanes"),                # the SDDMM template's, not SpMM's
])
def test_inapplicable_knob_is_named(target, knobs, bad):
    with pytest.raises(ValueError, match=rf"knob \['{bad}'\] does not apply"):
        sparsec.compile("spmm", "csr", feat=16, target=target, knobs=knobs)


def test_tensor_core_template_rejects_generic_knobs():
    with pytest.raises(ValueError, match=r"knob \['rows_per_block'\] does not apply.*n_tile"):
        sparsec.compile("spmm", "bsr:16x16", feat=128, dtype="float16", target=CUDA, knobs={"rows_per_block": 2})


@pytest.mark.parametrize("target, spec, op, knobs, expected", [
    ("llvm", "csr", "spmm", {}, {"parallel": True}),
    ("llvm", "bsr:4x4", "sddmm", {"parallel": False}, {"parallel": False}),
    (CUDA, "csr", "spmm", {"unroll": 4}, {"rows_per_block": "auto", "vec": 4, "unroll": 4, "feat_tiles": 1}),
    (CUDA, "ell:4", "spmm", {}, {"rows_per_block": "auto", "vec": 4, "slots_per_block": 64, "interleave": 1,
                                 "feat_tiles": 1}),
    (CUDA, "bsr:4x4", "spmm", {}, {"rows_per_block": "auto", "vec": 4, "feat_tiles": 1}),
    # the scale nest runs inside the dot's kernel: rows_over_threads' threads_per_block does nothing
    (CUDA, "csr", "sddmm", {"lanes": 8}, {"lanes": 8, "vec": 0, "groups": 0, "rows_per_block": 4, "unroll": 1}),
])
def test_kernel_knobs_are_the_knobs_that_took_effect(target, spec, op, knobs, expected):
    k = sparsec.compile(op, spec, feat=16, target=target, knobs=knobs or None)
    assert k.knobs == expected


def test_check_applicable_unit():
    t = Transformation("t", lambda sch, nest, **k: None,
                       {"a": Knob((1, 2)), "b": Knob((0, 1), shapes=("wide",))}, shape=lambda nest: "narrow")
    check_applicable({"a": 2}, [(t, ("narrow",))], "here")
    with pytest.raises(ValueError, match=r"here: knob \['b'\] does not apply; .* are \['a'\]"):
        check_applicable({"b": 1}, [(t, ("narrow",))], "here")
    check_applicable({"b": 1}, [(t, ("narrow", "wide"))], "here")
    with pytest.raises(ValueError, match="not among the choices"):
        Knob((1, 2), search=(3,))


# ---------------------------------------------------------------- derivation: one edit in the template

_DERIVATION = r"""
import json, sys
import numpy as np, scipy.sparse as sp
from sparsec.schedules import Knob
from sparsec.schedules.cuda import features_over_threads
# a throwaway knob, declared as a template declares its own (the Space and features read it)
features_over_threads.knobs["demo_hint"] = Knob((0, 1, 3), small=(0, 3), omit_default=True)
from sparsec.tune.features import FEATURE_NAMES, MatrixContext, feature_matrix, stored_row
from sparsec.tune.space import Space
m = sp.random(300, 300, 0.02, format="csr", dtype=np.float32, random_state=0)
space = Space("spmm", m, 32, families=["csr"], size=sys.argv[1])
ctx = MatrixContext(m)
X = feature_matrix(space.candidates, ctx)
col = FEATURE_NAMES.index("knob_demo_hint")
row = [None if not np.isfinite(v) else float(v) for v in X[0]]
print(json.dumps({"values": sorted({c["schedule_knobs"].get("demo_hint", 0) for c in space.candidates}),
                  "written": sorted({c["schedule_knobs"]["demo_hint"] for c in space.candidates
                                     if "demo_hint" in c["schedule_knobs"]}),
                  "column": sorted(set(X[:, col].tolist())),
                  "default_written": "demo_hint" in space.default["schedule_knobs"],
                  "old_row_extended": stored_row(row[:col])[col]}))
"""


@pytest.mark.parametrize("size, values", [("full", [0, 1, 3]), ("small", [0, 3])])
def test_a_knob_declared_in_the_template_alone_is_searched_and_featurized(size, values):
    out = subprocess.run([sys.executable, "-c", _DERIVATION, size], capture_output=True, text=True, check=True)
    got = json.loads(out.stdout)
    assert got["values"] == values and got["column"] == [float(v) for v in values]
    assert got["written"] == values[1:]  # omit_default: a candidate at the default keeps its old identity
    assert got["default_written"] is False
    assert got["old_row_extended"] == 0.0  # rows logged before the knob ran at its default


def test_transformation_apply_returns_the_knobs_for_the_nest_shape():
    calls = []

    @transformation(knobs={"a": (1, 2), "b": Knob((0, 1), shapes=("wide",))}, shape=lambda nest: nest)
    def throwaway(sch, nest, *, a, b):
        calls.append((a, b))

    assert throwaway(None, "narrow", a=2, b=1) == {"a": 2}
    assert throwaway(None, "wide") == {"a": 1, "b": 0}
    assert calls == [(2, 1), (1, 0)]
    with pytest.raises(ValueError, match="knob a should be one of"):
        throwaway(None, "wide", a=3)


# ---------------------------------------------------------------- capability check by structure


def _block_op(name="blockmm", extra=False):
    """SpMM's structure under other names; ``extra``: an epilogue factor (another operand)."""
    op = Operator(name, "Y[r, f] = sum_c W[r, c] * X[c, f]")
    r = op.dense_fixed("r")
    c = op.sparse_variable("c", parent=r)
    f = op.dense_fixed("f", extent="feat")
    W = op.sparse_input("W", (r, c))
    X = op.dense_input("X", (c, f))
    S = op.dense_input("S", (c, f)) if extra else None
    Y = op.dense_output("Y", (r, f))
    with op.iterate([r, c, f], "SRS") as (i, j, k):
        if extra:
            Y[i, k] += W[i, j] * X[j, k] * S[j, k]
        else:
            Y[i, k] += W[i, j] * X[j, k]
    return op


def _program(op, spec="bsr:16x16", dtype="float16"):
    return lower_program(op if isinstance(op, Operator) else sparsec.ops.get(op), make_format(spec), {"feat": 128},
                         dtype, atomics=True)[1]


def test_block_spmm_is_recognised_by_structure_not_name():
    assert tensorcore.is_block_spmm(_program("spmm"))
    assert tensorcore.is_block_spmm(_program(_block_op()))
    assert tensorcore.applies(_program(_block_op()), "cuda")
    assert not tensorcore.is_block_spmm(_program(_block_op(extra=True)))
    assert not tensorcore.is_block_spmm(_program("sddmm"))
    assert tensorcore.block_size(_program("spmm")) == 16
    assert tensorcore.block_size(_program("spmm", "bsr:16x32")) is None
    assert tensorcore.block_size(_program("spmm", "csr")) is None
    k = sparsec.compile(_block_op(), "bsr:16x16", feat=128, dtype="float16", target=CUDA)
    assert "mma.sync" in k.source() and k.knobs["n_tile"] == 128
