"""hyb(col_parts, buckets): SparseTIR's hybrid format, a composite of row-list ELL buckets.

The columns are cut into ``col_parts`` equal ranges of ``ceil(cols / col_parts)`` columns.
Within a range, a row with ``k > 0`` entries goes to the smallest bucket width ``w >= k``
(``buckets`` are increasing powers of two, e.g. 1/2/4/8/16/32); a row longer than the
widest bucket ``w_max`` is split into ``ceil(k / w_max)`` ELL rows of that bucket, which
is then ``unique=False`` (its row id repeats, kernels add partial sums). Rows with no
entries in a range are in no bucket. Every (range, bucket) pair is one ``rell`` part
(``formats.rell``), an empty bucket a part with no ELL rows: the part list depends on
the parameters alone, range-major, bucket-minor (widths increasing), ``col_parts *
len(buckets)`` parts, so a kernel compiled for one matrix runs on any other converted
with the same parameters (each part's ELL-row count is a run-time extent; an empty part
runs one guarded, idle thread block).

Padding: a row of ``k <= w_max`` entries pads to the next power of two (< 2x), a split
row only in its last piece, so ``stored / nnz`` stays below 2 whatever the skew.

Specs::

    hyb                       automatic col_parts and buckets (``choose_params``)
    hyb:4                     4 column ranges, automatic buckets
    hyb:4:1/2/4/8/16/32       both given ("auto" for an automatic col_parts: hyb:auto:1/2/4)
    hyb:col_parts=4,buckets=1/2/4     the keyword form (what ``CompositeFormat.spec`` prints;
                              a trailing "[parts...]" is ignored: parts are recomputed)
    convert(m, "hyb", col_parts=4, buckets=(1, 2, 4, 8))

Resolved spec and reuse. ``inst.format.family_spec`` is the spec with the parameters
resolved (``hyb:col_parts=1,buckets=1/2/4/8`` for a matrix converted with plain ``hyb``,
whose automatic parameters depend on the matrix); ``inst.format.spec`` appends the part
list (``[rell:1+rell:2+rell:4+rell:8,dup]``), which is what a kernel compiled for the
instance records. Convert further matrices with ``family_spec`` to run that kernel on them;
plain ``hyb`` may resolve differently for another matrix, and the kernel then refuses it
naming both specs. Whether a widest bucket splits rows (``rell:W,dup``) depends on the
matrix: a kernel compiled for a matrix without split rows stores each row's result (no
atomics) and refuses a matrix with split rows, naming the part; a kernel compiled for the
spec (``sparsec.compile(op, inst.format.family_spec)``, or for a matrix with split rows)
adds the widest buckets' rows up and takes any matrix converted with the spec. Compiling
for the matrix keeps its kernel exactly as fast as before; the metadata of an exported
module lists the requirement (``matrix_requirements``).
"""
from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Tuple

import numpy as np

from . import rell
from . import validate as V
from .base import FormatInstance
from .composite import CompositeFormat, CompositeInstance
from .convert import Canonical, canonical_csr
from .stats import summarize

NAME = "hyb"
DESCRIPTION = "hybrid (SparseTIR): column ranges x power-of-two ELL buckets of rows (rell parts); hyb:P:1/2/4/..."

MAX_COL_PARTS = 16      # the heuristic's ceiling (SparseTIR's configs used 1..16)
MAX_BUCKET = 64         # the heuristic's widest bucket
MIN_BUCKET = 4          # the heuristic's buckets always include 1/2/4
ROW_LEN_PER_PART = 32   # the heuristic adds column ranges only while rows keep ~32 entries per range
B_SLICE_BYTES = 4 << 20  # ... and only while a range's slice of B (128 float32 features) exceeds 4 MiB
B_ROW_BYTES = 128 * 4


# ------------------------------------------------------------------ parameters


def _col_parts(p):
    if p is None:
        return None
    if isinstance(p, (bool, np.bool_)) or not isinstance(p, (int, np.integer)):
        raise ValueError(f"hyb col_parts should be a positive integer, got {p!r}")
    if p < 1:
        raise ValueError(f"hyb col_parts should be >= 1, got {p}")
    return int(p)


def _buckets(b):
    if b is None:
        return None
    if isinstance(b, str):
        b = _parse_buckets(b)
    try:
        vals = list(b)
    except TypeError:
        raise ValueError(f"hyb buckets should be a list of powers of two like (1, 2, 4, 8), got {b!r}") from None
    if not vals:
        raise ValueError("hyb buckets should hold at least one width, got an empty list")
    for v in vals:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < 1 or (v & (v - 1)):
            raise ValueError(f"hyb buckets should be powers of two (1, 2, 4, 8, ...), got {v!r} in {tuple(vals)!r}")
    out = tuple(sorted(int(v) for v in vals))
    if len(set(out)) != len(out):
        raise ValueError(f"hyb buckets should be distinct widths, got {tuple(vals)!r}")
    return out


def _parse_buckets(text: str):
    try:
        return tuple(int(t) for t in text.replace(",", "/").split("/") if t.strip())
    except ValueError:
        raise ValueError(f"hyb buckets should be widths separated by '/', like 1/2/4/8, got {text!r}") from None


def parse_spec(arg: str | None) -> dict:
    """``None`` -> automatic; ``"4"``; ``"4:1/2/4/8"``; ``"auto:1/2/4"``;
    ``"col_parts=4,buckets=1/2/4"`` (optionally followed by ``[parts]``, ignored)."""
    if not arg:
        return {"col_parts": None, "buckets": None}
    arg = arg.split("[", 1)[0].strip()
    if "=" in arg:
        out = {"col_parts": None, "buckets": None}
        for item in arg.split(","):
            key, eq, val = item.partition("=")
            key = key.strip()
            if not eq or key not in out:
                raise ValueError(f"hyb spec keywords should be col_parts= and buckets=, got {item.strip()!r}")
            out[key] = val.strip()
        cp = out["col_parts"]
        return {"col_parts": None if cp in (None, "", "auto") else _col_parts(_int(cp)),
                "buckets": None if out["buckets"] in (None, "", "auto") else _buckets(out["buckets"])}
    head, sep, tail = arg.partition(":")
    head = head.strip()
    cp = None if head in ("", "auto") else _col_parts(_int(head))
    if ":" in tail:
        raise ValueError(f"hyb spec should be 'hyb', 'hyb:P' or 'hyb:P:1/2/4/...', got 'hyb:{arg}'")
    bk = None if not sep or tail.strip() in ("", "auto") else _buckets(tail.strip())
    return {"col_parts": cp, "buckets": bk}


def _int(text):
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"hyb col_parts should be a positive integer, got {text!r}") from None


def declare(col_parts=None, buckets=None) -> CompositeFormat:
    """The template for fully given parameters: every (column range, bucket) part, the
    widest ones ``dup`` (rows may be split), so a kernel compiled for it takes any matrix
    converted with these parameters. A converted matrix's own format has the same parts,
    its widest ones ``dup`` only where it splits rows; automatic parameters need the matrix
    (``convert``)."""
    p, b = _col_parts(col_parts), _buckets(buckets)
    if p is None or b is None:
        raise ValueError("hyb's automatic col_parts/buckets depend on the matrix: convert a matrix, "
                         "or give both (spec 'hyb:4:1/2/4/8/16/32')")
    parts = tuple(rell.declare(w, unique=(w != b[-1])) for _ in range(p) for w in b)
    return CompositeFormat(NAME, parts, (("col_parts", p), ("buckets", b)), disjoint_rows=p == 1)


def _pow2_ceil(x) -> int:
    x = int(max(x, 1))
    return 1 << (x - 1).bit_length()


def _pow2_floor(x) -> int:
    x = int(max(x, 1))
    return 1 << (x.bit_length() - 1)


def _groups(indptr, indices, n_cols: int, col_parts: int):
    """(row, column range) groups of a canonical CSR: for each non-empty group its row,
    range, first entry and length, in (row, range) order (entries are sorted by column,
    so every group is one contiguous run of entries: a group starts where a row starts or
    the column range changes within a row)."""
    ranges, starts, lengths = group_runs(indptr, indices, n_cols, col_parts)
    rows = np.searchsorted(indptr, starts, side="right") - 1
    return rows, ranges, starts, lengths


def group_runs(indptr, indices, n_cols: int, col_parts: int):
    """(range, first entry, length) of every non-empty group, as :func:`_groups` gives
    them without their rows (a binary search per group: what the tuner's picks skip)."""
    nnz = int(indices.size)
    pw = max(-(-n_cols // col_parts), 1)
    start = np.zeros(nnz, bool)
    start[indptr[:-1][np.diff(indptr) > 0]] = True
    part = None
    if col_parts > 1:
        part = indices // pw
        start[1:] |= part[1:] != part[:-1]
    starts = np.flatnonzero(start)
    lengths = np.diff(np.append(starts, nnz))
    ranges = part[starts].astype(np.int64) if part is not None else np.zeros(starts.size, np.int64)
    return ranges, starts, lengths


def group_lengths(csr, col_parts: int) -> np.ndarray:
    """Entries of every non-empty (row, column range) group (what the buckets hold)."""
    c = csr if isinstance(csr, Canonical) else canonical_csr(csr)
    return group_runs(c.indptr, c.indices, int(c.shape[1]), _col_parts(col_parts))[2]


def auto_col_parts(csr) -> int:
    """The automatic ``col_parts`` (the rule of :func:`choose_params`)."""
    c = csr if isinstance(csr, Canonical) else canonical_csr(csr)
    N = int(c.shape[1])
    nnz = int(c.indices.size)
    nonempty = int(np.count_nonzero(np.diff(c.indptr)))
    mean = nnz / nonempty if nonempty else 0.0
    p_cache = _pow2_ceil(-(-N * B_ROW_BYTES // B_SLICE_BYTES))
    p_len = _pow2_floor(mean / ROW_LEN_PER_PART) if mean >= ROW_LEN_PER_PART else 1
    return max(1, min(p_cache, p_len, MAX_COL_PARTS))


def buckets_for(lengths: np.ndarray) -> Tuple[int, ...]:
    """The automatic buckets for groups of these lengths (the rule of :func:`choose_params`)."""
    k99 = float(np.quantile(lengths, 0.99)) if lengths.size else 1.0
    w_max = min(max(_pow2_ceil(np.ceil(k99)), MIN_BUCKET), MAX_BUCKET)
    return tuple(1 << i for i in range(w_max.bit_length()))


def choose_params(csr) -> Tuple[int, Tuple[int, ...]]:
    """Automatic ``(col_parts, buckets)`` from the row-length distribution.

    * col_parts: 1 unless both (a) the columns' slice of B is large — ``cols * 512 B``
      (128 float32 features per row of B) over 4 MiB — and (b) rows are long enough to
      keep ~32 entries per range: ``min(pow2_ceil(cols * 512 / 4 MiB),
      pow2_floor(mean non-empty row length / 32), 16)``.
    * buckets: powers of two 1, 2, ..., w_max with ``w_max`` the power of two at or above
      the 99th percentile of the per-range row lengths, clamped to [4, 64]: 99% of rows
      fit a bucket without splitting, the rare longer ones are split into pieces of w_max.
    """
    c = csr if isinstance(csr, Canonical) else canonical_csr(csr)
    return choose_params_for(c, auto_col_parts(c))


def choose_params_for(csr, col_parts: int) -> Tuple[int, Tuple[int, ...]]:
    """Automatic buckets for a given ``col_parts`` (the rule of ``choose_params``)."""
    p = _col_parts(col_parts)
    return p, buckets_for(group_lengths(csr, p))


# ------------------------------------------------------------------ conversion


def from_matrix(matrix, *, shape=None, dtype=None, col_parts=None, buckets=None) -> CompositeInstance:
    """``matrix`` split into rell parts (see the module docstring). Vectorised: a few
    passes over the entries plus one slice per non-empty (range, bucket)."""
    t0 = time.perf_counter()
    p, b = _col_parts(col_parts), _buckets(buckets)
    m = canonical_csr(matrix, shape=shape, dtype=dtype)
    M, N = m.shape
    if p is None or b is None:
        auto_p, auto_b = choose_params(m) if p is None else choose_params_for(m, p)
        p = auto_p if p is None else p
        b = auto_b if b is None else b
    inst = _split(m, p, b)
    inst.conversion_s = time.perf_counter() - t0
    check(inst)
    return inst


def _split(m, p: int, buckets: Tuple[int, ...]) -> CompositeInstance:
    M, N = m.shape
    shape = (int(M), int(N))
    nnz = m.nnz
    widths = np.asarray(buckets, dtype=np.int64)
    B = widths.size
    rows, parts, starts, lengths = _groups(m.indptr, m.indices, N, p)
    # bucket: smallest width >= k; longer rows -> the widest, split into pieces
    bk = np.minimum(np.searchsorted(widths, lengths, side="left"), B - 1)
    w = widths[bk]
    pieces = -(-lengths // w)
    combo = parts * B + bk                                   # (range, bucket), range-major
    order = np.argsort(combo, kind="stable")                 # keeps row order within a combo
    n_combo = p * B
    ell_rows = np.bincount(combo, weights=pieces, minlength=n_combo).astype(np.int64)
    combo_slots = ell_rows * widths[np.arange(n_combo) % B]
    slot_base = np.zeros(n_combo + 1, dtype=np.int64)
    np.cumsum(combo_slots, out=slot_base[1:])
    # first ELL row of each group inside its combo
    sp_pieces = pieces[order]
    csum = np.cumsum(sp_pieces) - sp_pieces                  # exclusive, over sorted groups
    ell_base = np.zeros(n_combo + 1, dtype=np.int64)
    np.cumsum(ell_rows, out=ell_base[1:])
    first = np.empty_like(csum)
    first[order] = csum - ell_base[combo[order]]
    # per entry: its group, offset in the group -> global slot
    g = np.repeat(np.arange(lengths.size, dtype=np.int64), lengths)
    off = np.arange(nnz, dtype=np.int64) - starts[g]
    wg = w[g]
    slot = slot_base[combo[g]] + (first[g] + off // wg) * wg + off % wg
    total = int(slot_base[-1])
    col_all = np.full(total, -1, dtype=np.int32)
    val_all = np.zeros(total, dtype=m.data.dtype)
    col_all[slot] = m.indices
    val_all[slot] = m.data
    row_all = V.check_index(np.repeat(rows[order], sp_pieces), "row_ids", nnz=nnz, shape=shape)
    split = np.bincount(combo[pieces > 1], minlength=n_combo) > 0
    nnz_combo = np.bincount(combo, weights=lengths, minlength=n_combo).astype(np.int64)

    part_insts, part_fmts = [], []
    for c in range(n_combo):  # every (range, bucket) pair, empty ones too: the part list is the spec's
        fmt = rell.declare(int(widths[c % B]), unique=not bool(split[c]))
        inst = FormatInstance(fmt, shape,
                              {"row_ids": row_all[ell_base[c]:ell_base[c + 1]],
                               "col_ids": col_all[slot_base[c]:slot_base[c + 1]]},
                              val_all[slot_base[c]:slot_base[c + 1]], int(nnz_combo[c]))
        part_insts.append(inst)
        part_fmts.append(fmt)
    cf = CompositeFormat(NAME, tuple(part_fmts), (("col_parts", int(p)), ("buckets", tuple(int(x) for x in buckets))),
                         disjoint_rows=int(p) == 1)
    out = CompositeInstance(cf, shape, part_insts, int(nnz))
    out._data = val_all  # the parts' values are views into it, in part order
    return out


# ------------------------------------------------------------------ family interface


def root_extent(inst: CompositeInstance) -> int:
    """The logical rows (each part has its own run-time extent: ``extents``)."""
    return int(inst.shape[0])


def extents(inst: CompositeInstance) -> dict:
    """Each part's ELL-row count, keyed ``r_<k>`` (part k's root axis with SparseTIR's
    per-part suffix)."""
    return {f"r_{k}": rell.root_extent(p) for k, p in enumerate(inst.parts)}


def stored_coords(inst: CompositeInstance):
    return inst.stored_coords()


def check(inst: CompositeInstance, full: bool = False) -> None:
    """Parts are valid rell instances over the same shape, their nnz add up, and the
    format's params are valid; ``full`` also checks every part fully and that no entry
    is stored twice across parts (and that each lies in its part's column range)."""
    if not isinstance(inst, CompositeInstance) or inst.format.name != NAME:
        raise ValueError(f"a hyb instance should be a CompositeInstance of format hyb, got {type(inst).__name__}")
    p = _col_parts(inst.format.param("col_parts"))
    b = _buckets(inst.format.param("buckets"))
    if len(inst.parts) != p * len(b):
        raise ValueError(f"hyb:col_parts={p} with {len(b)} buckets should have {p * len(b)} parts (one per "
                         f"column range and bucket, empty ones included), got {len(inst.parts)}")
    for k, part in enumerate(inst.parts):
        w = b[k % len(b)]
        if part.format.name != rell.NAME or part.format.param("width") != w:
            raise ValueError(f"hyb part {k} should be the rell bucket of width {w} of column range "
                             f"{k // len(b)}, got {part.format.spec}")
        if w != b[-1] and not part.format.param("unique"):
            raise ValueError(f"hyb part {k} (width {w}, not the widest) should list each row once, got {part.format.spec}")
        rell.check(part, full=full)
    if sum(pt.nnz for pt in inst.parts) != inst.nnz:
        raise ValueError(f"the parts' nnz should add up to nnz = {inst.nnz}, got {sum(pt.nnz for pt in inst.parts)}")
    if full:
        rows, cols = inst.stored_coords()
        ok = rows >= 0
        key = rows[ok] * max(inst.shape[1], 1) + cols[ok]
        if V.has_repeats(key):  # a sort: np.unique hashes, ~7x slower
            raise ValueError("each entry should be stored in exactly one part, got one stored twice")
        pw = max(-(-inst.shape[1] // p), 1)
        for k, part in enumerate(inst.parts):
            c = part.arrays["col_ids"]
            c = c[c >= 0] // pw
            if c.size and c.min() != c.max():
                raise ValueError(f"part {k} should hold one column range, got ranges {int(c.min())}..{int(c.max())}")


def composite_summary(inst: CompositeInstance) -> dict:
    """``stats.summarize`` over a composite: all parts' arrays and values together."""
    arrays = {f"{k}.{n}": a for k, p in enumerate(inst.parts) for n, a in p.arrays.items()}
    view = SimpleNamespace(shape=inst.shape, nnz=inst.nnz, stored=inst.stored, format=inst.format,
                           arrays=arrays, data=inst.data)
    rows, _ = inst.stored_coords()
    s = summarize(view, np.bincount(rows[rows >= 0], minlength=inst.shape[0])[: inst.shape[0]])
    s["conversion_s"] = float(inst.conversion_s)
    s["parts"] = len(inst.parts)
    return s


def stats(inst: CompositeInstance) -> dict:
    """Totals (stored, padding ratio = stored / nnz, bytes, conversion time) and per part
    its column range, width, unique flag, ELL rows, stored slots and nnz."""
    s = composite_summary(inst)
    p = int(inst.format.param("col_parts"))
    n_b = len(inst.format.param("buckets"))
    per = []
    for k, part in enumerate(inst.parts):
        per.append({"partition": k // n_b,
                    "width": int(part.format.param("width")),
                    "unique": bool(part.format.param("unique")),
                    "ell_rows": rell.root_extent(part),
                    "stored": int(part.stored), "nnz": int(part.nnz)})
    s["col_parts"] = p
    s["buckets"] = tuple(inst.format.param("buckets"))
    s["part_stats"] = per
    return s
