#!/usr/bin/env python3
"""Held-out matrices for the tuner's zero-shot evaluation: kinds no tuning log trains on.

    python benchmarks/data/heldout.py [--cache DIR]     # prints each matrix's shape and row statistics

The shipped cost model (``tuning_logs/spmm_cuda_sm_90a.jsonl``) is trained on square graphs
(co-authorship, e-mail, trust, Internet AS, two meshes, R-MAT) and the structured synthetic
matrices of ``structured.py``. ``benchmarks/tune_eval.py held-out`` asks how its zero-shot
pick does on other kinds, none of them in any log (the job refuses a name a log has):

* ``4elt``: a real 2-D finite-element mesh (METIS examples, ``libmetis-doc``; 7,434 rows);
* ``hep-th``: a real co-authorship graph smaller than the suite's (graph-tool's collection);
* ``enron-incidence``: email-Enron's vertex x edge incidence matrix (36,692 x 183,831, two
  entries a column): non-square, with email-Enron's power-law degrees as row lengths;
* ``bipartite-zipf``: users x items (60,000 x 20,000, mean 12 a row), item popularity Zipf
  1.1: non-square, short rows, a few columns that most rows touch;
* ``hub-rows``: 50,000 x 50,000 uniform rows of mean 10 plus 8 rows of 25,000 entries: a
  few very long rows in an otherwise regular matrix;
* ``circuit``: 80,000 rows, each coupled to a few neighbours within +-40 (banded
  locality), plus 6 supply nets (dense rows and columns of 20,000): the SuiteSparse circuit
  pattern (no circuit matrix ships in a package, ``../shared/DATA.md``, so it is
  generated).

The real ones come from the graphs cache (``fetch.py``); the others from fixed seeds.
Values are standard-normal draws from fixed seeds, through ``structured.py``'s generator.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable, Dict

import numpy as np
import scipy.sparse as sp

from structured import rng as _structured_rng, summary, with_values as _structured_values

HERE = Path(__file__).resolve().parent
SALT = 100  # salts of their own: none of structured.py's matrices shares a generator with these


def _rng(salt: int) -> np.random.Generator:
    return _structured_rng(SALT + salt)


def _with_values(a, salt: int) -> sp.csr_matrix:
    return _structured_values(a, SALT + salt)


def _cached(cache_dir, name: str) -> sp.csr_matrix:
    path = Path(cache_dir) / f"{name}.npz"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run benchmarks/data/fetch.py --out {cache_dir} first")
    return sp.load_npz(path).tocsr()


def elt4(cache_dir) -> sp.csr_matrix:
    return _with_values(_cached(cache_dir, "4elt"), 1)


def hep_th(cache_dir) -> sp.csr_matrix:
    return _with_values(_cached(cache_dir, "hep-th"), 2)


def enron_incidence(cache_dir) -> sp.csr_matrix:
    """Vertex x edge: column e holds its two endpoints (each undirected edge once)."""
    g = sp.triu(_cached(cache_dir, "email-Enron"), k=1).tocoo()
    e = np.arange(g.nnz)
    inc = sp.csr_matrix((np.ones(2 * g.nnz), (np.concatenate([g.row, g.col]), np.concatenate([e, e]))),
                        shape=(g.shape[0], g.nnz))
    return _with_values(inc, 3)


def bipartite_zipf(rows: int = 60_000, cols: int = 20_000, mean: float = 12.0, a: float = 1.1) -> sp.csr_matrix:
    g = _rng(4)
    lengths = np.maximum(1, g.poisson(mean, rows))
    p = 1.0 / np.arange(1, cols + 1) ** a
    items = g.permutation(cols)[g.choice(cols, size=int(lengths.sum()), p=p / p.sum())]
    users = np.repeat(np.arange(rows), lengths)
    return _with_values(sp.csr_matrix((np.ones(users.size), (users, items)), shape=(rows, cols)), 4)


def hub_rows(n: int = 50_000, mean: float = 10.0, hubs: int = 8, hub_len: int = 25_000) -> sp.csr_matrix:
    g = _rng(5)
    nnz = int(n * mean)
    i, j = g.integers(0, n, nnz), g.integers(0, n, nnz)
    h = g.choice(n, hubs, replace=False)
    hi = np.repeat(h, hub_len)
    hj = np.concatenate([g.choice(n, hub_len, replace=False) for _ in range(hubs)])
    return _with_values(sp.csr_matrix((np.ones(nnz + hi.size), (np.concatenate([i, hi]), np.concatenate([j, hj]))),
                                      shape=(n, n)), 5)


def circuit(n: int = 80_000, couplings: int = 4, reach: int = 40, nets: int = 6, net_len: int = 20_000) -> sp.csr_matrix:
    g = _rng(6)
    i = np.repeat(np.arange(n), couplings)
    j = np.clip(i + g.integers(-reach, reach + 1, i.size), 0, n - 1)
    net = g.choice(n, nets, replace=False)
    members = np.concatenate([g.choice(n, net_len, replace=False) for _ in range(nets)])
    owners = np.repeat(net, net_len)
    rows = np.concatenate([np.arange(n), i, j, owners, members])  # diagonal, symmetric couplings and nets
    cols = np.concatenate([np.arange(n), j, i, members, owners])
    return _with_values(sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(n, n)), 6)


MATRICES: Dict[str, Callable] = {
    "4elt": elt4, "hep-th": hep_th, "enron-incidence": enron_incidence,
    "bipartite-zipf": lambda cache_dir: bipartite_zipf(), "hub-rows": lambda cache_dir: hub_rows(),
    "circuit": lambda cache_dir: circuit(),
}


def matrices(cache_dir, names=None) -> Dict[str, sp.csr_matrix]:
    """``{name: float32 CSR}`` of the held-out matrices (all, or ``names``)."""
    unknown = sorted(set(names or ()) - set(MATRICES))
    if unknown:
        raise ValueError(f"unknown held-out matrices {unknown}; known: {sorted(MATRICES)}")
    return {n: MATRICES[n](cache_dir) for n in (names or MATRICES)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", default=str(HERE / "cache"), help="the graphs cache (fetch.py's output)")
    args = ap.parse_args(argv)
    for name, m in matrices(args.cache).items():
        print(f"{name}: {summary(m)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
