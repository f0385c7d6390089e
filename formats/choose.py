"""The default sparse format for an operator, from a matrix's row-length statistics.

Measured on an H200 (benchmarks/results/spmm_check_H200.json: csr and fused hyb SpMM on
nine real graphs and two R-MAT graphs at F = 32/128/512): CSR's one-row-per-thread-group
kernel wins on regular rows (co-authorship graphs, meshes: coefficient of variation of the
row length <= 1.5 and no row over ~300 entries), and hyb wins everywhere else because it
splits long rows over many thread groups. SDDMM shows the same split
(benchmarks/results/sddmm_check_H200.json: hyb up to 13x over cuSPARSE on R-MAT, where
CSR's longest row serialises a warp). The tuner (issue 5) refines this per matrix.
"""
from __future__ import annotations

from typing import Dict

import numpy as np
import scipy.sparse as sp

REGULAR_CV = 1.5        # row-length std / mean at or below which CSR is the default
REGULAR_MAX_ROW = 300   # ... provided no row is longer than this


def row_stats(m) -> Dict[str, float]:
    """Row-length statistics of a scipy matrix (any format)."""
    m = sp.csr_matrix(m)
    lengths = np.diff(m.indptr)
    mean = float(lengths.mean()) if lengths.size else 0.0
    return {"rows": m.shape[0], "nnz": int(m.nnz), "row_len_mean": mean,
            "row_len_max": float(lengths.max()) if lengths.size else 0.0,
            "row_len_cv": float(lengths.std() / mean) if mean > 0 else 0.0}


def default_format(op: str, stats: Dict[str, float]) -> str:
    """``"csr"`` or ``"hyb"`` for SpMM and SDDMM, ``"csr"`` for other operators."""
    if op not in ("spmm", "sddmm"):
        return "csr"
    regular = stats["row_len_cv"] <= REGULAR_CV and stats["row_len_max"] <= REGULAR_MAX_ROW
    return "csr" if regular else "hyb"
