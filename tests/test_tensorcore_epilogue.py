"""The BSR Tensor Core template on every BSR fp16 SpMM-shaped operator, by structure: epilogues
after the reduction (a bias per row or per column, ReLU, a per-row scale, a constant, a cast
to float16) applied in the store, and few features (8, 16, 24, 40, 7: a guarded last N tile,
16 x 8 fragments for 8 columns). The staged function runs on llvm through a Kernel (NaN-
poisoned outputs) against ``reference.evaluate`` in float64; the CUDA kernels' PTX (nvcc)
holds mma.sync and ldmatrix, one launch with the epilogue inside."""
from __future__ import annotations

import re

import numpy as np
import pytest
import tvm

import sparsec
from sparsec import formats
from sparsec.build import _param_specs
from sparsec.kernel import Kernel
from sparsec.lower import lower_program
from sparsec.reference import evaluate, max_rel_err
from sparsec.schedules import tensorcore as tc
from sparsec.targets import parse_target

from dense_ops import spmm_bias_relu, spmm_row_bias_relu, spmm_scaled_half
from nvcc_tools import nvcc_ptx

CUDA = "cuda:sm_90a"


def bsr_matrix(bs: int, seed: int):
    """(5 bs - 3) x (4 bs - 5) of bs x bs blocks: block rows 1 and 3 empty, block row 4 full
    (a long row), odd edges; fp16 values with explicit zeros inside stored blocks."""
    rng = np.random.default_rng(seed)
    mask = rng.random((5, 4)) < 0.4
    mask[1] = mask[3] = False
    mask[4] = True
    mask[0, 0] = True
    vals = rng.standard_normal((5 * bs, 4 * bs))
    vals[rng.random(vals.shape) < 0.1] = 0.0
    dense = (np.kron(mask, np.ones((bs, bs))) * vals)[:5 * bs - 3, :4 * bs - 5]
    return formats.convert(dense.astype(np.float16), f"bsr:{bs}x{bs}")


def staged_kernel(op, A, feat: int, n_tile: int, stages: int, knobs=None) -> Kernel:
    """A Kernel (argument checks, output allocation, poisoning) around the *staged* function
    of ``op`` compiled for llvm: the Tensor Core template's semantics, unscheduled."""
    _, prog = lower_program(op, A.format, {"feat": feat}, "float16", atomics=True)
    assert tc.applies(prog, "cuda"), f"{op.name} should reach the Tensor Core template"
    ex = tvm.compile(tc.staged_for(prog, n_tile, stages), target="llvm")
    return Kernel(op.name, A.format.spec, parse_target("llvm"), "float16", _param_specs(prog), knobs or {}, ex)


def inputs(kernel, A, seed=0):
    rng = np.random.default_rng(seed)
    dims = {"rows": A.shape[0], "cols": A.shape[1]}
    return [rng.standard_normal(tuple(dims.get(d, d) for d in p.shape)).astype(p.dtype) for p in kernel.inputs]


CASES = [  # (operator, feat, n_tile, stages, block)
    (sparsec.ops.get("spmm"), 8, 8, 2, 16),
    (sparsec.ops.get("spmm"), 16, 16, 3, 16),
    (sparsec.ops.get("spmm"), 24, 16, 1, 16),
    (sparsec.ops.get("spmm"), 40, 32, 2, 32),
    (sparsec.ops.get("spmm"), 7, 8, 2, 16),
    (spmm_row_bias_relu(), 16, 16, 2, 32),
    (spmm_row_bias_relu(), 24, 32, 3, 16),
    (spmm_bias_relu(), 40, 64, 2, 16),
    (spmm_scaled_half(), 24, 16, 2, 16),
]


@pytest.mark.parametrize("op,feat,n_tile,stages,bs", CASES,
                         ids=[f"{c[0].name}-f{c[1]}-n{c[2]}-s{c[3]}-b{c[4]}" for c in CASES])
def test_staged_semantics_match_float64(op, feat, n_tile, stages, bs):
    A = bsr_matrix(bs, seed=feat + bs)
    k = staged_kernel(op, A, feat, n_tile, stages)
    ins = inputs(k, A)
    out = np.asarray(k(A, *ins, poison=True))
    want = evaluate(op, A, *ins, params={"feat": feat})
    assert not np.isnan(out).any()
    assert max_rel_err(out, want) <= (2e-3 if out.dtype == np.float16 else 1e-5)
    if op.name == "spmm":
        assert np.all(out[bs:2 * bs] == 0)  # an empty block row: zeros over the poison


def test_epilogue_structure_is_recognised():
    """What the template takes, by structure: SpMM + element-wise epilogues, whatever the
    names; not an epilogue that reads another row of C, nor one over a temporary."""
    from dense_ops import l2_rows, row_normalised, transform_aggregate

    fmt = formats.make_format("bsr:32x32")

    def prog(op):
        params = {k: v for k, v in {"feat": 16, "fin": 4, "fout": 16}.items() if k in op.params()}
        return lower_program(op, fmt, params, "float16", atomics=True)[1]

    for op in (spmm_row_bias_relu(), spmm_bias_relu(), spmm_scaled_half()):
        assert tc.is_block_spmm(prog(op)), op.name
    for op in (row_normalised(), l2_rows(), transform_aggregate()):
        assert not tc.is_block_spmm(prog(op)), op.name
    sig = tc.Signature.of(prog(spmm_scaled_half()), ("A", "B", "C"))
    assert [n for n, *_ in sig.buffers] == ["indptr", "indices", "A", "B", "s", "C"]


def test_default_knobs_fit_the_features():
    assert [tc.default_knobs(32, f)["n_tile"] for f in (1, 8, 9, 16, 24, 40, 64, 96, 128)] == \
        [8, 8, 16, 16, 16, 16, 16, 64, 128]
    assert tc.default_knobs(32, 8)["warp_n"] == 8
    assert {8, 16, 32}.issubset(tc.bsr_tensorcore.knobs["n_tile"].choices)
    assert 8 in tc.bsr_tensorcore.knobs["warp_n"].choices


# ---------------------------------------------------------------- CUDA kernels

def _kernels(src: str):
    heads = list(re.finditer(r"__global__ void __launch_bounds__\(\d+\) (\w+)\([^)]*\)\s*\{", src))
    return [src[h.end():heads[n + 1].start() if n + 1 < len(heads) else len(src)] for n, h in enumerate(heads)]


@pytest.mark.parametrize("op,feat", [("spmm", 16), ("epilogue", 16), ("spmm", 8)])
def test_cuda_kernel_is_one_tensor_core_launch(op, feat):
    operator = spmm_row_bias_relu() if op == "epilogue" else op
    k = sparsec.compile(operator, "bsr:32x32", feat=feat, dtype="float16", target=CUDA)
    assert k.knobs["n_tile"] == tc.default_knobs(32, feat)["n_tile"]
    src = k.source()
    bodies = _kernels(src)
    assert len(bodies) == 1
    if op == "epilogue":
        assert "bias_ptr" in bodies[0] and "max(" in bodies[0]
        assert [p.name for p in k.inputs] == ["B", "bias"]
    ptx = nvcc_ptx(src, "sm_90a")
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
    assert "ldmatrix.sync.aligned.m8n8" in ptx
    if feat == 8:  # 16 x 8 fragments: one m16n8k16 per tile, B as two 8 x 8 matrices
        assert "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16" in src


def test_tuner_space_searches_the_small_tiles():
    """The tuner's space for BSR fp16 with 16 features on a matrix the block-row template
    takes (1024 columns, 10 % of blocks; its knobs from bsr_tensorcore's declaration) tries
    the 8- and 16-column tiles and prunes the wider ones; on a matrix of short rows (256
    columns) it searches bsr_gather's knobs, the kernel sparsec.compile picks there."""
    import scipy.sparse as sp

    from sparsec.tune.space import Space

    def blocks(cols):
        mask = sp.random(16, cols // 16, 0.1, random_state=1).toarray() != 0
        return sp.csr_matrix(np.kron(mask, np.ones((16, 16))), dtype=np.float32)

    space = Space("spmm", blocks(1024), 16, "float16", families=["bsr"])
    tiles = {c["schedule_knobs"]["n_tile"] for c in space.candidates if c["format"] == "bsr:16x16"}
    assert tiles == {8, 16}
    assert any("wider than the 16 features need" in why for why in space.pruned)
    short = Space("spmm", blocks(256), 16, "float16", families=["bsr"])
    assert {c["schedule_knobs"]["split"] for c in short.candidates if c["format"] == "bsr:16x16"} == {1, 2}
