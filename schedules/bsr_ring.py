"""Tensor Core SpMM for BSR weights at few columns of B (8-64, a multiple of 8): ``C = A @ B``
with A a ``formats.bsr`` instance of float16 r x c blocks (r and c multiples of 16), B (K, N)
float16 and C (M, N) float32, N fixed when the kernel is built.

At a few columns of B the weight's blocks and B's rows for them are all there is to move,
and what held the earlier kernels (``bsr_stream``: B's rows for the CTA's part of K
resident; the block-row template) to a quarter of cuBLAS's byte rate was waiting: each warp
copied and then waited for its own blocks. Here a CTA owns one block row (or, in a cluster,
an even share of its stored blocks) and splits the work by role:

* **a producer warp** walks the row's stored blocks a ring of ``stages`` ahead: for each
  block it copies the block and B's ``c`` rows it meets (16-byte ``cp.async`` into rows
  padded so ``ldmatrix`` reads hit distinct banks; rows past K zero-filled), and signals
  the stage's ``mbarrier`` when its copies land (``cp.async.mbarrier.arrive.noinc``), with
  ``per_stage`` blocks a stage so short blocks amortise the handshake;
* or, with ``tma=1`` (the default wherever the shapes allow), **one lane of it issues TMA
  tensor copies**: one a stage for its blocks (consecutive in ``values``) and one a block
  for B's rows, into 1024-byte aligned stages that the copy engine swizzles (so ``ldmatrix``
  needs no padding), arming the stage's barrier with their byte count; the tensor maps are
  encoded on the host at every call and passed as grid constants (CUDA probe first:
  ``benchmarks/probe_bsr_tma.py``, ``results/probe_bsr_tma_H200.json``);
* **consumer warps** wait on the stage's barrier, multiply (``ldmatrix`` + ``mma.m16n8k16``
  into float32 accumulators; warp w takes 16 of the block's rows and a group of columns)
  and release the stage to the producer through a second barrier;
* **``cluster`` CTAs split a block row's stored blocks evenly** and add their partial tiles
  through distributed shared memory (one launch, no atomics, no C to zero first);
  **``col_split`` CTAs split B's columns** (more CTAs for short rows);
* **``teams`` of consumer warps split a row's walk inside the CTA**: stage j goes to team
  j % teams (``stages`` a multiple of ``teams``, so a ring slot always feeds one team and
  no team waits a phase ahead) and the teams add their partial tiles in shared memory
  after one CTA barrier, a long row split without a cluster's barriers and its launch.
  Measured, it does not pay (H200, ``benchmarks/results/bsr_small_feat_teams_H200.json``,
  27 cases: MiniLM's layers and random 70 % weights at 16 and 64 columns): the best set with
  2 or 4 teams was below the best one-team kernel, the default dispatch included, in 26 and
  level with it in one (0.82 against 0.81x dense); against the same ring with one team it was
  within 0.02x dense at best. So it stays a knob the tuner's full space holds and the
  defaults leave at 1.

Measured against the design first as CUDA (``benchmarks/probe_bsr_bulk.py``, results
``benchmarks/results/probe_bsr_bulk_r3_H200.json``). The kernel trusts its operands (a
``formats.bsr`` instance's own arrays; ``sparsec.compile``'s kernel checks them) and needs
``values`` and B 16-byte aligned (``sparsec``'s calls copy a misaligned view first).
"""
from __future__ import annotations

from types import SimpleNamespace

from .stream_mma import PAD, cluster_sum, mma_ops, sum_share
from .warp_mma import check_knobs, check_sizes, compile_for

SMEM_LIMIT = 227 * 1024  # shared memory one CTA may take on sm_90
KNOBS = {"warps": (2, 4, 1, 8), "stages": (4, 8, 2), "cluster": (1, 2, 4, 8), "per_stage": (1, 2, 4),
         "col_split": (1, 2, 4), "teams": (1, 2, 4), "tma": (1, 0)}
# tma=1: the producer's copies are TMA tensor copies into swizzled stages (below); the byte
# width of a row of a block (c halves) or of B's rows for it (a CTA's nb columns) picks the
# copy engine's swizzle pattern, whose 16-byte chunk index (address bits 4-6) is XORed with
# address bits 7-9 under this mask, so ldmatrix's eight rows land in distinct banks
# (a stage's box of per_stage x r rows stays within the copy engine's 256)
SWIZZLE = {16: (0, 0x00), 32: (1, 0x10), 64: (2, 0x30), 128: (3, 0x70)}  # row bytes: (driver enum, mask)
MAX_FEAT = 64  # wider B: the block-row template, whose gathers of B are then worth their bytes
# a matrix of at most this many stored blocks has its whole ``indices`` copied into shared
# memory by every CTA in the same round trip as its ``indptr`` entries, so the producer's
# first copies wait on one dependent load from memory instead of two (at a few microseconds a
# call, on layers of a few hundred blocks, a trip to memory is a sixth of the time)
INDEX_CACHE = 1024
SKEWED = 1.75  # longest block row over the mean from which default_knobs splits rows 8 ways


def takes(block, feat: int) -> bool:
    """Whether the kernel takes blocks of this shape at ``feat`` columns of B (16-byte rows;
    16, 32 or 64 block rows, which its 1-8 consumer warps split into 16-row tiles)."""
    r, c = (int(b) for b in block)
    return r in (16, 32, 64) and c % 16 == 0 and 16 <= c <= 128 and 8 <= feat <= MAX_FEAT and feat % 8 == 0


def plan(block, feat: int, warps: int, stages: int, cluster: int, per_stage: int, col_split: int,
         teams: int = 1, tma: int = 0) -> SimpleNamespace:
    """The kernel's sizes, checked: ValueError naming the first thing it cannot take."""
    r, c = (int(b) for b in block)
    if r % 16 or not 16 <= r <= 64:
        raise ValueError(f"block rows should be 16, 32, 48 or 64 (16 rows an MMA), got {r}")
    if c % 16 or not 16 <= c <= 128:
        raise ValueError(f"block columns should be a multiple of 16 up to 128 (the MMA's k-step), got {c}")
    check_sizes(feat=feat, warps=warps, stages=stages, cluster=cluster, per_stage=per_stage, col_split=col_split,
                teams=teams)
    check_knobs({"warps": warps, "stages": stages, "cluster": cluster, "per_stage": per_stage,
                 "col_split": col_split, "teams": teams, "tma": tma}, KNOBS)
    if teams > 1 and cluster > 1:
        raise ValueError(f"teams={teams} with cluster={cluster}: a row's walk is split either by teams of "
                         f"consumer warps in one CTA or by the CTAs of a cluster, not both")
    if warps * teams > 31:
        raise ValueError(f"warps={warps} x teams={teams} consumer warps and the producer pass a CTA's 32 warps")
    if stages % teams:
        raise ValueError(f"stages={stages} should be a multiple of teams={teams} (a ring slot always feeds the "
                         f"same team, so a team never waits a phase ahead)")
    if feat % 8 or feat > MAX_FEAT:
        raise ValueError(f"feat should be a multiple of 8 up to {MAX_FEAT} (B's rows copied 16 bytes at a "
                         f"time), got {feat}")
    if feat % (8 * col_split):
        raise ValueError(f"col_split={col_split} leaves a CTA {feat / col_split:g} of feat={feat} columns, "
                         f"not a multiple of 8")
    mt = r // 16
    if warps % mt:
        raise ValueError(f"warps={warps} should be a multiple of the block's {mt} 16-row tiles (block {r}x{c})")
    nb = feat // col_split
    groups = warps // mt
    if (nb // 8) % groups:
        raise ValueError(f"warps={warps} on a {r}-row block make {groups} column groups, which do not split a "
                         f"CTA's {nb} columns into 8-column tiles: take fewer warps or a smaller col_split")
    if tma:
        if c * 2 not in SWIZZLE or nb * 2 not in SWIZZLE:
            raise ValueError(f"tma=1 copies rows of a block ({c} columns) and of B ({nb} columns a CTA) of 16, 32, 64 "
                             f"or 128 bytes (the copy engine's swizzle spans): take tma=0")
    p = SimpleNamespace(r=r, c=c, feat=feat, W=warps, D=stages, S=cluster, G=per_stage, NS=col_split, nb=nb,
                        mt=mt, groups=groups, ntw=nb // 8 // groups, ks=c // 16, apitch=c + PAD, bpitch=nb + PAD,
                        TM=teams, threads=(warps * teams + 1) * 32, tma=bool(tma))
    p.a_halves = r * p.apitch
    p.block_halves = p.a_halves + c * p.bpitch
    p.stage_halves = per_stage * p.block_halves
    p.ring_halves = stages * p.stage_halves
    if tma:  # a stage: its blocks in one box, then B's rows for each, each region 1024-byte aligned
        p.a_bytes = per_stage * r * c * 2
        p.b_bytes = c * nb * 2
        p.a_region = -(-p.a_bytes // 1024) * 1024
        p.b_region = -(-p.b_bytes // 1024) * 1024
        p.stage_bytes = p.a_region + per_stage * p.b_region
        p.ring_halves = (stages * p.stage_bytes + 1024) // 2  # + the slack that aligns the ring
        p.a_swizzle, p.a_mask = SWIZZLE[c * 2]
        p.b_swizzle, p.b_mask = SWIZZLE[nb * 2]
    p.red = r * nb  # floats of a CTA's partial tile (cluster reduction; a team's, summed in the CTA)
    p.red_halves = 2 * p.red * (teams if teams > 1 else (1 if cluster > 1 else 0))
    p.bar_halves = 8 * stages  # full and empty barriers, 8 bytes each
    p.idx_halves = 2 * INDEX_CACHE  # int32 block columns of a small matrix
    p.idx_iters = -(-INDEX_CACHE // p.threads)
    p.smem = (p.ring_halves + p.red_halves + p.bar_halves + p.idx_halves) * 2
    p.a_chunks = r * c // 8  # 16-byte chunks of a block
    p.b_chunks = c * nb // 8  # of B's rows for it
    if p.smem > SMEM_LIMIT:
        raise ValueError(f"block {r}x{c} with stages={stages}, per_stage={per_stage} and {nb} columns a CTA needs "
                         f"{p.smem} bytes of shared memory, over {SMEM_LIMIT}: take fewer stages or blocks a stage")
    return p


def _fits(block, feat, knobs) -> bool:
    try:
        plan(block, feat, **knobs)
    except ValueError:
        return False
    return True


def default_knobs(block, feat: int, rows: int = 0, cols: int = 0, density: float = 0.3, fixed=None,
                  skew: float = 1.0) -> dict:
    """A rule fitted to the H200 probe's sweep (``probe_bsr_bulk_r3_H200.json``: 54 cases,
    every variant timed; this rule's pick is within 4.5 % of each case's best on geomean,
    41 % at worst). B's columns split in two at 32+ columns where there are fewer than 64
    block rows or the blocks have 64 rows; a block row's stored blocks split across a
    cluster of 4 where the row moves 12K+ halves (its blocks and B's rows for them) and the
    grid stays under 400 CTAs; two
    warps a 16-row tile up to 32-row blocks, one for 64; four blocks a stage on walks of 24+
    blocks, two on walks of 2+ (64-row blocks: one). ``rows`` x ``cols`` default to 4096 x
    4096; ``fixed``: knobs already chosen.

    ``skew``: the longest block row's stored blocks over the mean (1 where unknown). The
    probe's rows were even; a real pruned weight's are not (MiniLM's FFN-out at 70 %: the
    longest row 1.8-2.3x the mean), and the longest walk then sets the time: a cluster of 8
    instead of 4 from :data:`SKEWED` on (H200, MiniLM layer 0 FFN-out, blocks 16/32/64 at
    70 %, 16 and 64 columns: 6-19 % less time than a cluster of 4 in 6 of 6, the two
    timed in separate runs of one session, ``bsr_small_feat_minilm_sweeps_H200.json``)."""
    r, c = (int(b) for b in block)
    fixed = dict(fixed or {})
    rows, cols = rows or 4096, cols or 4096
    nbr = max(-(-rows // r), 1)
    per_row = max(-(-cols // c), 1) * max(min(float(density), 1.0), 0.0)  # stored blocks a block row
    # 64-row blocks split B's columns before they split a row's blocks: a cluster's partial
    # tiles are 64 x F fp32 there, and summing them through distributed shared memory costs more
    # than reading each block twice (H200, random 4096 x 4096, 64 x 64 blocks at 70 %, 64
    # columns: columns in two and a cluster of 2 take 8.56 us, a cluster of 4 10.81 us, dense
    # 10.71; results/bsr_ring_b64_split_H200.json)
    col_split = fixed.get("col_split", 2 if feat >= 32 and feat % 16 == 0 and (nbr < 64 or r >= 64) else 1)
    nb = max(feat // col_split, 1)
    moved = per_row * (r * c + c * nb) / 1024  # thousands of halves a block row moves
    # where 4 a row would pass 400 CTAs (many block rows), long walks still split in two: on the
    # H200 a cluster of 2 beat 1 on all 18 cases timed (random 4096 x 4096, 1024 x 4096 and BERT's
    # 768 x 3072 at 70 %, blocks 16-64, 16 and 64 columns; 4096 x 4096 at 64 columns: 1.12-1.16x
    # dense against 0.73-1.09x, results/bsr_small_feat_ring_clusters_H200.json)
    cluster = fixed.get("cluster", (4 if nbr * col_split * 4 <= 400 else 2) if moved >= 12 else 1)
    if cluster == 4 and "cluster" not in fixed and skew >= SKEWED and nbr * col_split * 8 <= 400:
        cluster = 8
    mt = r // 16
    warps = fixed.get("warps")
    if warps is None:
        warps = next((w for w in ((2 * mt, mt) if mt < 4 else (mt,)) if w in KNOBS["warps"]
                      and _fits(block, feat, {"warps": w, "stages": 2, "cluster": 1, "per_stage": 1,
                                              "col_split": col_split})), mt)
    walk = per_row / cluster
    per_stage = fixed.get("per_stage", 1 if mt == 4 else (4 if walk >= 24 else (2 if walk >= 2 else 1)))
    knobs = {"warps": warps, "stages": fixed.get("stages", 4), "cluster": cluster, "per_stage": per_stage,
             "col_split": col_split, "teams": fixed.get("teams", 1), "tma": fixed.get("tma", 0)}
    while not _fits(block, feat, knobs) and knobs["per_stage"] > 1 and "per_stage" not in fixed:
        knobs["per_stage"] //= 2
    while not _fits(block, feat, knobs) and knobs["stages"] > 2 and "stages" not in fixed:
        knobs["stages"] //= 2
    if "tma" not in fixed:  # tensor copies wherever their boxes and swizzles take the shapes
        knobs["tma"] = 1 if _fits(block, feat, {**knobs, "tma": 1}) else 0
    return knobs


def spmm(block=(32, 32), feat: int = 64, warps: int = 4, stages: int = 4, cluster: int = 1, per_stage: int = 1,
         col_split: int = 1, teams: int = 1, tma: int = 0, name: str = "bsr_ring"):
    """The PrimFunc ``name(indptr, indices, values, B, C)``: ``indptr`` (int32, block rows +
    1), ``indices`` (int32, block columns) and ``values`` (float16, the blocks row-major one
    after another) as ``formats.bsr`` stores them; B (K, feat) float16; C (M, feat) float32,
    written whole (no zero fill before). M and K are read from the operands."""
    from tvm.script import tirx as T

    p = plan(block, feat, warps, stages, cluster, per_stage, col_split, teams, tma)
    tma = bool(tma)  # TVMScript takes a Python bool as a branch decided when the function is built
    R, Cb, W, D, S, G, NS, nb, TM = p.r, p.c, p.W, p.D, p.S, p.G, p.NS, p.nb, p.TM
    AP, BP, MT, ntw = p.apitch, p.bpitch, p.mt, p.ntw
    cp, ldm, ldm_t, ldm_t2, mma = mma_ops()
    arrive_copies = T.ptx["cp.async.mbarrier.arrive.noinc.shared::cta.b64"]
    arrive = T.ptx["mbarrier.arrive.shared::cta.b64"]
    expect_bytes = T.ptx["mbarrier.arrive.expect_tx.shared::cta.b64"]
    tensor_copy = T.ptx["cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"]
    ld_idx, st_idx = T.ptx["ld.shared.s32"], T.ptx["st.shared.b32"]
    fence_async = T.ptx["fence.proxy.async.shared::cta"]
    full_mask = T.uint32(0xFFFFFFFF)
    sum_each = sum_share(p.red, S, p.threads)
    sum_cluster = cluster_sum(p.red, nb, feat, p.threads, S) if S > 1 else None
    a_iters = -(-p.a_chunks // 32)
    b_iters = -(-p.b_chunks // 32)
    per8 = nb // 8  # 16-byte chunks of a row of B's stage

    def sum_teams(Red, e):
        total = Red[e]
        for t in range(1, TM):
            total = total + Red[t * p.red + e]
        return total

    def at(base, halves):
        """A shared address ``halves`` float16 past ``base`` (held in a register: TVM's
        barrier planner does not see these accesses)."""
        return base + T.Cast("uint32", halves * 2)

    @T.macro
    def produce(sb, win, indices, values, B, K, q0, cnt, f0, j, tx, cached):
        """Copy stage ``j``'s blocks (``per_stage`` of them from the CTA's ``j * per_stage``-th)
        and B's rows for each; signal the stage's full barrier when they land. A block's
        copies go out before its column is read (they need only ``indptr``); ``cached``: the
        columns are in shared memory (at ``sb[2]``), else a window of 32 is loaded and shuffled."""
        s = T.meta_var(j % D)
        if j >= D:
            T.cuda.mbarrier_wait(sb[1] + T.Cast("uint32", (D + s) * 8), (j // D - 1) % 2)  # consumers done with it
        for g in T.unroll(G):
            i = T.meta_var(j * G + g)
            base = T.meta_var(s * p.stage_halves + g * p.block_halves)
            if i < cnt:
                for it in T.unroll(a_iters):
                    e = T.meta_var(it * 32 + tx)
                    if e < p.a_chunks:
                        cp(at(sb[0], base + e // (Cb // 8) * AP + e % (Cb // 8) * 8),
                           values.access_ptr("r", offset=(q0 + i) * (R * Cb) + e * 8, extent=8), 16, T.uint32(16))
            if cached:
                if i < cnt:
                    ld_idx(win[1], sb[2] + T.Cast("uint32", (q0 + i) * 4))
            else:
                if i % 32 == 0:
                    win[0] = T.if_then_else(i + tx < cnt, indices[T.min(q0 + i + tx, indices.shape[0] - 1)], 0)
                win[1] = T.call_extern("int32", "__shfl_sync", full_mask, win[0], i % 32)
            if i < cnt:
                for it in T.unroll(b_iters):
                    e = T.meta_var(it * 32 + tx)
                    k = T.meta_var(win[1] * Cb + e // per8)
                    if e < p.b_chunks:
                        cp(at(sb[0], base + p.a_halves + e // per8 * BP + e % per8 * 8),
                           B.access_ptr("r", offset=T.min(k, K - 1) * feat + f0 + e % per8 * 8, extent=8), 16,
                           T.Cast("uint32", T.if_then_else(k < K, 16, 0)))
        arrive_copies(sb[1] + T.Cast("uint32", s * 8))

    @T.macro
    def produce_tma(sb, win, cols, indices, q0, cnt, f0, j, tx, cached, map_a, map_b):
        """Stage ``j`` by tensor copies (tma=1): every lane reads the stage's block columns
        (a window of 32 shuffled, or shared memory), lane 0 waits for the slot, arms the
        stage's full barrier with its byte count and issues one copy of the stage's blocks
        (consecutive in ``values``) and one of B's ``c`` rows for each block (rows past K
        zero-filled by the copy engine)."""
        s = T.meta_var(j % D)
        for g in T.unroll(G):
            i = T.meta_var(j * G + g)
            if cached:
                if i < cnt:
                    ld_idx(cols[g], sb[2] + T.Cast("uint32", (q0 + i) * 4))
            else:
                if i % 32 == 0:
                    win[0] = T.if_then_else(i + tx < cnt, indices[T.min(q0 + i + tx, indices.shape[0] - 1)], 0)
                cols[g] = T.call_extern("int32", "__shfl_sync", full_mask, win[0], i % 32)
        if tx == 0:
            if j >= D:
                T.cuda.mbarrier_wait(sb[1] + T.Cast("uint32", (D + s) * 8), (j // D - 1) % 2)  # consumers done with it
            full = T.meta_var(sb[1] + T.Cast("uint32", s * 8))
            stage = T.meta_var(sb[0] + T.Cast("uint32", s * p.stage_bytes))
            expect_bytes(full, T.Cast("uint32", p.a_bytes + T.min(G, cnt - j * G) * p.b_bytes))
            tensor_copy(stage, T.address_of(map_a), 0, (q0 + j * G) * R, full)
            for g in T.unroll(G):
                if j * G + g < cnt:
                    tensor_copy(stage + T.uint32(p.a_region + g * p.b_region), T.address_of(map_b), f0,
                                cols[g] * Cb, full)
        T.evaluate(T.call_extern("void", "__syncwarp", full_mask))

    def swizzled(base, offset, mask):
        """``base`` (a 1024-byte aligned shared address) plus ``offset`` bytes as the copy engine
        laid them out: 16-byte chunk bits 4-6 XORed with bits 7-9 under ``mask``."""
        return base + T.Cast("uint32", offset ^ ((offset >> 3) & mask))

    def a_row(sb, s, g, mi, kk, tx):
        """Lane tx's ldmatrix row of stage s's block g: 16-row tile mi, k-step kk (padded rows
        from cp.async, or the copy engine's swizzled ones)."""
        row, k0 = mi * 16 + tx % 16, kk * 16 + tx // 16 * 8
        if p.tma:
            return swizzled(sb[0] + T.uint32(s * p.stage_bytes), (g * R + row) * (Cb * 2) + k0 * 2, p.a_mask)
        return at(sb[0], s * p.stage_halves + g * p.block_halves + row * AP + k0)

    def b_row(sb, s, g, kk, col, tx):
        """Lane tx's ldmatrix (transposed) row of B's rows for stage s's block g: k-step kk, the
        8 columns from ``col`` (a multiple of 8)."""
        row = kk * 16 + tx % 16
        if p.tma:
            return swizzled(sb[0] + T.uint32(s * p.stage_bytes + p.a_region + g * p.b_region),
                            row * (nb * 2) + col * 2, p.b_mask)
        return at(sb[0], s * p.stage_halves + g * p.block_halves + p.a_halves + row * BP + col)

    @T.macro
    def consume(sb, af, bf, acc, cnt, j, mi, n0, tx):
        """Wait for stage ``j``, multiply its blocks into the accumulators, release it."""
        s = T.meta_var(j % D)
        T.cuda.mbarrier_wait(sb[1] + T.Cast("uint32", s * 8), (j // D) % 2)
        for g in T.unroll(G):
            if j * G + g < cnt:
                for kk in T.unroll(p.ks):
                    ldm(af[0], af[1], af[2], af[3], a_row(sb, s, g, mi, kk, tx))
                    for t in T.unroll(ntw // 2):
                        ldm_t(bf[0], bf[1], bf[2], bf[3], b_row(sb, s, g, kk, n0 + t * 16 + tx // 16 * 8, tx))
                        for h in T.unroll(2):
                            a = T.meta_var((t * 2 + h) * 4)
                            mma(acc[a], acc[a + 1], acc[a + 2], acc[a + 3], af[0], af[1], af[2], af[3],
                                bf[h * 2], bf[h * 2 + 1], acc[a], acc[a + 1], acc[a + 2], acc[a + 3])
                    if ntw % 2 == 1:
                        ldm_t2(bf[0], bf[1], b_row(sb, s, g, kk, n0 + (ntw - 1) * 8, tx))
                        a = T.meta_var((ntw - 1) * 4)
                        mma(acc[a], acc[a + 1], acc[a + 2], acc[a + 3], af[0], af[1], af[2], af[3], bf[0], bf[1],
                            acc[a], acc[a + 1], acc[a + 2], acc[a + 3])
        if p.tma:  # ldmatrix reads (generic proxy) before the copy engine's refill (async proxy): bsr_tokens
            fence_async()  # lost refilled slots without it (H200, benchmarks/probe_bsr_tokens.py --repeat)
        T.evaluate(T.call_extern("void", "__syncwarp", full_mask))
        if tx == 0:
            arrive(sb[1] + T.Cast("uint32", (D + s) * 8))

    @T.prim_func(s_tir=True)
    def bsr_ring(i_h: T.handle, j_h: T.handle, v_h: T.handle, b_h: T.handle, c_h: T.handle):
        T.func_attr({"global_symbol": name, "tirx.noalias": True})
        n_ptr = T.int32()
        nnzb = T.int32()
        n_vals = T.int32()
        M = T.int32()
        K = T.int32()
        indptr = T.match_buffer(i_h, (n_ptr,), "int32")
        indices = T.match_buffer(j_h, (nnzb,), "int32")
        values = T.match_buffer(v_h, (n_vals,), "float16")
        B = T.match_buffer(b_h, (K, feat), "float16")
        C = T.match_buffer(c_h, (M, feat), "float32")
        nbr = T.meta_var(T.max(n_ptr - 1, 0))
        if tma:  # host side, every call: the tensor maps of the blocks (as rows of c) and of B
            map_a: T.let[T.TensorMap()] = T.tvm_stack_alloca("tensormap", 1)
            T.tensormap_encode_tiled(map_a, values.data, Cb, T.max(n_vals // Cb, 1), Cb * 2, Cb, G * R, 1, 1,
                                     descriptor_dtype="float16", rank=2, interleave=0, swizzle=p.a_swizzle,
                                     l2_promotion=2, oob_fill=0, force_cu_dtype=-1)
            map_b: T.let[T.TensorMap()] = T.tvm_stack_alloca("tensormap", 1)
            T.tensormap_encode_tiled(map_b, B.data, feat, T.max(K, 1), feat * 2, nb, Cb, 1, 1,
                                     descriptor_dtype="float16", rank=2, interleave=0, swizzle=p.b_swizzle,
                                     l2_promotion=2, oob_fill=0, force_cu_dtype=-1)
        bx = T.env_thread("blockIdx.x")
        ty = T.env_thread("threadIdx.y")
        tx = T.env_thread("threadIdx.x")
        T.launch_thread(bx, T.max(nbr, 1) * NS * S)
        if S > 1:
            cx = T.env_thread("clusterCtaIdx.x")
            T.launch_thread(cx, S)
        T.launch_thread(ty, W * TM + 1)
        T.launch_thread(tx, 32)
        # one dynamic buffer: the ring of stages, the partial tile (clusters), the barriers, the
        # columns of a small matrix's blocks
        Vs = T.alloc_buffer((p.ring_halves + p.red_halves + p.bar_halves + p.idx_halves,), "float16",
                            scope="shared.dyn",
                            align=128)
        Red = T.decl_buffer((max(p.red * TM, 1),), "float32", data=Vs.data, elem_offset=p.ring_halves // 2,
                            scope="shared.dyn")
        red_base = T.decl_buffer((max(p.red_halves, 1),), "float16", data=Vs.data, elem_offset=p.ring_halves,
                                 scope="shared.dyn")  # the partial tile's address, for distributed shared memory
        sb = T.alloc_buffer((3,), "uint32", scope="local")  # the ring's shared address, the barriers', the columns'.
        acc = T.alloc_buffer((ntw * 4,), "float32", scope="local")
        af = T.alloc_buffer((4,), "uint32", scope="local")
        bf = T.alloc_buffer((4,), "uint32", scope="local")
        # the CTA's first stored block, its count of them, its stages, its first column of B,
        # the block row's first and end stored block
        rng = T.alloc_buffer((6,), "int32", scope="local")
        # lane l: the column of the window's l-th block; the column of the block being copied
        win = T.alloc_buffer((2,), "int32", scope="local")
        cols = T.alloc_buffer((G,), "int32", scope="local")  # tma=1: the block columns of the stage being copied
        held = T.alloc_buffer((p.idx_iters,), "int32", scope="local")  # a thread's share of a small matrix's block columns
        mapped = T.alloc_buffer((1,), "uint64", scope="local")
        sums = T.alloc_buffer((sum_each,), "float32", scope="local")
        rank = T.meta_var(bx % S)
        br = T.meta_var(bx // S // NS)
        live = T.meta_var(br < nbr)
        cached = T.meta_var(T.And(nnzb > 0, nnzb <= INDEX_CACHE))
        tid = T.meta_var(ty * 32 + tx)
        sb[0] = T.call_extern("uint32", "__cvta_generic_to_shared", Vs.access_ptr("w"))
        sb[1] = sb[0] + T.uint32((p.ring_halves + p.red_halves) * 2)
        sb[2] = sb[1] + T.uint32(p.bar_halves * 2)
        if tma:  # the copy engine's swizzle follows address bits: stages start on 1024 bytes
            sb[0] = (sb[0] + T.uint32(1023)) & T.uint32(0xFFFFFC00)
        rng[3] = bx // S % NS * nb
        # the row's indptr entries and, for a small matrix, every block's column: loads that
        # do not depend on each other, in flight together (stored once all are issued)
        rng[4] = T.if_then_else(live, indptr[T.min(br, n_ptr - 1)], 0)
        rng[5] = T.if_then_else(live, indptr[T.min(br + 1, n_ptr - 1)], 0)
        if cached:
            for it in T.unroll(p.idx_iters):
                held[it] = indices[T.min(it * p.threads + tid, T.max(nnzb - 1, 0))]
            for it in T.unroll(p.idx_iters):
                if it * p.threads + tid < nnzb:
                    st_idx(sb[2] + T.Cast("uint32", (it * p.threads + tid) * 4), held[it])
        if tid == 0:
            for s in T.unroll(D):
                # the producer's 32 lanes (cp.async), or its lane 0 arming the byte count (tma)
                T.ptx.mbarrier.init.shared__cta.b64(sb[1] + T.uint32(s * 8), 1 if tma else 32)
                T.ptx.mbarrier.init.shared__cta.b64(sb[1] + T.uint32((D + s) * 8), W)  # a lane of each consumer
        T.tvm_storage_sync("shared")
        rng[0] = rng[4] + T.Cast("int32", T.Cast("int64", rng[5] - rng[4]) * rank // S)
        rng[1] = rng[4] + T.Cast("int32", T.Cast("int64", rng[5] - rng[4]) * (rank + 1) // S) - rng[0]
        rng[2] = (rng[1] + G - 1) // G
        if ty == W * TM:
            for j in range(rng[2]):
                if tma:
                    produce_tma(sb, win, cols, indices, rng[0], rng[1], rng[3], j, tx, cached, map_a, map_b)
                else:
                    produce(sb, win, indices, values, B, K, rng[0], rng[1], rng[3], j, tx, cached)
        else:
            team = T.meta_var(ty // W)  # stage j goes to team j % teams
            mi = T.meta_var(ty % W % MT)
            n0 = T.meta_var(ty % W // MT * ntw * 8)
            for i in T.unroll(ntw * 4):
                acc[i] = T.float32(0)
            for jj in range((rng[2] - team + TM - 1) // TM):
                consume(sb, af, bf, acc, rng[1], team + jj * TM, mi, n0, tx)
            for t in T.unroll(ntw):
                for h in T.unroll(2):
                    for e in T.unroll(2):
                        row = T.meta_var(mi * 16 + tx // 4 + h * 8)
                        col = T.meta_var(n0 + t * 8 + tx % 4 * 2 + e)
                        if S == 1 and TM == 1:
                            if T.And(live, br * R + row < M):
                                C[br * R + row, rng[3] + col] = acc[t * 4 + h * 2 + e]
                        else:
                            Red[team * p.red + row * nb + col] = acc[t * 4 + h * 2 + e]
        if TM > 1:  # the teams' partial tiles summed, C written row by row by every thread
            T.tvm_storage_sync("shared")
            for it in T.unroll(-(-p.red // p.threads)):
                e = T.meta_var(it * p.threads + tid)
                if e < p.red:
                    if T.And(live, br * R + e // nb < M):
                        C[br * R + e // nb, rng[3] + e % nb] = sum_teams(Red, e)
        if S > 1:
            if live:
                sum_cluster(C, red_base, mapped, sums, rank, br * R, rng[3], tid)

    return bsr_ring


def build(block=(32, 32), feat: int = 64, arch: str = "sm_90a", **knobs):
    """The compiled module (TVM executable) of :func:`spmm` for ``arch``."""
    return compile_for(spmm(block, feat, **knobs), arch)
