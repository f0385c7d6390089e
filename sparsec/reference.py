"""float64 references for the library operators, computed with scipy/numpy.

They work from the format instance's stored slots, so they define exactly what a
kernel must produce for every slot (SDDMM writes 0 into padding slots).
"""
from __future__ import annotations

import math

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


def max_rel_err(out, ref, *, norm: str = "max") -> float:
    """The relative error of ``out`` against ``ref``: the largest absolute error over the
    largest reference magnitude (``norm="max"``), or ``||out - ref|| / ||ref||``
    (``norm="fro"``, which forgives one element's rounding). A NaN in ``out`` where ``ref``
    has one, or the same infinity in both, is a match; any other NaN or infinity (an
    unwritten, poisoned element) is an infinite error. numpy arrays are compared in
    float64 on the host; when either argument is a torch tensor both are, in float64 on
    that tensor's device (outputs of hundreds of MB compare on the GPU in milliseconds).
    The one relative error of sparsec: ``--check``, the benchmark, the tuner and the
    examples all use it."""
    if norm not in ("max", "fro"):
        raise ValueError(f"norm should be 'max' or 'fro', got {norm!r}")
    torch_like = next((x for x in (out, ref) if type(x).__module__.startswith("torch")), None)
    if torch_like is not None:
        import torch as xp

        out, ref = (xp.as_tensor(x, device=torch_like.device).to(xp.float64) for x in (out, ref))
    else:
        xp = np
        out, ref = np.asarray(out, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(f"output shape {tuple(out.shape)} should match the reference {tuple(ref.shape)}")
    if not math.prod(out.shape):
        return 0.0
    match = (xp.isnan(out) & xp.isnan(ref)) | (xp.isinf(ref) & (out == ref))
    with np.errstate(invalid="ignore"):  # inf - inf: NaN, an infinite error below (numpy would warn)
        diff = xp.where(match, 0.0, xp.abs(out - ref))
    if not bool(xp.isfinite(diff).all()):
        return float("inf")
    ref = xp.where(match, 0.0, ref)
    if norm == "fro":
        worst, scale = float((diff * diff).sum()) ** 0.5, float((ref * ref).sum()) ** 0.5
    else:
        worst, scale = float(diff.max()), float(xp.abs(ref).max())
    return worst / scale if scale > 0 else worst
