"""Shared helpers for the kernel tests: test matrices of several shapes and structures,
and a NaN-aware accuracy check against the float64 references."""
from __future__ import annotations

import os
import sys
import zlib

import numpy as np
import pytest
import scipy.sparse as sp

# tests/dsl_ops.py (the test-only DSL operators) imports as a plain module
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from sparsec.reference import max_rel_err  # noqa: E402

MATRIX_KINDS = ("uniform", "empty_rows", "powerlaw", "one_huge_row", "empty")

# (kind, rows, cols): no dimension is a multiple of any tile used in the tests (2, 3, 4, 5, 16)
MATRIX_CASES = (
    ("uniform", 37, 53),
    ("uniform", 129, 250),
    ("empty_rows", 101, 67),
    ("powerlaw", 129, 250),
    ("one_huge_row", 101, 67),
    ("empty", 37, 53),
)

# every format the tests cover; "ell" takes its width from the matrix it is converted from
SPECS = ("csr", "bsr:2x2", "bsr:4x4", "bsr:16x16", "bsr:3x5", "ell")


def case_id(case) -> str:
    kind, rows, cols = case
    return f"{kind}-{rows}x{cols}"


def seed_of(*parts) -> int:
    """A stable seed for one parametrisation (reproducible, different per case)."""
    return zlib.crc32(repr(parts).encode())


def make_matrix(kind: str, rows: int, cols: int, seed: int, dtype=np.float32) -> sp.csr_matrix:
    """A canonical scipy CSR matrix of the given kind; values are standard normal."""
    rng = np.random.default_rng(seed)
    if kind == "uniform":
        m = sp.random(rows, cols, density=0.1, format="csr", dtype=np.float64, random_state=rng,
                      data_rvs=rng.standard_normal)
    elif kind == "empty_rows":
        m = sp.random(rows, cols, density=0.15, format="csr", dtype=np.float64, random_state=rng,
                      data_rvs=rng.standard_normal)
        keep = (rng.random(rows) >= 0.3).astype(np.float64)
        m = sp.csr_matrix(sp.diags(keep) @ m)
        m.eliminate_zeros()
    elif kind == "powerlaw":
        lengths = np.minimum(rng.zipf(1.7, size=rows) - 1, cols)
        lengths[rng.integers(rows)] = cols  # at least one full row, whatever the draw
        r = np.repeat(np.arange(rows), lengths)
        c = (np.concatenate([rng.choice(cols, size=k, replace=False) for k in lengths])
             if lengths.sum() else np.zeros(0, np.int64))
        m = sp.csr_matrix((rng.standard_normal(r.size), (r, c)), shape=(rows, cols))
    elif kind == "one_huge_row":
        heavy = rows // 2
        r = np.concatenate([np.full(cols, heavy), rng.integers(0, rows, size=max(1, rows // 10))])
        c = np.concatenate([np.arange(cols), rng.integers(0, cols, size=max(1, rows // 10))])
        m = sp.coo_matrix((rng.standard_normal(r.size), (r, c)), shape=(rows, cols)).tocsr()
        m.sum_duplicates()
    elif kind == "empty":
        m = sp.csr_matrix((rows, cols), dtype=np.float64)
    else:
        raise ValueError(f"kind should be one of {MATRIX_KINDS}, got {kind!r}")
    m = sp.csr_matrix(m, dtype=dtype)
    m.eliminate_zeros()
    m.sort_indices()
    return m


def dense(rng, shape, dtype=np.float32) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


def check(out, ref, tol: float = 1e-5):
    """``out`` has no NaN (unless the reference has one there) and is within ``tol`` of ``ref``
    relative to the reference's largest magnitude."""
    out = np.asarray(out.numpy() if hasattr(out, "numpy") and not isinstance(out, np.ndarray) else out)
    ref = np.asarray(ref)
    assert out.shape == ref.shape, f"shape {out.shape} != reference {ref.shape}"
    stray = np.isnan(out) & ~np.isnan(ref)
    assert not stray.any(), f"{int(stray.sum())} NaN outputs (unwritten or wrong), first at {np.argwhere(stray)[0]}"
    err = max_rel_err(out, ref)
    assert err < tol, f"max relative error {err:.3g} >= {tol:g}"


@pytest.fixture
def rng(request):
    """A generator seeded from the test's id: reproducible, fresh per parametrisation."""
    return np.random.default_rng(seed_of(request.node.nodeid))


def spec_case_params(specs=SPECS, cases=MATRIX_CASES):
    """(spec, case) pairs with readable ids."""
    out = []
    for spec in specs:
        for case in cases:
            out.append(pytest.param(spec, case, id=f"{spec}-{case_id(case)}"))
    return out
