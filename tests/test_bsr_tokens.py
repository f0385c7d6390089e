"""The token-major BSR linear-layer kernel (schedules/bsr_tokens.py) on the CPU: what nvcc makes
of it for sm_90a, its refusals by name, its defaults, and that sparsec.compile and
SparseLinear reach it by the operator's structure (the GPU checks and timings are
benchmarks/probe_bsr_tokens.py and benchmarks/weights.py)."""
import numpy as np
import pytest
import scipy.sparse as sp

from nvcc_tools import nvcc_ptx
from sparsec.schedules import bsr_tokens as bt
from sparsec.schedules.warp_mma import cuda_source


def linear_op(name="my_linear", out_dtype="float16", bias=None, act=None):
    """A user's linear layer on token-major X: Y[k, i] = act(sum_j A[i, j] * X[k, j] + bias[i])."""
    from sparsec import dsl

    op = dsl.Operator(name, "Y[k, i] = sum_j A[i, j] * X[k, j], written by a user")
    i = op.dense_fixed("i")
    j = op.sparse_variable("j", parent=i)
    k = op.dense_fixed("k", extent="feat")
    a, x = op.sparse_input("A", (i, j)), op.dense_input("X", (k, j))
    b = op.dense_input("bias", (i,), dtype=bias) if bias else None
    y = op.dense_output("Y", (k, i), dtype=out_dtype)
    with op.iterate([i, j, k], "SRS") as (vi, vj, vk):
        y[vk, vi] += a[vi, vj] * x[vk, vj]
    if bias or act:
        with op.iterate([k, i], "SS") as (vk, vi):
            v = y[vk, vi] + b[vi] if bias else y[vk, vi]
            y[vk, vi] = dsl.relu(v) if act == "relu" else v
    return op


def weight(rows=256, cols=512, block=32, seed=0):
    from sparsec import formats

    rng = np.random.default_rng(seed)
    keep = np.kron(rng.random((rows // block, cols // block)) < 0.3, np.ones((block, block), bool))
    w = np.where(keep, rng.standard_normal((rows, cols)), 0).astype(np.float32)
    return formats.convert(sp.csr_matrix(w), f"bsr:{block}x{block}", dtype="float16")


@pytest.mark.parametrize("block, tokens, kw", [
    ((64, 64), 4096, {}), ((32, 32), 1000, {}), ((16, 16), 77, {}),
    ((48, 32), 300, {"warps_n": 1, "bias": True, "activation": "relu"}),
    ((32, 64), 512, {"out_dtype": "float32", "direct": 1, "tiles": 4}),
    ((32, 32), 2000, {"tile": 64, "warps_m": 4, "warps_n": 2, "stages": 8, "per_stage": 2, "unchecked": True}),
    ((64, 16), 256, {"dtype": "bfloat16", "out_dtype": "bfloat16", "bias": True, "bias_dtype": "float16"})])
def test_builds_to_tensor_copies_mbarriers_and_mma(block, tokens, kw):
    """One lane of a producer warp issues a tensor copy of a stage's blocks and one of X's tile
    for each, arming the stage's mbarrier with their bytes; consumers wait on it, ldmatrix both
    K-major operands (no .trans) into mma.m16n8k16 with float32 sums, fence the slot's reads
    against the copy engine's next writes and release it; Y leaves packed (16-byte stores after
    a warp's staging rows, or 4-byte pairs with direct=1); one launch, no CTA barrier in the walk."""
    src = cuda_source(bt.build(block, tokens, **kw))
    ptx = nvcc_ptx(src, "sm_90a")
    ty = "bf16" if kw.get("dtype") == "bfloat16" else "f16"
    for needle in ("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes",
                   "mbarrier.arrive.expect_tx.shared::cta.b64", "mbarrier.try_wait.parity",
                   "mbarrier.arrive.shared::cta.b64", "fence.proxy.async.shared::cta",
                   "ldmatrix.sync.aligned.m8n8.x4.shared.b16", f"mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32"):
        assert needle in ptx, needle
    assert ".trans" not in ptx
    assert src.count("__grid_constant__ CUtensorMap") == 2 * 2  # X and the blocks (declaration and definition)
    if kw.get("out_dtype", "float16") != "float32":
        assert "cvt.rn." + ("bf16x2" if kw.get("out_dtype") == "bfloat16" else "f16x2") + ".f32" in ptx
    if kw.get("direct"):
        assert "ld.shared.v4" not in ptx
    else:
        assert "ld.shared.v4" in ptx and "st.global.v4" in ptx
    consumer = src[src.index("for (int jj = 0"):]
    assert "__syncthreads" not in consumer[:consumer.index("__syncwarp")]
    assert src.count("__global__") // 2 == 1


@pytest.mark.parametrize("kw, match", [
    ({"block": (80, 16)}, "block rows should be 16, 32, 48 or 64"),
    ({"block": (32, 128)}, "block columns should be 16, 32 or 64"),
    ({"tile": 96}, "tile should be one of"),
    ({"tile": 64, "warps_m": 8}, "not a multiple of 16"),
    ({"warps_n": 2}, r"warps_n should be one of \[1\]"),  # builds, not yet checked on the GPU
    ({"block": (48, 32), "warps_n": 2, "unchecked": True}, "do not split a 48-row block"),
    ({"tile": 256, "warps_m": 1, "warps_n": 1, "unchecked": True}, "accumulators a lane"),
    ({"warps_m": 8, "warps_n": 2, "tile": 256, "unchecked": True}, "at most 8"),
    ({"block": (64, 64), "tile": 256, "per_stage": 2, "stages": 8, "unchecked": True}, "bytes of shared memory"),
    ({"tokens": 0}, "tokens should be a positive int"),
    ({"bogus": 1}, "unexpected keyword|unknown knob")])
def test_refuses_what_it_cannot_take_by_name(kw, match):
    kw = dict(kw)
    block, tokens = kw.pop("block", (32, 32)), kw.pop("tokens", 1024)
    with pytest.raises((ValueError, TypeError), match=match):
        bt.plan(block, tokens, **{**bt.default_knobs(block, max(tokens, 1)), **kw})


def test_defaults_fit_and_follow_the_matrix():
    """Every default plans; 64-row blocks take 8 warps of 32 tokens and two 256-token tiles a
    CTA, smaller blocks 4 warps and one; a matrix of few block rows takes one tile a CTA, then
    128-token tiles; up to 128 tokens one 64- or 128-token tile."""
    for block in ((16, 16), (32, 32), (48, 64), (64, 64), (64, 16)):
        for tokens in (1, 64, 100, 129, 1024, 4096, 8192):
            for rows in (None, 384, 768, 4096, 11008):
                bt.plan(block, tokens, **bt.default_knobs(block, tokens, rows))
    assert bt.default_knobs((64, 64), 4096)["tiles"] == 2 and bt.default_knobs((64, 64), 4096)["warps_m"] == 8
    assert bt.default_knobs((32, 32), 4096)["tiles"] == 1 and bt.default_knobs((32, 32), 4096)["warps_m"] == 4
    assert bt.default_knobs((64, 64), 1024, rows=768)["tile"] == 128  # 12 block rows x 4 tiles < MIN_CTAS
    assert bt.default_knobs((64, 64), 4096, rows=768)["tiles"] == 2  # 12 x 8 CTAs
    assert bt.default_knobs((32, 32), 100)["tile"] == 128 and bt.default_knobs((32, 32), 50)["tile"] == 64


@pytest.mark.parametrize("kw", [{}, {"bias": "float32", "act": "relu"}, {"out_dtype": "float32"},
                                {"bias": "float16"}])
def test_compile_reaches_it_by_structure(kw):
    """A user's linear layer on token-major activations (any names, bias and activation in the
    statement) compiles to this kernel for sm_90a, taking X (tokens, in) and writing Y (tokens,
    out); for sm_80, which has no TMA, the generic template builds it; the library SpMM on
    feature-major B does not match it."""
    import sparsec

    inst = weight()
    op = linear_op(**kw)
    k = sparsec.compile(op, inst, target="cuda:sm_90a", dtype="float16", feat=300)
    assert set(k.knobs) == set(bt.KNOBS)
    shapes = {p.name: p.shape for p in k.params}
    assert shapes["X"] == (300, "cols") and shapes["Y"] == (300, "rows")
    assert "cp.async.bulk.tensor" in k.source() and k.extra["shape_multiple"] == 8
    assert not set(sparsec.compile(op, inst, target="cuda:sm_80", dtype="float16", feat=300).knobs) & {"tiles"}
    assert not set(sparsec.compile("spmm", inst, target="cuda:sm_90a", dtype="float16", feat=300).knobs) & {"tiles"}


def test_knobs_given_are_checked_by_name_and_odd_matrices_are_refused():
    """Knobs reach the kernel; a refused set names its problem; a matrix whose rows or columns
    are not a multiple of 8 gets the generic template, and a kernel compiled for an aligned one
    refuses it by name before launch."""
    import sparsec
    from sparsec import formats

    inst = weight()
    k = sparsec.compile(linear_op(), inst, target="cuda:sm_90a", dtype="float16", feat=512,
                        knobs={"tile": 128, "tiles": 2, "direct": 1})
    assert k.knobs["tiles"] == 2 and k.knobs["direct"] == 1
    with pytest.raises(ValueError, match="not a multiple of 16"):
        sparsec.compile(linear_op(), inst, target="cuda:sm_90a", dtype="float16", feat=512,
                        knobs={"tile": 64, "warps_m": 8})
    odd = formats.convert(sp.csr_matrix(np.ones((250, 510), np.float32)), "bsr:32x32", dtype="float16")
    generic = sparsec.compile(linear_op(), odd, target="cuda:sm_90a", dtype="float16", feat=64)
    assert "tiles" not in generic.knobs
    with pytest.raises(ValueError, match="multiples of 8"):
        k._check_instance(odd)


def test_sparse_linear_keeps_other_paths_off_hopper():
    """On the CPU (and any GPU before sm_90) SparseLinear runs its other paths: the same
    outputs as the dense layer."""
    import torch

    from sparsec.torch import SparseLinear

    w = torch.from_numpy(weight().to_dense()).float()
    layer = SparseLinear.from_dense(w, fmt="bsr:32x32", dtype="float32")
    x = torch.randn(5, 512)
    assert not layer._token_major(x)
    torch.testing.assert_close(layer(x), x @ w.t(), rtol=1e-4, atol=1e-4)


def test_the_library_linear_operator_reaches_it_from_the_cli(capsys):
    """``linear`` (Y = X A^T on token-major X) is a library operator: its float64 reference
    agrees with the DSL evaluator, ``sparsec run`` checks it on the CPU, and ``sparsec build
    linear --format bsr ... --target cuda:sm_90a --emit-source`` prints this kernel's TMA code."""
    from sparsec import cli, ops, reference

    inst = weight()
    x = np.random.default_rng(2).standard_normal((37, 512))
    np.testing.assert_allclose(reference.linear(inst, x),
                               reference.evaluate(ops.get("linear"), inst, x, params={"feat": 37}), rtol=1e-10)
    assert cli.main(["run", "linear", "--format", "bsr", "--block", "32x32", "--dtype", "float16", "--random",
                     "200,320,0.1", "--feat", "40", "--target", "llvm", "--check"]) == 0
    capsys.readouterr()
    assert cli.main(["build", "linear", "--format", "bsr", "--block", "64x64", "--dtype", "float16", "--target",
                     "cuda:sm_90a", "--emit-source"]) == 0
    out = capsys.readouterr().out
    assert "cp.async.bulk.tensor" in out and "fence.proxy.async" in out


def test_defaults_fit_a_float32_output():
    """A float32 Y's staging rows take twice the bytes: the default then takes 3 stages, or
    direct stores, rather than a plan over the shared memory (the library ``linear`` at 4096
    tokens on 64-row blocks once failed to build by default)."""
    for block in ((64, 64), (64, 32), (32, 64), (16, 16)):
        for tokens in (100, 1024, 4096):
            kn = bt.default_knobs(block, tokens, out_bytes=4)
            bt.plan(block, tokens, **kn, out_bytes=4)
    assert bt.default_knobs((64, 64), 4096, out_bytes=4)["stages"] == 3


def test_launch_copies_a_misaligned_view_of_an_input():
    """A layer's input may be a view that starts inside its allocation; the launch path hands
    the kernels (whose TMA and 16-byte copies need aligned rows) a copy then, and the tensor
    itself otherwise."""
    import torch

    from sparsec import torch_launch
    from sparsec.kernel import ParamSpec

    p = ParamSpec("X", "input", "float16", (4, 8))
    base = torch.zeros(100, dtype=torch.float16)
    view = base[1:33].view(4, 8)
    got = torch_launch._check("linear", p, view, (4, 8), base.device)
    assert got.data_ptr() % 16 == 0 and torch.equal(got, view) and got.data_ptr() != view.data_ptr()
    whole = torch.zeros(4, 8, dtype=torch.float16)
    assert torch_launch._check("linear", p, whole, (4, 8), whole.device) is whole


@pytest.mark.parametrize("kw, match", [({"activation": "silu"}, "activation should be one of"),
                                       ({"bias": True, "bias_dtype": "int8"}, "bias_dtype should be one of"),
                                       ({"out_dtype": "int32"}, "out_dtype should be one of")])
def test_spmm_refuses_an_epilogue_it_does_not_carry(kw, match):
    """An activation the epilogue has no code for would pass through unapplied: refused by name."""
    with pytest.raises(ValueError, match=match):
        bt.spmm((32, 32), 256, **kw)
