"""CUDA code generation without a GPU: every operator x format compiles for cuda:sm_80 and
cuda:sm_90a, its CUDA source has kernels with the launch bounds the default schedule
implies, and nvcc compiles that source to a cubin for both architectures."""
from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys

import pytest

import sparsec

from conftest import SPECS
from nvcc_tools import nvcc_many, nvcc_sources
from dsl_ops import TEST_OPS

OPS = ("spmm", "sddmm", "rowsum", "row_softmax")
ARCHS = ("sm_80", "sm_90a")
FEAT = 16
# ELL compiles for a known width; "ell" alone takes it from a converted matrix
CUDA_SPECS = tuple("ell:8" if s == "ell" else s for s in SPECS)

LAUNCH_BOUNDS = re.compile(r"__launch_bounds__\((\d+)\)")


def build(op: str, spec: str, arch: str, feat: int = FEAT) -> sparsec.Kernel:
    if op in TEST_OPS:
        return sparsec.compile(TEST_OPS[op][0](), spec, target=f"cuda:{arch}")
    return sparsec.compile(op, spec, feat=feat, target=f"cuda:{arch}")


def expected_threads(op: str, feat: int = FEAT) -> int:
    """Threads per block under the default CUDA templates (schedules/cuda.py defaults):
    SpMM: features over threadIdx.x in vectors of 4 (1 when feat % 4), at most 256 threads
    (the rest serial), times rows_per_block="auto" rows on threadIdx.y (blocks of about 128 threads);
    SDDMM (schedules/cuda_sddmm.py): lanes x groups = one warp per row, times 4 rows; row
    reductions (rowsum, a softmax's max and sum): a warp of lanes (32) times 4 rows;
    element-wise row kernels (a softmax's normalisation): 64 rows."""
    if op == "spmm":
        vec = 4 if feat % 4 == 0 else 1
        tx = feat // vec
        while tx > 256 and tx % 2 == 0:
            tx //= 2
        return tx * max(1, min(max(1, min(16, 128 // tx)), 1024 // tx))  # rows_per_block "auto"
    if op in ("sddmm", "rowsum"):
        return 32 * 4
    return 64


# the thread count of each kernel of an operator (SDDMM: the dot products and the scale by A in
# one kernel; row_softmax: the max, the sum of exponentials, the normalisation)
KERNELS = {"spmm": ("spmm",), "sddmm": ("sddmm",), "rowsum": ("rowsum",),
           "row_softmax": ("rowsum", "rowsum", "elementwise")}


def kernel_defs(src: str):
    """(launch bound, name) of each __global__ definition (not the forward declarations)."""
    return re.findall(r"__global__ void __launch_bounds__\((\d+)\) (\w+)\([^)]*\)\s*\{", src)


@pytest.fixture(scope="module")
def sources():
    """CUDA source of every (op, spec, arch), compiled once for the module."""
    return {(op, spec, arch): build(op, spec, arch).source() for op in OPS for spec in CUDA_SPECS for arch in ARCHS}


@pytest.fixture(scope="module")
def nvcc_results(sources):
    return nvcc_sources(sources)


# ---------------------------------------------------------------- sparsec side


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("spec", CUDA_SPECS)
@pytest.mark.parametrize("op", OPS)
def test_cuda_source(sources, op, spec, arch):
    src = sources[(op, spec, arch)]
    assert "__global__" in src
    defs = kernel_defs(src)
    kinds = KERNELS[op]
    assert len(defs) == len(kinds), f"expected {len(kinds)} kernels, found {[n for _, n in defs]}"
    assert [int(b) for b, _ in defs] == [expected_threads(k) for k in kinds], f"launch bounds {defs}"
    assert "threadIdx.x" in src and "blockIdx.x" in src


@pytest.mark.parametrize("feat", [1, 7, 33, 64, 1024, 1030])
@pytest.mark.parametrize("op", ["spmm", "sddmm"])
def test_launch_bounds_follow_feat(op, feat):
    """1030: 1030 features in 515 threads, 2 serially per thread, one row per block."""
    src = build(op, "csr", "sm_90a", feat=feat).source()
    assert int(kernel_defs(src)[0][0]) == expected_threads(op, feat)


@pytest.mark.parametrize("feat", [1, 17, 33, 64])
def test_sddmm_reduces_within_a_warp(feat):
    """A reduction group narrower than a warp would make TVM reduce through shared memory with
    __syncthreads inside the row loop, whose trip count differs between the rows of a block:
    a deadlock on the GPU. The dot products must reduce with warp shuffles only (feat=1: one
    lane per entry, nothing to combine)."""
    src = build("sddmm", "csr", "sm_90a", feat=feat).source()
    assert "__syncthreads" not in src
    assert ("__shfl" in src) == (feat > 1)


@pytest.mark.parametrize("feat,vec,lanes", [(64, 4, 16), (32, 4, 8), (512, 4, 32), (34, 2, 16), (17, 1, 16)])
def test_sddmm_lane_groups(feat, vec, lanes):
    """One kernel: vec consecutive features per lane as one vector load of X and Y, a shuffle
    reduction over `lanes` lanes (a power of two), then C = A * dot stored by the group's first lane."""
    src = build("sddmm", "csr", "sm_90a", feat=feat).source()
    assert len(kernel_defs(src)) == 1
    if vec > 1:
        assert f"*(float{vec}*)(Y_ptr + " in src and f"*(float{vec}*)(X_ptr + " in src
    offsets = [int(o) for o in re.findall(r"__shfl_down_sync\(mask_ptr\[0\], red_buf0_ptr\[0\], (\d+), 32\)", src)]
    assert max(offsets) == lanes // 2 and "__syncthreads" not in src
    assert re.search(r"C_ptr\[.*\] = \(A_ptr\[.*\] \* red_buf0_ptr\[0\]\);", src)


@pytest.mark.parametrize("knobs", [{"lanes": 32, "vec": 1, "groups": 1, "rows_per_block": 1},
                                   {"lanes": 8, "vec": 2, "groups": 8, "rows_per_block": 2}])
def test_sddmm_knobs(knobs):
    k = sparsec.compile("sddmm", "csr", feat=64, target="cuda:sm_90a", knobs=knobs)
    threads = knobs["lanes"] * knobs["groups"] * knobs["rows_per_block"]
    assert int(kernel_defs(k.source())[0][0]) == threads
    assert {n: k.knobs[n] for n in knobs} == knobs


@pytest.mark.parametrize("spec", ["csr", "bsr:2x2", "ell:8"])
@pytest.mark.parametrize("feat", [1032, 2048])
def test_spmm_wide_feat_compiles_for_cuda(feat, spec):
    src = build("spmm", spec, "sm_90a", feat=feat).source()
    assert int(kernel_defs(src)[0][0]) == expected_threads("spmm", feat)


def test_cuda_kernel_knobs_recorded():
    k = build("spmm", "bsr:4x4", "sm_90a")
    assert k.target.name == "cuda:sm_90a"
    # BSR's blocks are unrolled fully and its rows are of data-dependent length: neither
    # unroll nor slots_per_block / interleave acts on them, so they are not reported
    assert k.knobs == {"rows_per_block": "auto", "vec": 4, "feat_tiles": 1}


# ---------------------------------------------------------------- nvcc side


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("spec", CUDA_SPECS)
@pytest.mark.parametrize("op", OPS)
def test_nvcc_compiles(nvcc_results, op, spec, arch):
    ok, log = nvcc_results[(op, spec, arch)]
    assert ok, f"nvcc -arch={arch} failed for {op} {spec}:\n{log[-3000:]}"


def test_spmm_csr_source_compiles_for_sm80_and_sm90a():
    """The issue's CI check: the spmm csr CUDA source compiles with nvcc for sm_80 (source
    generated for cuda:sm_80) and sm_90a (source generated for cuda:sm_90a)."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    jobs = {arch: (build("spmm", "csr", arch).source(), arch) for arch in ARCHS}
    for arch, (ok, log) in nvcc_many(jobs).items():
        assert ok, f"nvcc -arch={arch}:\n{log[-3000:]}"


def test_cli_emit_source_compiles_for_sm80_and_sm90a():
    """`sparsec build spmm --format csr --feat 64 --target cuda:sm_XX --emit-source` prints CUDA source
    that nvcc compiles."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    if importlib.util.find_spec("sparsec.cli") is None:
        pytest.skip("sparsec.cli is not present in this checkout")
    jobs = {}
    for arch in ARCHS:
        # the `sparsec` console script's entry point (pyproject: sparsec = "sparsec.cli:main")
        p = subprocess.run([sys.executable, "-c", "import sys; from sparsec.cli import main; sys.exit(main())",
                            "build", "spmm", "--format", "csr", "--feat", "64", "--target", f"cuda:{arch}",
                            "--emit-source"],
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        assert "__global__" in p.stdout
        jobs[arch] = (p.stdout, arch)
    for arch, (ok, log) in nvcc_many(jobs).items():
        assert ok, f"nvcc -arch={arch} on the CLI's output:\n{log[-3000:]}"


def test_unrolled_loops_are_left_to_nvcc_unless_asked(monkeypatch):
    """The default CUDA build marks unrolled loops with #pragma unroll (small sources, fast
    builds); SPARSEC_CUDA_UNROLL=explicit makes TVM copy the bodies; a bad mode is named."""
    import sparsec
    from sparsec.build import cuda_unroll_config

    knobs = {"rows_per_block": 1, "vec": 1, "slots_per_block": 128, "interleave": 1}
    pragma = sparsec.compile("spmm", "ell:4", target="cuda:sm_90a", feat=32, knobs=knobs).source()
    monkeypatch.setenv("SPARSEC_CUDA_UNROLL", "explicit")
    explicit = sparsec.compile("spmm", "ell:4", target="cuda:sm_90a", feat=32, knobs=knobs).source()
    assert "#pragma unroll" in pragma and "#pragma unroll" not in explicit
    assert len(explicit) > 3 * len(pragma)
    monkeypatch.setenv("SPARSEC_CUDA_UNROLL", "sideways")
    with pytest.raises(ValueError, match="SPARSEC_CUDA_UNROLL should be one of"):
        cuda_unroll_config()


@pytest.mark.parametrize("spec", ["csr", "ell", "hyb"])
def test_wide_features_accumulate_per_serial_chunk(spec):
    """F / vec > 256 runs feature chunks serially per thread. Each chunk keeps its own vec
    accumulators and writes them back as one vector: with the chunks inside the entry loop,
    TVM's write-back covered the span between a thread's chunks, other threads' outputs
    included (wrong SpMM results at F >= 2048 on the H200)."""
    import numpy as np
    import scipy.sparse as sp

    m = sp.random(300, 200, density=0.05, format="csr", random_state=0, dtype=np.float32)
    for feat in (2048, 4096):
        A = sparsec.formats.convert(m, spec)
        src = sparsec.compile("spmm", A, target="cuda:sm_90a", feat=feat).source()
        sizes = [int(n) for n in re.findall(r"C_local_ptr\[(\d+)\]", src)]
        assert sizes and max(sizes) <= 4, (spec, feat, sizes)
        assert not re.search(r"for \(int ax0 = 0; ax0 < \d{3,}", src)  # no long scalar write-back


def _transposed_spmm():
    """Out[k, i] = sum_j A[i, j] B[j, k]: the output's features are a row apart in memory."""
    from sparsec import dsl

    op = dsl.Operator("transposed_spmm")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    K = op.dense_fixed("k", extent="feat")
    A = op.sparse_input("A", (I, J))
    B = op.dense_input("B", (J, K))
    Out = op.dense_output("Out", (K, I))
    with op.iterate([I, J, K], "SRS") as (i, j, k):
        Out[k, i] += A[i, j] * B[j, k]
    return op


@pytest.mark.parametrize("spec", ["bsr:4x4", "bsr:2x3", "csr"])
def test_transposed_output_is_stored_by_scalars(spec):
    """A transposed output on BSR made TVM fail to vectorise the write-back over the block's
    rows (a run-time extent); its features are not contiguous, so no vector store is asked for:
    the source compiles, with vector loads of B kept (float4) and no vector store into Out."""
    src = sparsec.compile(_transposed_spmm(), spec, target="cuda:sm_90a", feat=16).source()
    assert "float4" in src
    assert not re.search(r"\*\(float4\*\)\(Out_ptr", src)
    (ok, log), = nvcc_sources({(spec, "sm_90a"): src}).values()
    assert ok, log[:2000]
