"""The search space: format knobs x the chosen template's schedule knobs, pruned before building.

A candidate is the runner's dict (``sparsec.tune.runner``), always with every knob written
out: hyb's ``col_parts`` and ``buckets`` resolved, and the schedule template's knobs with
their defaults filled in and ``rows_per_block="auto"`` resolved the way the template
resolves it. So two spellings of one kernel are one candidate, and a record says exactly
what ran.

Pruned before anything is built (each rule names why):

* ``vec`` must divide the feature width, and a narrower vector is kept only while a row's
  threads still fit in one warp (beyond that it only adds threads doing the same loads).
* ``rows_per_block`` may not push a block past 1024 threads.
* hyb ``col_parts`` keeps at least :data:`MIN_RANGE_COLS` columns a range (narrower ranges
  only add launches), and its widest bucket is capped at the longest (row, range) group:
  wider buckets would be empty, the same instance as the cap.
* ELL only when its padding (rows x longest row / nnz) is at most :data:`MAX_ELL_PADDING`;
  BSR only when blocks are at least :data:`MIN_BSR_FILL` full.
* ``interleave`` only when some bucket is coarsened (several row groups a block).
* ``feat_tiles`` (feature slices on blockIdx.y) only while a slice keeps at least
  :data:`MIN_TILE_FEATURES` features.

Fixed-width rows take at most 128 slots a block in the full space: on the H200 graphs log
(784 measurements, 49 cases) no candidate with 256, 512 or 1024 slots came within 3 % of
its case's best, and they were the slowest to build (most of the build timeouts).

``feat_tiles`` came after the first logs: a candidate writes it out only when it is not 1,
so the kernels logged before it keep their identity (``--resume``, the committed tables).
"""
from __future__ import annotations

import json
from typing import Any, Dict, Iterable, List, Optional, Sequence

import numpy as np

from ..formats import hyb as hyb_format
from ..formats.choose import default_format
from ..formats.convert import as_csr
from .features import resolve_spmm
from .signature import matrix_stats

MIN_RANGE_COLS = 1024
MAX_ELL_PADDING = 3.0
MIN_BSR_FILL = 0.5
MIN_TILE_FEATURES = 64
BSR_BLOCKS = (2, 4, 8, 16, 32)
HYB_COL_PARTS = (1, 2, 4, 8, 16)
HYB_MAX_BUCKETS = (4, 8, 16, 32, 64, 128)
FAMILIES = ("csr", "hyb", "ell", "bsr")
SIZES = ("full", "small")

# SpMM template (schedules.cuda.features_over_threads): knobs by row shape
SPMM_DEFAULTS = {"rows_per_block": "auto", "vec": 4, "slots_per_block": 64, "unroll": 2, "interleave": 1}
SPMM_DYNAMIC = {"rows_per_block": ("auto", 1, 2, 4, 8, 16), "vec": (4, 2, 1), "unroll": (1, 2, 4, 8),
                "feat_tiles": (1, 2, 4, 8)}
SPMM_FIXED = {"rows_per_block": ("auto", 1, 2, 4), "vec": (4, 2, 1), "slots_per_block": (64, 128),
              "interleave": (1, 0), "feat_tiles": (1, 2, 4, 8)}
SPMM_DYNAMIC_SMALL = {"rows_per_block": ("auto", 1, 2, 4, 8), "vec": (4,), "unroll": (1, 2, 4)}
SPMM_FIXED_SMALL = {"rows_per_block": ("auto", 1), "vec": (4,), "slots_per_block": (64, 512), "interleave": (1, 0)}
# SDDMM template (schedules.cuda_sddmm.lane_groups); 0 = the template's automatic choice
SDDMM_DEFAULTS = {"lanes": 0, "vec": 0, "groups": 0, "rows_per_block": 4}
SDDMM_KNOBS = {"lanes": (0, 4, 8, 16, 32), "vec": (0, 4), "groups": (0, 1, 2, 4), "rows_per_block": (4, 1, 2, 8)}
SDDMM_KNOBS_SMALL = {"lanes": (0, 8, 32), "vec": (0,), "groups": (0, 1, 4), "rows_per_block": (4, 1, 8)}

MAX_THREADS = 1024  # as in schedules.cuda


def feature_slices(feat: int) -> List[int]:
    """The ``feat_tiles`` values worth building at width ``feat``: dividing it, and leaving
    at least :data:`MIN_TILE_FEATURES` features a slice."""
    return [t for t in SPMM_FIXED["feat_tiles"] if feat % t == 0 and (t == 1 or feat // t >= MIN_TILE_FEATURES)]


def _resolved(rows_per_block, feat: int, vec: int, feat_tiles: int):
    """(rows a block takes, threads a row), as ``features_over_threads`` resolves its knobs."""
    r = resolve_spmm(feat, {"rows_per_block": rows_per_block, "vec": vec, "feat_tiles": feat_tiles})
    return r["rows_per_block"], r["threads_per_row"]


def candidate(op: str, fmt: str, feat: int, dtype: str = "float32", format_knobs=None, schedule_knobs=None) -> dict:
    return {"op": op, "format": fmt, "format_knobs": dict(format_knobs or {}),
            "schedule_knobs": dict(schedule_knobs or {}), "feat": int(feat), "dtype": dtype}


def candidate_id(c: dict) -> str:
    """A stable text key of a candidate (what identifies it in logs and tables)."""
    return json.dumps([c["op"], c["format"], c["format_knobs"], c["schedule_knobs"], c["feat"], c["dtype"]],
                      sort_keys=True)


def describe(c: dict) -> str:
    """Short human-readable form, e.g. ``hyb P=2 W=32: rpb=4 vec=4 slots=256 il=1``."""
    fk = c["format_knobs"]
    if c["format"] == "hyb":
        w = str(fk.get("buckets", "?")).split("/")[-1]
        head = f"hyb P={fk.get('col_parts', '?')} W={w}"
    else:
        head = c["format"]
    short = {"rows_per_block": "rpb", "slots_per_block": "slots", "interleave": "il", "unroll": "unroll",
             "vec": "vec", "lanes": "lanes", "groups": "groups", "feat_tiles": "tiles"}
    knobs = " ".join(f"{short.get(k, k)}={v}" for k, v in sorted(c["schedule_knobs"].items()))
    return f"{head}: {knobs}"


class Space:
    """Every unpruned candidate for one (op, matrix, feature width, dtype)."""

    def __init__(self, op: str, matrix, feat: int, dtype: str = "float32",
                 families: Optional[Sequence[str]] = None, size: str = "full", stats: Optional[dict] = None):
        if op not in ("spmm", "sddmm"):
            raise ValueError(f"the tuner handles spmm and sddmm, got {op!r}")
        if isinstance(feat, bool) or not isinstance(feat, (int, np.integer)) or feat < 1:
            raise ValueError(f"feat should be a positive int, got {feat!r}")
        if size not in SIZES:
            raise ValueError(f"size should be one of {SIZES}, got {size!r}")
        families = tuple(families) if families else ("csr", "hyb", "ell", "bsr")
        unknown = [f for f in families if f not in FAMILIES]
        if unknown:
            raise ValueError(f"unknown format famil{'ies' if len(unknown) > 1 else 'y'} {unknown}; "
                             f"the tuner searches {list(FAMILIES)}")
        self.op, self.feat, self.dtype, self.size = op, int(feat), dtype, size
        self.matrix = as_csr(matrix)
        self.stats = stats or matrix_stats(self.matrix)
        self.families = families
        self._longest: Dict[int, int] = {}
        self.pruned: Dict[str, int] = {}
        self.candidates = self._enumerate()
        self.default = self._default()
        if candidate_id(self.default) not in {candidate_id(c) for c in self.candidates}:
            self.candidates.insert(0, self.default)

    def __len__(self):
        return len(self.candidates)

    # ---- the default: what sparsec does untuned ----------------------------------------------
    def _default(self) -> dict:
        fam = default_format(self.op, self.stats, self.feat)
        fk = self.hyb_knobs(*hyb_format.choose_params(self.matrix)) if fam == "hyb" else {}
        return candidate(self.op, fam, self.feat, self.dtype, fk, self._fill_defaults({}, fam))

    def _fill_defaults(self, knobs: dict, fam: str) -> dict:
        if self.op == "sddmm":
            return {**SDDMM_DEFAULTS, **knobs}
        k = {**SPMM_DEFAULTS, **knobs}
        tiles = k.pop("feat_tiles", 1)
        if tiles != 1:
            k["feat_tiles"] = tiles
        width = self.feat // tiles
        vec = k["vec"] if width % k["vec"] == 0 else 1
        k["vec"] = vec
        k["rows_per_block"], _ = _resolved(k["rows_per_block"], self.feat, vec, tiles)
        if fam == "csr":  # dynamic rows: slots and interleave do not apply
            k.pop("slots_per_block"), k.pop("interleave")
        else:  # fixed-width rows are unrolled fully: unroll does not apply
            k.pop("unroll")
        return k

    # ---- enumeration ------------------------------------------------------------------------
    def _enumerate(self) -> List[dict]:
        out: List[dict] = []
        seen = set()
        for fam, fk in self._formats():
            for sk in self._schedules(fam):
                c = candidate(self.op, fam, self.feat, self.dtype, fk, sk)
                key = candidate_id(c)
                if key not in seen:
                    seen.add(key)
                    out.append(c)
        return out

    def _prune(self, why: str):
        self.pruned[why] = self.pruned.get(why, 0) + 1

    def _formats(self) -> Iterable[tuple]:
        st = self.stats
        if "csr" in self.families:
            yield "csr", {}
        if "hyb" in self.families and st["nnz"]:
            yield from self._hyb_formats()
        if "ell" in self.families and st["nnz"]:
            padding = st["rows"] * st["row_len_max"] / st["nnz"]
            if padding <= MAX_ELL_PADDING:
                yield "ell", {}
            else:
                self._prune(f"ell: padding {padding:.1f} > {MAX_ELL_PADDING:g}")
        if "bsr" in self.families and st["nnz"]:
            for b in BSR_BLOCKS:
                fill = self._block_fill(b)
                if fill >= MIN_BSR_FILL:
                    yield f"bsr:{b}x{b}", {}
                else:
                    self._prune(f"bsr: block fill below {MIN_BSR_FILL:g}")

    def hyb_knobs(self, col_parts: int, buckets) -> dict:
        return {"col_parts": int(col_parts), "buckets": "/".join(str(int(b)) for b in buckets)}

    def _hyb_formats(self):
        cols = self.stats["cols"]
        auto_p, auto_b = hyb_format.choose_params(self.matrix)
        parts = sorted({p for p in HYB_COL_PARTS if p == 1 or cols / p >= MIN_RANGE_COLS} | {auto_p})
        for p in HYB_COL_PARTS:
            if p not in parts:
                self._prune(f"hyb: fewer than {MIN_RANGE_COLS} columns a range")
        if self.size == "small":  # the automatic choice and its neighbours
            i = parts.index(auto_p)
            parts = parts[max(0, i - 1):i + 2]
        for p in parts:
            cap = hyb_format._pow2_ceil(self._longest_group(p))
            widths = sorted({min(w, max(cap, 1)) for w in HYB_MAX_BUCKETS} | ({auto_b[-1]} if p == auto_p else set()))
            if self.size == "small":
                mid = auto_b[-1] if p == auto_p else hyb_format.choose_params_for(self.matrix, p)[1][-1]
                widths = [w for w in widths if mid // 2 <= w <= mid * 2]
            for w in widths:
                yield "hyb", self.hyb_knobs(p, [1 << i for i in range(int(w).bit_length())])

    def _longest_group(self, p: int) -> int:
        if p not in self._longest:
            m = self.matrix
            lengths = hyb_format._groups(m.indptr, m.indices, int(m.shape[1]), p)[3]
            self._longest[p] = int(lengths.max()) if lengths.size else 1
        return self._longest[p]

    def _block_fill(self, b: int) -> float:
        key = f"block_fill_{b}"
        if key in self.stats:
            return float(self.stats[key])
        m = self.matrix
        if not m.nnz:
            return 0.0
        rows = np.repeat(np.arange(m.shape[0]) // b, np.diff(m.indptr))
        keys = np.unique(rows.astype(np.int64) * (m.shape[1] // b + 1) + m.indices // b)
        return m.nnz / (keys.size * b * b)

    def _schedules(self, fam: str) -> Iterable[dict]:
        if self.op == "sddmm":
            grid = SDDMM_KNOBS_SMALL if self.size == "small" else SDDMM_KNOBS
            for k in _product(grid):
                yield {**SDDMM_DEFAULTS, **k}
            return
        dynamic = fam == "csr"
        if dynamic:
            grid = SPMM_DYNAMIC_SMALL if self.size == "small" else SPMM_DYNAMIC
        else:
            grid = SPMM_FIXED_SMALL if self.size == "small" else SPMM_FIXED
        for k in _product(grid):
            vec, tiles = k["vec"], k.get("feat_tiles", 1)
            if tiles not in feature_slices(self.feat):
                self._prune(f"feat_tiles not cutting F into slices of at least {MIN_TILE_FEATURES}")
                continue
            width = self.feat // tiles
            if width % vec:
                self._prune("vec does not divide the feature width")
                continue
            if vec < 4 and width % (vec * 2) == 0 and width // (vec * 2) >= 32:
                self._prune("narrower vec past a warp of threads a row")
                continue
            _, tx = _resolved(k["rows_per_block"], self.feat, vec, tiles)
            if k["rows_per_block"] != "auto" and int(k["rows_per_block"]) * tx > MAX_THREADS:
                self._prune("more than 1024 threads a block")
                continue
            k = self._fill_defaults(k, fam)
            if not dynamic and k["interleave"] == 0 and k["slots_per_block"] <= k["rows_per_block"]:
                self._prune("interleave without coarsening")
                continue
            yield k


def _product(grid: Dict[str, Sequence[Any]]) -> Iterable[dict]:
    names = list(grid)
    for values in np.ndindex(*[len(grid[n]) for n in names]):
        yield {n: grid[n][i] for n, i in zip(names, values)}
