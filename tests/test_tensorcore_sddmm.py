"""Tensor Core block SDDMM (schedules/tensorcore_sddmm.py): the staged operator's semantics on
the CPU against the float64 reference on the logical pattern, for the library SDDMM and
user-written plain and scaled forms; the CUDA kernels' PTX (mma.sync, ldmatrix) and the
capability check's refusals."""
from __future__ import annotations


import numpy as np
import pytest
import scipy.sparse as sp
import tvm

import sparsec
from sparsec import dsl, ops
from sparsec.lower import lower_program
from sparsec.reference import evaluate
from sparsec.schedules import tensorcore_sddmm as ts

from nvcc_tools import nvcc_ptx


def scores_op(kind: str):
    """A user's block-sparse attention scores: ``S[i, j] = sum_k Q[i, k] * Kt[j, k]``, with a
    constant scale in the dot (``scaled``) or without the matrix as an input (``nomatrix``).
    Kt is declared before Q, so the kernel takes them in that order."""
    op = dsl.Operator(f"scores_{kind}", "S[i, j] = sum_k Q[i, k] * Kt[j, k] on the pattern")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    K = op.dense_fixed("k", extent="feat")
    if kind != "nomatrix":
        op.sparse_input("A", (I, J))
    Kt = op.dense_input("Kt", (J, K))
    Q = op.dense_input("Q", (I, K))
    S = op.sparse_output("S", (I, J))
    with op.iterate([I, J, K], "SSR") as (i, j, k):
        if kind == "scaled":
            S[i, j] += 0.125 * Q[i, k] * Kt[j, k]
        else:
            S[i, j] += Q[i, k] * Kt[j, k]
    return op


def block_pattern(bs, rows, cols, seed):
    """bs x bs blocks over rows x cols (neither a multiple of bs), block row 1 empty, block row 0
    full, holes inside stored blocks (slots off the pattern) and explicit zeros."""
    rng = np.random.default_rng(seed)
    mb, kb = -(-rows // bs), -(-cols // bs)
    mask = rng.random((mb, kb)) < 0.5
    mask[1], mask[0] = False, True
    dense = np.kron(mask, np.ones((bs, bs)))[:rows, :cols] * rng.standard_normal((rows, cols))
    dense[rng.random(dense.shape) < 0.2] = 0
    m = sp.csr_matrix(dense.astype(np.float32))
    r, c = m.nonzero()
    m[r[:4], c[:4]] = 0  # explicit zeros: entries all the same
    return sparsec.formats.convert(m, f"bsr:{bs}x{bs}", dtype="float16")


@pytest.mark.parametrize("make,bs,feat,stages,row_split", [
    (ops.sddmm, 16, 24, 1, 1),                         # sampled by A; feat not a multiple of 16
    (lambda: scores_op("plain"), 16, 24, 2, 2),
    (lambda: scores_op("nomatrix"), 32, 32, 3, 1),
    (lambda: scores_op("scaled"), 16, 64, 2, 3),
])
def test_staged_operator_matches_float64(make, bs, feat, stages, row_split):
    op = make()
    _, program = lower_program(op, sparsec.formats.make_format(f"bsr:{bs}x{bs}"), {"feat": feat}, "float16",
                               atomics=True)
    shape = ts.match(program)
    assert shape is not None
    rows, cols = 4 * bs - 3, 3 * bs - 5
    A = block_pattern(bs, rows, cols, seed=bs + stages)
    rng = np.random.default_rng(1)
    dense = {"Q": rng.standard_normal((rows, feat)), "Kt": rng.standard_normal((cols, feat))}
    dense = {k: v.astype(np.float16) for k, v in dense.items()}
    dense.update(X=dense["Q"], Y=dense["Kt"])
    out = np.full(A.data.shape, np.nan, np.float32)  # poisoned: every slot must be written
    arrays = A.kernel_arrays()
    by_role = {"indptr": arrays["indptr"], "indices": arrays["indices"], "valid": A.slot_mask(), "A": A.data,
               "Q": dense["X"], "K": dense["Y"], "S": out}
    ex = tvm.compile(ts.staged_sddmm(shape, stages, row_split, name=op.name), target="llvm")
    ex[op.name](*[by_role[r] for r in shape.params], arrays["indptr"].size - 1, rows, cols)
    ref = evaluate(op, A, *[dense[b.name] for b in op.call_inputs()], params={"feat": feat}, dtype="float16")
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)


def test_shapes_the_capability_check_reads():
    fmt = sparsec.formats.make_format("bsr:16x16")
    _, sampled = lower_program(ops.sddmm(), fmt, {"feat": 32}, "float16", atomics=True)
    _, scaled = lower_program(scores_op("scaled"), fmt, {"feat": 32}, "bfloat16", atomics=True)
    assert ts.match(sampled) == ts.SddmmShape(16, 32, "float16", ("indptr", "indices", "A", "Q", "K", "S"),
                                              1.0, True, False)
    assert ts.match(scaled) == ts.SddmmShape(16, 32, "bfloat16", ("indptr", "indices", "valid", "A", "K", "Q", "S"),
                                             0.125, False, True)
    for spec, dtype, feat in (("bsr:16x16", "float32", 32), ("bsr:16x32", "float16", 32), ("bsr:8x8", "float16", 32),
                              ("csr", "float16", 32), ("bsr:16x16", "float16", 20)):
        _, program = lower_program(ops.sddmm(), sparsec.formats.make_format(spec), {"feat": feat}, dtype,
                                   atomics=True)
        assert ts.match(program) is None, (spec, dtype, feat)
    _, spmm = lower_program(ops.spmm(), fmt, {"feat": 32}, "float16", atomics=True)
    assert ts.match(spmm) is None


# ------------------------------------------------------------------- CUDA kernels (no GPU needed)


@pytest.mark.parametrize("bs", [16, 32])
def test_cuda_kernel_is_a_tensor_core_kernel(bs):
    k = sparsec.compile("sddmm", f"bsr:{bs}x{bs}", feat=64, dtype="float16", target="cuda:sm_90a")
    assert set(k.knobs) == {"warp_m", "warp_n", "stages", "row_split"}
    assert k.outputs[0].dtype == "float32"
    ptx = nvcc_ptx(k.source(), "sm_90a")
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in ptx and "cp.async.cg.shared.global" in ptx


@pytest.mark.parametrize("spec,dtype", [("bsr:16x16", "float32"), ("bsr:16x32", "float16")])
def test_refused_shapes_take_the_cuda_core_template(spec, dtype):
    k = sparsec.compile("sddmm", spec, feat=64, dtype=dtype, target="cuda:sm_90a")
    assert "mma.sync" not in k.source() and "lanes" in k.knobs


def test_cuda_core_knobs_keep_the_cuda_core_template():
    k = sparsec.compile("sddmm", "bsr:16x16", feat=64, dtype="float16", knobs={"lanes": 8}, target="cuda:sm_90a")
    assert "mma.sync" not in k.source()


@pytest.mark.parametrize("knobs,match", [({"warp_m": 64}, "warp_m should divide the block size 32"),
                                         ({"row_split": 3}, "row_split should be one of")])
def test_knobs_are_validated(knobs, match):
    with pytest.raises(ValueError, match=match):
        sparsec.compile("sddmm", "bsr:32x32", feat=64, dtype="float16", knobs=knobs, target="cuda:sm_90a")


def test_plan_lists_the_template_for_the_tuner():
    from sparsec.schedules import templates

    _, program = lower_program(ops.sddmm(), sparsec.formats.make_format("bsr:32x32"), {"feat": 64}, "float16",
                               atomics=True)
    (use,) = templates(program, "cuda")
    assert use.transformation is ts.bsr_tensorcore_sddmm
    assert set(use.knobs) == {"warp_m", "warp_n", "stages", "row_split"}
    assert use.transformation.prune(program, {"stages": 4, "warp_m": 16}) is None
    assert "warp_n should divide" in use.transformation.prune(program, {"warp_n": 64})
