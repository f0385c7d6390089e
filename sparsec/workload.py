"""What a run works on: the matrix (a file, a random draw or the embedded default), its
conversion (N:M pruned, SR-BCRS int8/int4 quantized when needed), the dense inputs, and
how a result is compared with the reference."""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from . import datasets, formats, reference

INT_DENSE_RANGE = (-8, 7)  # dense inputs of integer kernels: random integers in this range


def random_matrix(text):
    parts = text.split(",")
    try:
        if len(parts) not in (3, 4):
            raise ValueError
        rows, cols, density = int(parts[0]), int(parts[1]), float(parts[2])
        seed = int(parts[3]) if len(parts) == 4 else 0
        if rows < 1 or cols < 1 or not 0.0 <= density <= 1.0 or seed < 0:
            raise ValueError
    except ValueError:
        raise ValueError(f"--random should be ROWS,COLS,DENSITY[,SEED] with positive sizes and a density "
                         f"in [0, 1] (e.g. 3000,2000,0.01), got {text!r}") from None
    # a Generator samples positions directly; an int seed makes scipy permute all rows*cols slots
    m = sp.random(rows, cols, density, format="csr", dtype=np.float32, random_state=np.random.default_rng(seed))
    return m, seed


def load_matrix(args):
    """(scipy matrix, seed, source description) from --matrix, --random or the embedded default."""
    if args.matrix is not None:
        return datasets.load_npz(args.matrix), 0, args.matrix
    if args.random is not None:
        m, seed = random_matrix(args.random)
        return m, seed, f"random {args.random}"
    return datasets.default_matrix(), 0, f"embedded {datasets.DEFAULT_MATRIX}"


NM_FAMILIES = ("nm", "mma_sp", "nm_tc")  # N:M patterns a matrix is magnitude-pruned to (mma_sp: 2:4)


def prune_nm(matrix, params):
    """The stored entries of ``matrix`` that N:M magnitude pruning keeps (formats.nm.prune's
    rule, applied without densifying), and the source's nnz."""
    src = formats.as_csr(matrix)
    pruned = formats.nm.prune_stored(src, n=params.get("n", 2), m=params.get("m", 4), vec=params.get("vec") or 1)
    return pruned, int(src.nnz)


def is_int_in_range(matrix, dtype):
    lo, hi = formats.srbcrs.INT_RANGE[dtype]
    d = formats.as_csr(matrix).data
    with np.errstate(invalid="ignore"):
        return bool(np.all((d == np.round(d)) & (d >= lo) & (d <= hi)))


def convert(matrix, spec, params, dtype):
    """The instance (nm pruned, srbcrs int8/int4 quantized when needed) and what was done."""
    info = {"pruned": False, "quantized": False, "scale": None, "source_nnz": None}
    module, spec_params = formats.parse_spec(spec)
    family = module.NAME
    if family in NM_FAMILIES:  # N, M and V from the spec unless given (mma_sp: 2:4)
        given = {**spec_params, **{k: v for k, v in params.items() if v is not None}}
        matrix, info["source_nnz"] = prune_nm(matrix, given)
        info["pruned"] = True
    if family == "srbcrs" and dtype in ("int8", "int4") and not is_int_in_range(matrix, dtype):
        info["source_nnz"] = int(formats.as_csr(matrix).nnz)
        matrix, info["scale"] = formats.srbcrs.quantize(matrix, 8 if dtype == "int8" else 4)
        info["quantized"] = True
    kw = dict(params)
    kw.setdefault("dtype", dtype)
    return formats.convert(matrix, spec, **kw), info


def dense_inputs(kernel, A, seed):
    """Random inputs for every input after the matrix (``kernel.inputs``): edge data per entry,
    (nnz, *trailing); index inputs within the extents they index; integers in a small range."""
    rng = np.random.default_rng(seed + 1)
    sizes = {"rows": A.shape[0], "cols": A.shape[1]}
    out = []
    for p in kernel.inputs:
        if p.sparse:
            shape = (A.to_scipy().nnz,) + tuple(p.shape[1:])
        else:
            shape = tuple(sizes[d] if isinstance(d, str) else d for d in p.shape)
        if p.index_extents:
            high = min(sizes[d] if isinstance(d, str) else d for d, _ in p.index_extents)
            out.append(rng.integers(0, high, size=shape).astype(p.dtype))
        elif p.dtype.startswith("int"):
            lo, hi = INT_DENSE_RANGE
            out.append(rng.integers(lo, hi + 1, size=shape).astype(p.dtype))
        else:
            out.append(rng.standard_normal(shape).astype(p.dtype))
    return out


def errors(out, ref, exact):
    """(max_rel_err, max_abs_err); integer kernels are exact or have a relative error of at least
    the reference's own (so an exact kernel reads 0.0)."""
    o = np.asarray(out, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    rel = reference.max_rel_err(o, r)
    with np.errstate(invalid="ignore"):
        diff = np.abs(o - r)
    ok = ~(np.isnan(o) & np.isnan(r))
    abs_err = float(np.nanmax(diff[ok])) if ok.any() and not np.isnan(diff[ok]).any() else (
        float("inf") if ok.any() else 0.0)
    if exact and abs_err == 0.0:
        rel = 0.0
    return rel, abs_err
