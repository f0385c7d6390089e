"""Matrices the CLI and examples use: the embedded default and ``save_npz`` files.

    from sparsec.datasets import default_matrix
    m = default_matrix()          # scipy CSR, float32: the power-grid matrix in sparsec/data
"""
from __future__ import annotations

import importlib.resources
import os
import zipfile

import scipy.sparse as sp

DEFAULT_MATRIX = "power_grid.npz"


def default_matrix() -> sp.csr_matrix:
    """The matrix embedded in the package (``sparsec/data/power_grid.npz``), as scipy CSR."""
    res = importlib.resources.files("sparsec").joinpath("data", DEFAULT_MATRIX)
    with importlib.resources.as_file(res) as path:
        return load_npz(path)


def load_npz(path) -> sp.csr_matrix:
    """A ``scipy.sparse.save_npz`` file as CSR; a missing or unreadable file is a ValueError
    that names it."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"matrix file {path!r} does not exist")
    try:
        m = sp.load_npz(path)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
        raise ValueError(f"matrix file {path!r} should be a scipy.sparse.save_npz file ({e})") from None
    return sp.csr_matrix(m)
