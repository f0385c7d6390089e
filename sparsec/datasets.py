"""Matrices the CLI and examples use: the embedded default and ``save_npz`` files.

    from sparsec.datasets import default_matrix
    m = default_matrix()          # scipy CSR, float32: the power-grid matrix in sparsec/data

A file is read with the checks of ``sparsec.formats.convert`` (the API's): a matrix the API
refuses (integer or bool values, ``indptr[-1]`` short of the stored entries, ...) is refused
here too, with the file's name, instead of being cast or trimmed by scipy.
"""
from __future__ import annotations

import importlib.resources
import os
import zipfile

import numpy as np
import scipy.sparse as sp

DEFAULT_MATRIX = "power_grid.npz"
_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = b"PK\x03\x04"
_SAVE_NPZ_KEYS = {"format", "shape"}


def default_matrix() -> sp.csr_matrix:
    """The matrix embedded in the package (``sparsec/data/power_grid.npz``), as scipy CSR."""
    res = importlib.resources.files("sparsec").joinpath("data", DEFAULT_MATRIX)
    with importlib.resources.as_file(res) as path:
        return load_npz(path)


def load_npz(path) -> sp.csr_matrix:
    """A ``scipy.sparse.save_npz`` file as canonical CSR (``sparsec.formats.as_csr``).

    A missing path, a directory, an empty file, a ``.npy`` array, a ``.npz`` of other arrays
    or any other file is a ValueError that names the file and says what it is; values the
    API refuses are a TypeError, a broken structure a ValueError, both naming the file."""
    path = os.fspath(path)
    _check_is_npz(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            keys = set(z.files)
            if not _SAVE_NPZ_KEYS <= keys:
                raise ValueError(f"matrix file {path!r} is a .npz of arrays {sorted(keys)}, not a scipy.sparse "
                                 "matrix (write one with scipy.sparse.save_npz)")
            _check_raw_structure(path, z)
        m = sp.load_npz(path)
    except (OSError, KeyError, EOFError, zipfile.BadZipFile) as e:
        raise ValueError(f"matrix file {path!r} is a damaged .npz file ({type(e).__name__}: {e})") from None
    except ValueError as e:
        if str(e).startswith(f"matrix file {path!r}"):
            raise
        raise ValueError(f"matrix file {path!r} is not a readable scipy.sparse.save_npz file ({e})") from None
    from . import formats

    try:
        return formats.as_csr(m)
    except (TypeError, ValueError) as e:
        raise type(e)(f"matrix file {path!r}: {e}") from None


def _check_is_npz(path: str) -> None:
    if not os.path.exists(path):
        raise ValueError(f"matrix file {path!r} does not exist")
    if os.path.isdir(path):
        raise ValueError(f"matrix file {path!r} is a directory, not a scipy.sparse.save_npz file")
    if not os.path.isfile(path):
        raise ValueError(f"matrix file {path!r} is not a regular file")
    size = os.path.getsize(path)
    if size == 0:
        raise ValueError(f"matrix file {path!r} is empty (0 bytes), not a scipy.sparse.save_npz file")
    with open(path, "rb") as f:
        head = f.read(8)
    if head.startswith(_NPY_MAGIC):
        raise ValueError(f"matrix file {path!r} is a .npy array (numpy.save), not a sparse matrix: "
                         "write one with scipy.sparse.save_npz")
    if not head.startswith(_ZIP_MAGIC):
        raise ValueError(f"matrix file {path!r} is not a .npz file ({size} bytes that are not a zip archive); "
                         "write one with scipy.sparse.save_npz")


def _check_raw_structure(path: str, z) -> None:
    """The stored arrays as written, before scipy's reader trims ``data``/``indices`` to
    ``indptr[-1]``: compressed formats must end indptr at the stored entries, as the API asks."""
    fmt = z["format"].item()
    fmt = fmt.decode() if isinstance(fmt, bytes) else str(fmt)
    if fmt in ("csr", "csc") and {"indptr", "indices"} <= set(z.files):
        indptr, indices = z["indptr"], z["indices"]
        if indptr.ndim == 1 and indptr.size and int(indptr[-1]) != indices.size:
            raise ValueError(f"matrix file {path!r}: indptr should end at nnz = len(indices) = {indices.size}, "
                             f"got {int(indptr[-1])}")
