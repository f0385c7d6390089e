"""float64 references for the library operators, computed with scipy/numpy.

They work from the format instance's stored slots, so they define exactly what a
kernel must produce for every slot (SDDMM writes 0 into padding slots).
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .formats import FormatInstance

# the accepted max |out - ref| / max |ref| of a kernel's result, by the kernel's value dtype
# (fp16/bf16 inputs accumulate in float32; integer kernels must be exact)
TOLERANCE = {"float16": 1e-2, "bfloat16": 2e-2, "float32": 1e-5, "float64": 1e-5, "int8": 0.0, "int4": 0.0}


def spmm(A: FormatInstance, B) -> np.ndarray:
    return A.to_scipy().astype(np.float64) @ np.asarray(B, dtype=np.float64)


def sddmm(A: FormatInstance, X, Y) -> np.ndarray:
    """``A[i, j] * (X[i, :] . Y[j, :])`` at every stored slot (X: rows x feat, Y: cols x feat)."""
    rows, cols = A.stored_coords()
    ok = rows >= 0
    X = np.asarray(X, dtype=np.float64)
    Y = np.asarray(Y, dtype=np.float64)
    out = np.zeros(A.stored, dtype=np.float64)
    r, c = rows[ok], cols[ok]
    # chunked so a large matrix does not build an (nnz, K) temporary all at once
    step = max(1, (1 << 24) // max(1, X.shape[1]))
    vals = A.slot_values()[ok].astype(np.float64)
    res = np.empty(r.size)
    for s in range(0, r.size, step):
        res[s:s + step] = np.einsum("ij,ij->i", X[r[s:s + step]], Y[c[s:s + step]])
    out[ok] = vals * res
    return out


def attention(A: FormatInstance, Q, Kt, V) -> np.ndarray:
    """``softmax_j(A[i, j] * Q[i, :] . Kt[j, :]) @ V`` with the softmax over each row's stored
    entries (the mask); a row with none gives 0. Rows x feat, float64."""
    rows, cols = A.stored_coords()
    ok = rows >= 0
    r, c = rows[ok], cols[ok]
    scores = sddmm(A, Q, Kt)[ok]
    n = A.shape[0]
    mx = np.full(n, -np.inf)
    np.maximum.at(mx, r, scores)
    e = np.exp(scores - mx[r])
    p = e / np.bincount(r, weights=e, minlength=n)[r]
    return sp.csr_matrix((p, (r, c)), shape=A.shape) @ np.asarray(V, dtype=np.float64)


REFERENCES = {"spmm": spmm, "sddmm": sddmm, "attention": attention}


def max_rel_err(out, ref) -> float:
    """Largest absolute error over the largest reference magnitude (NaN where the
    reference has NaN is a match; any other NaN is an infinite error)."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if out.shape != ref.shape:
        raise ValueError(f"output shape {out.shape} should match the reference {ref.shape}")
    both_nan = np.isnan(out) & np.isnan(ref)
    same_inf = np.isinf(ref) & (out == ref)
    mask = ~(both_nan | same_inf)
    if not mask.any():
        return 0.0
    diff = np.abs(out[mask] - ref[mask])
    if np.isnan(diff).any():
        return float("inf")
    scale = np.abs(ref[mask]).max() if mask.any() else 0.0
    return float(diff.max() / scale) if scale > 0 else float(diff.max())
