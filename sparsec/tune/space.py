"""The search space: format knobs x the schedule knobs of the templates that apply, pruned before building.

A candidate is the runner's dict (``sparsec.tune.runner``), always with every knob written
out: hyb's ``col_parts`` and ``buckets`` resolved, and the schedule knobs that take effect
with their defaults filled in and resolved the way the template resolves them
(``rows_per_block="auto"`` becomes the number of rows it means, an SDDMM ``lanes=0`` the
lanes it chooses). So two spellings of one kernel are one candidate, and a record says
exactly what ran.

The schedule knobs are not declared here. For each format family the program is lowered
for the target and ``sparsec.schedules.templates`` names the transformations the default
schedule applies to it (CPU templates for ``llvm``; on CUDA the SpMM, SDDMM or Tensor Core
template) with the shapes of the nests they run on; each knob that takes effect there
contributes the values its declaration (``sparsec.schedules.knobs.Knob``) lists for the
search size, and the template's own ``prune`` drops combinations that are no distinct valid
kernel (a vector not dividing the row, a block past 1024 threads, interleave without
coarsening, Tensor Core warp tiles that do not fit). Adding a knob to a template is an edit
of that template only.

Search strategy, decided here (each rule names why when it prunes):

* a narrower ``vec`` is kept only while a row's threads still fit in one warp (beyond that
  it only adds threads doing the same loads);
* ``feat_tiles`` (feature slices on blockIdx.y) only while a slice keeps at least
  :data:`MIN_TILE_FEATURES` features;
* hyb ``col_parts`` keeps at least :data:`MIN_RANGE_COLS` columns a range (narrower ranges
  only add launches), and its widest bucket is capped at the longest (row, range) group:
  wider buckets would be empty, the same instance as the cap;
* ELL only when its padding (rows x longest row / nnz) is at most :data:`MAX_ELL_PADDING`;
  BSR only when blocks are at least :data:`MIN_BSR_FILL` full.
"""
from __future__ import annotations

import inspect
import json
from functools import lru_cache
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from .. import ops
from ..formats import hyb as hyb_format
from ..formats import make_format
from ..formats.choose import default_format
from ..formats.convert import canonical_csr
from ..formats.stats import block_counts
from ..lower import lower_flat
from ..schedules import features_over_threads, templates
from ..targets import parse_target
from .signature import matrix_stats

MIN_RANGE_COLS = 1024
MAX_ELL_PADDING = 3.0
MIN_BSR_FILL = 0.5
MIN_TILE_FEATURES = 64
BSR_BLOCKS = (2, 4, 8, 16, 32)
HYB_COL_PARTS = (1, 2, 4, 8, 16)
HYB_MAX_BUCKETS = (4, 8, 16, 32, 64, 128)
FAMILIES = ("csr", "hyb", "ell", "bsr", "mma_sp", "nm_tc", "srbcrs", "tiled")
# the Tensor Core formats, searched for the precision whose operand they pack; the matrix is
# pruned (mma_sp, nm_tc) or quantized (srbcrs) to them by ``workload.convert``; tiled keeps
# every value (bitmap tiles, expanded on the GPU; 16-row tiles are what the streaming kernel
# of few columns was measured on)
TC_FORMATS = {"mma_sp": ("float16", ("mma_sp",)), "nm_tc": ("float16", ("nm_tc:1:8:v128",)),
              "srbcrs": ("int8", tuple(f"srbcrs:v{v},int8" for v in (2, 4, 8))),
              "tiled": ("float16", ("tiled", "tiled:16x64", "tiled:32x128"))}
# families whose untuned kernel is in the space whatever the grid: their templates pick
# tiles per block size and width (``resolve``), which the grid's values need not include
BASELINE_FAMILIES = ("bsr", *TC_FORMATS)
SIZES = ("full", "small")
# hyb's parts have rows of a fixed width whatever its parameters: its schedule knobs are
# read from this small instance of it
HYB_SHAPE_SPEC = "hyb:1:1/2"


def feature_slices(feat: int) -> List[int]:
    """The ``feat_tiles`` values worth building at width ``feat``: dividing it, and leaving
    at least :data:`MIN_TILE_FEATURES` features a slice."""
    return [t for t in features_over_threads.knobs["feat_tiles"].choices
            if feat % t == 0 and (t == 1 or feat // t >= MIN_TILE_FEATURES)]


@lru_cache(maxsize=256)
def schedule_uses(op: str, spec: str, feat: int, dtype: str, target_kind: str, shape=None, density=None,
                  clusters: bool = True, rows=None):
    """The transformations (``schedules.plan.Use``) that schedule ``op`` over the format
    ``spec`` at width ``feat`` on ``target_kind``, read off the lowered program; ``shape``
    and ``density``: of the matrix, where the template depends on it (BSR float16);
    ``clusters``: the CUDA arch has thread-block clusters (sm_90 on); ``rows``: (the longest
    row's stored entries, the mean), where the template depends on them (CSR float32)."""
    program = lower_flat(ops.get(op), make_format(spec), {"feat": feat}, dtype, atomics=target_kind == "cuda")
    return tuple(templates(program, target_kind, shape=shape, density=density, clusters=clusters, rows=rows))


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
    """Every unpruned candidate for one (op, matrix, feature width, dtype) on ``target``
    (``llvm`` or a cuda target: the templates, hence the schedule knobs, differ)."""

    def __init__(self, op: str, matrix, feat: int, dtype: str = "float32",
                 families: Optional[Sequence[str]] = None, size: str = "full", stats: Optional[dict] = None,
                 target: str = "cuda", only: Optional[Iterable[str]] = None):
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
        self.target = target
        self.target_kind = parse_target(target).kind
        self.clusters = parse_target(target).has_clusters
        # validated once: the hyb rules below take the Canonical as it is (a MatrixContext's,
        # passed by tuned_config, is not validated again either)
        self._canon = canonical_csr(matrix)
        self.matrix = self._canon.scipy()
        self.stats = stats or matrix_stats(self.matrix)
        self.families = families
        wrong = [f for f in families if f in TC_FORMATS and TC_FORMATS[f][0] != dtype]
        if wrong and len(wrong) == len(families):
            raise ValueError(f"dtype {dtype}: " + "; ".join(f"{f} packs {TC_FORMATS[f][0]} values" for f in wrong)
                             + f" (tune {'them' if len(wrong) > 1 else 'it'} with that dtype, e.g. "
                             f"--dtype {TC_FORMATS[wrong[0]][0]})")
        self._group_lengths: Dict[int, np.ndarray] = {}  # hyb's (row, range) groups per col_parts
        self._blocks: Dict[int, int] = {}  # stored b x b blocks, by b (_block_fill)
        self._outcomes: Dict[str, List[tuple]] = {}  # _schedules, by format spec
        # ``only``: ``transfer.config_key``s -- the schedules of just these configurations (and
        # the default), unpruned ones as the full space has them: a zero-shot pick ranks no
        # other, and skips the enumeration of every knob product (most of a pick's time)
        self._only, self._only_parts = (None, None) if only is None else _listed(only)
        self.pruned: Dict[str, int] = {}
        self.candidates = self._enumerate()
        self.default = self._default()
        if candidate_id(self.default) not in {candidate_id(c) for c in self.candidates}:
            self.candidates.insert(0, self.default)

    def __len__(self):
        return len(self.candidates)

    # ---- the default: what sparsec does untuned ----------------------------------------------
    def _default(self) -> dict:
        """sparsec's untuned choice among the families searched. When only packed Tensor
        Core families are searched, the first one's untuned kernel: they compute a pruned or
        quantized matrix, so the untuned kernel of the full matrix is no baseline for them.
        When only block families are (BSR, with or without packed ones), the untuned kernel
        of the largest block the matrix fills: what ``sparsec.compile`` builds for it (on
        Tensor Cores from 16 x 16 in fp16), not a CSR kernel the search never looks at."""
        packed = [spec for fam, (dtype, specs) in TC_FORMATS.items()
                  if fam in self.families and self.dtype == dtype for spec in specs]
        blocks = [c["format"] for c in self.candidates if c["format"].startswith("bsr:")]
        if blocks and all(f in BASELINE_FAMILIES for f in self.families):
            return self.format_default(max(blocks, key=lambda spec: int(spec.split(":")[1].split("x")[0])))
        if packed and all(f in TC_FORMATS for f in self.families):
            return self.format_default(packed[0])
        fam, _, arg = default_format(self.op, self.stats, self.feat).partition(":")
        fk = {}
        if fam == "hyb":  # the rule's buckets where it gives them (SDDMM), else hyb's own
            given = hyb_format.parse_spec(arg or None)
            auto_p, auto_b = self._auto_hyb()
            fk = self.hyb_knobs(auto_p, given["buckets"] or auto_b)
        return candidate(self.op, fam, self.feat, self.dtype, fk, self._written({}, self._uses(fam), resolve_all=True))

    def format_default(self, spec: str, format_knobs: Optional[dict] = None) -> dict:
        """The untuned kernel of format ``spec``: its templates' defaults, resolved as they
        resolve them (a Tensor Core template picks its tiles by block size and width)."""
        return candidate(self.op, spec, self.feat, self.dtype, format_knobs,
                         self._written({}, self._uses(spec), resolve_all=True))

    def format_candidates(self, spec: str, format_knobs: Optional[dict] = None) -> List[dict]:
        """The schedules this space searches for format ``spec`` (any spec of its families,
        e.g. ``nm_tc:2:8:v64``; or a family with its ``format_knobs``, e.g. "hyb" and
        {"col_parts": 1, "buckets": "1/2/4"}), pruned, with the format's untuned kernel first."""
        out = [self.format_default(spec, format_knobs)]
        seen = {candidate_id(out[0])}
        for sk in self._schedules(spec):
            c = candidate(self.op, spec, self.feat, self.dtype, format_knobs or {}, sk)
            if candidate_id(c) not in seen:
                seen.add(candidate_id(c))
                out.append(c)
        return out

    def _density(self) -> float:
        """Stored entries per element of the matrix (the tiled kernel sizes its slots by it)."""
        rows, cols = (int(d) for d in self.matrix.shape)
        return self.matrix.nnz / (rows * cols) if rows * cols else 0.0

    def _uses(self, fam: str):
        """The templates that schedule format ``fam`` (a spec such as ``bsr:4x4``) here."""
        family = fam.split(":")[0]
        spec = {"hyb": HYB_SHAPE_SPEC, "ell": f"ell:{max(int(self.stats['row_len_max']), 1)}"}.get(family, fam)
        if family == "bsr" and self.dtype == "float16":  # which BSR kernel runs depends on the matrix
            shape = tuple(int(d) for d in self.matrix.shape)
            return schedule_uses(self.op, spec, self.feat, self.dtype, self.target_kind, shape, self._density(),
                                 self.clusters)
        # the matrix's row lengths, as sparsec.compile reads them: a template that applies by them
        # (csr_split on skewed CSR-like rows) is the one searched
        rows = (int(self.stats["row_len_max"]), float(self.stats["row_len_mean"]))
        return schedule_uses(self.op, spec, self.feat, self.dtype, self.target_kind, clusters=self.clusters,
                             rows=rows)

    def _written(self, knobs: dict, uses, resolve_all: bool = False) -> dict:
        """``knobs`` with the defaults of every knob that takes effect filled in, resolved as
        the template resolves them (where that names one of the knob's choices), and knobs
        declared ``omit_default`` left out at their default. ``resolve_all``: resolve from
        the template's own defaults (the untuned kernel), not from the filled-in values."""
        out = {}
        for u in uses:
            t = u.transformation
            mine = {k: knobs.get(k, t.knobs[k].default) for k in u.knobs}
            resolved = (_resolved(t, u.subjects[0], {} if resolve_all else mine, self.matrix.shape, self._density())
                        if t.resolve else {})
            for k in u.knobs:
                v = resolved.get(k, mine[k])
                out[k] = v if v in t.knobs[k].choices else mine[k]
                if t.knobs[k].omit_default and out[k] == t.knobs[k].default:
                    del out[k]
        return out

    # ---- enumeration ------------------------------------------------------------------------
    def _enumerate(self) -> List[dict]:
        out: List[dict] = []
        seen = set()
        for fam, fk in self._formats():
            schedules = self._schedules(fam)
            if fam.split(":")[0] in BASELINE_FAMILIES:  # the format's untuned kernel, a baseline
                schedules = [self.format_default(fam)["schedule_knobs"], *schedules]
            for sk in schedules:
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
        for fam, (dtype, specs) in TC_FORMATS.items():
            if fam in self.families and st["nnz"]:
                if self.dtype == dtype:
                    yield from ((spec, {}) for spec in specs)
                else:
                    self._prune(f"{fam}: packs {dtype} values, not {self.dtype}")
        if "bsr" in self.families and st["nnz"]:
            for b in BSR_BLOCKS:
                if self._fill_bound(b) >= MIN_BSR_FILL and self._block_fill(b) >= MIN_BSR_FILL:
                    yield f"bsr:{b}x{b}", {}
                else:
                    self._prune(f"bsr: block fill below {MIN_BSR_FILL:g}")

    def hyb_knobs(self, col_parts: int, buckets) -> dict:
        return {"col_parts": int(col_parts), "buckets": "/".join(str(int(b)) for b in buckets)}

    def _hyb_formats(self):
        cols = self.stats["cols"]
        auto_p, auto_b = self._auto_hyb()
        parts = sorted({p for p in HYB_COL_PARTS if p == 1 or cols / p >= MIN_RANGE_COLS} | {auto_p})
        for p in HYB_COL_PARTS:
            if p not in parts:
                self._prune(f"hyb: fewer than {MIN_RANGE_COLS} columns a range")
        if self.size == "small":  # the automatic choice and its neighbours
            i = parts.index(auto_p)
            parts = parts[max(0, i - 1):i + 2]
        if self._only_parts is not None:  # column ranges no listed configuration names write none of them
            parts = [p for p in parts if p == auto_p or p in self._only_parts]
        for p in parts:
            cap = hyb_format._pow2_ceil(self._longest_group(p))
            widths = sorted({min(w, max(cap, 1)) for w in HYB_MAX_BUCKETS} | ({auto_b[-1]} if p == auto_p else set()))
            if self.size == "small":
                mid = auto_b[-1] if p == auto_p else hyb_format.buckets_for(self._lengths(p))[-1]
                widths = [w for w in widths if mid // 2 <= w <= mid * 2]
            for w in widths:
                yield "hyb", self.hyb_knobs(p, [1 << i for i in range(int(w).bit_length())])

    def _lengths(self, p: int) -> np.ndarray:
        """hyb's group lengths at ``p`` column ranges, worked out once per Space (the
        automatic buckets, the longest group and the small space's widths all read them)."""
        if p not in self._group_lengths:
            self._group_lengths[p] = hyb_format.group_lengths(self._canon, p)
        return self._group_lengths[p]

    def _auto_hyb(self):
        """hyb's automatic (col_parts, buckets), as ``hyb_format.choose_params`` gives them."""
        p = hyb_format.auto_col_parts(self._canon)
        return p, hyb_format.buckets_for(self._lengths(p))

    def _longest_group(self, p: int) -> int:
        if p == 1:  # one column range: the groups are the rows
            return max(int(self.stats["row_len_max"]), 1)
        lengths = self._lengths(p)
        return int(lengths.max()) if lengths.size else 1

    def _fill_bound(self, b: int) -> float:
        """An upper bound of ``_block_fill(b)`` from the statistics, without counting: a 2b
        block holds at most four b blocks and at least one, so fill_b <= 4 fill_2b."""
        known = self.stats.get(f"block_fill_{2 * b}")
        return 1.0 if known is None else 4 * float(known)

    def _block_fill(self, b: int) -> float:
        key = f"block_fill_{b}"
        if key in self.stats:
            return float(self.stats[key])
        m = self.matrix
        if not m.nnz:
            return 0.0
        if b not in self._blocks:  # every BSR size at once, each coarsening the last
            self._blocks.update(block_counts(m.indptr, m.indices, m.shape[1], sorted({*BSR_BLOCKS, b})))
        return m.nnz / (self._blocks[b] * b * b)

    def _schedules(self, fam: str) -> Iterable[dict]:
        """The written, unpruned schedules of format ``fam``, worked out once per spec (hyb's
        dozens of bucket and column-range variants share one): each use counts its prunes."""
        if fam not in self._outcomes:
            self._outcomes[fam] = list(self._schedule_outcomes(fam))
        for why, sk in self._outcomes[fam]:
            if why:
                self._prune(why)
            else:
                yield dict(sk)

    def _schedule_outcomes(self, fam: str) -> Iterable[tuple]:
        """(prune reason, None) or (None, written schedule) for each knob product of ``fam``."""
        uses = self._uses(fam)
        knobs, grid = {}, {}
        for u in uses:
            for k in u.knobs:
                knobs.setdefault(k, u.transformation.knobs[k])
                shapes = [s for v in uses if k in v.knobs for s in v.shapes]
                grid[k] = knobs[k].grid(self.size, shapes)
        combos = _product(grid) if self._only is None else self._listed(fam, knobs, grid)
        for combo in combos:
            why = self._strategy(combo, uses) or self._template_prune(combo, uses)
            yield (why, None) if why else (None, self._written(combo, uses))

    def _listed(self, fam: str, knobs: dict, grid: dict) -> Iterable[dict]:
        """The knob products that may write ``only``'s schedules for format ``fam``: a written
        schedule's values (its left-out knobs at their defaults), and for a value off this
        space's grid (one a grid value such as ``"auto"`` resolved to on the matrix it won
        on) every grid value of that knob; ``transfer_pool`` keeps what writes a listed key."""
        seen = set()
        for sk in self._only.get(fam, ()):
            if not set(sk) <= set(grid):
                continue
            options = {}
            for k in grid:  # every value from the grid: each combo is one the full space enumerates
                want = sk.get(k, knobs[k].default)
                options[k] = (want,) if want in grid[k] else grid[k]
            for combo in _product(options):
                key = json.dumps(combo, sort_keys=True, default=str)
                if key not in seen:
                    seen.add(key)
                    yield combo

    def _strategy(self, k: dict, uses) -> Optional[str]:
        """Search-strategy pruning of the SpMM template's knobs (the module docstring says why)."""
        if not any(u.transformation.name == features_over_threads.name for u in uses):
            return None
        tiles = k.get("feat_tiles", 1)
        if tiles not in feature_slices(self.feat):
            return f"feat_tiles not cutting F into slices of at least {MIN_TILE_FEATURES}"
        width, vec = self.feat // tiles, k.get("vec", 4)
        if width % vec == 0 and vec < 4 and width % (vec * 2) == 0 and width // (vec * 2) >= 32:
            return "narrower vec past a warp of threads a row"
        return None

    @staticmethod
    def _template_prune(k: dict, uses) -> Optional[str]:
        for u in uses:
            t = u.transformation
            if t.prune is None:
                continue
            mine = {n: k[n] for n in u.knobs}
            for subject in u.subjects:
                why = t.prune(subject, mine)
                if why:
                    return f"{t.name}: {why}"
        return None


def _listed(keys: Iterable[str]) -> Tuple[Dict[str, List[dict]], set]:
    """(format -> the schedule knobs, hyb's named ``col_parts``) of ``transfer.config_key``s
    (JSON [op, format, col_parts, schedule_knobs]), in the keys' sorted order: a set's order
    changes with each process's string hashing, and the candidates' order breaks the model's
    ties, so the pick would too."""
    schedules: Dict[str, List[dict]] = {}
    parts = set()
    for key in sorted(keys):
        _, fmt, col_parts, sk = json.loads(key)
        schedules.setdefault(fmt, []).append(sk)
        if fmt == "hyb" and col_parts is not None:
            parts.add(int(col_parts))
    return schedules, parts


def _product(grid: Dict[str, Sequence[Any]]) -> Iterable[dict]:
    names = list(grid)
    for values in np.ndindex(*[len(grid[n]) for n in names]):
        yield {n: grid[n][i] for n, i in zip(names, values)}


def _resolved(t, subject, knobs: dict, shape, density: Optional[float] = None) -> dict:
    """``t``'s resolve of ``knobs`` for ``subject``, given the matrix's ``shape`` where the
    template picks its defaults by it (the Tensor Core templates do, as ``sparsec.compile``
    does for a converted matrix): the space's untuned kernel is then the one compile builds."""
    params = inspect.signature(t.resolve).parameters
    extra = {"density": density} if "density" in params and density is not None else {}
    if "shape" in params:
        return t.resolve(subject, knobs, shape=tuple(int(d) for d in shape), **extra)
    return t.resolve(subject, knobs, **extra)
