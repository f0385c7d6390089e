"""What a benchmark runs: cases of (op, matrix, format, dtype, feat, knobs), grouped by matrix.

Matrices come from a ``save_npz`` file or from a suite of :mod:`sparsec.bench.suites` (data in
``$SPARSEC_DATA_DIR``, default ``~/.cache/sparsec``; fetched by ``benchmarks/data/fetch.py`` of
a source checkout, the R-MAT graphs generated on first use):

    graphs  real graphs + R-MAT, feature widths 32..512, float32, format from
            default_format_for (CSR for now)
    blocks  MiniLM layers and random matrices pruned to blocks of 16/32/64 at 70/90/95 %
            block sparsity, dense widths 512..8192, float16, format bsr:<block>x<block>

``--quick`` keeps a few cases of each (smoke runs); ``max_rmat`` leaves out the R-MAT
graphs with more non-zeros (the 30M one is generated on first use: 22 s, 1.6 GB).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import scipy.sparse as sp

from .. import datasets, formats, ops
from ..dtypes import dtype_spec
from . import suites

SUITES = ("graphs", "blocks")
FETCH_HINT = ("run `python benchmarks/data/fetch.py --out DIR` of a source checkout first, "
              f"DIR the cache folder (${suites.DATA_DIR_ENV}, default ~/.cache/sparsec)")

# --quick: a handful of cases per suite
QUICK_GRAPHS = 2  # the smallest real graphs, plus the smallest R-MAT within max_rmat
QUICK_GRAPH_FEATS = (32, 256)
QUICK_BLOCKS = {"blocks_": (32,), "sparsities": (0.9,), "random_shapes": ((4096, 4096),),
                "minilm_layers": ("minilm-L0-ffn-in",)}
QUICK_BLOCK_DIMS = (512, 4096)


@dataclass(frozen=True)
class Case:
    """One timed measurement. ``knobs`` is a sorted tuple of (name, value) (hashable: it keys
    the kernel cache); ``block`` and ``sparsity`` describe a blocks-suite matrix."""

    op: str
    matrix: str
    spec: str
    dtype: str
    feat: int
    knobs: Tuple[Tuple[str, Any], ...] = ()
    suite: Optional[str] = None
    block: Optional[int] = None
    sparsity: Optional[float] = None


@dataclass
class MatrixCases:
    """A matrix (canonical float32 scipy CSR) and the cases run on it, so its conversions
    and device copies are made once for all of them."""

    name: str
    matrix: sp.csr_matrix
    cases: List[Case] = field(default_factory=list)


def default_format_for(op: str, stats: Dict[str, float], feat: Optional[int] = None) -> str:
    """The sparsec format a case uses when none is given: sparsec's own rule
    (``sparsec.formats.choose``) on the row-length statistics of :func:`matrix_stats` and the
    feature width."""
    from sparsec.formats.choose import default_format

    return default_format(op, stats, feat)


AUTO = "auto"  # --format auto: the format sparsec picks for each matrix and width (convert(m, "auto"))


def auto_spec(op: str, m, feat: int, target: Optional[str], dtype: str) -> str:
    """The format spec ``formats.convert(m, "auto", ...)`` takes for this case: the tuning
    logs' pick (format and format knobs) for ``target``, else the rule's default, written
    out with its knobs so that the case names what it ran."""
    from ..formats.choose import auto_format

    spec, knobs, _ = auto_format(m, op, feat, target, dtype)
    return formats.make_format(spec, **knobs).spec if knobs else spec


def matrix_stats(m: sp.csr_matrix) -> Dict[str, float]:
    """The row statistics a case records and the default format is chosen on (one
    implementation: ``sparsec.formats.stats.row_stats``)."""
    from ..formats.stats import row_stats

    return row_stats(m)


def normalize_spec(spec: str) -> str:
    """``bsr:32`` -> ``bsr:32x32`` (square blocks may be given by one size); other specs are
    checked by parsing and returned as given."""
    name, _, arg = spec.strip().partition(":")
    if name == "bsr" and arg.isdigit():
        spec = f"bsr:{arg}x{arg}"
    formats.parse_spec(spec)
    return spec


def parse_count(text) -> int:
    """``4M`` -> 4000000, ``500k`` -> 500000, ``0`` -> 0 (R-MAT non-zero limits)."""
    t = str(text).strip().lower().replace("_", "")
    scale = {"k": 10**3, "m": 10**6, "g": 10**9}.get(t[-1:], 1)
    digits = t[:-1] if scale > 1 else t
    try:
        value = float(digits)
    except ValueError:
        value = -1.0
    if value < 0 or value != value:
        raise ValueError(f"a count should be a number >= 0 with an optional k/M/G suffix (e.g. 4M), got {text!r}")
    return int(value * scale)


def parse_knobs(text: Optional[str]) -> Tuple[Tuple[str, Any], ...]:
    if not text:
        return ()
    try:
        knobs = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--knobs should be a JSON object like '{{\"rows_per_block\": 4}}', got {text!r} ({e})") \
            from None
    if not isinstance(knobs, dict):
        raise ValueError(f"--knobs should be a JSON object, got {type(knobs).__name__}: {text!r}")
    return tuple(sorted(knobs.items()))


# ---- suites ----------------------------------------------------------------------------------
def graph_matrices(cache_dir, quick: bool = False, max_rmat: Optional[int] = None) -> List[Tuple[str, sp.csr_matrix]]:
    real = suites.real_graphs(cache_dir)
    if not real:
        raise ValueError(f"the graphs suite has no real graph in {cache_dir}: {FETCH_HINT}")
    specs = [s for s in suites.RMAT_SPECS if max_rmat is None or s.nnz <= max_rmat]
    if quick:
        real, specs = real[:QUICK_GRAPHS], sorted(specs, key=lambda s: s.nnz)[:1]
    return real + [(s.name, suites.rmat_graph(cache_dir, s)) for s in specs]


def block_matrices(cache_dir, quick: bool = False, blocks: Optional[Sequence[int]] = None,
                   sparsities: Optional[Sequence[float]] = None) -> List[Tuple[str, sp.csr_matrix, int, float]]:
    layers = dict(suites.MINILM_BLOCK_LAYERS)
    missing = [n for n, t in layers.items() if suites.load_minilm(cache_dir, t) is None]
    if missing:
        raise ValueError(f"the blocks suite needs the MiniLM weights ({', '.join(missing)} not in "
                         f"{Path(cache_dir) / 'minilm'}): {FETCH_HINT}")
    kw: Dict[str, Any] = {}
    if quick:
        kw = dict(QUICK_BLOCKS, minilm_layers={n: layers[n] for n in QUICK_BLOCKS["minilm_layers"]})
    if blocks:
        bad = [b for b in blocks if b not in suites.BLOCKS]
        if bad:
            raise ValueError(f"--block should be among the suite's block sizes {suites.BLOCKS}, got {bad[0]}")
        kw["blocks_"] = tuple(blocks)
    if sparsities:
        bad = [s for s in sparsities if not any(abs(s - t) < 1e-9 for t in suites.BLOCK_SPARSITIES)]
        if bad:
            raise ValueError(f"--sparsity should be among the suite's {suites.BLOCK_SPARSITIES}, got {bad[0]}")
        kw["sparsities"] = tuple(sparsities)
    out = []
    for name, w, block, s in suites.blocks(cache_dir, **kw):
        m = sp.csr_matrix(w)
        m.eliminate_zeros()
        out.append((name, m, block, s))
    return out


def default_cache_dir() -> Path:
    return suites.default_cache_dir()


# ---- building the cases ----------------------------------------------------------------------
def build_cases(op: str, *, matrix: Optional[str] = None, suite: Optional[str] = None,
                feats: Optional[Sequence[int]] = None, spec: Optional[str] = None, dtype: Optional[str] = None,
                sparsities: Optional[Sequence[float]] = None, blocks: Optional[Sequence[int]] = None,
                knobs: Tuple[Tuple[str, Any], ...] = (), quick: bool = False, max_rmat: Optional[int] = None,
                cache_dir=None, target: Optional[str] = None) -> List[MatrixCases]:
    """The cases of one ``sparsec bench`` invocation, grouped by matrix. ``spec="auto"``
    (graphs or a matrix file): each case takes the format sparsec picks for its matrix and
    width on ``target`` (:func:`auto_spec`)."""
    if op not in ops.LIBRARY:
        raise ValueError(f"op should be one of {sorted(ops.LIBRARY)}, got {op!r}")
    if (matrix is None) == (suite is None):
        raise ValueError("give one matrix source: --matrix FILE.npz or --suite graphs|blocks")
    if suite is not None and suite not in SUITES:
        raise ValueError(f"--suite should be one of {SUITES}, got {suite!r}")
    if sparsities and suite != "blocks":
        raise ValueError("--sparsity selects cases of the blocks suite (--suite blocks)")
    if blocks and suite == "graphs":
        raise ValueError("--block applies to --suite blocks or to --matrix (BSR with that block)")
    if blocks and spec is not None:
        raise ValueError("give either --format or --block (which means --format bsr:BxB)")
    if any(f < 1 for f in feats or ()):
        raise ValueError(f"--feat should be positive, got {list(feats)}")
    if spec == AUTO and (suite == "blocks" or blocks):
        raise ValueError("--format auto picks among the formats of a graph or matrix file, not the blocks suite's BSR")
    spec = normalize_spec(spec) if spec not in (None, AUTO) else spec
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if suite == "blocks":
        dtype = _float_dtype(dtype or "float16")
        dims = tuple(feats or (QUICK_BLOCK_DIMS if quick else suites.BLOCK_DENSE_DIMS))
        out = []
        for name, m, block, s in block_matrices(cache_dir, quick, blocks, sparsities):
            case_spec = spec or f"bsr:{block}x{block}"
            out.append(MatrixCases(name, m, [Case(op, name, case_spec, dtype, f, knobs, suite, block, s) for f in dims]))
        return out
    dtype = _float_dtype(dtype or "float32")
    if suite == "graphs":
        widths = tuple(feats or (QUICK_GRAPH_FEATS if quick else suites.GRAPH_FEATS))
        groups = graph_matrices(cache_dir, quick, max_rmat)
    else:
        widths = tuple(feats or (64,))
        m = datasets.load_npz(matrix)
        groups = [(Path(matrix).name[: -len(".npz")] if matrix.endswith(".npz") else Path(matrix).name,
                   sp.csr_matrix(m, dtype=np.float32))]
    out = []
    for name, m in groups:
        if blocks:
            cases = [Case(op, name, f"bsr:{b}x{b}", dtype, f, knobs, suite, b) for b in blocks for f in widths]
        else:
            stats = matrix_stats(m)
            pick = (lambda f: auto_spec(op, m, f, target, dtype)) if spec == AUTO else \
                (lambda f: spec or default_format_for(op, stats, f))
            cases = [Case(op, name, s, dtype, f, knobs, suite, _square_block(s)) for f in widths for s in [pick(f)]]
        out.append(MatrixCases(name, m, cases))
    return out


def _float_dtype(name: str) -> str:
    d = dtype_spec(name).name
    if d not in ("float32", "float16", "float64"):
        raise ValueError(f"the benchmark compares floating-point kernels: --dtype should be float32, float16 or "
                         f"float64, got {d}")
    return d


def _square_block(spec: str) -> Optional[int]:
    module, params = formats.parse_spec(spec)
    block = params.get("block") if module.NAME == "bsr" else None
    return block[0] if block and block[0] == block[1] else None
