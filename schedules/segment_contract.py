"""Segment contraction: a sum over a row's entries and a dense axis whose far factor does not
depend on the entry, computed as a segment sum and then one small GEMM per tile (CUDA).

Capability (nothing here looks at an operator's name): a sparse nest that sums into a dense
output over its entries ``j`` and a dense axis ``f`` (compile-time extent), spatial over one
dense axis ``g`` (compile-time extent), whose value is a product of factors that split in two:

    P(p, j, f)   every factor that reads the entry or does not read g (A[..] * X[col, f]),
    Q(p, f, g)   one load of a dense buffer indexed by f, g and the root position only
                 (W[r, f, g] with r = row // lrows of a stacked structure (r, i, j)).

Distributivity gives sum_{j, f} P Q = sum_f (sum_j P) Q: per root position ("segment")
Z[f] = sum_j P, then Y[.., g] += sum_f Z[f] Q[f, g]. Work drops from entries x F x G to
segments x F x G + entries x F, and Q is read once per run of segments that share its slice
instead of once per entry -- RGCN's ``A[r, i, j] * X[j, f] * W[r, f, g]``: SparseTIR's
"aggregate, then transform", in one launch.

The kernel (block bx * SPLITS + s: root positions bx * 256 + tid, split s of SPLITS; the
splits of one group are adjacent, so a hub group's blocks all start early): a segment's
entries are cut in chunks of CHUNK and chunk c belongs to split c mod SPLITS
(``schedules.segment_split``), so a power-law graph's hub rows, which sit
together in a few groups of positions, are summed by SPLITS blocks instead of one. Block
(bx, s) keeps the segments it holds entries of (count > s * CHUNK): a block that holds none
(most blocks with s > 0) leaves after one barrier (``__syncthreads_or``); the others compact
theirs (a scan in shared memory), then, 32 or 64 at a time, each segment's partial Z row is
summed by the threads over f -- a whole chunk as one unrolled run, its loads in flight
together, the last partial chunk in guarded unrolled steps -- and every run of consecutive
segments with the same Q slice loads the slice into shared memory once (not at all when the
slice there is already that one) and multiplies its Z rows by it, a register tile of 4
segments x G/32 adjacent columns per thread, for the thread rows that hold segments of the run. Partial sums from
several blocks are correct by linearity where the output is added atomically (root
positions that share an output row; the program's fill nest set it to the identity). An
output that is stored (each row owned by one root position, empty rows given the identity
here) keeps SPLITS = 1: a store and an atomicAdd into one element from different blocks
would race.

Where the output's fill may run in this launch (``lower.fuse_fill``, on by default: see
there), the blocks order themselves through a workspace of int32 counters that persists
from call to call (``ir_attrs.SYNC_PREFIX``): the first block to reach a group of 256 output
rows in a call claims and fills it, the others wait for that group only, before they add
(:func:`sync_head`, :func:`sync_decide`, :func:`sync_claim`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from sparsec.expr import BinOp, Const, Expr, Load, Select, Var, render, walk
from sparsec.ir_attrs import SYNC_PREFIX, SYNC_ROWS

from .segment_split import Partition, Sym

THREADS = 256  # threads per block, and root positions per block (one flag each in the scan)
assert THREADS == SYNC_ROWS  # a fused fill's groups of rows are one block's positions (ir_attrs)
PER_THREAD = 4  # segments of a thread's register tile
COL_THREADS = 32  # threads over g (fewer where G is smaller): G / COL_THREADS columns of the tile
SHARED_BYTES = 46 * 1024  # the static shared memory a block may take (48 KiB, less the scan's)
# The split of long segments (``schedules.segment_split``), constants (the kernel is written
# before schedule knobs apply; benchmarks/time_rgcn_splits.py and check_segment_split.py time
# other values). CHUNK 32: entries a thread sums with their loads in flight together, 32x fewer
# dependent memory round trips along a long segment (H100, R-MAT s18 at 8 splits: 2.30 ms
# against 2.55 ms at 16, 64x64). STEP 4: the unrolled step of a segment's last, partial
# chunk, so a typical short segment (R-MAT s18: 5.5 entries) wastes at most 3 guarded slots.
# SPLITS: blocks per group of 256 root positions at most; how many a kernel takes follows the
# matrix it is compiled for (:func:`splits_for`), DEFAULT_SPLITS when only its format is known.
SPLITS, DEFAULT_SPLITS, CHUNK, STEP = 16, 8, 32, 4
# The head pass (:func:`sums`): a segment whose share holds at most HEAD entries is summed in
# groups of HEAD_GROUP of a thread's sums, their loads in flight together; 0 turns it off
HEAD, HEAD_GROUP = 0, 4
BALANCED = 8  # a heaviest group within this many times the mean group is not split at all
# The product's f loop is unrolled up to this F where a thread has BG > 1 columns: with f
# constant, a thread's Z row and its BG adjacent W columns are consecutive words that nvcc
# loads as vectors (LDS.128 / LDS.64). H200, rgcn_bias at R = 16 + root, whole call
# (benchmarks/results/rgcn_kernel_H200.json): 64x64 mdual 1.36 -> 1.14 ms, R-MAT s18
# 2.15 -> 1.99 ms, with the W reuse below; at 64x16 (BG = 1) the unrolled loop was slower
# (mdual 0.77 -> 0.91 ms), so it stays a loop there
UNROLL_F = 64


def splits_for(row_lengths) -> int:
    """Splits for a matrix whose root positions hold ``row_lengths`` entries: 1 when its
    heaviest group of THREADS positions is within BALANCED x the mean group (every split adds
    a block per group that mostly only reads its counts and leaves), else the power of two
    that brings the heaviest group's share of a block near BALANCED x the mean, at most SPLITS.

    Measured on an H100 (benchmarks/results/rgcn_splits_H100.json, RGCN 64x64, R = 16 + root):
    mdual, heaviest group 3.4x the mean: 1.38 ms at 1 split, 1.47 at 8, 1.70 at 32; R-MAT s18,
    heaviest 54x the mean: 2.96 ms at 1, 2.30 at 8, 2.61 at 32 (32-entry chunks)."""
    import numpy as np

    lengths = np.asarray(row_lengths, dtype=np.int64)
    if lengths.size == 0 or lengths.sum() == 0:
        return 1
    groups = np.add.reduceat(lengths, np.arange(0, lengths.size, THREADS))
    ratio = groups.max() / (BALANCED * groups.mean())
    if ratio <= 1:
        return 1
    return int(min(SPLITS, 1 << int(np.ceil(np.log2(ratio)))))


@dataclass(frozen=True)
class Contraction:
    """What the kernel is made of, all as flat-program expressions over v_<loop> iterators."""

    root: str  # loop names
    entry: str
    spatial: str
    reduced: str
    root_extent: Expr
    entry_extent: Expr
    G: int
    F: int
    near: Expr  # P(p, j, f)
    far: Load  # Q(p, f, g)
    key: Tuple[Expr, ...]  # Q's index expressions that depend on the root position only
    target: Load
    write_guard: Optional[Expr]
    atomic: bool


def _uses(e: Expr) -> set:
    """The loop iterators (``v_<loop>``) ``e`` reads; scalars (lrows, n_<axis>) do not count."""
    return {n.name for n in walk(e) if isinstance(n, Var) and n.name.startswith("v_")}


def _factors(e: Expr) -> List[Expr]:
    if isinstance(e, BinOp) and e.op == "*":
        return _factors(e.a) + _factors(e.b)
    return [e]


def _product(fs: List[Expr]) -> Expr:
    out = fs[0]
    for f in fs[1:]:
        out = BinOp("*", out, f)
    return out


def match(nest, program) -> Optional[Contraction]:
    """The contraction of ``nest`` (a flat-program LoopNest), or None where it does not fit."""
    if nest.dense or nest.fill or nest.scatter or nest.reduce != "sum" or not nest.blocks or len(nest.blocks[0]) != 1:
        return None
    sparse_bufs = {b.name for b in program.buffers if b.sparse}
    if nest.target.buffer in sparse_bufs:
        return None
    loops = [b for blk in nest.blocks for b in blk]
    root = loops[0]
    if root.loop.role != "root" or root.loop.kind != "S":
        return None
    entries = [b for b in loops[1:] if b.loop.role == "sparse"]
    dense = [b for b in loops[1:] if b.loop.role == "dense"]
    if len(entries) != 1 or entries[0].loop.kind != "R" or len(dense) != 2 or len(loops) != 4:
        return None
    spatial = [b for b in dense if b.loop.kind == "S"]
    reduced = [b for b in dense if b.loop.kind == "R"]
    if len(spatial) != 1 or len(reduced) != 1:
        return None
    if not all(isinstance(b.extent, Const) for b in dense):
        return None
    vp, vj, vg, vf = (f"v_{b.loop.name}" for b in (root, entries[0], spatial[0], reduced[0]))
    value, guard = nest.value, None
    if isinstance(value, Select) and isinstance(value.other, Const) and value.other.value == 0.0:
        guard, value = value.cond, value.then  # padding: the entry contributes nothing
        if vg in _uses(guard) or vf in _uses(guard):
            return None
    near, far = [], []
    for fac in _factors(value):
        used = _uses(fac)
        (far if vg in used and vj not in used else near).append(fac)
    if len(far) != 1 or not isinstance(far[0], Load) or any(vg in _uses(f) for f in near):
        return None
    q = far[0]
    plain = [i for i in q.index if isinstance(i, Var) and i.name in (vf, vg)]
    key = tuple(i for i in q.index if not (isinstance(i, Var) and i.name in (vf, vg)))
    if len(plain) != 2 or any(_uses(k) - {vp} for k in key) or any(isinstance(n, Load) and n.buffer == q.buffer
                                                                     for k in key for n in walk(k)):
        return None
    if _uses(nest.target) - {vp, vg} or (nest.write_guard is not None and _uses(nest.write_guard) - {vp, vg}):
        return None
    G, F = int(spatial[0].extent.value), int(reduced[0].extent.value)
    itemsize = 8 if program.dtype.out.endswith("64") else 4  # accumulation in the output dtype
    if (F * G + THREADS // min(COL_THREADS, G) * PER_THREAD * F) * itemsize > SHARED_BYTES:  # Ws + Zs
        return None
    p = _product(near)
    if guard is not None:
        p = Select(guard, p, Const(0.0))
    return Contraction(root.loop.name, entries[0].loop.name, spatial[0].loop.name, reduced[0].loop.name,
                       root.extent, entries[0].extent, G, F,
                       p, q, key, nest.target, nest.write_guard, bool(nest.atomic or not nest.init))


def partition(c: Contraction, splits: Optional[int] = None) -> Partition:
    """How ``c``'s segments are split. Only an output that is added atomically may take
    partial sums from several blocks; one that is stored (owned rows, each written once, its
    empty rows given the identity) keeps each segment in one block: a store and an
    atomicAdd from different blocks into one element would race. Segments of a width known
    at compile time (ell, hyb's buckets) take no more splits than they have chunks."""
    splits = min(SPLITS, splits or DEFAULT_SPLITS) if c.atomic else 1
    if isinstance(c.entry_extent, Const):
        splits = max(1, min(splits, -(-int(c.entry_extent.value) // CHUNK)))
    return Partition(splits, CHUNK, STEP)


def fuses_fill(c: Contraction, fill) -> bool:
    """The fill nest ``fill`` can run in ``c``'s launch (``lower.fuse_fill``): ``c`` adds
    atomically into ``Y[p % E, g]`` or ``Y[p, g]`` with no write guard, and ``fill`` sets rows
    [0, E) x the same compile-time g extent to a value of the row and g alone."""
    if not c.atomic or c.write_guard is not None or fill.write_guard is not None:
        return False
    loops = [b for blk in fill.blocks for b in blk]
    if len(loops) != 2 or not isinstance(loops[1].extent, Const) or int(loops[1].extent.value) != c.G:
        return False
    vr, vg = (f"v_{b.loop.name}" for b in loops)
    if tuple(getattr(i, "name", None) for i in fill.target.index) != (vr, vg):
        return False
    if _uses(fill.value) - {vr, vg} or any(isinstance(n, Load) and n.buffer == fill.target.buffer
                                           for n in walk(fill.value)):
        return False
    return _adds_into_rows(c, loops[0].extent)


def _adds_into_rows(c: Contraction, rows: Expr) -> bool:
    """``c`` adds into output row p % ``rows`` (or p) of root position p, column g."""
    vp, vg = f"v_{c.root}", f"v_{c.spatial}"
    if len(c.target.index) != 2 or getattr(c.target.index[1], "name", None) != vg:
        return False
    r = c.target.index[0]
    return (isinstance(r, Var) and r.name == vp) or (
        isinstance(r, BinOp) and r.op == "%" and isinstance(r.a, Var) and r.a.name == vp
        and render(r.b, "int32") == render(rows, "int32"))


_LOCALS = ("bs", "sp", "cnt", "kc", "base", "u", "v", "sc", "sg", "rs", "Zs", "Ws", "acc", "tmp", "z", "ns", "rv", "rw", "p0", "bx", "tid", "ch", "k", "e", "p", "f", "g", "q",
           "t", "t0", "a", "b", "sgt", "sgq", "lp", "sk", "sf", "ck", "fv", "gl", "st", "sq", "gn", "tr", "fi",
           "fr", "fg", "ga", "gs", "ng", "kg", "kk", "lm", "held", "hp", "hc", "hw", "rm", "ml", "wi", "ln", "wv")
_LOCAL_RE = re.compile(r"\b(" + "|".join(_LOCALS) + r")\b")
PREFIX = "l__"  # the kernel's own names: "l_" is reserved for sparsec's loops, so no buffer clashes


def _local(name: str) -> str:
    return PREFIX + name


def _fill(template: str, exprs: Dict[str, str]) -> str:
    """``template`` with its local names prefixed, then the rendered expressions put in
    (``{name}`` slots; rendered after, so a buffer called ``f`` is not renamed)."""
    text = _LOCAL_RE.sub(lambda m: PREFIX + m.group(1), template.replace("T.", "\0"))
    return text.replace("\0", "T.").format(**exprs)


def tile(c: Contraction) -> Tuple[int, int, int]:
    """(GT, TS, BG): threads over g, segments per chunk (thread rows x PER_THREAD), g columns
    per thread."""
    GT = min(COL_THREADS, c.G)
    return GT, THREADS // GT * PER_THREAD, -(-c.G // GT)


def slots(nest, c: Contraction, dtype: str, reads: List[str], writes: str, part: Partition) -> Dict[str, str]:
    """The rendered expressions the kernel text's ``{name}`` slots take (``sp``: the block's split)."""
    P = PREFIX
    sp = Sym(P + "sp")
    _, TS, _ = tile(c)
    root, entry, spatial, reduced = (f"v_{x}" for x in (c.root, c.entry, c.spatial, c.reduced))
    cnt, base = Sym(P + "cnt[0]"), Sym(P + "base")
    near = {root: P + "p", reduced: P + "f"}
    return {
        "name": nest.name, "reads": ", ".join(reads), "writes": writes, "dtype": dtype,
        "n_root": render(c.root_extent, "int32"),
        "count_p0": render(c.entry_extent, "int32", {root: P + "p0"}),
        "count_p": render(c.entry_extent, "int32", {root: P + "p"}),
        "holds": str(part.holds(cnt, sp)),
        "chunks": str(part.chunks(cnt, sp)),
        "first": str(part.first(sp, Sym(P + "kc"))),
        "full": str(part.full(cnt, base)),
        "first0": str(part.first(sp, 0)),
        "count_head": render(c.entry_extent, "int32", {root: f"{P}hp[{P}kk]"}),
        "near_head": render(c.near, dtype, {root: f"{P}hp[{P}kk]", reduced: P + "f",
                                            entry: f"T.min({P}base + {P}u, {P}hc[{P}kk] - 1)"}),
        "steps": str(part.steps(cnt, base)),
        "near_full": render(c.near, dtype, {**near, entry: f"({P}base + {P}u)"}),
        "near_step": render(c.near, dtype, {**near, entry: f"({P}base + {P}v * {part.step} + {P}u)"}),
        "far": render(c.far, dtype, {root: f"{P}sg[{P}ch * {TS} + {P}t0]", reduced: P + "f", spatial: P + "g"}),
        "key_change": " or ".join(
            f"({render(k, 'int32', {root: P + 'sgt'})}) != ({render(k, 'int32', {root: P + 'sgq'})})"
            for k in c.key) or "False",
        "guard_p": ("True" if c.write_guard is None else
                    render(c.write_guard, "int32", {root: P + "p", spatial: P + "g"})),
    }


def declarations(c: Contraction) -> str:
    """The block's shared and local buffers."""
    GT, TS, BG = tile(c)
    return f"""sc = T.alloc_buffer(({THREADS},), "int32", scope="shared")
sg = T.alloc_buffer(({THREADS},), "int32", scope="shared")
rs = T.alloc_buffer(({TS},), "int32", scope="shared")
Zs = T.alloc_buffer(({TS}, {c.F}), "{{dtype}}", scope="shared")
Ws = T.alloc_buffer(({c.F}, {c.G}), "{{dtype}}", scope="shared")
acc = T.alloc_buffer(({PER_THREAD}, {BG}), "{{dtype}}", scope="local")
tmp = T.alloc_buffer((1,), "int32", scope="local")
lp = T.alloc_buffer((1,), "int32", scope="local")
cnt = T.alloc_buffer((1,), "int32", scope="local")
z = T.alloc_buffer((1,), "{{dtype}}", scope="local")
ns = T.alloc_buffer((1,), "int32", scope="local")
rv = T.alloc_buffer((1,), "int32", scope="local")
rw = T.alloc_buffer((1,), "int32", scope="local")
rm = T.alloc_buffer(({-(-min(TS, THREADS) // 32)},), "uint32", scope="shared")
ml = T.alloc_buffer((1,), "uint32", scope="local")
wi = T.alloc_buffer((1,), "int32", scope="local")
ln = T.alloc_buffer((1,), "int32", scope="local")
lm = T.alloc_buffer((1,), "int32", scope="local")
hp = T.alloc_buffer(({HEAD_GROUP},), "int32", scope="local")
hc = T.alloc_buffer(({HEAD_GROUP},), "int32", scope="local")
hw = T.alloc_buffer(({HEAD_GROUP * max(HEAD, 1)},), "{{dtype}}", scope="local")
"""


def _segment_sum(c: Contraction, part: Partition) -> str:
    """Kernel text: the sum of all the entries of split sp's share of segment p, for one f, into z."""
    return f"""cnt[0] = {{count_p}}
z[0] = T.{{dtype}}(0)
for kc in range({{chunks}}):
    base: T.int32 = {{first}}
    if {{full}}:
        for u in T.unroll({part.chunk}):
            z[0] = z[0] + {{near_full}}
    else:
        for v in range({{steps}}):
            for u in T.unroll({part.step}):
                if base + v * {part.step} + u < cnt[0]:
                    z[0] = z[0] + {{near_step}}"""


def head_plan(c: Contraction) -> Tuple[int, int]:
    """(head, group): entries of a short segment summed in the prefetched pass, and how many
    of a thread's (segment, f) sums that pass unrolls together; (0, 1) where the chunk takes
    more than 31 sums a thread (the pass's bit mask) or HEAD is 0."""
    _, TS, _ = tile(c)
    K = -(-TS * c.F // THREADS)
    if not HEAD or K > 31:
        return 0, 1
    group = max(g for g in range(1, min(HEAD_GROUP, K) + 1) if K % g == 0)
    return HEAD, group


def sums(c: Contraction, part: Partition) -> str:
    """Kernel text: per chunk of TS segments, each (segment, f) sum of the thread's K into Zs.

    Without a head pass each sum is a chain of dependent loads (the segment's count, then its
    entries' columns and values, then X's rows), walked one sum after another: K chains a
    thread, the kernel's latency. With one (:func:`head_plan`), a group of the thread's sums
    is unrolled and every sum whose share of the segment has at most ``head`` entries (RGCN's
    typical (relation, row) segment: 1-2 entries) is done there, its loads in flight together
    across the group (their addresses clamped into the segment, so no load sits behind a
    branch; a Select keeps the real entries); the longer ones are marked (bit k of lm) and
    summed after, as before. Each entry is added in the same order either way. Off by
    default (HEAD = 0): on an H200 it won on some RGCN layers and lost on others
    (benchmarks/results/rgcn_fill_H200.json, session22)."""
    _, TS, _ = tile(c)
    K = -(-TS * c.F // THREADS)
    one = _segment_sum(c, part)
    head, group = head_plan(c)
    if not head:
        return f"""for k in range({K}):
    e: T.int32 = tid + k * {THREADS}
    if e < {TS * c.F}:
        if ch * {TS} + e // {c.F} < ns[0]:
            p: T.int32 = sg[ch * {TS} + e // {c.F}]
            f: T.int32 = e % {c.F}
{indent(one, 12)}
            Zs[e // {c.F}, f] = z[0]
        else:
            Zs[e // {c.F}, e % {c.F}] = T.{{dtype}}(0)"""
    guard = "" if K * THREADS == TS * c.F else f" and e < {TS * c.F}"
    pos = f"ch * {TS} + e // {c.F}"
    store = f"Zs[e // {c.F}, e % {c.F}] = T.Select(held, z[0], T.{{dtype}}(0))"
    if guard:  # the chunk's last sums reach past it
        store = f"if e < {TS * c.F}:\n            {store}"
    return f"""lm[0] = 0
for kg in range({K // group}):
    for kk in T.unroll({group}):
        e: T.int32 = tid + (kg * {group} + kk) * {THREADS}
        hp[kk] = sg[T.min({pos}, ns[0] - 1)]
    for kk in T.unroll({group}):
        hc[kk] = {{count_head}}
    for kk in T.unroll({group}):
        for u in T.unroll({head}):
            e: T.int32 = tid + (kg * {group} + kk) * {THREADS}
            f: T.int32 = e % {c.F}
            base: T.int32 = {{first0}}
            hw[kk * {head} + u] = {{near_head}}
    for kk in T.unroll({group}):
        e: T.int32 = tid + (kg * {group} + kk) * {THREADS}
        held: T.bool = {pos} < ns[0]{guard}
        base: T.int32 = {{first0}}
        z[0] = T.{{dtype}}(0)
        for u in T.unroll({head}):
            z[0] = z[0] + T.Select(base + u < hc[kk], hw[kk * {head} + u], T.{{dtype}}(0))
        if held and hc[kk] - base > {head}:
            lm[0] = T.bitwise_or(lm[0], T.shift_left(1, kg * {group} + kk))
        {store}
if lm[0] != 0:
    for k in range({K}):
        if T.bitwise_and(T.shift_right(lm[0], k), 1) != 0:
            e: T.int32 = tid + k * {THREADS}
            p: T.int32 = sg[ch * {TS} + e // {c.F}]
            f: T.int32 = e % {c.F}
{indent(one, 12)}
            Zs[e // {c.F}, f] = z[0]"""


def runs(c: Contraction) -> str:
    """Kernel text, per chunk: rs[t] = the first segment of segment t's run (consecutive
    segments of one Q slice; -2 past the chunk's segments), then a loop that reaches the body
    after it once per run, t0 = the run's first segment, every thread alike (the body holds
    barriers). The runs' first segments are bits of warp ballots (rm, one word per 32
    segments): each thread finds its run's start from the words (count leading zeros), and
    the loop visits only the set bits (find first set). The walk this replaced (each thread
    stepping back segment by segment, the loop visiting every segment of the chunk) held a
    quarter of the kernel's stall samples at its barrier and a fifth of its instructions
    (Nsight Compute, mdual 64x64 on an H200; 1.2-1.7x slower per RGCN layer:
    benchmarks/results/rgcn_fill_H200.json, session22)."""
    _, TS, _ = tile(c)
    span = min(TS, THREADS)
    words = -(-span // 32)
    return f"""if tid < {words * 32}:
    t: T.int32 = tid
    tmp[0] = 0
    if t < {span} and ch * {TS} + t < ns[0]:
        tmp[0] = T.if_then_else(t == 0, 1, 0)
        if t > 0:
            sgt: T.int32 = sg[ch * {TS} + t]
            sgq: T.int32 = sg[ch * {TS} + t - 1]
            if {{key_change}}:
                tmp[0] = 1
    ml[0] = T.call_extern("uint32", "__ballot_sync", T.uint32(0xFFFFFFFF), tmp[0])
    if t % 32 == 0:
        rm[t // 32] = ml[0]
T.tvm_storage_sync("shared")
if tid < {span}:
    rs[tid] = -2
    if ch * {TS} + tid < ns[0]:
        wi[0] = tid // 32
        ln[0] = tid % 32
        ml[0] = T.shift_left(rm[tid // 32], T.uint32(31) - T.Cast("uint32", tid % 32))
        while ml[0] == T.uint32(0):
            wi[0] = wi[0] - 1
            ln[0] = 31
            ml[0] = rm[wi[0]]
        rs[tid] = wi[0] * 32 + ln[0] - T.call_extern("int32", "__clz", ml[0])
T.tvm_storage_sync("shared")
for wv in range({words}):
    ml[0] = rm[wv]
    while ml[0] != T.uint32(0):
        t0: T.int32 = wv * 32 + T.call_extern("int32", "__ffs", ml[0]) - 1
        ml[0] = T.bitwise_and(ml[0], ml[0] - T.uint32(1))
"""


def segments_body(c: Contraction, part: Partition, decide: str = "", claim: str = "") -> str:
    """What a block does with the root positions p0 it holds (``{holds}``, at least one in the
    block): compact them (a scan in shared memory), then per chunk of TS of them sum each
    segment's Z row, find the runs of one Q slice, and per run multiply by the slice and hand
    every (segment, g) sum to ``{store}`` (p: the segment's root position; acc[a, b]: its
    value). A run whose slice is the one in Ws already (the previous run's, often the
    previous chunk's) does not load it again (lp: the position it was loaded for, -1 before
    the first). A thread row whose segments are all outside the run, or past the chunk's
    segments, skips the product (whole warps at G >= 32)."""
    GT, TS, BG = tile(c)
    scan = ""
    s = 1
    while s < THREADS:
        scan += f"""
T.tvm_storage_sync("shared")
tmp[0] = sc[tid] + T.if_then_else(tid >= {s}, sc[T.max(tid - {s}, 0)], 0)
T.tvm_storage_sync("shared")
sc[tid] = tmp[0]"""
        s *= 2
    return scan + f"""
T.tvm_storage_sync("shared")
if {{holds}}:
    sg[sc[tid] - 1] = p0
ns[0] = sc[{THREADS - 1}]{decide}
T.tvm_storage_sync("shared"){claim}
for ch in range({-(-THREADS // TS)}):  # one chunk where TS >= THREADS (G < 4)
    if ch * {TS} < ns[0]:
{indent(sums(c, part), 8)}
{indent(runs(c), 8)}
                sgt: T.int32 = sg[ch * {TS} + t0]
                sgq: T.int32 = T.max(lp[0], 0)
                rw[0] = T.if_then_else(lp[0] < 0, 1, 0)
                if lp[0] >= 0:
                    if {{key_change}}:
                        rw[0] = 1
                if rw[0] != 0:
                    for k in range({-(-c.F * c.G // THREADS)}):
                        e: T.int32 = tid + k * {THREADS}
                        if e < {c.F * c.G}:
                            f: T.int32 = e // {c.G}
                            g: T.int32 = e % {c.G}
                            Ws[f, g] = {{far}}
                    lp[0] = sgt
                T.tvm_storage_sync("shared")
                t: T.int32 = tid // {GT} * {PER_THREAD}
                rv[0] = {TS}
                rw[0] = -1
                if t < ns[0] - ch * {TS}:
                    rv[0] = rs[t]
                    rw[0] = rs[T.min(t + {PER_THREAD - 1}, ns[0] - ch * {TS} - 1)]
                if rv[0] <= t0 and rw[0] >= t0:
                    for a, b in T.grid({PER_THREAD}, {BG}):
                        acc[a, b] = T.{{dtype}}(0)
                    for f in {"T.unroll" if c.F <= UNROLL_F and BG > 1 else "range"}({c.F}):
                        for a, b in T.grid({PER_THREAD}, {BG}):
                            acc[a, b] = acc[a, b] + Zs[tid // {GT} * {PER_THREAD} + a, f] * Ws[f, T.min(tid % {GT} * {BG} + b, {c.G - 1})]
                    for a, b in T.grid({PER_THREAD}, {BG}):
                        t: T.int32 = tid // {GT} * {PER_THREAD} + a
                        g: T.int32 = tid % {GT} * {BG} + b
                        if g < {c.G}:
                            if t < ns[0] - ch * {TS}:
                                rw[0] = rs[t]
                                if rw[0] == t0:
                                    p: T.int32 = sg[ch * {TS} + t]
                                    if {{guard_p}}:
                                        {{store}}
                T.tvm_storage_sync("shared")
        T.tvm_storage_sync("shared")
"""


# Thread blocks per SM a kernel with a fused fill is compiled to keep resident
# (``__launch_bounds__(256, N)``: registers capped at 65536 / (256 N)); 0: no bound. Since
# the protocol appears once in the kernel (:func:`sync_takes_part`), ptxas at TVM's
# --register-usage-level=10 gives the fused kernel the registers of the contraction alone
# (32 at G = 16, 39 at G = 64), so no bound by default. H200, an earlier tree with two
# copies (benchmarks/results/rgcn_fill_H200.json, session18.v5_bounded): a bound of 8 at
# G <= 32 spilled and made R-MAT s18 64x16 1.26x the two launches (1.10x unbounded);
# ``benchmarks/time_rgcn_fill.py --variants fused_b6`` measures one again
FUSED_MIN_BLOCKS = 0
# Spins of a block waiting for another block's fill before it stops the kernel (__trap: a
# workspace that no longer matches the matrix, never a hang); a fill takes microseconds
SPIN_LIMIT = 1 << 24


def sync_slots(c: Contraction, fill, dtype: str, part: Partition) -> Dict[str, str]:
    """The rendered pieces of the fill protocol (``fill`` run in this launch): ``E`` (output
    rows), ``ws`` (the workspace), ``grid`` (thread blocks), ``fill_store`` (the fill's
    statement at row fr, column fg)."""
    loops = [b for blk in fill.blocks for b in blk]
    names = {f"v_{loops[0].loop.name}": PREFIX + "fr", f"v_{loops[1].loop.name}": PREFIX + "fg"}
    E = render(loops[0].extent, "int32")
    n_root = render(c.root_extent, "int32")
    return {
        "E": E, "ws": SYNC_PREFIX + str(part.splits),
        "grid": f"(T.max(T.max({n_root}, {E}), 1) + {THREADS - 1}) // {THREADS} * {part.splits}",
        "fill_store": f"{render(fill.target, dtype, names)} = {render(fill.value, dtype, names)}",
    }


def sync_declarations() -> str:
    """The protocol's block-level values and buffers: groups of rows (ng), the claim results
    and group ids thread 0 hands the block (sk), its go-ahead (sf), thread 0's counts."""
    return f"""ng: T.int32 = ({{E}} + {THREADS - 1}) // {THREADS}
sk = T.alloc_buffer((8,), "int32", scope="shared")
sf = T.alloc_buffer((1,), "int32", scope="shared")
""" + "\n".join(f'{n} = T.alloc_buffer(({k},), "int32", scope="local")'
                 for n, k in (("ck", 1), ("fv", 3), ("gl", 3), ("st", 3), ("sq", 1), ("gn", 1), ("tr", 1))) + "\n"


def sync_head() -> str:
    """Thread 0, as the block starts: its groups of output rows (up to 3: its 256 positions'
    rows p % E may wrap past row E - 1) into gl, and in split 0 the loads the protocol
    decides on -- its own call count (ck) and the groups' fill counts (fv) -- issued beside the
    segment counts' and used only after the scan, so their latency hides behind it. Blocks of
    other splits, most of which hold nothing and leave at once (a block cannot retire before
    its loads land), load them only once they know they take part (:func:`sync_decide`)."""
    return f"""ck[0] = 0
if tid == 0:
    ga: T.int32 = bx * {THREADS} % T.max({{E}}, 1)
    gs: T.int32 = T.min({THREADS - 1}, T.max(T.max({{n_root}}, {{E}}), 1) - 1 - bx * {THREADS})
    gl[0] = ga // {THREADS}
    gl[1] = T.if_then_else(ga + gs < {{E}}, (ga + gs) // {THREADS}, ({{E}} - 1) // {THREADS})
    gl[2] = T.if_then_else(ga + gs < {{E}}, (ga + gs) // {THREADS}, T.min(ga + gs - {{E}}, {{E}} - 1) // {THREADS})
    if sp == 0 and 2 * ng + {{grid}} <= n_sync:
        ck[0] = {{ws}}[2 * ng + bs]
        for q in range(3):
            fv[q] = {{ws}}[ng + gl[q]]
"""


def sync_decide() -> str:
    """Thread 0 of a block that takes part: count this call (its call count + 1) and tell
    the block, through ``sf`` and the barrier after, whether a group of its rows is not yet
    filled in this call (fill count != ck + 1)."""
    return """if tid == 0:
    if 2 * ng + {grid} > n_sync:
        T.evaluate(T.call_extern("int32", "__trap"))
    if sp != 0:
        ck[0] = {ws}[2 * ng + bs]
        for q in range(3):
            fv[q] = {ws}[ng + gl[q]]
    {ws}[2 * ng + bs] = ck[0] + 1
    sq[0] = 0
    for q in range(3):
        if fv[q] != ck[0] + 1:
            sq[0] = 1
    sf[0] = sq[0]
"""


def sync_claim(c: Contraction) -> str:
    """After the barrier that follows :func:`sync_decide`: where a group is not yet filled,
    thread 0 claims each of the block's groups (claim count c -> c + 1, atomicCAS); the
    winner fills the group's rows (all threads, coalesced) and, after a barrier and a fence,
    sets its fill count to c + 1; the others spin on the fill count (atomic reads: a plain
    load in a loop may be hoisted) before the block adds anything."""
    G = c.G
    return f"""sq[0] = sf[0]
if sq[0] != 0:
    if tid == 0:
        for q in range(3):
            st[q] = 2
            if T.call_extern("int32", "atomicCAS", T.address_of({{ws}}[gl[q]]), ck[0], ck[0] + 1) == ck[0]:
                st[q] = 1
            sk[q] = st[q]
            sk[4 + q] = gl[q]
    T.tvm_storage_sync("shared")
    for q in range(3):
        sq[0] = sk[q]
        gn[0] = sk[4 + q]
        if sq[0] == 1:
            for fi in range({G}):
                fr: T.int32 = gn[0] * {THREADS} + (fi * {THREADS} + tid) // {G}
                fg: T.int32 = (fi * {THREADS} + tid) % {G}
                if fr < {{E}}:
                    {{fill_store}}
    T.tvm_storage_sync("shared")
    if tid == 0:
        T.evaluate(T.call_extern("int32", "__threadfence"))
        for q in range(3):
            if st[q] == 1:
                T.evaluate(T.call_extern("int32", "atomicExch", T.address_of({{ws}}[ng + gl[q]]), ck[0] + 1))
        for q in range(3):
            if st[q] == 2:
                tr[0] = 0
                while T.call_extern("int32", "atomicOr", T.address_of({{ws}}[ng + gl[q]]), 0) != ck[0] + 1:
                    tr[0] = tr[0] + 1
                    if tr[0] > {SPIN_LIMIT}:
                        T.evaluate(T.call_extern("int32", "__trap"))
        T.evaluate(T.call_extern("int32", "__threadfence"))
    T.tvm_storage_sync("shared")
"""


def sync_takes_part() -> str:
    """The condition under which a block runs the body (the scan, the protocol, the
    segments): it holds entries, or it must take part without any (split 0 of a group of
    positions below E, so every group of rows is reached in every call; its scan finds no
    segments). One copy of the protocol's code for both: a second copy for entry-less blocks
    made ptxas (at TVM's --register-usage-level=10) give the whole kernel 40 registers at
    G = 16 instead of 32."""
    return f"rv[0] != 0 or ({{E}} > 0 and sp == 0 and bx * {THREADS} < {{E}})"


def indent(text: str, spaces: int) -> str:
    """``text`` with every non-blank line moved right by ``spaces`` (to nest a piece of kernel text)."""
    return "\n".join((" " * spaces + line) if line.strip() else line for line in text.strip("\n").split("\n"))


def emit(printer, depth: int, nest, c: Contraction, dtype: str, reads: List[str], writes: str,
         splits: Optional[int] = None) -> None:
    """TVMScript of the contraction kernel, at ``depth`` of the operator's PrimFunc."""
    P = PREFIX
    root, spatial = f"v_{c.root}", f"v_{c.spatial}"
    part = partition(c, splits)
    x = slots(nest, c, dtype, reads, writes, part)
    x["store"] = (f'T.evaluate(T.call_extern("{dtype}", "atomicAdd", T.address_of('
                  f'{render(c.target, dtype, {root: P + "p", spatial: P + "g"})}), {P}acc[{P}a, {P}b]))' if c.atomic else
                  f"{render(c.target, dtype, {root: P + 'p', spatial: P + 'g'})} = {P}acc[{P}a, {P}b]")
    identity = f"{render(c.target, dtype, {root: P + 'p0', spatial: P + 'g'})} = T.{dtype}(0)"
    guard_p0 = ("True" if c.write_guard is None else
                render(c.write_guard, "int32", {root: P + "p0", spatial: P + "g"}))
    owned = "" if c.atomic else f"""
                if cnt[0] == 0:
                    for g in range({c.G}):
                        if {guard_p0}:
                            {identity}"""
    fill = nest.prologue
    head = decide = claim = ""
    takes_part = "rv[0] != 0"
    grid = f"(T.max({{n_root}}, 1) + {THREADS - 1}) // {THREADS} * {part.splits}"
    if fill is not None:  # the output's fill runs here first (lower.fuse_fill)
        x.update(sync_slots(c, fill, dtype, part))
        grid = "{grid}"
        head = "\n" + indent(sync_declarations() + sync_head(), 12)
        decide = "\n" + sync_decide().rstrip("\n")
        claim = "\n" + sync_claim(c).rstrip("\n")
        takes_part = sync_takes_part()
    text = f"""
for bs in T.thread_binding({grid}, thread="blockIdx.x"):
    for tid in T.thread_binding({THREADS}, thread="threadIdx.x"):
        with T.sblock("{{name}}"):
            T.reads({{reads}})
            T.writes({{writes}})
            bx: T.int32 = bs // {part.splits}
            sp: T.int32 = bs % {part.splits}
{indent(declarations(c), 12)}
            p0: T.int32 = bx * {THREADS} + tid
            lp[0] = -1
            cnt[0] = 0
            if p0 < {{n_root}}:
                cnt[0] = {{count_p0}}{owned}{head}
            sc[tid] = T.if_then_else({{holds}}, 1, 0)
            rv[0] = T.call_extern("int32", "__syncthreads_or", T.if_then_else({{holds}}, 1, 0))
            if {takes_part}:
{indent(segments_body(c, part, decide, claim), 16)}
"""
    if fill is not None and FUSED_MIN_BLOCKS:
        text = _min_blocks(text, FUSED_MIN_BLOCKS)
    for line in _fill(text, x).strip("\n").split("\n"):
        printer(depth, line)


def _min_blocks(text: str, blocks: int) -> str:
    """``text`` with the block's body under a launch bound of ``blocks`` resident blocks per
    SM (TVM's ``tirx.launch_bounds_min_blocks_per_sm``, read inside the thread binding)."""
    lines = text.split("\n")
    at = next(i for i, line in enumerate(lines) if 'thread="threadIdx.x"' in line) + 1
    pad = " " * (len(lines[at]) - len(lines[at].lstrip()))
    bound = f'{pad}with T.attr(0, "tirx.launch_bounds_min_blocks_per_sm", {blocks}):'
    return "\n".join(lines[:at] + [bound] + [("    " + line) if line.strip() else line for line in lines[at:]])
