#!/usr/bin/env python3
"""The ``lowprec`` and ``nm`` benchmark suites (issue 6): pruned transformer weights.

    python benchmarks/data/lowprec.py [--cache DIR] [--suite lowprec|nm|all]

Weights, as the SpMM's sparse operand A (out features x in features; the dense operand is
in features x N, N the tokens: :data:`DENSE_DIMS`, 16 ... 8192):

* MiniLM-L6 layer 0, real weights (the cache's ``minilm`` folder, ``fetch.py --minilm``; skipped with a message when
  absent): FFN in 1536x384, FFN out 384x1536, attention query 384x384;
* BERT-base-sized layers, normal(0, 0.02) from a fixed seed (BERT's initialiser):
  FFN in 3072x768, FFN out 768x3072, attention 768x768.

``lowprec(cache)`` -> ``[(name, pruned float32, V, sparsity)]``: each weight pruned for
SR-BCRS at V in :data:`VECS` and sparsity in :data:`SPARSITIES` by
:func:`prune_vectors` (the V x 1 column vectors of largest L2 norm survive, counted over the
whole layer, as magnitude pruning of a real model does: rows end up unequal).

``nm(cache)`` -> ``[(name, pruned float32, N, M)]``: each weight pruned to N:M along the
reduction dimension (in features) for N:M in :data:`NM_PATTERNS`, by ``formats.nm.prune``
(magnitude, per window of M).

The weights are dense float32 with zeros where pruned; the benchmark quantizes (int8 /
int4) or casts (fp16) and converts them to its formats.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

import _preamble  # noqa: F401  (the checkout root on sys.path, SPARSEC_DATA_DIR)

from sparsec.bench.suites import default_cache_dir, load_minilm

DEFAULT_CACHE = default_cache_dir()
DENSE_DIMS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
VECS = (2, 4, 8)
SPARSITIES = (0.70, 0.80, 0.90, 0.95)
NM_PATTERNS = ((2, 4), (1, 8))
SEED = 6
MINILM_LAYERS = {  # name in the suite -> tensor in the cache's minilm folder
    "minilm-L0-ffn-in": "encoder.layer.0.intermediate.dense.weight",  # 1536 x 384
    "minilm-L0-ffn-out": "encoder.layer.0.output.dense.weight",  # 384 x 1536
    "minilm-L0-attn-q": "encoder.layer.0.attention.self.query.weight",  # 384 x 384
}
BERT_BASE_SHAPES = {"bert-ffn-in": (3072, 768), "bert-ffn-out": (768, 3072), "bert-attn": (768, 768)}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def vector_keep_count(n_vectors: int, sparsity: float) -> int:
    """Vectors kept at sparsity ``sparsity``: ``n_vectors - round(n_vectors * sparsity)``."""
    if not 0.0 <= sparsity < 1.0:
        raise ValueError(f"sparsity should be in [0, 1), got {sparsity}")
    return n_vectors - int(round(n_vectors * sparsity))


def prune_vectors(w: np.ndarray, vec: int, sparsity: float) -> np.ndarray:
    """Copy of ``w`` (float32) keeping the :func:`vector_keep_count` column vectors of ``vec``
    consecutive rows (rows grouped from the top; a last partial group counts as a vector)
    with the largest L2 norm over the whole matrix (ties: lower row group, then lower
    column), zeroing the rest."""
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise ValueError(f"w should be a 2-D weight, got shape {w.shape}")
    if vec not in VECS and vec != 1:
        raise ValueError(f"vec should be 1 or one of {VECS}, got {vec!r}")
    rows, cols = w.shape
    groups = -(-rows // vec)
    pad = np.zeros((groups * vec, cols), np.float64)
    pad[:rows] = w
    norms = np.sqrt((pad.reshape(groups, vec, cols) ** 2).sum(axis=1))  # (groups, cols)
    keep = np.zeros(norms.size, bool)
    keep[np.argsort(-norms.ravel(), kind="stable")[: vector_keep_count(norms.size, sparsity)]] = True
    mask = np.repeat(keep.reshape(groups, cols), vec, axis=0)[:rows]
    return np.where(mask, w, np.float32(0))


def weights(cache_dir=DEFAULT_CACHE, minilm_layers=MINILM_LAYERS, bert_shapes=BERT_BASE_SHAPES):
    """``[(name, float32 weight)]``: the MiniLM layers found in the cache, then the
    BERT-base-sized random layers."""
    out, missing = [], []
    for name, tensor in minilm_layers.items():
        w = load_minilm(cache_dir, tensor)
        if w is None:
            missing.append(tensor)
        else:
            out.append((name, np.asarray(w, np.float32)))
    if missing:
        log(f"skip {len(missing)} MiniLM layers (not in {Path(cache_dir) / 'minilm'}): "
            "run benchmarks/data/fetch.py --minilm")
    for name, (rows, cols) in bert_shapes.items():
        g = np.random.Generator(np.random.PCG64([SEED, rows, cols]))
        out.append((name, (0.02 * g.standard_normal((rows, cols))).astype(np.float32)))
    return out


def lowprec(cache_dir=DEFAULT_CACHE, vecs=VECS, sparsities=SPARSITIES, **kw):
    """SR-BCRS cases: ``[(name, pruned float32, V, sparsity)]``."""
    return [(f"{name}-v{v}-s{int(round(s * 100))}", prune_vectors(w, v, s), v, s)
            for name, w in weights(cache_dir, **kw) for v in vecs for s in sparsities]


def nm(cache_dir=DEFAULT_CACHE, patterns=NM_PATTERNS, **kw):
    """N:M cases: ``[(name, pruned float32, N, M)]``."""
    from sparsec.formats import nm as nm_format

    out = []
    for name, w in weights(cache_dir, **kw):
        for n, m in patterns:
            _, keep = nm_format.prune(w, n=n, m=m)
            out.append((f"{name}-{n}of{m}", np.where(keep, w, np.float32(0)), n, m))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--suite", choices=("lowprec", "nm", "all"), default="all")
    args = ap.parse_args(argv)
    if args.suite in ("lowprec", "all"):
        cases = lowprec(args.cache)
        print(f"lowprec suite: {len(cases)} weights x dense dims {DENSE_DIMS}")
        for name, w, v, s in cases:
            print(f"  {name:<28} {w.shape[0]:>5}x{w.shape[1]:<5} V={v} sparsity {1 - np.count_nonzero(w) / w.size:.3f}")
    if args.suite in ("nm", "all"):
        cases = nm(args.cache)
        print(f"nm suite: {len(cases)} weights x dense dims {DENSE_DIMS}")
        for name, w, n, m in cases:
            print(f"  {name:<28} {w.shape[0]:>5}x{w.shape[1]:<5} {n}:{m} sparsity {1 - np.count_nonzero(w) / w.size:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
