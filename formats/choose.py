"""The default sparse format for an operator, from a matrix's row-length statistics and the
feature width.

Measured on an H200 with CUDA-graph timing (device time; `sparsec bench {spmm,sddmm}
--suite graphs --format csr|hyb --feat 32 256`; benchmarks/results/format_choice_H200.json):

* SpMM. CSR's one-row-per-thread-group kernel wins on meshes (row-length coefficient of
  variation <= 0.5, no row over ~300 entries: copter2 4.2x vs hyb's 3.0x over cuSPARSE)
  and on moderately skewed rows once the feature width reaches 128 (the co-authorship
  graphs at F = 256: 1.5-1.7x vs 1.2-1.6x), where each row's loads are wide enough to hide
  the latency of its serial chain. At narrow widths the longest row's chain of dependent
  loads sets the kernel time, and hyb, which caps a row piece at its widest bucket, wins
  (cond-mat-2003 at F = 32: 1.5x vs 1.0x). Power-law graphs always take hyb.
* SDDMM. hyb wins except on meshes with rows of eight or more entries (copter2: CSR 1.7x vs
  1.35x), where CSR's lane groups already run full warps. Its rows are cut in pieces of at
  most four entries (buckets 1/2/4): an SDDMM entry is its own output, so a cut costs no
  atomics, only one more read of the row's X, and a lane group walks at most four entries
  in turn instead of up to 64. Over the graphs suite's 55 hyb cases (F = 32-512; two
  suite runs on an H200 with the same kernel, one per bucket choice) that is 1.35x faster
  than hyb's automatic buckets (geomean), 1.0-3.6x on the graphs under 1M entries; on the
  1M-30M-entry R-MATs it gives 0.65-0.74x at F = 32 and 0.92-1.27x above, mdual
  0.99-1.01x (a refinement left to the SDDMM log).

The tuner (issue 5) refines this per matrix.
"""
from __future__ import annotations

import warnings
from importlib.metadata import EntryPoint, PackageNotFoundError, entry_points, version
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from .stats import row_stats  # noqa: F401  (the statistics default_format reads; callers import it from here)

MESH_CV = 0.5           # row-length std / mean at or below which rows are mesh-regular
REGULAR_CV = 1.5        # ... at or below which CSR wins SpMM at wide features
REGULAR_MAX_ROW = 300   # ... provided no row is longer than this
WIDE_FEAT = 128         # feature width from which CSR's per-row chain is hidden
SDDMM_CSR_MEAN_ROW = 8  # SDDMM: CSR on mesh-regular rows at least this long
SDDMM_HYB = "hyb:auto:1/2/4"  # SDDMM's hyb: automatic column ranges, row pieces of 1, 2 or 4 entries


def default_format(op: str, stats: Dict[str, float], feat: Optional[int] = None) -> str:
    """``"csr"`` or ``"hyb"`` for SpMM, ``"csr"`` or :data:`SDDMM_HYB` (hyb with its buckets
    given) for SDDMM, ``"csr"`` for other operators. ``feat`` (the dense width; None:
    unknown, taken as wide) matters for SpMM only."""
    if op not in ("spmm", "sddmm"):
        return "csr"
    cv, longest = stats["row_len_cv"], stats["row_len_max"]
    if stats["nnz"] == 0:
        return "csr"
    if op == "sddmm":
        return "csr" if cv <= MESH_CV and stats["row_len_mean"] >= SDDMM_CSR_MEAN_ROW else SDDMM_HYB
    if longest > REGULAR_MAX_ROW:
        return "hyb"
    if cv <= MESH_CV:
        return "csr"
    wide = feat is None or feat >= WIDE_FEAT
    return "csr" if cv <= REGULAR_CV and wide else "hyb"


# Pickers that know more than the rule (the tuner's cost model) register under this
# entry-point group (pyproject.toml): the formats layer sits below the tuner and never
# imports it. A picker is called as pick(matrix, op, feat, target, dtype) and returns
# (family spec, format knobs, source) or None where it has nothing to say.
PICKERS = "sparsec.format_pickers"
AUTO_KEYWORDS = ("op", "feat", "target")  # what convert(m, "auto") reads besides dtype
CHECKOUT_PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def pickers() -> list:
    """The registered pickers; where sparsec runs from a source checkout that was never
    installed (PYTHONPATH only: no package metadata, so no entry points), the ones its
    pyproject.toml declares. Why: without this, "auto" silently fell back to the rule on
    such a checkout (it did on the GPU host, whose sparsec is a copied tree)."""
    found = list(entry_points(group=PICKERS))
    if found or not CHECKOUT_PYPROJECT.is_file():
        return found
    try:
        version("sparsec")
        return found  # installed: its metadata is the truth, even if it registers none
    except PackageNotFoundError:
        pass
    import tomllib

    with open(CHECKOUT_PYPROJECT, "rb") as f:
        declared = tomllib.load(f).get("project", {}).get("entry-points", {}).get(PICKERS, {})
    return [EntryPoint(name=name, value=value, group=PICKERS) for name, value in declared.items()]


def auto_format(matrix, op: str = "spmm", feat: Optional[int] = None, target: Optional[str] = None,
                dtype: Optional[str] = None) -> Tuple[str, Dict[str, Any], str]:
    """(spec, format knobs, source) for ``convert(matrix, "auto", ...)``: the first
    registered picker's answer (source "record" or "model": the tuning logs' pick for this
    matrix, ``op``, width ``feat`` and ``target``), else :func:`default_format` (source
    "default"). A picker that cannot load or lacks a package (no xgboost) is skipped; one
    that fails otherwise warns, and the rule answers."""
    from .convert import as_csr

    for ep in pickers():
        try:
            pick = ep.load()
        except ImportError:
            continue
        try:
            got = pick(matrix, op, feat, target, dtype or "float32")
        except ImportError:  # the picker's own needs (xgboost: the tune extra) are missing
            continue
        except Exception as e:  # a damaged log or model must not stop a conversion
            warnings.warn(f"format picker {ep.name!r} failed ({type(e).__name__}: {e}); "
                          "using the rule-based default format", stacklevel=3)
            continue
        if got is not None:
            return got
    return default_format(op, row_stats(as_csr(matrix)), feat), {}, "default"
