"""CUDA code of user-written non-linear operators: what the GPU run found wrong, pinned on
the generated source (no GPU here).

* An SDDMM-shaped nest with no scale by A (an edge softmax's scores into a sparse temporary)
  is reduced across lanes by TVM, whose lowering drops the entry predicate from the store it
  makes: lane groups past a row's end overwrote the next row's entries.
* Horizontal fusion put parts that different templates scheduled (a warp-per-row reduction
  and a thread-per-row atomic part of hyb) in one launch, with one block shape for both.
"""
from __future__ import annotations

import re

import scipy.sparse as sp

import sparsec
from sparsec.formats import convert

import dsl_ops
from nvcc_tools import nvcc_sources

TARGET = "cuda:sm_90a"


def _matrix():
    m = sp.random(37, 53, density=0.1, format="csr", random_state=0, dtype="float32")
    m = m.tolil()
    m[5, :40] = 1.0  # one long row: hyb splits it over its widest bucket (atomic part)
    return m.tocsr()


def _kernels(source: str):
    """{kernel name: (launch bound, body)} of the generated CUDA."""
    out = {}
    for m in re.finditer(r'__global__ void __launch_bounds__\((\d+)\) (\w+)\((.*?)\) \{(.*?)\n\}', source, re.S):
        out[m.group(2)] = (int(m.group(1)), m.group(3) + m.group(4))
    return out


def test_unscaled_sddmm_nest_stores_only_entries_of_the_row():
    A = convert(_matrix(), "csr")
    src = sparsec.compile(dsl_ops.edge_softmax(), A, target=TARGET, feat=32).source()
    stores = [m.start() for m in re.finditer(r"\bS_ptr\[[^\n]*\] = red_buf", src)]
    assert stores, "the score nest should reduce across lanes"
    for at in stores:
        guard = src[:at].rsplit("if (", 1)[1]
        assert "indptr_ptr" in guard, f"the store of a score is not guarded by the row's length: if ({guard}"
    assert all(ok for ok, _ in nvcc_sources({("edge_softmax", "sm_90a"): src}).values())


def test_parts_with_different_block_shapes_get_launches_of_their_own():
    A = convert(_matrix(), "hyb:1:1/2/4")
    assert A.parts[-1].format.spec.endswith(",dup")
    src = sparsec.compile(dsl_ops.rownorm_spmm(), A, target=TARGET, feat=32).source()
    kernels = _kernels(src)
    for name, (bound, body) in kernels.items():
        parts = sorted(set(re.findall(r"\bp(\d+)_row_ids_ptr\[", body)))
        if len(parts) > 1:
            # a fused launch: each part's code must use the same thread shape (bound threads)
            assert "atomicAdd" not in body or "threadIdx.y" in body.split("atomicAdd")[0], name
    atomic = [n for n, (_, body) in kernels.items() if "p2_row_ids_ptr[" in body]
    warp = [n for n, (_, body) in kernels.items() if "p0_row_ids_ptr[" in body and "__shfl" in body]
    assert warp and atomic and not set(warp) & set(atomic), \
        "hyb's warp-per-row parts and its thread-per-row split part should be separate launches"
