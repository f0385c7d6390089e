"""float64 references, computed with scipy/numpy on the matrix's logical pattern.

An operator's value is defined on the matrix's coordinates (the entries the user stored,
explicit zeros included), never on the slots a format happens to store (``formats.base``:
padding). So every reference reads the instance's logical pattern (``to_scipy`` and
``stored_coords``, which leave padding out) and gives:

  * a dense output as the array the kernel returns;
  * a sparse output as one value per stored slot, 0 at padding slots, compared slot by
    slot: a kernel must write that 0 (outputs are deterministic whatever the format).

``spmm``, ``sddmm`` and ``attention`` are the library's, written for speed; ``evaluate``
interprets *any* DSL operator on the logical pattern (each iteration vectorised over the
matrix's entries and the dense axes; a dense iteration over its axes' coordinates), so
user-written operators have a reference too.
"""
from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp
from scipy import special

from .dsl import Access, Operator
from .expr import BinOp, Call, Const, Expr, Select
from .formats import EdgeValues, FormatInstance

# the accepted max |out - ref| / max |ref| of a kernel's result, by the kernel's value dtype
# (fp16/bf16 inputs accumulate in float32; integer kernels must be exact)
TOLERANCE = {"float16": 1e-2, "bfloat16": 2e-2, "float32": 1e-5, "float64": 1e-5, "int8": 0.0, "int4": 0.0}


def spmm(A: FormatInstance, B) -> np.ndarray:
    return A.to_scipy().astype(np.float64) @ np.asarray(B, dtype=np.float64)


def linear(A: FormatInstance, X) -> np.ndarray:
    """``X @ A^T``: a linear layer's product on token-major X (tokens x cols)."""
    return (A.to_scipy().astype(np.float64) @ np.asarray(X, dtype=np.float64).T).T


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


REFERENCES = {"spmm": spmm, "linear": linear, "sddmm": sddmm, "attention": attention}


# ---- any DSL operator --------------------------------------------------------------------------
_BINOPS = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide, "//": np.floor_divide,
           "<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal, "and": np.logical_and}
_CALLS = {"exp": np.exp, "sqrt": np.sqrt, "abs": np.abs, "max": np.maximum, "min": np.minimum, "tanh": np.tanh,
          "erf": special.erf}
_AT = {"sum": np.add.at, "max": np.maximum.at, "min": np.minimum.at}


def identity(kind: str, dtype: str = "float32") -> float:
    """The start value of a ``kind`` reduction, as kernels of ``dtype`` use it: 0 for a sum,
    the dtype's lowest (highest) finite value for a max (min), like TVM's T.min_value: a row
    with no entries keeps it."""
    if kind == "sum":
        return 0.0
    info = np.finfo(dtype) if np.dtype(dtype).kind == "f" else np.iinfo(dtype)
    return float(info.min if kind == "max" else info.max)


def evaluate(op: Operator, A, *dense, params=None, dtype: str = "float32"):
    """Run the DSL operator ``op`` in float64 on ``A``'s logical pattern, with the further
    inputs in the operator's order (``op.call_inputs()``: dense inputs, and edge data as
    ``A.edge_values(x)`` or per-entry arrays (nnz, *trailing) in canonical CSR order) and its
    compile-time extents in ``params`` (e.g. ``{"feat": 16}``). Returns the outputs in the
    operator's order (one array, or a tuple): dense outputs as arrays, sparse outputs one
    value per stored slot of ``A`` (0 at padding; (stored, *trailing) with trailing axes).
    Integer inputs stay integers (indirect indices, checked against their axis's extent).
    ``dtype``: the kernel's output dtype, for the identities of max/min reductions.
    Memory: a statement's values over entries x dense axes at once (nnz * feat floats)."""
    params = dict(params or {})
    inputs = op.call_inputs()
    if len(dense) != len(inputs):
        raise TypeError(f"{op.name} takes {len(inputs)} inputs after the matrix "
                        f"({', '.join(b.name for b in inputs)}), got {len(dense)}")
    row, col = op.structure()
    outer = op.outer_axes()  # a structure (r, i, j): A holds the patterns stacked along its rows
    m = A.to_scipy()
    n_rows, n_cols = A.shape
    r = np.repeat(np.arange(n_rows), np.diff(m.indptr))
    c = m.indices.astype(np.int64)

    def extent(axis) -> int:
        if axis is row:
            return n_rows // stacked
        if axis is col:
            return n_cols
        if isinstance(axis.extent, int):
            return axis.extent
        if axis.extent not in params:
            raise ValueError(f"{op.name} needs params[{axis.extent!r}] (the extent of axis {axis.name})")
        return int(params[axis.extent])

    stacked = 1
    for a in outer:
        stacked *= extent(a)
    if n_rows % stacked:
        raise ValueError(f"{op.name}: the matrix has {n_rows} rows, which should be {stacked} equal blocks of rows, "
                         f"one per coordinate of {', '.join(a.name for a in outer)} (sparsec.formats.stack_rows)")
    coordinate = {row: r % (n_rows // stacked)}
    if outer:
        coordinate[outer[0]] = r // (n_rows // stacked)

    vals: dict = {}
    for b in op.buffers:
        want = tuple(extent(a) for a in b.axes) if not b.sparse else (m.nnz,) + tuple(extent(a) for a in b.trailing)
        if b.matrix:
            vals[b.name] = m.data.astype(np.float64)
        elif b.role == "input":
            x = dense[inputs.index(b)]
            if b.sparse and isinstance(x, EdgeValues):
                x = A.coordinate_values(x) if x.belongs_to(A) else None
                if x is None:
                    raise ValueError(f"{op.name}: {b.name} holds EdgeValues made for another matrix")
            if type(x).__module__.startswith("torch"):
                x = x.detach().cpu().numpy()
            x = np.asarray(x, dtype=np.int64 if b.integer else np.float64)
            if x.shape != want:
                raise ValueError(f"{op.name}: {b.name} should have shape {want}"
                                 f"{' (one value per entry, canonical CSR order)' if b.sparse else ''}, got {x.shape}")
            vals[b.name] = x
        else:
            vals[b.name] = np.zeros(want)
    for it in op.iterations:
        if not op.is_sparse_iteration(it):
            _evaluate_dense(it, vals, extent, dtype, m)
            continue
        st = it.statement
        others = [a for a in it.axes if a is not col and a not in coordinate]
        ndim = 1 + len(others)

        def index(axis):  # the coordinate of ``axis`` over the space (entries, *other axes)
            if axis in coordinate:
                return coordinate[axis].reshape((-1,) + (1,) * len(others))
            if axis is col:
                return c.reshape((-1,) + (1,) * len(others))
            shape = [1] * ndim
            shape[1 + others.index(axis)] = extent(axis)
            return np.arange(extent(axis)).reshape(shape)

        entries = np.arange(m.nnz).reshape((-1,) + (1,) * len(others))

        def position(acc: Access, n: int, a):
            """The index along axis ``n`` of ``acc``: a coordinate, or an indirect index's values."""
            if not isinstance(a, Access):
                return index(a)
            got = access(a)
            declared = acc.buffer.axes[n]
            bad = (got < 0) | (got >= extent(declared))
            if bad.any():
                raise ValueError(f"{op.name}: {a.buffer.name} holds {int(got[bad].flat[0])}, out of range for axis "
                                 f"{declared.name} of {acc.buffer.name} (extent {extent(declared)})")
            return got

        def access(acc: Access):
            if acc.buffer.sparse:
                return vals[acc.buffer.name][(entries,) + tuple(index(a) for a in acc.buffer.trailing)]
            return vals[acc.buffer.name][tuple(position(acc, n, a) for n, a in enumerate(acc.axes))]

        with np.errstate(all="ignore"):  # the kernels' IEEE arithmetic: 0/0 is NaN, as on the device
            value = np.broadcast_to(_eval(st.value, access), (m.nnz,) + tuple(extent(a) for a in others))
        tgt = st.target
        out = vals[tgt.buffer.name]
        if tgt.buffer.sparse:
            idx = (entries,) + tuple(index(a) for a in tgt.buffer.trailing)
        else:
            idx = tuple(index(a) for a in tgt.axes)
        idx = tuple(np.broadcast_to(i, value.shape) for i in idx)
        if st.reduce is None:
            out[idx] = value
        else:  # a reduction starts from its identity (the kernels' T.init), every element of the target
            out[...] = identity(st.reduce, dtype)
            with np.errstate(all="ignore"):
                _AT[st.reduce](out, idx, value)
    res = []
    for b in op.outputs():
        res.append(_per_slot(A, m, vals[b.name]) if b.sparse else vals[b.name])
    return res[0] if len(res) == 1 else tuple(res)


def _evaluate_dense(it, vals: dict, extent, dtype: str, m) -> None:
    """A dense iteration (no sparse structure): its statement over the grid of its axes'
    coordinates (the row axis 0..rows, the column axis 0..cols), reductions over its R axes,
    reading the values the earlier iterations left; a lookup (``A[i, jd]``) reads a sparse
    buffer's value where (i, jd) is an entry of the pattern ``m``, else 0."""
    st = it.statement
    shape = tuple(extent(a) for a in it.axes)

    def index(axis):
        at = [1] * len(shape)
        at[it.axes.index(axis)] = shape[it.axes.index(axis)]
        return np.arange(shape[it.axes.index(axis)]).reshape(at)

    def access(acc: Access):
        if acc.lookup:
            return _lookup(vals[acc.buffer.name], m, index(acc.axes[0]), index(acc.axes[1]),
                           tuple(index(a) for a in acc.axes[2:]))
        return vals[acc.buffer.name][tuple(indirect(acc, n, a) if isinstance(a, Access) else index(a)
                                           for n, a in enumerate(acc.axes))]

    def indirect(acc: Access, n: int, a: Access):
        """An indirect index's values (W[T[j], f]), checked against the axis they index."""
        got = access(a).astype(np.int64)
        declared = acc.buffer.axes[n]
        bad = (got < 0) | (got >= extent(declared))
        if bad.any():
            raise ValueError(f"{a.buffer.name} holds {int(got[bad].flat[0])}, out of range for axis {declared.name} "
                             f"of {acc.buffer.name} (extent {extent(declared)})")
        return got

    with np.errstate(all="ignore"):
        value = np.broadcast_to(_eval(st.value, access), shape)
    out = vals[st.target.buffer.name]
    idx = tuple(np.broadcast_to(index(a), shape) for a in st.target.axes)
    if st.reduce is None:
        out[idx] = value
    else:
        out[...] = identity(st.reduce, dtype)
        with np.errstate(all="ignore"):
            _AT[st.reduce](out, idx, value)


def _lookup(values: np.ndarray, m, rows, cols, trailing) -> np.ndarray:
    """``values`` (one per entry of canonical CSR ``m``, then trailing axes) at coordinates
    (rows, cols), broadcast together; 0 where (row, col) is no entry (a column past the matrix
    included)."""
    n_cols = max(m.shape[1], 1)
    rows, cols = np.broadcast_arrays(rows, cols)
    keys = np.repeat(np.arange(m.shape[0], dtype=np.int64), np.diff(m.indptr)) * n_cols + m.indices
    want = rows.astype(np.int64) * n_cols + cols
    if not keys.size:
        return np.zeros(np.broadcast_shapes(want.shape, *(t.shape for t in trailing)))
    at = np.minimum(np.searchsorted(keys, want), keys.size - 1)  # canonical CSR: keys are sorted
    hit = (cols < m.shape[1]) & (keys[at] == want)
    return np.where(hit, values[(at,) + tuple(trailing)], 0.0)


def _eval(e: Expr, access):
    if isinstance(e, Access):
        return access(e)
    if isinstance(e, Const):
        return float(e.value)
    if isinstance(e, BinOp):
        return _BINOPS[e.op](_eval(e.a, access), _eval(e.b, access))
    if isinstance(e, Call) and e.fn in _CALLS:
        return _CALLS[e.fn](*(_eval(a, access) for a in e.args))
    if isinstance(e, Select):
        return np.where(_eval(e.cond, access), _eval(e.then, access), _eval(e.other, access))
    raise ValueError(f"the reference cannot evaluate {e!r}")


def _per_slot(A, m, entry_values: np.ndarray) -> np.ndarray:
    """Values per logical entry (``m``'s order) -> one per stored slot of ``A``, 0 at padding."""
    rows, cols = A.stored_coords()
    out = np.zeros((A.stored,) + entry_values.shape[1:])
    ok = rows >= 0
    keys = m.indices.astype(np.int64) + np.repeat(np.arange(A.shape[0]), np.diff(m.indptr)) * max(A.shape[1], 1)
    want = rows[ok].astype(np.int64) * max(A.shape[1], 1) + cols[ok]
    out[ok] = entry_values[np.searchsorted(keys, want)]  # canonical CSR: keys are sorted
    return out


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
