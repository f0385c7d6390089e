"""Any supported matrix -> one canonical scipy CSR matrix.

Every format converts from canonical CSR (sorted, duplicate-free rows, int32 indices,
a supported float dtype), so input handling and validation live here once. Accepted:
scipy sparse matrices/arrays of any format, 2-D numpy arrays, torch tensors (strided,
sparse COO, sparse CSR; torch is imported only when given one), and the tuples
``(data, indices, indptr)`` and ``(data, (row, col))`` with ``shape=``. See
``validate`` for how unsorted and duplicate entries are treated.

``canonical_csr`` is the one canonicalisation: it returns a plain ``Canonical`` tuple (which
keeps float16, unlike scipy.sparse); ``Canonical.scipy()`` and ``as_csr`` give the same matrix
as a scipy CSR matrix, float16 upcast to float32.
"""
from __future__ import annotations

from typing import NamedTuple, Tuple

import numpy as np
import scipy.sparse as sp

from . import validate as V

_ACCEPTED = ("a scipy sparse matrix, a 2-D numpy array, a torch tensor, "
             "(data, indices, indptr) or (data, (row, col)) with shape=")


class Canonical(NamedTuple):
    """Canonical CSR arrays: int32 indptr/indices, sorted duplicate-free rows."""

    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray
    shape: Tuple[int, int]

    @property
    def nnz(self) -> int:
        return int(self.indices.size)

    def scipy(self) -> sp.csr_matrix:
        """These arrays as a canonical ``scipy.sparse.csr_matrix`` (sharing them; float16
        values upcast to float32, as scipy.sparse has no float16)."""
        data = self.data.astype(np.float32) if self.data.dtype == np.float16 else self.data
        m = sp.csr_matrix((data, self.indices, self.indptr), shape=self.shape, copy=False)
        # scipy may widen the index dtype for large shapes; sparsec kernels take int32.
        m.indptr, m.indices = self.indptr, self.indices
        m.has_sorted_indices = True
        m.has_canonical_format = True
        return m


def as_csr(matrix, shape=None, dtype=None) -> sp.csr_matrix:
    """``canonical_csr(matrix, shape, dtype).scipy()``: a canonical ``scipy.sparse.csr_matrix``
    that never aliases the input's arrays (unless given a ``Canonical``). ``dtype=None`` keeps
    float16/32/64 values and refuses others (float16 comes back as float32)."""
    return canonical_csr(matrix, shape=shape, dtype=dtype).scipy()


def canonical_csr(matrix, shape=None, dtype=None, *, any_real: bool = False) -> Canonical:
    """``matrix`` validated and canonicalised (see the module docstring). A ``Canonical``
    is returned as it is when no ``shape`` or ``dtype`` asks for a change. ``any_real``: a
    scipy or numpy matrix of integer or bool values is read as float64 instead of refused
    (for statistics, which read only the pattern, and signatures, which hash float64 values)."""
    if any_real and dtype is None and _integer_valued(matrix):
        dtype = np.float64
    if isinstance(matrix, Canonical):  # already canonical (a NamedTuple: checked before tuples)
        if shape is not None and V.check_shape(shape) != matrix.shape:
            raise ValueError(f"shape should match the matrix's shape {matrix.shape}, got {tuple(shape)}")
        if dtype is None or np.dtype(dtype) == matrix.data.dtype:
            return matrix
        return _from_compressed(matrix.data, matrix.indices, matrix.indptr, matrix.shape, dtype, "reject")
    if isinstance(matrix, tuple):
        return _from_tuple(matrix, shape, dtype)
    if shape is not None:
        shape = V.check_shape(shape)
    if sp.issparse(matrix):
        m = _from_scipy(matrix, dtype)
    elif type(matrix).__module__.startswith("torch"):
        m = _from_torch(matrix, dtype)
    elif isinstance(matrix, np.ndarray):
        m = _from_dense(matrix, dtype)
    else:
        raise TypeError(f"matrix should be {_ACCEPTED}, got {type(matrix).__name__}")
    if shape is not None and tuple(m.shape) != shape:
        raise ValueError(f"shape should match the matrix's shape {tuple(m.shape)}, got {shape}")
    return m


def _integer_valued(matrix) -> bool:
    kind = getattr(getattr(matrix, "dtype", None), "kind", None)  # numpy dtypes; torch's have none
    return kind is not None and kind in "biu"


def _build(indptr, indices, data, shape) -> Canonical:
    return Canonical(indptr, indices, data, (int(shape[0]), int(shape[1])))


def _from_coo(row, col, data, shape, dtype, duplicates="sum") -> Canonical:
    shape = V.check_shape(shape)
    data = V.check_values(data, dtype, name="data")
    row = V.check_index(row, "row", nnz=np.asarray(row).size, shape=shape)
    col = V.check_index(col, "col", nnz=np.asarray(col).size, shape=shape)
    if row.size != col.size:
        raise ValueError(f"col should have one entry per row index ({row.size}), got {col.size}")
    V.check_lengths(data, row, "row")
    V.check_range(row, shape[0], minor="row", major="row")
    V.check_range(col, shape[1], owner=row)
    indptr, indices, data = V.canonical(row, col, data, shape[0], duplicates)
    return _build(indptr, indices, data, shape)


def _from_compressed(data, indices, indptr, shape, dtype, duplicates) -> Canonical:
    shape = V.check_shape(shape)
    data = V.check_values(data, dtype, name="data")
    indptr, indices = V.check_compressed(indptr, indices, shape)
    V.check_lengths(data, indices)
    indptr, indices, data = V.canonical(V.major_ids(indptr), indices, data, shape[0], duplicates)
    return _build(indptr, indices, data, shape)


def _from_tuple(t, shape, dtype) -> Canonical:
    if shape is None:
        raise ValueError("shape should be given with a tuple input (it cannot be inferred), got None")
    if len(t) == 2 and isinstance(t[1], tuple) and len(t[1]) == 2:
        data, (row, col) = t
        return _from_coo(row, col, data, shape, dtype, duplicates="sum")
    if len(t) == 3:
        data, indices, indptr = t
        return _from_compressed(data, indices, indptr, shape, dtype, duplicates="reject")
    raise ValueError(f"a tuple input should be (data, indices, indptr) or (data, (row, col)), got {len(t)} items")


def _from_scipy(m, dtype) -> Canonical:
    if m.ndim != 2:
        raise ValueError(f"matrix should be 2-D, got {m.ndim}-D")
    shape = V.check_shape(m.shape)
    fmt = m.format
    if fmt == "csr":
        return _from_compressed(m.data, m.indices, m.indptr, shape, dtype, duplicates="sum")
    if fmt == "csc":
        data = V.check_values(m.data, dtype, name="data")
        indptr, indices = V.check_compressed(m.indptr, m.indices, shape[::-1], major="column", minor="row")
        V.check_lengths(data, indices)
        return _from_coo(indices, V.major_ids(indptr), data, shape, None)
    if fmt == "coo":
        return _from_coo(m.row, m.col, m.data, shape, dtype)
    if fmt == "bsr":
        r, c = m.blocksize
        V.check_compressed(m.indptr, m.indices, (shape[0] // r, shape[1] // c),
                           major="block row", minor="block column")
    c = m.tocoo()  # dia, lil, dok, and bsr once its structure is checked
    return _from_coo(c.row, c.col, c.data, shape, dtype)


def _from_dense(a, dtype) -> Canonical:
    if a.ndim != 2:
        raise ValueError(f"a dense matrix should be 2-D, got shape {a.shape}")
    shape = V.check_shape(a.shape)
    a = np.asarray(a)  # np.matrix indexes as 2-D
    V.check_values(np.empty(0, a.dtype), dtype)  # dtype check before scanning the array
    row, col = np.nonzero(a)  # NaN counts as non-zero, as in scipy
    return _from_coo(row, col, a[row, col], shape, dtype)


def _from_torch(t, dtype) -> Canonical:
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"matrix should be {_ACCEPTED}, got {type(t).__module__}.{type(t).__name__}")
    if t.dim() != 2:
        raise ValueError(f"a torch matrix should be 2-D, got {t.dim()}-D (shape {tuple(t.shape)})")
    if t.dtype not in (torch.float16, torch.float32, torch.float64) and (dtype is None or t.dtype.is_complex):
        raise TypeError(f"value dtype should be one of {', '.join(V.SUPPORTED_VALUE_DTYPES)}, got {t.dtype}"
                        " (cast the tensor first, or pass dtype=)")
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16; explicit dtype= was given above
        t = t.float()
    t = t.detach().cpu()
    shape = tuple(int(s) for s in t.shape)
    if t.layout == torch.strided:
        return _from_dense(t.numpy(), dtype)
    if t.layout == torch.sparse_csr:
        return _from_compressed(t.values().numpy(), t.col_indices().numpy(), t.crow_indices().numpy(),
                                shape, dtype, duplicates="sum")
    t = t.to_sparse_coo().coalesce() if t.layout != torch.sparse_coo else t.coalesce()
    idx = t.indices().numpy()
    return _from_coo(idx[0], idx[1], t.values().numpy(), shape, dtype)
