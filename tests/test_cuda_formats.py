"""CUDA code generation for the new formats without a GPU: SpMM and SDDMM on hyb (with a row
split over several ELL rows), bsr+csr, N:M (2:4 element- and vector-wise) and SR-BCRS (int8,
int4, float16) compile for cuda:sm_80 and cuda:sm_90a, and nvcc compiles each source for its
architecture. The sources show what the formats need: atomics where hyb rows repeat (SpMM
only: SDDMM writes one value per slot), the int4 nibble unpack and int32 accumulation. A max
reduction over repeated rows has no atomic and is refused on CUDA (the CPU runs it serially)."""
from __future__ import annotations

import re

import numpy as np
import pytest
import scipy.sparse as sp

import sparsec
from sparsec.formats import convert, nm

from dsl_ops import TEST_OPS
from nvcc_tools import nvcc_sources

OPS = ("spmm", "sddmm")
ARCHS = ("sm_80", "sm_90a")
FEAT = 16
NAMES = ("hyb", "bsr+csr", "nm-2:4", "nm-2:4-v4", "srbcrs-v8-int8", "srbcrs-v4-int4", "srbcrs-v2-float16")
SPLIT_ROW = 131


def _source_matrix(values: str = "float") -> sp.csr_matrix:
    """211 x 61 with ~2 entries per row, 30% of rows empty and row 131 full: the automatic hyb
    buckets stop well below 61 (their widest is the 99th percentile of the row lengths), so row
    131 is split over several ELL rows of the widest bucket. Integer variants for SR-BCRS."""
    rng = np.random.default_rng(2024)
    rows, cols = 211, 61
    mask = rng.random((rows, cols)) < 0.04
    mask[rng.random(rows) < 0.3] = False
    mask[SPLIT_ROW] = True
    if values == "int8":
        v = rng.integers(-100, 100, size=(rows, cols), endpoint=True)
    elif values == "int4":
        v = rng.integers(-8, 7, size=(rows, cols), endpoint=True)
    else:
        v = rng.standard_normal((rows, cols))
    v[v == 0] = 1
    return sp.csr_matrix(np.where(mask, v, 0).astype(np.float32))


def _instance(name: str):
    if name == "hyb":
        return convert(_source_matrix(), "hyb")
    if name == "bsr+csr":
        return convert(_source_matrix(), "bsr+csr", block=(4, 4), block_fill=0.3)
    if name == "nm-2:4":
        return nm.prune(_source_matrix(), n=2, m=4)[0]
    if name == "nm-2:4-v4":
        return nm.prune(_source_matrix(), n=2, m=4, vec=4)[0]
    _, v, dtype = name.split("-")
    return convert(_source_matrix(dtype if dtype.startswith("int") else "float"), "srbcrs", vec=int(v[1:]),
                   dtype=dtype)


@pytest.fixture(scope="module")
def instances():
    return {name: _instance(name) for name in NAMES}


@pytest.fixture(scope="module")
def kernels(instances):
    """{(name, op, arch): Kernel} compiled for cuda:<arch>, once for the module."""
    return {(name, op, arch): sparsec.compile(op, instances[name], feat=FEAT, target=f"cuda:{arch}")
            for name in NAMES for op in OPS for arch in ARCHS}


@pytest.fixture(scope="module")
def sources(kernels):
    return {key: k.source() for key, k in kernels.items()}


@pytest.fixture(scope="module")
def nvcc_results(sources):
    return nvcc_sources(sources)


# ---------------------------------------------------------------- the instances are what the tests need


def test_instances(instances):
    h = instances["hyb"]
    dup = [p for p in h.parts if not p.format.param("unique")]
    assert len(dup) == 1, h.format.spec
    widest = max(h.format.param("buckets"))
    assert np.count_nonzero(dup[0].arrays["row_ids"] == SPLIT_ROW) == -(-h.shape[1] // widest) > 1
    assert [p.format.name for p in instances["bsr+csr"].parts] == ["bsr", "csr"]
    assert {n: instances[n].value_dtype for n in NAMES if n.startswith("srbcrs")} == {
        "srbcrs-v8-int8": "int8", "srbcrs-v4-int4": "int4", "srbcrs-v2-float16": "float16"}


# ---------------------------------------------------------------- sparsec side


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("name", NAMES)
def test_cuda_source(kernels, sources, name, op, arch):
    k, src = kernels[(name, op, arch)], sources[(name, op, arch)]
    assert k.target.kind == "cuda" and k.target.name == f"cuda:{arch}"
    assert "__global__" in src and "threadIdx.x" in src and "blockIdx." in src
    # atomics only where rows repeat (hyb's split row) and only for SpMM's accumulation
    assert ("atomicAdd" in src) == (name == "hyb" and op == "spmm"), f"{name} {op}: atomicAdd"


def test_hyb_spmm_adds_split_rows_atomically(sources):
    for arch in ARCHS:
        spmm, sddmm = sources[("hyb", "spmm", arch)], sources[("hyb", "sddmm", arch)]
        assert "atomicAdd(" in spmm
        assert "atomicAdd" not in sddmm  # one output per stored slot: nothing to combine


@pytest.mark.parametrize("op", OPS)
def test_int4_unpack_and_int32_accumulation(sources, op):
    """int4 values are two per byte: the kernel sign-extends a nibble with a left shift that
    puts it at the top of an int (28 - 4 * (slot & 1)) then an arithmetic right shift by 28;
    int8 dense operands, int32 accumulation and outputs."""
    src = sources[("srbcrs-v4-int4", op, "sm_90a")]
    assert "<< (28 - " in src and ">> 28)" in src
    assert "signed char* __restrict__ A_ptr" in src
    assert "int* __restrict__ C_ptr" in src  # the output (SpMM's C, SDDMM's per-slot values) is int32
    assert not re.search(r"\b(float|half|double)\b", src)  # no floating-point arithmetic anywhere
    i8 = sources[("srbcrs-v8-int8", op, "sm_90a")]
    assert ">> 28" not in i8  # int8 values are read whole
    if op == "spmm":  # int8 SR-BCRS SpMM runs on the integer Tensor Core kernel (schedules.srbcrs_tensorcore)
        assert _int8_tensor_core(i8)
    else:
        assert "signed char* __restrict__ A_ptr" in i8


def _int8_tensor_core(src: str) -> bool:
    """The source is the int8 SR-BCRS Tensor Core kernel: s8 x s8 -> s32 ``mma``."""
    return "mma.sync.aligned" in src and ".s32.s8.s8.s32" in src


def test_integer_kernels_accumulate_in_int32(kernels, sources):
    for name in ("srbcrs-v8-int8", "srbcrs-v4-int4"):
        k = kernels[(name, "spmm", "sm_90a")]
        assert k.dtypes.out == "int32" and k.dtypes.dense == "int8"
        src = sources[(name, "spmm", "sm_90a")]
        if name == "srbcrs-v8-int8":  # Tensor Cores: the mma itself accumulates in s32
            assert _int8_tensor_core(src) and "int* __restrict__ C" in src
            continue
        assert "int* __restrict__ C_ptr" in src and "signed char* __restrict__ B_ptr" in src
        # the per-thread accumulators are int, not a narrower type
        assert "int C_local" in src or "int C_" in src


def test_float16_kernels_compute_in_half(sources):
    for op in OPS:
        assert "half" in sources[("srbcrs-v2-float16", op, "sm_90a")]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("name", [n for n in NAMES if n.startswith(("nm", "srbcrs"))])
def test_padding_slots_are_guarded(sources, name, op):
    """Formats with padding slots (index -1: N:M's unused window slots, SR-BCRS's stride
    padding) must not read the dense operand at that index: the source tests it first. The
    int8 Tensor Core SpMM reads row 0 there instead (its values are 0), which
    tests/test_tc_formats.py replays against the generic kernel."""
    src = sources[(name, op, "sm_90a")]
    if name == "srbcrs-v8-int8" and op == "spmm":
        assert _int8_tensor_core(src)
        return
    assert "0 <= indices_ptr[" in src


# ---------------------------------------------------------------- nvcc side


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("name", NAMES)
def test_nvcc_compiles(nvcc_results, name, op, arch):
    ok, log = nvcc_results[(name, op, arch)]
    assert ok, f"nvcc -arch={arch} failed for {op} {name}:\n{log[-3000:]}"


# ---------------------------------------------------------------- reductions over repeated rows


def test_max_over_split_rows_uses_an_atomic_max_on_cuda(instances):
    """row_softmax's max reduction over hyb's repeated rows: CUDA emits the float atomic max of
    schedules.atomics (integer atomics on the value's bits, chosen by its sign bit); nvcc
    compiles it; the CPU runs the repeated rows serially and matches the reference."""
    from nvcc_tools import nvcc_sources

    h = instances["hyb"]
    src = sparsec.compile(TEST_OPS["row_softmax"][0](), h, target="cuda:sm_90a").source()
    assert "atomicMax((&(((int*)" in src and "atomicMin((&(((uint*)" in src
    ok, log = nvcc_sources({("row_softmax", "sm_90a"): src})[("row_softmax", "sm_90a")]
    assert ok, log[-3000:]
    k = sparsec.compile(TEST_OPS["row_softmax"][0](), h, target="llvm")
    out = k(h, poison=True)
    ref = TEST_OPS["row_softmax"][1](h)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def test_sum_over_split_rows_uses_atomics_on_cuda(instances):
    """rowsum (an additive reduction) over the same instance compiles, with atomicAdd."""
    src = sparsec.compile(TEST_OPS["rowsum"][0](), instances["hyb"], target="cuda:sm_90a").source()
    assert "atomicAdd(" in src


@pytest.mark.parametrize("name", ["bsr+csr", "nm-2:4"])
def test_max_over_unique_rows_compiles_on_cuda(instances, name):
    src = sparsec.compile(TEST_OPS["row_softmax"][0](), instances[name], target="cuda:sm_90a").source()
    assert "__global__" in src and "atomic" not in src
