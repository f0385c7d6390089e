"""A sum into an output declared float16 (or bfloat16) accumulates in float32 and is rounded
once where it is stored, on the generic templates as on the Tensor Core ones
(``schedules.widen``). Summed in the output's dtype, a row of thousands of entries came out
about 20 % wrong; rounded once, it is within float16's half ulp of the float64 sum."""
from __future__ import annotations

import re

import numpy as np
import pytest
import scipy.sparse as sp

import sparsec
from sparsec import dsl, formats, reference

TOL = 2e-3  # float16 keeps 11 bits: one rounding is 2.4e-4 relative, a half-precision sum of 8000 terms ~2e-1
LONG = 6000  # entries of the long row (and the length of the SDDMM's dot products)


def spmm_half(dtype: str = "float16") -> dsl.Operator:
    op = dsl.Operator("spmm_half", "C = A @ B, C declared 16-bit")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    K = op.dense_fixed("k", extent="feat")
    A = op.sparse_input("A", (I, J))
    B = op.dense_input("B", (J, K))
    C = op.dense_output("C", (I, K), dtype=dtype)
    with op.iterate([I, J, K], "SRS") as (i, j, k):
        C[i, k] += A[i, j] * B[j, k]
    return op


def sddmm_half() -> dsl.Operator:
    """The library SDDMM (``sparsec.ops.sddmm``) with its sparse output declared float16."""
    op = dsl.Operator("sddmm_half", "C[i, j] = A[i, j] * sum_k X[i, k] * Y[j, k], C float16")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    K = op.dense_fixed("k", extent="feat")
    A = op.sparse_input("A", (I, J))
    X = op.dense_input("X", (I, K))
    Y = op.dense_input("Y", (J, K))
    C = op.sparse_output("C", (I, J), dtype="float16")
    with op.iterate([I, J, K], "SSR") as (i, j, k):
        C[i, j] += X[i, k] * Y[j, k]
    with op.iterate([I, J], "SS") as (i, j):
        C[i, j] = A[i, j] * C[i, j]
    return op


def long_row_matrix(rows: int = 40, cols: int = LONG) -> sp.csr_matrix:
    """A sparse matrix with one full row (row 3) of positive values: its sum grows to
    thousands, where float16's spacing is 1 or 2."""
    m = sp.random(rows, cols, density=0.01, format="lil", dtype=np.float32, random_state=0)
    m[3, :] = np.random.default_rng(1).random(cols).astype(np.float32)
    return m.tocsr()


def rel_err(got, ref) -> float:
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    return float(np.abs(got - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("spec", ["csr", "ell", "hyb", "bsr:16x16"])
def test_spmm_into_a_float16_output_sums_a_long_row_in_float32_on_llvm(spec):
    m = long_row_matrix()
    inst = formats.convert(m, spec, dtype="float16")
    k = sparsec.compile(spmm_half(), inst, target="llvm", dtype="float16", feat=16)
    B = np.random.default_rng(2).random((m.shape[1], 16)).astype(np.float16)
    out = np.asarray(k(inst, B), dtype=np.float64)
    ref = m.toarray().astype(np.float16).astype(np.float64) @ B.astype(np.float64)
    assert out.dtype == np.float64 and k.outputs[0].dtype == "float16"
    assert rel_err(out[3], ref[3]) < TOL, spec
    assert rel_err(out, ref) < TOL, spec


@pytest.mark.parametrize("spec", ["csr", "ell", "hyb"])
def test_sddmm_into_a_float16_output_sums_a_long_dot_in_float32_on_llvm(spec):
    m = sp.random(30, 50, density=0.2, format="csr", dtype=np.float32, random_state=1)
    inst = formats.convert(m, spec, dtype="float16")
    k = sparsec.compile(sddmm_half(), inst, target="llvm", dtype="float16", feat=LONG)
    g = np.random.default_rng(3)
    X = g.random((30, LONG)).astype(np.float16)
    Y = g.random((50, LONG)).astype(np.float16)
    out = np.asarray(k(inst, X, Y), dtype=np.float64)
    ref = reference.sddmm(inst, X, Y)
    stored = inst.stored_coords()[0] >= 0
    assert rel_err(out[stored], ref[stored]) < TOL, spec


def test_a_float32_output_keeps_its_schedule_on_llvm():
    """Only 16-bit outputs get a local accumulator: a float32 kernel is scheduled as before."""
    k = sparsec.compile(spmm_half("float32"), "csr", target="llvm", dtype="float16", feat=16)
    assert "_local" not in k.script and "float32[" not in k.script


def _accumulators(source: str):
    """The element types of the register arrays the CUDA source declares (``float C_local_ptr[4]``)."""
    return set(re.findall(r"(\w+) \w+_local_ptr(?:_\d+)?\[", source))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cuda_csr_template_accumulates_in_float_registers(dtype):
    k = sparsec.compile(spmm_half(dtype), "csr", target="cuda:sm_90a", dtype=dtype, feat=128)
    src = k.source()
    assert _accumulators(src) and _accumulators(src) <= {"float", "float4", "float2"}, _accumulators(src)
    assert "vec" in k.knobs  # the generic CUDA-core template (features_over_threads)


def test_cuda_hyb_adds_each_threads_float_sum_once():
    """hyb's split rows share an output row: each thread sums its part in float32 and adds it
    to the float16 output with one atomicAdd (the output's running total stays 16-bit)."""
    inst = formats.convert(long_row_matrix(), "hyb", dtype="float16")
    src = sparsec.compile(spmm_half(), inst, target="cuda:sm_90a", dtype="float16", feat=128).source()
    assert _accumulators(src) <= {"float", "float4", "float2"}
    assert re.search(r"atomicAdd\(.*\(\(half\)\w+_local_ptr", src)


def test_bsr_tensor_core_template_is_unchanged():
    inst = formats.convert(long_row_matrix(64, 512), "bsr:16x16", dtype="float16")
    k = sparsec.compile(spmm_half(), inst, target="cuda:sm_90a", dtype="float16", feat=128)
    assert "n_tile" in k.knobs
    assert not _accumulators(k.source())
