#!/usr/bin/env python3
"""Structured synthetic matrices: meshes and uniform-degree graphs, from fixed seeds.

    python benchmarks/data/structured.py [--cache DIR]     # writes DIR/structured/<name>.npz

The real graphs of the ``graphs`` suite are mostly power-law (row-length coefficient of
variation 1.1-7.8); only two are meshes (copter2, mdual). A cost model trained on half of
them may see no mesh at all, and then has no measurement of what a fixed-width format
(ELL) or a dynamic-row kernel does on near-constant rows. These matrices fill that gap as
training data for the tuner (``benchmarks/tune_eval.py zero-shot`` trains on them, never
tests on them). Each is one structural class, at the size of the real graphs:

* ``syn-grid2d``: 5-point stencil on a 400 x 400 grid, natural order (banded, rows of 3-5);
* ``syn-grid3d``: 27-point stencil on a 30^3 grid (rows of 8-27, three bands);
* ``syn-regular``: every row 6 distinct uniform random columns (no variance, no locality);
* ``syn-geometric``: random points in the unit square, sorted into 64 x 64 cells, joined
  within a radius (Poisson rows, mean 12: a FEM-like mesh with locality);
* ``syn-uniform``: Erdos-Renyi, mean 8 a row (Poisson rows, no locality).

Values are standard-normal draws from a fixed seed, as in ``suites.py``; files go to a
subdirectory of the cache so the suite's ``real_graphs`` (which globs the cache itself)
never counts them as real graphs.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable, Dict

import numpy as np
import scipy.sparse as sp

HERE = Path(__file__).resolve().parent
DEFAULT_DIR = HERE / "cache" / "structured"
SEED = 11


def rng(salt: int) -> np.random.Generator:
    """The generator of one matrix: this module's seed and the matrix's own salt (held-out
    matrices, ``heldout.py``, take salts of their own)."""
    return np.random.Generator(np.random.PCG64([SEED, salt]))


def with_values(a, salt: int) -> sp.csr_matrix:
    """Canonical float32 CSR of ``a``'s pattern, standard-normal values from :func:`rng`."""
    a = sp.csr_matrix(a, dtype=np.float32)
    a.sum_duplicates()
    a.sort_indices()
    a.data = rng(salt).standard_normal(a.nnz, dtype=np.float32)
    return a


def _band(n: int, width: int) -> sp.csr_matrix:
    """Ones on the diagonals -width..width of an n x n matrix."""
    return sp.diags([np.ones(n - abs(k)) for k in range(-width, width + 1)], list(range(-width, width + 1)),
                    shape=(n, n), format="csr")


def grid2d(n: int = 400) -> sp.csr_matrix:
    eye, path = sp.identity(n, format="csr"), _band(n, 1)
    lap = sp.kron(path, eye) + sp.kron(eye, path)  # diagonal counted twice: same pattern
    return with_values(lap, 1)


def grid3d(n: int = 30) -> sp.csr_matrix:
    t = _band(n, 1)
    return with_values(sp.kron(sp.kron(t, t), t), 2)


def regular(rows: int = 100_000, degree: int = 6) -> sp.csr_matrix:
    g = rng(3)
    cols = np.sort(_distinct_columns(g, rows, degree), axis=1)
    indptr = np.arange(0, rows * degree + 1, degree)
    return with_values(sp.csr_matrix((np.ones(rows * degree), cols.ravel(), indptr), shape=(rows, rows)), 3)


def _distinct_columns(g: np.random.Generator, rows: int, degree: int) -> np.ndarray:
    """rows x degree uniform columns, distinct within each row (redrawn where they clash)."""
    cols = g.integers(0, rows, size=(rows, degree))
    while True:
        s = np.sort(cols, axis=1)
        clash = np.any(s[:, 1:] == s[:, :-1], axis=1)
        if not clash.any():
            return cols
        cols[clash] = g.integers(0, rows, size=(int(clash.sum()), degree))


def geometric(points: int = 80_000, mean_degree: float = 12.0, cells: int = 64) -> sp.csr_matrix:
    from scipy.spatial import cKDTree

    xy = rng(4).random((points, 2))
    cell = np.minimum((xy * cells).astype(np.int64), cells - 1)
    order = np.lexsort((xy[:, 0], cell[:, 0], cell[:, 1]))  # row-major over cells: neighbours near in id
    xy = xy[order]
    radius = np.sqrt(mean_degree / (np.pi * points))
    pairs = cKDTree(xy).query_pairs(radius, output_type="ndarray")
    i = np.concatenate([pairs[:, 0], pairs[:, 1], np.arange(points)])
    j = np.concatenate([pairs[:, 1], pairs[:, 0], np.arange(points)])
    return with_values(sp.csr_matrix((np.ones(i.size), (i, j)), shape=(points, points)), 4)


def uniform(rows: int = 60_000, mean_degree: float = 8.0) -> sp.csr_matrix:
    g = rng(5)
    nnz = int(rows * mean_degree)
    i, j = g.integers(0, rows, nnz), g.integers(0, rows, nnz)
    return with_values(sp.csr_matrix((np.ones(nnz), (i, j)), shape=(rows, rows)), 5)


MATRICES: Dict[str, Callable[[], sp.csr_matrix]] = {
    "syn-grid2d": grid2d, "syn-grid3d": grid3d, "syn-regular": regular,
    "syn-geometric": geometric, "syn-uniform": uniform,
}


def write_all(directory=DEFAULT_DIR) -> Dict[str, Path]:
    """Generate every matrix into ``directory`` (skipping files already there)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, make in MATRICES.items():
        path = directory / f"{name}.npz"
        if not path.is_file():
            sp.save_npz(path, make())
        out[name] = path
    return out


def summary(m) -> str:
    """Shape, entries and row-length statistics of ``m``, one line."""
    lens = np.diff(m.indptr)
    return (f"{m.shape[0]} x {m.shape[1]}, {m.nnz} nnz, row length mean {lens.mean():.1f} "
            f"cv {lens.std() / lens.mean():.2f} max {lens.max()}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=str(DEFAULT_DIR), help="output directory")
    args = ap.parse_args(argv)
    for name, path in write_all(args.dir).items():
        print(f"{name}: {summary(sp.load_npz(path))} -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
