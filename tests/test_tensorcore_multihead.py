"""Multi-head SpMM on the BSR Tensor Core template, by structure: the library's
``multihead_spmm`` and the same structure under a user's names (``tests/multihead_ops.py``),
with a scale + bias per (head, feature) + ReLU or a bias per (row, head) after the reduction.
The dispatch picks ``bsr_tensorcore`` for them on bsr:16x16 / 32x32 in fp16 and bf16 and
leaves the CUDA-core template what does not qualify; the staged function runs on llvm
(NaN-poisoned outputs) against ``reference.evaluate`` in float64; the CUDA kernel is one
launch whose PTX (nvcc, sm_90a) holds mma.sync and ldmatrix."""
from __future__ import annotations

import numpy as np
import pytest
import tvm

import sparsec
from sparsec import formats
from sparsec.build import _param_specs
from sparsec.kernel import Kernel
from sparsec.lower import lower_program
from sparsec.reference import evaluate, max_rel_err
from sparsec.schedules import templates
from sparsec.schedules import tensorcore as tc
from sparsec.targets import parse_target

from edge_ops import spmm_edge_only
from multihead_ops import heads_blockmm, heads_row_bias, heads_row_norm, heads_scaled_relu
from nvcc_tools import nvcc_ptx
from test_tensorcore_epilogue import _kernels, bsr_matrix

CUDA = "cuda:sm_90a"
MULTIHEAD = sparsec.ops.get("multihead_spmm")


def _program(op, spec, dtype="float16", heads=4, feat=16, kind="cuda"):
    params = {k: v for k, v in {"heads": heads, "feat": feat}.items() if k in op.params()}
    return lower_program(op, formats.make_format(spec), params, dtype, atomics=kind == "cuda")[1]


def _uses(op, spec, dtype="float16", kind="cuda"):
    return [u.transformation.name for u in templates(_program(op, spec, dtype, kind=kind), kind)]


@pytest.mark.parametrize("op,spec,dtype", [
    (MULTIHEAD, "bsr:16x16", "float16"), (MULTIHEAD, "bsr:32x32", "float16"), (MULTIHEAD, "bsr:32x32", "bfloat16"),
    (heads_blockmm(), "bsr:16x16", "float16"), (heads_scaled_relu(), "bsr:32x32", "float16"),
    (heads_row_bias(), "bsr:16x16", "bfloat16"), (spmm_edge_only(), "bsr:16x16", "float16")],
    ids=lambda x: getattr(x, "name", x))
def test_dispatch_picks_the_tensor_core_template(op, spec, dtype):
    assert _uses(op, spec, dtype) == ["bsr_tensorcore"]


@pytest.mark.parametrize("op,spec,dtype,kind", [
    (MULTIHEAD, "bsr:16x32", "float16", "cuda"),      # blocks not square
    (MULTIHEAD, "bsr:8x8", "float16", "cuda"),        # blocks not a multiple of 16
    (MULTIHEAD, "bsr:16x16", "float32", "cuda"),      # no 16-bit operands
    (MULTIHEAD, "bsr:16x16", "float16", "llvm"),
    (MULTIHEAD, "csr", "float16", "cuda"),
    (heads_row_norm(), "bsr:16x16", "float16", "cuda")])  # the epilogue reads other heads' outputs
def test_what_does_not_qualify_stays_on_cuda_cores(op, spec, dtype, kind):
    assert "bsr_tensorcore" not in _uses(op, spec, dtype, kind)


def test_head_axis_and_features_are_told_apart():
    prog = _program(heads_scaled_relu(), "bsr:32x32", heads=3, feat=24)
    assert (tc.heads_of(prog), tc.feat_of(prog), tc.block_size(prog)) == (3, 24, 32)
    assert tc.heads_of(_program(sparsec.ops.get("spmm"), "bsr:16x16")) is None
    swapped = _program(heads_blockmm(), "bsr:16x16", heads=2, feat=40)  # its loops: features, then heads
    assert [b.loop.name for b in swapped.nests[0].blocks[-1]][-2:] == ["c", "g"]
    assert (tc.heads_of(swapped), tc.feat_of(swapped)) == (2, 40)
    sig = tc.Signature.of(prog, tc._spmm_parts(prog))
    assert [(n, r) for n, r, *_ in sig.buffers] == [
        ("indptr", "indptr"), ("indices", "indices"), ("valid", "unused"), ("M", "unused"), ("W", "A"),
        ("X", "B"), ("bias", "extra"), ("Y", "C")]


CASES = [  # (operator, heads, feat, n_tile, stages, block)
    (MULTIHEAD, 4, 16, 16, 2, 16),
    (MULTIHEAD, 1, 24, 16, 3, 32),      # one head; a guarded last N tile
    (heads_scaled_relu(), 3, 24, 32, 2, 16),
    (heads_row_bias(), 2, 8, 8, 1, 32),
    (heads_blockmm(), 2, 40, 32, 2, 16),  # its loops: features, then heads
    (spmm_edge_only(), None, 16, 16, 2, 16),  # no head axis: edge data (nnz,) as the values
]


def _inputs(kernel, A, heads, seed=0):
    """Per-entry edge data (nnz, heads) for the sparse input, dense inputs of their shapes."""
    rng = np.random.default_rng(seed)
    dims = {"rows": A.shape[0], "cols": A.shape[1]}
    entries = (A.nnz,) if heads is None else (A.nnz, heads)
    return [rng.standard_normal(entries if p.sparse else tuple(dims.get(d, d) for d in p.shape)).astype(p.dtype)
            for p in kernel.inputs]


@pytest.mark.parametrize("op,heads,feat,n_tile,stages,bs", CASES,
                         ids=[f"{c[0].name}-h{c[1]}-f{c[2]}-n{c[3]}-s{c[4]}-b{c[5]}" for c in CASES])
def test_staged_semantics_match_float64(op, heads, feat, n_tile, stages, bs):
    A = bsr_matrix(bs, seed=(heads or 0) + feat)
    params = {k: v for k, v in {"heads": heads, "feat": feat}.items() if k in op.params()}
    _, prog = lower_program(op, A.format, params, "float16", atomics=True)
    ex = tvm.compile(tc.staged_for(prog, n_tile, stages), target="llvm")
    k = Kernel(op.name, A.format.spec, parse_target("llvm"), "float16", _param_specs(prog), {}, ex)
    ins = _inputs(k, A, heads)
    ins[0] = A.edge_values(ins[0]) if heads == 1 else ins[0]  # edge data either way
    out = np.asarray(k(A, *ins, poison=True))
    want = evaluate(op, A, *ins, params=params)
    assert out.shape == ((A.shape[0], feat) if heads is None else (A.shape[0], heads, feat))
    assert not np.isnan(out).any() and max_rel_err(out, want) <= 1e-5
    if op is MULTIHEAD or heads is None:
        assert np.all(out[bs:2 * bs] == 0)  # an empty block row: zeros over the poison


def test_cuda_kernels_are_one_tensor_core_launch():
    """multihead_spmm fp16 (4 heads, 64 features, blocks of 32) and the user operator with a
    scale, a bias per (head, feature) and ReLU in bf16: one launch each, the head in the grid's
    y dimension, mma.sync and ldmatrix in the PTX."""
    want = {"float16": "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
            "bfloat16": "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"}
    for op, spec, dtype, heads, feat in ((MULTIHEAD, "bsr:32x32", "float16", 4, 64),
                                         (heads_scaled_relu(), "bsr:16x16", "bfloat16", 2, 16)):
        k = sparsec.compile(op, spec, heads=heads, feat=feat, dtype=dtype, target=CUDA)
        assert k.knobs["n_tile"] == tc.default_knobs(int(spec[4:6]), feat)["n_tile"]
        src = k.source()
        bodies = _kernels(src)
        assert len(bodies) == 1 and "blockIdx.y" in bodies[0]
        ptx = nvcc_ptx(src, "sm_90a")
        assert want[dtype] in ptx and "ldmatrix.sync.aligned.m8n8" in ptx
