"""The benchmark suites of issue 4: ``graphs`` (SpMM/SDDMM on graphs) and ``blocks`` (BSR).

    from sparsec.bench import suites
    suites.graphs(suites.default_cache_dir())      # or: python benchmarks/data/suites.py (describe)

The data live in one cache folder, :func:`default_cache_dir`: ``$SPARSEC_DATA_DIR`` when set,
else ``~/.cache/sparsec`` (``$XDG_CACHE_HOME/sparsec``). ``benchmarks/data/fetch.py`` writes
there; the benchmark scripts set ``SPARSEC_DATA_DIR`` to ``benchmarks/data/cache`` of their
checkout unless it is set (see ``benchmarks/README.md``).

``graphs(cache_dir)`` -> ``[(name, csr)]``: the real graphs that ``fetch.py`` wrote to the
cache (``<name>.npz``; those with fewer than 10,000 rows are skipped), smallest first,
then the R-MAT graphs of :data:`RMAT_SPECS` (Graph500 a, b, c = 0.57, 0.19, 0.19, fixed
seeds; generated on first use by :mod:`sparsec.bench.rmat` and cached as ``cache/rmat-*.npz``). Every
matrix is a canonical float32 CSR whose values are standard-normal draws from a fixed seed
(:data:`VALUE_SEED`), the same on every run. Benchmarks use the dense feature widths
:data:`GRAPH_FEATS`.

``blocks(cache_dir)`` -> ``[(name, dense weight, block, sparsity)]``: for each block size
in :data:`BLOCKS` and block sparsity in :data:`BLOCK_SPARSITIES`,

* MiniLM-L6 layer-0 weights (FFN 1536x384 and 384x1536, attention query 384x384; from
  the ``minilm`` folder of the cache (``fetch.py --minilm``), skipped with a message when absent) pruned by the Frobenius norm
  of each block (:func:`prune_blocks`), and
* random normal 4096x4096 and 1024x4096 matrices under random block masks (fixed seeds,
  :func:`random_block_mask`).

The weights are dense float32 with zeros outside the kept blocks (the bench converts them
to BSR); the dense operand's width is taken from :data:`BLOCK_DENSE_DIMS`.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from .rmat import rmat

__all__ = [
    "GRAPH_FEATS",
    "BLOCK_DENSE_DIMS",
    "BLOCKS",
    "BLOCK_SPARSITIES",
    "RMAT_SPECS",
    "MINILM_BLOCK_LAYERS",
    "RANDOM_BLOCK_SHAPES",
    "VALUE_SEED",
    "BLOCK_SEED",
    "MIN_GRAPH_ROWS",
    "RmatSpec",
    "graphs",
    "real_graphs",
    "rmat_graph",
    "blocks",
    "prune_blocks",
    "block_keep_count",
    "block_norms",
    "random_block_mask",
    "describe",
    "default_cache_dir",
    "minilm_dir",
    "load_minilm",
]

DATA_DIR_ENV = "SPARSEC_DATA_DIR"

GRAPH_FEATS = (32, 64, 128, 256, 512)
BLOCK_DENSE_DIMS = (512, 1024, 2048, 4096, 8192)
BLOCKS = (16, 32, 64)
BLOCK_SPARSITIES = (0.70, 0.90, 0.95)

VALUE_SEED = 4  # values of every graph: standard normal from Generator(PCG64(VALUE_SEED))
BLOCK_SEED = 4  # random block matrices and masks
MIN_GRAPH_ROWS = 10_000


class RmatSpec(NamedTuple):
    """``rmat(scale, nnz, seed, rows=rows)``, cached as ``<name>.npz``."""

    name: str
    scale: int
    rows: int
    nnz: int
    seed: int


RMAT_SPECS = (
    RmatSpec("rmat-s16", 16, 65_536, 1_000_000, 16),
    RmatSpec("rmat-s18", 18, 262_144, 4_000_000, 18),
    # scale 20 (1,048,576 ids) with the ids >= 1,000,000 dropped: exactly 1M rows
    RmatSpec("rmat-1M-30M", 20, 1_000_000, 30_000_000, 20),
)

# name in the suite -> tensor name in the cache's minilm folder
MINILM_BLOCK_LAYERS = {
    "minilm-L0-ffn-in": "encoder.layer.0.intermediate.dense.weight",  # 1536 x 384
    "minilm-L0-ffn-out": "encoder.layer.0.output.dense.weight",  # 384 x 1536
    "minilm-L0-attn-q": "encoder.layer.0.attention.self.query.weight",  # 384 x 384
}
RANDOM_BLOCK_SHAPES = ((4096, 4096), (1024, 4096))


def default_cache_dir() -> Path:
    """Where the suites' data live: ``$SPARSEC_DATA_DIR``, else ``$XDG_CACHE_HOME/sparsec``
    (``~/.cache/sparsec``). Read at each call, so a script may set the variable first."""
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "sparsec"


def minilm_dir(cache_dir) -> Path:
    """The MiniLM weights' folder in a cache (``fetch.py --minilm`` writes it)."""
    return Path(cache_dir) / "minilm"


def load_minilm(cache_dir, name: str) -> np.ndarray | None:
    """One saved MiniLM weight (float32), or ``None`` if the cache does not have it."""
    p = minilm_dir(cache_dir) / f"{name}.npy"
    return np.load(p) if p.is_file() else None


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- graphs


def _with_values(a: sp.csr_matrix) -> sp.csr_matrix:
    """Canonical float32 CSR of ``a``'s pattern with standard-normal values (fixed seed)."""
    a = sp.csr_matrix(a)
    a.sum_duplicates()
    a.sort_indices()
    vals = np.random.Generator(np.random.PCG64(VALUE_SEED)).standard_normal(a.nnz, dtype=np.float32)
    out = sp.csr_matrix((vals, a.indices, a.indptr), shape=a.shape)
    out.has_sorted_indices = True
    out.has_canonical_format = True
    return out


def real_graphs(cache_dir, min_rows: int = MIN_GRAPH_ROWS) -> list[tuple[str, sp.csr_matrix]]:
    """The square matrices ``cache_dir/*.npz`` written by ``fetch.py`` (``rmat-*`` excluded)
    with at least ``min_rows`` rows, smallest nnz first; values set by :func:`_with_values`."""
    cache_dir = Path(cache_dir)
    out = []
    for path in sorted(cache_dir.glob("*.npz")) if cache_dir.is_dir() else []:
        name = path.name[: -len(".npz")]
        if name.startswith("rmat-"):
            continue
        try:
            a = sp.load_npz(path)
        except Exception as exc:  # not a scipy sparse file
            log(f"skip {path.name}: {exc}")
            continue
        if a.shape[0] != a.shape[1] or a.shape[0] < min_rows:
            continue
        out.append((name, _with_values(a)))
    out.sort(key=lambda t: (t[1].nnz, t[0]))
    return out


def rmat_graph(cache_dir, spec: RmatSpec, pattern_only: bool = False) -> sp.csr_matrix:
    """The R-MAT graph of ``spec``: loaded from ``cache_dir/<name>.npz`` when it is there
    with the right shape and nnz, else generated and cached (pattern, values 1.0)."""
    spec = RmatSpec(*spec)
    path = Path(cache_dir) / f"{spec.name}.npz"
    a = None
    if path.is_file():
        try:
            a = sp.load_npz(path).tocsr()
        except Exception as exc:
            log(f"regenerate {path.name}: {exc}")
        if a is not None and (a.shape != (spec.rows, spec.rows) or a.nnz != spec.nnz):
            log(f"regenerate {path.name}: cached {a.shape}, {a.nnz} nnz do not match the spec")
            a = None
    if a is None:
        t0 = time.perf_counter()
        a = rmat(spec.scale, spec.nnz, spec.seed, rows=spec.rows)
        log(f"generated {spec.name} ({spec.rows:,} rows, {spec.nnz:,} nnz) in {time.perf_counter() - t0:.1f} s")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.npz")
        sp.save_npz(tmp, a, compressed=True)
        os.replace(tmp, path)
    return a if pattern_only else _with_values(a)


def graphs(cache_dir=None, rmat_specs=RMAT_SPECS, min_rows: int = MIN_GRAPH_ROWS):
    """``[(name, csr float32)]``: :func:`real_graphs` then the R-MAT graphs of ``rmat_specs``
    (pass a smaller list, or ``()``, to avoid generating the big ones)."""
    cache_dir = default_cache_dir() if cache_dir is None else cache_dir
    out = real_graphs(cache_dir, min_rows)
    if not out:
        log(f"no real graph in {cache_dir}: run benchmarks/data/fetch.py")
    for spec in rmat_specs:
        out.append((RmatSpec(*spec).name, rmat_graph(cache_dir, spec)))
    return out


# ----------------------------------------------------------------------------- blocks


def _grid(shape, block: int) -> tuple[int, int]:
    return -(-shape[0] // block), -(-shape[1] // block)


def block_keep_count(n_blocks: int, sparsity: float) -> int:
    """Blocks kept at block sparsity ``sparsity``: ``n_blocks - round(n_blocks * sparsity)``."""
    if not 0.0 <= sparsity <= 1.0:
        raise ValueError(f"sparsity {sparsity} not in [0, 1]")
    return n_blocks - int(round(n_blocks * sparsity))


def block_norms(w: np.ndarray, block: int) -> np.ndarray:
    """Frobenius norm of each ``block`` x ``block`` block of ``w`` (blocks that straddle the
    bottom/right edge are the partial blocks, counted as blocks), shape = the block grid."""
    w = np.asarray(w)
    gr, gc = _grid(w.shape, block)
    pad = np.zeros((gr * block, gc * block), dtype=np.float64)
    pad[: w.shape[0], : w.shape[1]] = w
    return np.sqrt(np.einsum("ibjc,ibjc->ij", pad.reshape(gr, block, gc, block), pad.reshape(gr, block, gc, block)))


def _expand(keep: np.ndarray, shape, block: int) -> np.ndarray:
    return np.repeat(np.repeat(keep, block, axis=0), block, axis=1)[: shape[0], : shape[1]]


def prune_blocks(w: np.ndarray, block: int, sparsity: float) -> np.ndarray:
    """Copy of ``w`` (float32) keeping the :func:`block_keep_count` blocks of largest
    Frobenius norm (ties: lower block index, row-major, first) and zeroing the rest."""
    w = np.asarray(w, dtype=np.float32)
    norms = block_norms(w, block)
    k = block_keep_count(norms.size, sparsity)
    order = np.argsort(-norms.ravel(), kind="stable")
    keep = np.zeros(norms.size, dtype=bool)
    keep[order[:k]] = True
    return np.where(_expand(keep.reshape(norms.shape), w.shape, block), w, np.float32(0))


def random_block_mask(shape, block: int, sparsity: float, seed) -> np.ndarray:
    """Boolean element mask of ``shape`` with exactly :func:`block_keep_count` blocks set,
    chosen uniformly at random from ``Generator(PCG64(seed))``."""
    gr, gc = _grid(shape, block)
    k = block_keep_count(gr * gc, sparsity)
    keep = np.zeros(gr * gc, dtype=bool)
    keep[np.random.Generator(np.random.PCG64(seed)).choice(gr * gc, size=k, replace=False)] = True
    return _expand(keep.reshape(gr, gc), shape, block)


def _case(base: str, block: int, s: float) -> str:
    return f"{base}-b{block}-s{int(round(s * 100))}"


def blocks(cache_dir=None, blocks_=BLOCKS, sparsities=BLOCK_SPARSITIES,
           random_shapes=RANDOM_BLOCK_SHAPES, minilm_layers=MINILM_BLOCK_LAYERS):
    """``[(name, dense float32, block, sparsity)]``: every MiniLM layer of ``minilm_layers``
    then every random shape, each for every block size and sparsity. (The default suite holds
    ~0.75 GB of dense matrices, mostly the 4096x4096 ones.)"""
    cache_dir = default_cache_dir() if cache_dir is None else cache_dir
    bases: list[tuple[str, np.ndarray, bool]] = []  # (name, weight, is_random)
    missing = []
    for base, tensor in minilm_layers.items():
        w = load_minilm(cache_dir, tensor)
        if w is None:
            missing.append(tensor)
        else:
            bases.append((base, w, False))
    if missing:
        log(f"skip {len(missing)} MiniLM layers (not in {Path(cache_dir) / 'minilm'}): "
            "run benchmarks/data/fetch.py --minilm")
    for rows, cols in random_shapes:
        w = np.random.Generator(np.random.PCG64([BLOCK_SEED, rows, cols])).standard_normal(
            (rows, cols), dtype=np.float32)
        bases.append((f"random-{rows}x{cols}", w, True))

    out = []
    for base, w, is_random in bases:
        for block in blocks_:
            for s in sparsities:
                if is_random:
                    seed = [BLOCK_SEED, w.shape[0], w.shape[1], block, int(round(s * 1000))]
                    pruned = np.where(random_block_mask(w.shape, block, s, seed), w, np.float32(0))
                else:
                    pruned = prune_blocks(w, block, s)
                out.append((_case(base, block, s), pruned, block, s))
    return out


# ----------------------------------------------------------------------------- describe


def describe(cache_dir=None, suite: str = "all", rmat_specs=RMAT_SPECS, file=None) -> None:
    """Print the cases of each suite (name, shape, nnz, block, sparsity)."""
    cache_dir = default_cache_dir() if cache_dir is None else cache_dir
    p = lambda *a: print(*a, file=file or sys.stdout)  # noqa: E731
    if suite in ("graphs", "all"):
        cases = graphs(cache_dir, rmat_specs)
        p(f"graphs suite: {len(cases)} matrices x feature widths {GRAPH_FEATS}")
        p(f"  {'name':<20} {'rows':>10} {'nnz':>12} {'mean row':>9} {'max row':>9}")
        for name, a in cases:
            deg = np.diff(a.indptr)
            p(f"  {name:<20} {a.shape[0]:>10,} {a.nnz:>12,} {deg.mean():>9.1f} {deg.max():>9,}")
    if suite in ("blocks", "all"):
        cases = blocks(cache_dir)
        p(f"blocks suite: {len(cases)} matrices x dense widths {BLOCK_DENSE_DIMS}")
        p(f"  {'name':<28} {'shape':>11} {'nnz':>10} {'block':>5} {'sparsity':>8} {'kept blocks':>12}")
        for name, w, block, s in cases:
            nz = block_norms(w, block) > 0
            p(f"  {name:<28} {f'{w.shape[0]}x{w.shape[1]}':>11} {np.count_nonzero(w):>10,} {block:>5} "
              f"{s:>8.2f} {f'{nz.sum()}/{nz.size}':>12}")
