"""Shape-of-the-sparsity summary shared by every format's ``stats``.

Row-length skew and padding are what decide between formats and schedules (ELL pads
to the longest row, BSR fills blocks), so every format reports the same numbers.
"""
from __future__ import annotations

import numpy as np


def summarize(inst, row_lengths: np.ndarray) -> dict:
    """Common statistics of ``inst``; ``row_lengths`` counts real entries per logical row."""
    rows, cols = inst.shape
    lengths = np.asarray(row_lengths, dtype=np.float64)
    if lengths.size:
        p50, p90, p99 = (float(v) for v in np.quantile(lengths, [0.5, 0.9, 0.99]))
        mean, mx = float(lengths.mean()), float(lengths.max())
        cv = float(lengths.std() / mean) if mean > 0 else 0.0
    else:
        p50 = p90 = p99 = mean = mx = cv = 0.0
    nbytes = sum(int(a.nbytes) for a in inst.arrays.values()) + int(inst.data.nbytes)
    return {
        "format": inst.format.spec,
        "rows": int(rows),
        "cols": int(cols),
        "nnz": int(inst.nnz),
        "stored": int(inst.stored),
        "padding_ratio": float(inst.stored / inst.nnz) if inst.nnz else 1.0,
        "density": float(inst.nnz / (rows * cols)) if rows * cols else 0.0,
        "row_len_mean": mean,
        "row_len_max": mx,
        "row_len_p50": p50,
        "row_len_p90": p90,
        "row_len_p99": p99,
        "row_len_cv": cv,
        "bytes": nbytes,
    }


def row_lengths_from_coords(inst) -> np.ndarray:
    """Entries per logical row, counting only slots that hold a source non-zero position."""
    rows, _ = inst.stored_coords()
    return np.bincount(rows[rows >= 0], minlength=inst.shape[0])[: inst.shape[0]]
