"""The packed Tensor Core formats through the compiler: ``mma_sp`` and ``nm_tc`` as registry
families (specs, conversion, validation, CLI flags), the packed operands the kernel layer
hands the kernels (replayed on the CPU against the generic llvm kernel), the capability
dispatch in ``sparsec.compile`` (by structure, with a bias/ReLU epilogue, and the fallbacks),
and the PTX nvcc emits for what ``sparsec build --emit-source`` prints. (The kernels run on
the GPU host: benchmarks/check_tc_formats.py.)"""
import contextlib
import io

import numpy as np
import pytest
import scipy.sparse as sp

from nvcc_tools import nvcc_ptx
from sparsec import build, cli, dsl, formats
from sparsec.formats import mma_sp, nm_tc
from sparsec.formats.registry import format_from_spec, make_format
from sparsec.schedules import srbcrs_tensorcore as stc
from sparsec.schedules import tensorcore_packed, templates
from sparsec.tc_operands import packed_operands

from dense_ops import spmm_row_bias_relu

SP24 = "mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32"
GATHER = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
S8 = "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32"


def _two_four(rows, cols, seed):
    """A 2:4 float16 matrix with an empty row and an explicit zero."""
    w = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    w[1] = 0
    dense = formats.nm.prune(w, n=2, m=4)[0].to_dense()
    m = sp.csr_matrix(dense)
    m.data[0] = 0.0  # an explicit zero stays an entry
    return m


# ---------------------------------------------------------------- the families


@pytest.mark.parametrize("spec, want", [("mma_sp", "mma_sp"), ("mma_sp:2:4", "mma_sp"), ("nm_tc:1:8", "nm_tc:1,8,128"),
                                        ("nm_tc:1:8:v16", "nm_tc:1,8,16"), ("nm_tc:2,8,v=64", "nm_tc:2,8,64")])
def test_specs_round_trip(spec, want):
    fmt = make_format(spec)
    assert fmt.spec == want and format_from_spec(fmt.spec) == fmt
    names = [n for n, _ in formats.families()]
    assert "mma_sp" in names and "nm_tc" in names


@pytest.mark.parametrize("spec, match", [("mma_sp:1:4", "mma_sp is 2:4 only"), ("nm_tc:1:8:v8", "vec should be one of"),
                                         ("nm_tc", "nm_tc needs N and M"), ("nm_tc:4:4", "1 <= N < M")])
def test_bad_specs_name_the_parameter(spec, match):
    with pytest.raises(ValueError, match=match):
        make_format(spec)


def test_conversion_packs_once_and_validation_names_what_is_wrong():
    m = _two_four(37, 70, 0)
    A = formats.convert(m, "mma_sp", dtype=np.float16)
    values, meta = A.arrays["sp24_values"], A.arrays["sp24_meta"]
    assert np.array_equal(mma_sp.unpack(values, meta, A.shape), A.to_dense())
    assert packed_operands(A, ["sp24_values"])["sp24_values"] is values  # the conversion's arrays, not a repack
    assert "sp24_values" not in formats.convert(m, "mma_sp").arrays  # float32 values: no packed operand
    with pytest.raises(ValueError, match=r"row 0, columns 0..3 hold 4 non-zeros, more than N=2 of every M=4"):
        formats.convert(sp.csr_matrix(np.ones((4, 8), np.float32)), "mma_sp")
    stale = formats.FormatInstance(A.format, A.shape, {**A.arrays, "sp24_values": values * 2}, A.data, A.nnz)
    with pytest.raises(ValueError, match="should encode the same matrix as data"):
        stale.seal()
    B = formats.convert(nm_tc.prune(np.random.default_rng(2).standard_normal((40, 50)), n=1, m=8, vec=16),
                        "nm_tc:1:8:v16", dtype=np.float16)
    assert np.array_equal(nm_tc.unpack(B.arrays["gather_values"], B.arrays["gather_cols"], B.shape, 16),
                          B.to_dense().astype(np.float64))
    with pytest.raises(ValueError, match="uses 2 columns in window|distinct columns"):
        formats.convert(sp.csr_matrix(np.eye(32, 16, dtype=np.float32)), "nm_tc:1:8:v16")


def test_cli_runs_the_families_and_names_flags_that_do_not_apply(capsys):
    for args in (["--format", "mma_sp"], ["--format", "nm_tc", "--n", "1", "--m", "8", "--vec", "16"]):
        assert cli.main(["run", "spmm", *args, "--random", "40,64,0.3", "--dtype", "float16", "--feat", "8",
                         "--check"]) == 0
    assert cli.main(["run", "spmm", "--format", "mma_sp", "--vec", "16", "--random", "8,8,0.5"]) == 2
    assert "--vec does not apply to format mma_sp" in capsys.readouterr().err


# ---------------------------------------------------------------- the operands, replayed on the CPU


def test_packed_operands_replay_the_generic_kernel():
    """What the kernels read, replayed lane by lane (mma_sp) or per vector (nm_tc), equals
    the generic llvm kernel on the logical pattern (odd sizes, an empty row)."""
    rng = np.random.default_rng(5)
    A = formats.convert(_two_four(37, 70, 1), "nm:2:4", dtype=np.float16)
    B = rng.standard_normal((70, 8)).astype(np.float16)
    ref = build.compile("spmm", A, target="llvm", feat=8)(A, B, poison=True)
    ops = packed_operands(A, ["sp24_values", "sp24_meta"])
    got = mma_sp.emulate(ops["sp24_values"], ops["sp24_meta"], B)[:37]
    np.testing.assert_allclose(got, ref, rtol=2e-3, atol=2e-3)
    again = A.with_data(A.data * np.float16(2))  # new values: packed again, never read stale
    np.testing.assert_allclose(mma_sp.unpack(*packed_operands(again, ["sp24_values", "sp24_meta"]).values(),
                                             A.shape), 2 * A.to_dense().astype(np.float32))

    G = formats.convert(nm_tc.prune(rng.standard_normal((40, 50)), n=1, m=4, vec=16), "nm_tc:1:4:v16",
                        dtype=np.float16)
    Bg = rng.standard_normal((50, 16)).astype(np.float16)
    vals, cols = G.arrays["gather_values"].astype(np.float64), G.arrays["gather_cols"]
    got = np.concatenate([vals[v * 16:(v + 1) * 16] @ Bg[cols[v]].astype(np.float64) for v in range(cols.shape[0])])
    ref = build.compile("spmm", G, target="llvm", feat=16)(G, Bg, poison=True)
    np.testing.assert_allclose(got[:40], ref, rtol=2e-3, atol=2e-3)

    Q = formats.convert(sp.random(21, 40, density=0.3, random_state=3, dtype=np.float32, data_rvs=lambda n:
                                  rng.integers(-9, 9, n)), "srbcrs:v8,int8")
    Bi = rng.integers(-5, 5, (40, 16)).astype(np.int8)
    ref = build.compile("spmm", Q, target="llvm", feat=16)(Q, Bi, poison=True)
    got = stc.emulate(Q.arrays["indptr"], Q.arrays["indices"], Q.data, Bi, 21, 8)
    assert np.array_equal(got, ref)


# ---------------------------------------------------------------- the dispatch and the code


def test_dispatch_is_by_structure_and_capability():
    from sparsec.lower import lower_program
    from sparsec import ops

    def uses(op, spec, dtype, kind="cuda"):
        _, program = lower_program(op, make_format(spec), {"feat": 64}, dtype, atomics=kind == "cuda")
        return [u.transformation.name for u in templates(program, kind)]

    assert uses(ops.get("spmm"), "nm:2:4", "float16") == ["tc_pipeline_spmm"]
    assert uses(spmm_row_bias_relu(), "mma_sp", "float16") == ["tc_pipeline_spmm"]
    assert uses(ops.get("spmm"), "srbcrs:v8,int8", "int8") == ["srbcrs_int8_spmm"]
    assert "tc_pipeline_spmm" not in uses(ops.get("spmm"), "nm:2:4", "float32")  # no fp16 operand: CUDA cores
    assert "tc_pipeline_spmm" not in uses(ops.get("spmm"), "nm:1:4", "float16")
    assert "tc_pipeline_spmm" not in uses(ops.get("spmm"), "nm:2:4", "float16", "llvm")
    assert "srbcrs_int8_spmm" not in uses(ops.get("spmm"), "srbcrs:v8,int4", "int4")
    assert "tc_pipeline_spmm" not in uses(ops.get("sddmm"), "nm:2:4", "float16")
    t = tensorcore_packed.tc_pipeline_spmm
    assert set(t.knobs) >= {"warps_m", "warp_n_tiles", "k_steps", "stages", "group_m"}
    k = build.compile("spmm", "nm_tc:1:8:v16", target="cuda:sm_90a", dtype="float16", feat=64,
                      knobs={"stages": 2, "warp_n_tiles": 2})
    assert k.knobs["stages"] == 2 and k.knobs["warps_m"] * k.knobs["warp_m_tiles"] * 16 <= 16
    with pytest.raises(ValueError, match="rows_per_block"):
        build.compile("spmm", "mma_sp", target="cuda:sm_90a", dtype="float16", feat=64, knobs={"rows_per_block": 4})


def _emitted(argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["build", "spmm", *argv, "--target", "cuda:sm_90a", "--emit-source"]) == 0
    return out.getvalue()


@pytest.mark.parametrize("argv, want", [
    (["--format", "nm", "--n", "2", "--m", "4", "--dtype", "float16"], SP24),
    (["--format", "mma_sp", "--dtype", "float16"], SP24),
    (["--format", "nm_tc", "--n", "1", "--m", "8", "--vec", "16", "--dtype", "float16"], GATHER),
    (["--format", "srbcrs", "--vec", "8", "--dtype", "int8"], S8)])
def test_build_emits_tensor_core_code_that_nvcc_compiles(argv, want):
    ptx = nvcc_ptx(_emitted(argv), "sm_90a")
    assert want in ptx
    if want != S8:
        assert "cp.async.cg.shared.global" in ptx and "ldmatrix.sync.aligned.m8n8.x4" in ptx


def test_user_operator_with_bias_and_relu_runs_mma_sp_with_the_epilogue():
    k = build.compile(spmm_row_bias_relu(), "nm:2:4", target="cuda:sm_90a", dtype="float16", feat=64)
    assert [p.name for p in k.params] == ["sp24_values", "sp24_meta", "B", "bias", "C"]
    ptx = nvcc_ptx(k.source(), "sm_90a")
    assert SP24 in ptx and "max.f32" in ptx


def test_tuner_derives_the_tensor_core_space_from_the_declarations():
    from sparsec.tune.space import Space

    m = sp.random(64, 128, density=0.3, random_state=0, format="csr", dtype=np.float32)
    s = Space("spmm", m, 64, dtype="float16", families=("mma_sp", "nm_tc"), size="small")
    tc = [c for c in s.candidates if c["format"] in ("mma_sp", "nm_tc:1:8:v128")]
    assert {c["format"] for c in tc} == {"mma_sp", "nm_tc:1:8:v128"} and len(tc) > 2
    assert all(set(c["schedule_knobs"]) == set(tensorcore_packed.tc_pipeline_spmm.knobs) for c in tc)
    assert all(128 % (16 * c["schedule_knobs"]["warps_m"] * c["schedule_knobs"]["warp_m_tiles"]) == 0
               for c in tc if c["format"].startswith("nm_tc"))  # a block gathers one row vector's columns
    q = Space("spmm", m, 64, dtype="int8", families=("srbcrs",), size="full")
    assert {c["format"] for c in q.candidates} >= {"srbcrs:v2,int8", "srbcrs:v8,int8"}


def _linear(transpose: bool, bias_axis: str, activation, out_dtype="float16"):
    """A user's SpMM with a bias along ``bias_axis`` (i: per row, k: per column of B), an
    activation of the sum, a declared output dtype, written C[k, i] when ``transpose``."""
    op = dsl.Operator(f"lin_{transpose}_{bias_axis}_{out_dtype}", "C = act(A @ B + bias)")
    i = op.dense_fixed("i")
    j = op.sparse_variable("j", parent=i)
    k = op.dense_fixed("k", extent="feat")
    A, B = op.sparse_input("A", (i, j)), op.dense_input("B", (j, k))
    bias = op.dense_input("bias", (i,) if bias_axis == "i" else (k,), dtype="float32")
    C = op.dense_output("C", (k, i) if transpose else (i, k), dtype=out_dtype)

    def at(ii, kk):
        return (kk, ii) if transpose else (ii, kk)

    with op.iterate([i, j, k], "SRS") as (ii, jj, kk):
        C[at(ii, kk)] += A[ii, jj] * B[jj, kk]
    with op.iterate([i, k], "SS") as (ii, kk):
        C[at(ii, kk)] = activation(C[at(ii, kk)] + (bias[ii] if bias_axis == "i" else bias[kk]))
    return op


def test_dispatch_takes_output_precision_transposed_output_and_epilogues():
    from sparsec.lower import lower_program

    def found(op, spec="mma_sp", feat=64):
        _, program = lower_program(op, make_format(spec), {"feat": feat}, "float16", atomics=True)
        return tensorcore_packed.match(program, "cuda")

    m = found(_linear(True, "i", dsl.gelu))
    assert (m.transpose_c, m.out_dtype, m.bias_axis, m.bias_dtype, m.activation) == \
        (True, "float16", "row", "float32", "gelu")
    m = found(_linear(False, "k", dsl.gelu_tanh, "float32"), "nm_tc:1:8:v16")
    assert (m.layout, m.transpose_c, m.out_dtype, m.bias_axis, m.activation) == \
        ("gather", False, "float32", "col", "gelu_tanh")
    assert found(_linear(True, "i", lambda x: x)).activation == "none"
    assert found(_linear(True, "i", dsl.exp)) is None  # no epilogue the kernel carries: the generic template
    assert found(_linear(True, "i", dsl.relu, "int32")) is None  # an output precision the kernel cannot store
    # the tile rule per feature count (a linear layer's tokens) and gathered row length
    small, large = tensorcore_packed.default_pipeline_knobs("gather", 128, 64, 320), \
        tensorcore_packed.default_pipeline_knobs("gather", 128, 4096, 320)
    assert (small["warps_m"], small["k_steps"], large["warps_m"], large["k_steps"], large["stages"]) == (4, 4, 2, 4, 3)
    assert tensorcore_packed.default_pipeline_knobs("gather", 128, 4096, 96)["k_steps"] == 2


def test_transposed_fp16_output_with_a_column_bias_compiles_to_tensor_core_ptx():
    """C[k, i] in float16 with bias[k] and ReLU: one kernel, the store chosen when it runs
    (16-byte rows where the row count allows it)."""
    k = build.compile(_linear(True, "k", dsl.relu), "mma_sp", target="cuda:sm_90a", dtype="float16", feat=64)
    assert [(p.name, p.dtype, p.shape) for p in k.params][2:] == \
        [("B", "float16", ("cols", 64)), ("bias", "float32", (64,)), ("C", "float16", (64, "rows"))]
    ptx = nvcc_ptx(k.source(), "sm_90a")
    assert SP24 in ptx and "max.f32" in ptx and "cvt.rn.f16.f32" in ptx and "st.global.v4" in ptx


def test_torch_launch_hands_packed_operands_packed_from_the_values_given():
    """sparsec.torch on CUDA: a 2:4 float16 matrix's SpMM reads the packed operands, packed
    from the launch's values tensor and again when that tensor is written in place."""
    import torch

    from sparsec import torch as st
    from sparsec import torch_launch

    A = st.SparseTensor(_two_four(32, 64, 7), "nm:2:4", dtype=np.float16)
    _, recipe, _ = torch_launch._matrix_plan("spmm", A.key, "float16", 16, "cuda")  # compiles for CUDA (no GPU needed)
    assert [r for r in recipe if r[0] == "packed"] == [("packed", "sp24_values"), ("packed", "sp24_meta")]
    first = torch_launch.packed_operand(A.key, "sp24_values", A.values)
    assert torch_launch.packed_operand(A.key, "sp24_values", A.values) is first
    with torch.no_grad():
        A.values.mul_(2)
    again = torch_launch.packed_operand(A.key, "sp24_values", A.values)
    np.testing.assert_array_equal(again.float().numpy(), 2 * first.float().numpy())


def test_kernel_compiled_for_a_matrix_carries_a_body_sized_for_it():
    """Compiled for a converted matrix, the pipelined kernel holds two kernels: one sized for
    that matrix (constant bounds; on the H100 the any-size one took 1.3-1.5x its time at 4096
    columns) and the any-size one it falls back to for other matrices of the format. The
    sized one has no bound check on the full tiles of a 64 x 64 matrix: fewer predicates."""
    A = formats.convert(_two_four(64, 64, 3), "mma_sp", dtype=np.float16)
    sized = build.compile("spmm", A, target="cuda:sm_90a", feat=64)
    general = build.compile("spmm", "mma_sp", target="cuda:sm_90a", dtype="float16", feat=64)
    assert general.source().count("__global__") * 2 == sized.source().count("__global__")
    from sparsec import ops
    from sparsec.lower import lower_program

    _, program = lower_program(ops.get("spmm"), A.format, {"feat": 64}, "float16", atomics=True)
    assert tensorcore_packed.match(program, "cuda", shape=A.shape).sized_for == (64, 64, 0)
    assert tensorcore_packed.match(program, "cuda").sized_for is None
    assert SP24 in nvcc_ptx(sized.source(), "sm_90a")


def test_int8_kernel_compiled_for_a_matrix_carries_a_body_sized_for_it():
    """The int8 SR-BCRS kernel compiled for a converted matrix holds the hand-built kernel for
    its size (constant grid, M and K; on the H100 the any-size one alone ran at 0.66-0.92x
    its speed) beside the any-size one, which is all a kernel compiled for the spec holds."""
    rng = np.random.default_rng(4)
    Q = formats.convert(sp.random(21, 40, density=0.3, random_state=4, dtype=np.float32,
                                  data_rvs=lambda n: rng.integers(-9, 9, n)), "srbcrs:v8,int8")
    sized = build.compile("spmm", Q, target="cuda:sm_90a", feat=16)
    general = build.compile("spmm", "srbcrs:v8,int8", target="cuda:sm_90a", dtype="int8", feat=16,
                            knobs=sized.knobs)  # without a matrix the default is by width alone
    assert general.source().count("__global__") * 2 == sized.source().count("__global__") == 4
    assert [p.name for p in sized.params] == [p.name for p in general.params]
    from sparsec import ops
    from sparsec.lower import lower_program

    _, program = lower_program(ops.get("spmm"), Q.format, {"feat": 16}, "int8", atomics=True)
    assert tensorcore_packed.match(program, "cuda", shape=Q.shape).sized_for == (21, 40, 0)
    assert tensorcore_packed.match(program, "cuda").sized_for is None
    assert nvcc_ptx(sized.source(), "sm_90a").count(S8) == 2 * nvcc_ptx(general.source(), "sm_90a").count(S8)
