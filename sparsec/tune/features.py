"""Candidate features for the cost model: what one (format, knobs) choice means on one matrix.

The model (``tune.model``) ranks candidates by predicted throughput. Raw knob values alone
do not transfer between matrices, so a candidate is described by the numbers that explain
its speed: the matrix's structure (``signature.matrix_stats``), what the format costs on this
matrix (padding, rows split into pieces, how many rows and parts the kernel loops over),
what the schedule launches (threads per row and per block, thread blocks) and the work.

A candidate is the autotuner's plain dict::

    {"op": "spmm" | "sddmm", "format": "hyb", "format_knobs": {"col_parts": 2, "buckets": "1/2/4/8"},
     "schedule_knobs": {"vec": 2}, "feat": 64, "dtype": "float32"}

The format-derived quantities need the matrix, so a ``MatrixContext`` computes them with
numpy once per distinct format parameters and caches them (hyb's per-(row, column range)
lengths once per ``col_parts``): scoring thousands of candidates on a matrix of millions of
entries costs a few passes over its entries, not one conversion per candidate.
"""
from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import scipy.sparse as sp

from sparsec.formats import bsr, ell, hyb, registry
from sparsec.formats.convert import Canonical, canonical_csr
from sparsec.schedules import features_over_threads, lane_groups, parallel_rows
from sparsec.schedules.csr_split import csr_split_spmm
from sparsec.schedules.cuda import resolve_rows
from sparsec.schedules.cuda_sddmm import resolve_lanes
from sparsec.schedules.tensorcore import bsr_tensorcore
from sparsec.schedules.tensorcore_packed import (bsr_gather_spmm, bsr_ring_spmm, bsr_stream_spmm,
                                                 srbcrs_int8_spmm, tc_pipeline_spmm, tiled_stream_spmm)
from sparsec.schedules.tensorcore_sddmm import bsr_tensorcore_sddmm

from .signature import matrix_signature, matrix_stats

OPS = ("spmm", "sddmm")
# each op's templates, the first the one whose defaults the schedule columns fill in; the
# Tensor Core templates added later come last, so the knob columns of older logs keep their order
TEMPLATES = {"spmm": (features_over_threads, bsr_tensorcore, parallel_rows, tc_pipeline_spmm, srbcrs_int8_spmm),
             "sddmm": (lane_groups, parallel_rows, bsr_tensorcore_sddmm)}
# templates the tuner builds whose own knobs have no columns yet (a column would change
# FEATURE_NAMES and retire the shipped model): their knobs are accepted, and those that share
# a name with a modelled knob (warps, stages) fill its column
UNMODELLED = {"spmm": (tiled_stream_spmm, bsr_stream_spmm, bsr_ring_spmm, bsr_gather_spmm, csr_split_spmm),
              "sddmm": ()}
FAMILIES = ("csr", "hyb", "ell", "bsr")  # formats with format-derived features; others: "other", NaN
# formats that store a Tensor Core operand packed: a column each (they share their kernels'
# knob names, so without it the model could not tell 2:4 from vector-wise N:M), the share of
# K a row keeps (N / M) and log2 of the row vector (NaN where they do not apply)
PACKED_FAMILIES = ("mma_sp", "nm_tc", "srbcrs")
PACKED_NAMES = (*(f"fmt_{f}" for f in PACKED_FAMILIES), "packed_kept", "log2_row_vec")
DTYPE_BYTES = {"float64": 8.0, "float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "int8": 1.0, "int4": 0.5}

_LOG_STATS = ("rows", "cols", "nnz", "row_len_mean", "row_len_p50", "row_len_p90", "row_len_p99", "row_len_max")
DERIVED_NAMES = ("log_serial_chain", "log_chain_over_mean", "log_chain_bound")
_PLAIN_STATS = ("density", "row_len_cv", "empty_row_frac", "col_span_mean",
                "block_fill_4", "block_fill_16", "block_fill_32")
# knobs with columns of their own among the schedule columns below (named before knobs were
# declared in one place); every other knob of the templates gets a ``knob_<name>`` column
_NAMED_KNOBS = ("rows_per_block", "vec", "slots_per_block", "unroll", "interleave", "feat_tiles", "lanes", "groups")


def _declared_knobs():
    """(name, Knob) of every knob of the tuned templates without a named column, in order."""
    out = {}
    for templates in TEMPLATES.values():
        for t in templates:
            for k, knob in t.knobs.items():
                if k not in _NAMED_KNOBS:
                    out.setdefault(k, knob)
    return tuple(out.items())


KNOB_COLUMNS = _declared_knobs()

FEATURE_NAMES: Tuple[str, ...] = (
    # the matrix (log1p of counts and lengths; fractions as they are)
    *(f"log_{k}" for k in _LOG_STATS), *_PLAIN_STATS,
    # the operator
    "is_sddmm", "log2_feat", "dtype_bytes",
    # the format family and its parameters (NaN where they do not apply)
    *(f"fmt_{f}" for f in FAMILIES), "fmt_other",
    "hyb_log2_col_parts", "hyb_log2_max_bucket", "hyb_n_buckets",
    "bsr_block_rows", "bsr_block_cols", "ell_log2_width",
    # the schedule, defaults filled in and resolved as the template resolves them
    "rows_per_block", "rows_per_block_auto", "vec", "log2_slots_per_block", "unroll", "interleave",
    "sddmm_lanes", "sddmm_groups", "threads_per_row", "threads_per_block",
    # the format on this matrix
    "padding_ratio", "split_frac", "log_ell_rows", "n_parts", "log_thread_blocks",
    # the work: entries x features, stored slots x features, rows x features (SpMM's output)
    "log_work_nnz", "log_work_stored", "log_work_rows",
    # knobs added after the first H200 logs: appended, so older rows extend with LEGACY_VALUES
    "log2_feat_tiles",
    # derived from the columns above (``derived_features``), so stored rows of any age get them
    *DERIVED_NAMES,
    # every other declared knob, as its value (NaN where the candidate's kernel does not take it)
    *(f"knob_{k}" for k, _ in KNOB_COLUMNS),
    # the packed Tensor Core formats (``format_features``), last: computed from a record's format
    *PACKED_NAMES,
)
LEGACY_VALUES = (0.0,)  # log2(feat_tiles = 1): rows logged before it ran untiled kernels
KNOBS_AT = len(FEATURE_NAMES) - len(KNOB_COLUMNS) - len(PACKED_NAMES)
PACKED_AT = len(FEATURE_NAMES) - len(PACKED_NAMES)
BASE_LENGTH = KNOBS_AT - len(DERIVED_NAMES)
LEGACY_LENGTH = BASE_LENGTH - len(LEGACY_VALUES)


def _knob_value(v) -> float:
    if isinstance(v, (bool, np.bool_)):
        return float(v)
    if isinstance(v, (int, float, np.integer, np.floating)):
        return float(v)
    return math.nan  # "auto" and other words


def knob_features(schedule_knobs: Optional[Mapping[str, Any]]) -> List[float]:
    """The ``knob_<name>`` columns of a candidate's written-out schedule knobs: a knob it
    names, its value; one it leaves out, the default when the knob is declared
    ``omit_default`` (written only when not at its default, so the kernel ran with it),
    else NaN (the candidate's template does not take it)."""
    knobs = schedule_knobs or {}
    return [_knob_value(knobs[k]) if k in knobs else (_knob_value(knob.default) if knob.omit_default else math.nan)
            for k, knob in KNOB_COLUMNS]


def derived_features(f: Mapping[str, float]) -> Dict[str, float]:
    """Costs a tree model cannot form from the raw columns (it splits on one column at a
    time, it does not multiply them), computed from those columns alone:

    * ``log_serial_chain``: the longest serial chain of one thread, log(longest stored row
      piece x feature steps a thread takes): CSR's longest row, hyb's widest bucket, ELL's
      width. One row of 2,390 entries on a CSR kernel (as-22july06) bounds the whole
      launch however fast the rest is; hyb cuts it at the bucket width.
    * ``log_chain_over_mean``: that longest piece over the mean row: how unequal the
      threads' work is.
    * ``log_chain_bound``: log(2 x nnz x feat / serial chain), the throughput the chain
      alone allows (per unit of step latency), on the scale of the model's target: a kernel
      is never faster than its longest thread, on any matrix.
    """
    out = dict.fromkeys(DERIVED_NAMES, math.nan)
    longest = math.expm1(f["log_row_len_max"])
    if f["fmt_hyb"] == 1.0 and math.isfinite(f["hyb_log2_max_bucket"]):
        longest = min(longest, 2.0 ** f["hyb_log2_max_bucket"])
    elif f["fmt_ell"] == 1.0 and math.isfinite(f["ell_log2_width"]):
        longest = 2.0 ** f["ell_log2_width"]
    tiles = 2.0 ** f["log2_feat_tiles"] if math.isfinite(f["log2_feat_tiles"]) else 1.0
    lanes = f["threads_per_row"] * f["vec"]
    if not (math.isfinite(longest) and math.isfinite(lanes) and lanes > 0):
        return out
    steps = max(1.0, 2.0 ** f["log2_feat"] / tiles / lanes)
    out["log_serial_chain"] = math.log1p(max(longest, 0.0) * steps)
    mean = math.expm1(f["log_row_len_mean"])
    out["log_chain_over_mean"] = math.log(max(longest, 1.0) / max(mean, 1e-9))
    nnz = math.expm1(f["log_nnz"])
    out["log_chain_bound"] = math.log(2.0 * max(nnz, 1.0) * 2.0 ** f["log2_feat"]) - out["log_serial_chain"]
    return out


def format_features(fmt: Optional[str], format_knobs: Optional[Mapping[str, Any]] = None) -> List[float]:
    """The ``PACKED_NAMES`` columns of a format spec (a family outside ``PACKED_FAMILIES``,
    or None: zeros and NaN): which packed family, the share of K a row keeps, log2 of its
    row vector (2:4 keeps half of K in rows of one)."""
    family, params = None, {}
    if fmt is not None:
        module, params = registry.parse_spec(fmt)
        family = module.NAME
        params = {**params, **{k: v for k, v in (format_knobs or {}).items() if v is not None}}
    flags = [float(family == f) for f in PACKED_FAMILIES]
    if family == "mma_sp":
        return flags + [0.5, 0.0]
    if family == "nm_tc":
        return flags + [params["n"] / params["m"], math.log2(params["vec"])]
    if family == "srbcrs":
        return flags + [math.nan, math.log2(params["vec"])]
    return flags + [math.nan, math.nan]


def stored_row(x, schedule_knobs: Optional[Mapping[str, Any]] = None, fmt: Optional[str] = None,
               format_knobs: Optional[Mapping[str, Any]] = None):
    """A feature row read back from a log or results file, with None for NaN, as a list in
    ``FEATURE_NAMES`` order: a row stored before the newest features were added is extended
    with the values its kernel ran with, and the derived columns are computed afresh. The
    ``knob_<name>`` columns are computed from the record's ``schedule_knobs`` when given
    (then their order in older rows does not matter), else read from the row where it has
    them and filled as :func:`knob_features` fills a knob left out; the packed-format
    columns from the record's ``fmt`` when given, else read from a row of today's length
    (an older row is of a format that was not packed: those were not tuned before the
    columns existed). None when the row is of no known length."""
    if not isinstance(x, list):
        return None
    if len(x) == LEGACY_LENGTH:
        x = x + list(LEGACY_VALUES)
    if len(x) != BASE_LENGTH and not KNOBS_AT <= len(x) <= len(FEATURE_NAMES):
        return None
    full = len(x) == len(FEATURE_NAMES)
    base = [math.nan if v is None else float(v) for v in x[:BASE_LENGTH]]
    extra = derived_features(dict(zip(FEATURE_NAMES, base)))
    knobs = knob_features(schedule_knobs)
    if schedule_knobs is None and len(x) > KNOBS_AT:
        stored = x[KNOBS_AT:PACKED_AT] if full else x[KNOBS_AT:KNOBS_AT + len(knobs)]
        knobs[:len(stored)] = [math.nan if v is None else float(v) for v in stored]
    if fmt is not None or not full:
        try:
            packed = format_features(fmt, format_knobs)
        except ValueError:
            return None  # a format this sparsec does not know
    else:
        packed = [math.nan if v is None else float(v) for v in x[PACKED_AT:]]
    return base + [extra[k] for k in DERIVED_NAMES] + knobs + packed


@dataclass(frozen=True)
class Layout:
    """How a format stores one matrix, as far as the kernel's cost goes: ``stored`` value
    slots (padding included), ``split_nnz`` entries in rows cut into pieces, and per part
    (hyb's non-empty (range, bucket) pairs; one for the other formats) the rows its root
    loop runs over and its fixed row width (0: data-dependent, as in CSR)."""

    stored: int
    split_nnz: int
    loop_rows: Tuple[int, ...]
    widths: Tuple[int, ...]


_SIGNATURE_POOL: Optional[Tuple[int, ThreadPoolExecutor]] = None  # (the process it serves, the pool)


def _signature_pool() -> ThreadPoolExecutor:
    """One worker thread for MatrixContext's signatures, started on first use in each
    process (a forked child, such as a tuner's build worker, inherits the pool but not its
    thread: it gets its own rather than wait on one that is not there)."""
    global _SIGNATURE_POOL
    if _SIGNATURE_POOL is None or _SIGNATURE_POOL[0] != os.getpid():
        _SIGNATURE_POOL = (os.getpid(), ThreadPoolExecutor(max_workers=1, thread_name_prefix="sparsec-signature"))
    return _SIGNATURE_POOL[1]


class MatrixContext:
    """One matrix, its statistics, and its format layouts computed on demand and cached."""

    def __init__(self, matrix):
        # validated once; the statistics, the signature and a Space read the Canonical as it is
        self.canonical: Canonical = canonical_csr(matrix)
        self.csr: sp.csr_matrix = self.canonical.scipy()
        # the signature hashes on a second core while the statistics sort block rows (blake2b
        # and scipy's sparsetools release the GIL): a pick reads both, a third of its time
        self._pending_signature = _signature_pool().submit(matrix_signature, self.canonical)
        self.stats: Dict[str, float] = matrix_stats(self.canonical)
        self._signature: Optional[str] = None
        self._group_cache: Dict[int, Tuple[np.ndarray, np.ndarray]] = {}
        self._auto_cache: Dict[Optional[int], Tuple[int, Tuple[int, ...]]] = {}
        self._layout_cache: Dict[tuple, Layout] = {}

    @property
    def signature(self) -> str:
        """``signature.matrix_signature`` of the matrix (computed once; tuning records name
        their matrix by it)."""
        if self._signature is None:
            self._signature = self._pending_signature.result()
        return self._signature

    @property
    def matrix(self) -> sp.csr_matrix:
        """The matrix in canonical CSR (what the runner converts and measures)."""
        return self.csr

    @property
    def rows(self) -> int:
        return int(self.csr.shape[0])

    @property
    def nnz(self) -> int:
        return int(self.csr.nnz)

    def _canonical(self) -> Canonical:
        c = self.csr
        return Canonical(c.indptr, c.indices, c.data, (int(c.shape[0]), int(c.shape[1])))

    def hyb_params(self, col_parts: Optional[int], buckets: Optional[Tuple[int, ...]]
                   ) -> Tuple[int, Tuple[int, ...]]:
        """(col_parts, buckets) with automatic ones (None) resolved as ``hyb.from_matrix``
        resolves them on this matrix."""
        if col_parts is not None and buckets is not None:
            return col_parts, buckets
        if col_parts not in self._auto_cache:
            c = self._canonical()
            self._auto_cache[col_parts] = (hyb.choose_params(c) if col_parts is None
                                           else hyb.choose_params_for(c, col_parts))
        auto_p, auto_b = self._auto_cache[col_parts]
        return (auto_p if col_parts is None else col_parts), (auto_b if buckets is None else buckets)

    def _groups(self, col_parts: int) -> Tuple[np.ndarray, np.ndarray]:
        """(column range, length) of every non-empty (row, range) group, by hyb's own grouping."""
        if col_parts not in self._group_cache:
            c = self.csr
            ranges, _, lengths = hyb.group_runs(c.indptr, c.indices, int(c.shape[1]), col_parts)
            self._group_cache[col_parts] = (ranges.astype(np.int64), lengths.astype(np.int64))
        return self._group_cache[col_parts]

    def layout(self, family: str, params: Mapping[str, Any]) -> Optional[Layout]:
        """The layout of ``family`` with resolved ``params`` (as ``format_params`` returns
        them); None for families without a layout model."""
        if family == "csr":
            return Layout(self.nnz, 0, (self.rows,), (0,))
        if family == "hyb":
            key = ("hyb", *self.hyb_params(params["col_parts"], params["buckets"]))
        elif family == "ell":
            key = ("ell", params["width"])
        elif family == "bsr":
            key = ("bsr", *params["block"])
        else:
            return None
        if key not in self._layout_cache:
            build = {"hyb": self._hyb_layout, "ell": self._ell_layout, "bsr": self._bsr_layout}[family]
            self._layout_cache[key] = build(*key[1:])
        return self._layout_cache[key]

    def _hyb_layout(self, col_parts: int, buckets: Tuple[int, ...]) -> Layout:
        """As ``hyb._split`` stores it: a group of k entries goes to the narrowest bucket
        w >= k; a longer one to ceil(k / w_max) ELL rows of the widest bucket."""
        ranges, lengths = self._groups(col_parts)
        widths = np.asarray(buckets, dtype=np.int64)
        n_b = widths.size
        bucket = np.minimum(np.searchsorted(widths, lengths, side="left"), n_b - 1)
        w = widths[bucket]
        pieces = -(-lengths // w)
        combo = ranges * n_b + bucket
        ell_rows = np.bincount(combo, weights=pieces, minlength=col_parts * n_b).astype(np.int64)
        used = np.flatnonzero(ell_rows)
        # hyb stores every (column range, bucket) part, empty ones as zero-length parts;
        # the layout counts the parts holding entries, the ones with loop work
        if not used.size:
            return Layout(0, 0, (0,), (int(widths[0]),))
        return Layout(stored=int(np.dot(pieces, w)), split_nnz=int(lengths[lengths > widths[-1]].sum()),
                      loop_rows=tuple(int(r) for r in ell_rows[used]),
                      widths=tuple(int(widths[c % n_b]) for c in used))

    def _ell_layout(self, width: Optional[int]) -> Layout:
        if width is None:
            width = max(int(self.stats["row_len_max"]), 1)
        return Layout(self.rows * width, 0, (self.rows,), (width,))

    def _bsr_layout(self, r: int, c: int) -> Layout:
        """Stored r x c blocks (those holding an entry; edge blocks count whole, as BSR
        stores them), counted by coarsening the pattern as ``signature`` counts square ones."""
        m = self.csr
        block_rows, block_cols = -(-m.shape[0] // r), -(-m.shape[1] // c)
        bptr = m.indptr[::r].copy()  # sum_duplicates below writes into it
        if bptr.size < block_rows + 1:
            bptr = np.append(bptr, m.indptr[-1])
        # int8 ones may wrap when summed; only the number of distinct blocks is used
        b = sp.csr_matrix((np.ones(m.nnz, np.int8), m.indices // c, bptr), shape=(block_rows, block_cols))
        b.sum_duplicates()
        return Layout(int(b.nnz) * r * c, 0, (block_rows,), (0,))


# ------------------------------------------------------------------ knobs


def format_params(fmt: str, knobs: Optional[Mapping[str, Any]]) -> Tuple[str, Dict[str, Any]]:
    """(family, parameters) of a format spec with ``knobs`` overriding the spec's
    parameters, as the runner passes them to ``formats.convert``; automatic ones stay None.
    A knob the family does not take is a ValueError naming it."""
    module, params = registry.parse_spec(fmt)
    knobs = dict(knobs or {})
    unknown = sorted(set(knobs) - set(params))
    if unknown:
        raise ValueError(f"format {fmt!r}: unknown format knob {unknown[0]!r}; "
                         f"known: {sorted(params) or 'none'}")
    params.update(knobs)
    family = module.NAME
    if family == "hyb":
        cp, bk = params["col_parts"], params["buckets"]
        params = {"col_parts": hyb._col_parts(cp), "buckets": hyb._buckets(bk)}
    elif family == "ell":
        params = {"width": ell._width(params["width"])}
    elif family == "bsr":
        if params["block"] is None:
            raise ValueError(f"format {fmt!r}: bsr needs a block shape, e.g. 'bsr:4x4'")
        params = {"block": bsr._block(params["block"])}
    return (family if family in FAMILIES else "other"), params


def schedule_knobs(op: str, knobs: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """``knobs`` with the defaults of the op's main template filled in (the schedule
    columns describe its kernel). A knob none of the op's templates declares is a
    ValueError naming it, and so is a value of the wrong kind; an integer outside the
    declared choices is featurized as it is (the build rejects it, and the tuner records
    that rather than stopping)."""
    if op not in TEMPLATES:
        raise ValueError(f"op should be one of {list(OPS)}, got {op!r}")
    templates = TEMPLATES[op]
    declared = {}
    for t in (*templates, *UNMODELLED[op]):
        for k, knob in t.knobs.items():
            declared.setdefault(k, knob)
    knobs = dict(knobs or {})
    for key, value in knobs.items():
        if key not in declared:
            raise ValueError(f"{op}: unknown schedule knob {key!r} for templates {[t.name for t in templates]}; "
                             f"known: {sorted(declared)}")
        choices = declared[key].choices
        if value in choices and type(value) is type(choices[choices.index(value)]):
            continue
        numbers = [c for c in choices if not isinstance(c, (str, bool))]
        if not numbers or isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < min(numbers):
            raise ValueError(f"{op}: schedule knob {key!r} should be one of {choices}"
                             f"{f' or an integer >= {min(numbers)}' if numbers else ''}, got {value!r}")
    return {**templates[0].defaults(), **{k: (int(v) if isinstance(v, np.integer) else v) for k, v in knobs.items()}}


# ------------------------------------------------------------------ features


def _thread_blocks(op: str, layout: Layout, knobs: Mapping[str, Any], feat: int, rows_per_block: int) -> int:
    """Thread blocks launched over all parts: SpMM groups a part's fixed-width rows into
    row groups a block (``resolve_rows``' coarsen)."""
    total = 0
    for rows, width in zip(layout.loop_rows, layout.widths):
        coarsen = resolve_rows(feat, knobs, width)["coarsen"] if op == "spmm" and width else 1
        total += -(-rows // (rows_per_block * coarsen))
    return total


def candidate_features(cand: Mapping[str, Any], ctx: MatrixContext) -> Dict[str, float]:
    """The features of one candidate on ``ctx``'s matrix, keyed by ``FEATURE_NAMES``."""
    if not isinstance(cand, Mapping):
        raise ValueError(f"a candidate should be a dict, got {type(cand).__name__}")
    op, feat, dtype = cand.get("op"), cand.get("feat"), cand.get("dtype") or "float32"
    if op not in OPS:
        raise ValueError(f"candidate op should be one of {list(OPS)}, got {op!r}")
    if isinstance(feat, bool) or not isinstance(feat, (int, np.integer)) or feat < 1:
        raise ValueError(f"candidate feat should be a positive int, got {feat!r}")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"candidate dtype should be one of {list(DTYPE_BYTES)}, got {dtype!r}")
    feat = int(feat)
    family, params = format_params(cand.get("format"), cand.get("format_knobs"))
    knobs = schedule_knobs(op, cand.get("schedule_knobs"))
    s = ctx.stats
    f: Dict[str, float] = dict.fromkeys(FEATURE_NAMES, math.nan)
    for k in _LOG_STATS:
        f[f"log_{k}"] = math.log1p(s[k])
    for k in _PLAIN_STATS:
        f[k] = float(s[k])
    f["is_sddmm"] = float(op == "sddmm")
    f["log2_feat"] = math.log2(feat)
    f["dtype_bytes"] = DTYPE_BYTES[dtype]
    for name in (*FAMILIES, "other"):
        f[f"fmt_{name}"] = float(family == name)

    if family == "hyb":
        col_parts, buckets = ctx.hyb_params(params["col_parts"], params["buckets"])
        params = {"col_parts": col_parts, "buckets": buckets}
        f["hyb_log2_col_parts"] = math.log2(col_parts)
        f["hyb_log2_max_bucket"] = math.log2(buckets[-1])
        f["hyb_n_buckets"] = float(len(buckets))
    elif family == "bsr":
        f["bsr_block_rows"], f["bsr_block_cols"] = (float(v) for v in params["block"])
    elif family == "ell":
        width = params["width"] if params["width"] is not None else max(int(s["row_len_max"]), 1)
        f["ell_log2_width"] = math.log2(width)

    if op == "spmm":
        r = resolve_rows(feat, knobs)
        f["rows_per_block_auto"] = float(knobs["rows_per_block"] == "auto")
        f["log2_slots_per_block"] = math.log2(knobs["slots_per_block"])
        f["unroll"] = float(knobs["unroll"])
        f["interleave"] = float(knobs["interleave"])
    else:
        r = {**resolve_lanes(feat, knobs), "feat_tiles": 1}
        f["rows_per_block_auto"] = 0.0
        f["sddmm_lanes"] = float(r["lanes"])
        f["sddmm_groups"] = float(r["groups"])
    f["rows_per_block"] = float(r["rows_per_block"])
    f["vec"] = float(r["vec"])
    f["threads_per_row"] = float(r["threads_per_row"])
    f["threads_per_block"] = float(r["threads_per_row"] * r["rows_per_block"])
    f["log2_feat_tiles"] = math.log2(r["feat_tiles"])

    nnz = ctx.nnz
    layout = ctx.layout(family, params)
    if layout is not None:
        f["padding_ratio"] = layout.stored / nnz if nnz else 1.0
        f["split_frac"] = layout.split_nnz / nnz if nnz else 0.0
        f["log_ell_rows"] = math.log1p(sum(layout.loop_rows))
        f["n_parts"] = float(len(layout.loop_rows))
        f["log_thread_blocks"] = math.log1p(r["feat_tiles"] * _thread_blocks(op, layout, knobs, feat,
                                                                              r["rows_per_block"]))
        f["log_work_stored"] = math.log1p(layout.stored * feat)
    f["log_work_nnz"] = math.log1p(nnz * feat)
    f["log_work_rows"] = math.log1p(ctx.rows * feat)
    f.update(derived_features(f))
    f.update(zip((f"knob_{k}" for k, _ in KNOB_COLUMNS), knob_features(cand.get("schedule_knobs"))))
    f.update(zip(PACKED_NAMES, format_features(cand.get("format"), cand.get("format_knobs"))))
    return f


def feature_matrix(cands: Sequence[Mapping[str, Any]], ctx: MatrixContext) -> np.ndarray:
    """float32 array of shape (len(cands), len(FEATURE_NAMES)), columns in that order."""
    out = np.empty((len(cands), len(FEATURE_NAMES)), dtype=np.float32)
    for i, cand in enumerate(cands):
        f = candidate_features(cand, ctx)
        out[i] = [f[name] for name in FEATURE_NAMES]
    return out
