"""Tensor Core linear layers (sparsec.tc_linear): pattern parsing, packing of pruned weights
(vector-wise N:M padded to whole stages, 2:4 for mma.sp), clear errors for what the kernels
cannot take, the knobs picked per token count, and the kernels themselves: built by
sparsec.compile from the layer's DSL operator (PTX checked with nvcc; its semantics on the
llvm target against float64). (The kernels run on the GPU host: benchmarks/time_ffn_tc.py
and examples/pruned_encoder.py.)"""
import numpy as np
import pytest
import torch

from sparsec.formats import nm_tc
from sparsec import tc_linear as tl
from sparsec.torch import SparseLinear


@pytest.mark.parametrize("text, want", [("nm_tc:1,10", ("nm_tc", 1, 10)), ("nm_tc:2,8", ("nm_tc", 2, 8)),
                                        ("mma_sp:2,4", ("mma_sp", 2, 4))])
def test_patterns_parse(text, want):
    assert tl.parse_pattern(text) == want


@pytest.mark.parametrize("text, match", [("nm_tc", "should be 'nm_tc:N,M'"), ("csr:1,2", "should be"),
                                         ("mma_sp:1,4", "2:4 weights only"), ("nm_tc:3,2", "0 < N <= M")])
def test_bad_patterns_are_named(text, match):
    with pytest.raises(ValueError, match=match):
        tl.parse_pattern(text)


def test_vector_wise_weight_packs_as_its_format_with_the_same_product():
    rng = np.random.default_rng(0)
    w = tl.prune(rng.standard_normal((300, 770)).astype(np.float32), "nm_tc:1,10")
    assert np.count_nonzero(w) / w.size <= 0.1 + 1e-9
    layer = tl.TensorCoreLinear.from_dense(w, np.ones(300), "nm_tc:1,10", activation="gelu", device="cpu")
    values, cols = layer.values.float().numpy(), layer.index.numpy()
    # the format's gathered row length, the one sparsec.compile sizes the kernel's fast body for
    assert values.shape[1] == nm_tc.gathered_row_length(770, 1, 10) == layer.instance.arrays["gather_values"].shape[1]
    assert cols.shape == (3, values.shape[1])
    assert layer.bias.dtype == torch.float32
    dense = nm_tc.unpack(values, cols, w.shape, tl.VEC)  # the padding slots add zeros
    np.testing.assert_allclose(dense, w.astype(np.float16).astype(np.float64), rtol=0, atol=0)


def test_two_four_weight_packs_for_mma_sp_and_other_weights_are_refused():
    rng = np.random.default_rng(1)
    w = tl.prune(rng.standard_normal((64, 128)).astype(np.float32), "mma_sp:2,4")
    layer = tl.TensorCoreLinear.from_dense(w, None, "mma_sp:2,4", device="cpu")
    assert layer.index.dtype == torch.uint32 and layer.values.shape == (64, 64)
    with pytest.raises(ValueError, match="more than N=2 of every M=4"):
        tl.TensorCoreLinear.from_dense(rng.standard_normal((64, 128)), None, "mma_sp:2,4", device="cpu")
    with pytest.raises(ValueError, match=r"rows 0\.\.127, columns 0\.\.9 .* distinct columns"):
        tl.TensorCoreLinear.from_dense(rng.standard_normal((128, 40)), None, "nm_tc:1,10", device="cpu")


def test_inputs_the_kernel_cannot_take_are_named():
    w = tl.prune(np.random.default_rng(2).standard_normal((128, 64)).astype(np.float32), "nm_tc:1,8")
    layer = tl.TensorCoreLinear.from_dense(w, None, "nm_tc:1,8", device="cpu")
    with pytest.raises(ValueError, match="runs on a CUDA GPU"):
        layer(torch.zeros(4, 64, dtype=torch.float16))
    with pytest.raises(ValueError, match="last dimension should be 64"):
        layer(torch.zeros(4, 65, dtype=torch.float16))
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        tl.TensorCoreLinear.from_dense(w, None, "nm_tc:1,8", device="cpu", dtype=torch.float32)
    with pytest.raises(ValueError, match="activation should be one of"):
        tl.TensorCoreLinear.from_dense(w, None, "nm_tc:1,8", activation="swish", device="cpu")
    with pytest.raises(ValueError, match="up gives 128 features but down takes 64"):
        tl.SparseFFN(layer, layer)


def test_sparse_linear_hands_tensor_core_patterns_to_tensor_core_linear():
    w = tl.prune(np.random.default_rng(3).standard_normal((128, 64)).astype(np.float32), "nm_tc:1,8")
    layer = SparseLinear.from_dense(torch.from_numpy(w), fmt="nm_tc:1,8", device="cpu")
    assert isinstance(layer, tl.TensorCoreLinear) and layer.values.dtype == torch.float16


@pytest.mark.parametrize("mode, tokens, kc, want", [
    ("gather", 128, 96, dict(warps_m=4, k_steps=4)), ("gather", 4096, 96, dict(warps_m=2, k_steps=2, stages=3)),
    ("gather", 4096, 320, dict(k_steps=4, stages=3)), ("sp24", 4096, 0, dict(k_steps=4))])
def test_knobs_follow_the_token_count_and_row_length(mode, tokens, kc, want):
    from sparsec.schedules import tc_pipeline as tp

    knobs = tl.knobs_for(mode, tokens, kc)
    assert {k: knobs[k] for k in want} == want
    bm, _ = tp.block_shape({**{k: v[0] for k, v in tp.KNOBS.items()}, **knobs})
    assert tl.VEC % bm == 0  # a block gathers within one row vector
    tp.check(mode, 3072, 768, tokens, "float16", "float16", tl.VEC, {**{k: v[0] for k, v in tp.KNOBS.items()}, **knobs})


def test_transpose_kernel_moves_16_byte_chunks_and_names_sizes_it_cannot_take():
    """The token-major -> feature-major step (torch's strided copy ran at 21 us where this
    kernel takes 4 us on an H200 at 4096 x 768; benchmarks/results/ffn_tc_H200.json)."""
    from nvcc_tools import nvcc_sources
    from sparsec.schedules import transpose
    from sparsec.schedules.warp_mma import cuda_source

    src = cuda_source(transpose.build(4104, 776))
    assert src.count("*(uint4*)(X_ptr") >= 1 and src.count("*(uint4*)(Y_ptr") >= 1
    results = nvcc_sources({("transpose", "sm_90a"): src})
    assert all(ok for ok, _ in results.values()), results
    with pytest.raises(ValueError, match="multiples of 8"):
        transpose.transpose(4096, 770)
    with pytest.raises(ValueError, match="dtype should be one of"):
        transpose.transpose(64, 64, "float32")


def test_feature_major_builds_the_transpose_kernel_it_launches():
    """SparseFFN's one transpose: on CUDA, feature_major launches the tiled kernel built by
    ``_transposer`` (which once went missing: a NameError on the GPU host alone); elsewhere
    it is torch's own transpose."""
    assert callable(tl._transposer(64, 32, "float16", "sm_90a"))
    x = torch.arange(12, dtype=torch.float16).reshape(3, 4)
    assert torch.equal(tl.feature_major(x), x.t().contiguous())


SP24 = "mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32"
GATHER = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"


@pytest.mark.parametrize("pattern, via_sparse_linear, instr", [("mma_sp:2,4", True, SP24), ("nm_tc:1,8", False, GATHER)])
def test_layer_kernel_is_sparsec_compile_of_its_operator_on_tensor_cores(pattern, via_sparse_linear, instr):
    """The layer's kernel is what sparsec.compile builds for its DSL operator and converted
    weight: the packed Tensor Core pipeline with a float16, token-major output, the bias and
    activation in its epilogue, and the tile rule of its token count."""
    from nvcc_tools import nvcc_ptx

    rng = np.random.default_rng(4)
    w = tl.prune(rng.standard_normal((256, 96)).astype(np.float32), pattern)
    bias = torch.from_numpy(rng.standard_normal(256).astype(np.float32))
    if via_sparse_linear:  # SparseLinear hands the pattern to the same layer (CUDA kernels, no GPU needed to build)
        layer = SparseLinear.from_dense(torch.from_numpy(w), bias, fmt=pattern, device="cpu")
    else:
        layer = tl.TensorCoreLinear.from_dense(w, bias, pattern, activation="gelu", device="cpu")
    k = layer.kernel(64)
    assert [p.name for p in k.params][2:] == ["X", "bias", "C"]
    out = k.params[-1]
    assert out.dtype == "float16" and out.shape == (64, "rows")  # token-major, the layer's precision
    mode = "gather" if pattern.startswith("nm_tc") else "sp24"
    assert {n: k.knobs[n] for n in ("warps_m", "k_steps", "stages")} == \
        {n: tl.knobs_for(mode, 64, int(layer.values.shape[1]), w.shape)[n] for n in ("warps_m", "k_steps", "stages")}
    ptx = nvcc_ptx(k.source(), "sm_90a")
    assert instr in ptx and "cvt.rn.f16.f32" in ptx and "st.global.v4" in ptx  # fp16 C, 16-byte stores
    assert layer.kernel(64) is k  # compiled once per pattern, token count and layout


def test_bfloat16_layer_kernel_carries_the_body_sized_for_its_weight():
    """A bfloat16 layer's matrix is a float32 instance (the formats pack float16), which
    carries no packed rows: its kernel still takes the row length that packing gives, so it
    has the sized body and the knobs of the float16 layer's kernel."""
    w = tl.prune(np.random.default_rng(5).standard_normal((256, 770)).astype(np.float32), "nm_tc:1,10")
    half, bf16 = (tl.TensorCoreLinear.from_dense(w, None, "nm_tc:1,10", device="cpu", dtype=dt)
                  for dt in (torch.float16, torch.bfloat16))
    assert "gather_values" not in bf16.instance.arrays and bf16.values.shape == half.values.shape
    kh, kb = half.kernel(1024), bf16.kernel(1024)
    assert kb.knobs == kh.knobs and kb.source().count("__global__") == kh.source().count("__global__") == 4


def test_token_counts_the_gathered_kernel_does_not_take_run_padded_to_16():
    """Vector-wise N:M kernels load B 16 columns at a time; a layer given another token
    count runs the kernel for the next multiple of 16 (the input padded with zeros, the
    extra outputs dropped) rather than fail or fall to the CUDA cores; 2:4 runs as given."""
    w = tl.prune(np.random.default_rng(6).standard_normal((256, 96)).astype(np.float32), "nm_tc:1,8")
    layer = tl.TensorCoreLinear.from_dense(w, None, "nm_tc:1,8", device="cpu")
    assert [layer.kernel_tokens(t) for t in (0, 1, 16, 17, 200)] == [16, 16, 16, 32, 208]
    k = layer.kernel(200)
    assert k is layer.kernel(208) and k.params[-1].shape == (208, "rows") and "warps_m" in k.knobs
    sp = tl.TensorCoreLinear.from_dense(tl.prune(w, "mma_sp:2,4"), None, "mma_sp:2,4", device="cpu")
    assert [sp.kernel_tokens(t) for t in (0, 37)] == [1, 37]
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="tokens should be a non-negative int"):
            layer.kernel_tokens(bad)


def test_layer_operator_computes_the_linear_layer_on_the_llvm_target():
    """The operator the layer compiles (bias per output feature, GELU, float16 output written
    token-major) against float64 on a poisoned output, through the generic llvm kernel."""
    from sparsec import build, formats, reference

    rng = np.random.default_rng(5)
    w = tl.prune(rng.standard_normal((40, 48)).astype(np.float32), "mma_sp:2,4")
    w[3] = 0  # an empty row (an output feature that is its bias alone)
    A = formats.convert(w, "mma_sp", dtype=np.float16)
    op = tl.linear_operator(True, "gelu", True, "float16")
    x = rng.standard_normal((48, 8)).astype(np.float16)
    b = rng.standard_normal(40).astype(np.float32)
    got = build.compile(op, A, target="llvm", tokens=8)(A, x, b, poison=True)
    want = reference.evaluate(op, A, x, b, params={"tokens": 8})
    assert got.dtype == np.float16 and got.shape == (8, 40)
    gelu = torch.nn.functional.gelu(torch.from_numpy(w.astype(np.float16).astype(np.float64) @ x.astype(np.float64)
                                                     + b[:, None])).numpy().T
    np.testing.assert_allclose(want, gelu, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)


def test_half_bsr_layer_kernel_sums_in_float32_and_stores_half():
    """SparseLinear's BSR path past the few-column kernels: the operator declaring C float16
    reaches the block-row Tensor Core template, whose accumulators are float32 and whose
    store writes half (no float32 C and cast pass after it); on the CPU the layer keeps the
    float32 path."""
    import sparsec
    from sparsec import formats
    from sparsec.torch import FEW_COLUMNS, _spmm_stored_as

    g = np.random.default_rng(7)
    w = np.where(g.random((8, 12)) < 0.4, 0, g.standard_normal((8, 12)))
    w = np.kron(w, np.ones((32, 32))).astype(np.float32)  # 256 x 384 of 32 x 32 blocks
    inst = formats.convert(w, "bsr:32x32", dtype="float16")
    k = sparsec.compile(_spmm_stored_as("float16"), inst, target="cuda:sm_90a", dtype="float16",
                        feat=FEW_COLUMNS + 64)
    src = k.source()
    assert {"n_tile", "warp_m", "stages"} <= set(k.knobs) and "mma.sync" in src
    assert "float acc" in src and k.outputs[0].dtype == "float16"
    layer = SparseLinear.from_dense(torch.from_numpy(w).half(), fmt="bsr:32x32")
    assert not layer._stores_half(torch.zeros(FEW_COLUMNS + 1, 384, dtype=torch.float16))  # CPU tensor
