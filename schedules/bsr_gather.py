"""Tensor Core SpMM for BSR weights at few columns of B on short walks: ``C = A @ B`` with A
a ``formats.bsr`` instance of float16 r x c blocks, B (K, N) float16 and C (M, N) float32,
N (8-64, a multiple of 8) fixed when the kernel is built.

On a small layer (MiniLM's 384-column weights: dense cuBLAS takes ~3 us) what decides the
time is how many dependent trips to memory the longest block row waits on, and how many
bytes one SM moves for it. A block-pruned real weight keeps some rows whole (MiniLM's
attention-Q at 90 %: a row of all 24 blocks among rows of ~2), so:

* **a CTA owns a block row and its ``warps`` split the row's stored blocks** (warp w:
  blocks w, w + W, ...), each warp issuing the copies of up to ``per_warp`` blocks at once:
  the block (16-byte ``cp.async``) and its column in one trip after ``indptr``, B's rows
  for it in the next, so the whole row is in flight together; the warp then multiplies
  every row tile of its blocks (``ldmatrix`` + ``mma.m16n8k16`` into float32) and the warps'
  partial tiles are added in shared memory;
* **a row of ``heavy`` or more stored blocks has its columns of B split across ``split``
  CTAs**, so a dense row's bytes go through several SMs, while shorter rows stay whole in
  one CTA (A read once; the other CTAs of the row exit at once).

Designed and measured first as CUDA (``benchmarks/probe_bsr_lean.py``, the ``bsr_split``
kernel; ``benchmarks/results/probe_bsr_lean_r3_H200.json``): on MiniLM's FFN-in and
attention-Q weights at 64 columns 0.81-1.00x dense against the block-row template's
0.71-0.98x (separate runs of one session), at 16 columns 0.96-1.34x. This TIR kernel,
checked on the H200 (``results/check_bsr_gather_H200.json``), is ``sparsec.compile``'s
default for up to 64 columns on matrices of short rows and is reached by its own knobs
elsewhere (``schedules.bsr_dispatch``). The kernel trusts its operands (a ``formats.bsr``
instance's own arrays) and needs ``values`` and B 16-byte aligned.
"""
from __future__ import annotations

from types import SimpleNamespace

from .stream_mma import PAD, mma_ops
from .warp_mma import check_knobs, check_sizes, compile_for

SMEM_LIMIT = 227 * 1024  # shared memory one CTA may take on sm_90
FEW_BLOCK_ROWS = 32  # from 64 columns: at most this many block rows split a long row 4 ways
KNOBS = {"warps": (8, 4, 2, 16), "per_warp": (4, 2, 1), "split": (1, 2, 4), "heavy": (1, 2, 4, 8, 16, 32)}
MAX_FEAT = 64
MAX_TILES = 16  # 16 x 8 accumulator tiles a warp holds (64 registers)


def red_pitch(fw: int) -> int:
    """Floats a row of a warp's partial tile takes in shared memory: ``fw`` padded so that the
    rows a warp's store instruction touches (8 rows, 4 lanes a row) start 8 banks apart. An
    unpadded 64-column tile puts all 8 rows on one bank (8-way conflicts); on the H200 the
    partial tiles' stores then took ~900 cycles of a 16 x 64 tile's CTA and ~500 padded
    (``benchmarks/probe_bsr_baked.py --timeline``, ``results/probe_bsr_baked_timeline_H200.json``)."""
    return fw if fw % 16 == 8 else fw + 8


def held_columns(feat: int, split: int, heavy: int) -> int:
    """Columns of B a CTA holds accumulators for: a share of them when every row is split
    (``heavy`` = 1: an empty row's CTAs write their shares of zeros too), else all ``feat``
    (a light row takes every column in one CTA)."""
    return feat // split if heavy == 1 else feat


def takes(block, feat: int) -> bool:
    """Whether the kernel takes blocks of this shape at ``feat`` columns of B with every
    column in one CTA (the defaults' region)."""
    r, c = (int(b) for b in block)
    return (r % 16 == 0 and 16 <= r <= 64 and c % 16 == 0 and 16 <= c <= 128 and 8 <= feat <= MAX_FEAT
            and feat % 8 == 0 and r // 16 * feat // 8 <= MAX_TILES)


def plan(block, feat: int, warps: int, per_warp: int, split: int, heavy: int) -> SimpleNamespace:
    """The kernel's sizes, checked: ValueError naming the first thing it cannot take."""
    r, c = (int(b) for b in block)
    if r % 16 or not 16 <= r <= 64:
        raise ValueError(f"block rows should be 16, 32, 48 or 64 (16 rows an MMA), got {r}")
    if c % 16 or not 16 <= c <= 128:
        raise ValueError(f"block columns should be a multiple of 16 up to 128 (the MMA's k-step), got {c}")
    check_sizes(feat=feat, warps=warps, per_warp=per_warp, split=split, heavy=heavy)
    check_knobs({"warps": warps, "per_warp": per_warp, "split": split, "heavy": heavy}, KNOBS)
    if feat % 8 or feat > MAX_FEAT:
        raise ValueError(f"feat should be a multiple of 8 up to {MAX_FEAT} (B's rows copied 16 bytes at a "
                         f"time), got {feat}")
    if feat % (8 * split):
        raise ValueError(f"split={split} leaves a CTA {feat / split:g} of feat={feat} columns, not a multiple of 8")
    mt = r // 16
    held = held_columns(feat, split, heavy)
    if mt * held // 8 > MAX_TILES:
        raise ValueError(f"a warp holds every row tile of its blocks: {r}-row blocks at {held} columns a CTA "
                         f"make {mt * held // 8} accumulator tiles, over {MAX_TILES} (split every row with "
                         f"heavy=1, or bsr_ring or the block-row template take them)")
    p = SimpleNamespace(r=r, c=c, feat=feat, W=warps, G=per_warp, S=split, H=heavy, mt=mt, ks=c // 16,
                        apitch=c + PAD, threads=warps * 32)
    p.a_halves = r * p.apitch
    p.slot_halves = p.a_halves + c * (feat + PAD)  # a block and B's rows for it, all columns
    p.slots_halves = warps * per_warp * p.slot_halves
    p.red_floats = warps * r * red_pitch(feat)  # the warps' partial tiles, over the slots once they are done
    p.smem = max(p.slots_halves * 2, p.red_floats * 4)
    p.a_chunks = r * c // 8
    if p.smem > SMEM_LIMIT:
        raise ValueError(f"block {r}x{c} with warps={warps}, per_warp={per_warp} at {feat} columns needs "
                         f"{p.smem} bytes of shared memory, over {SMEM_LIMIT}: take fewer warps or blocks a warp")
    return p


def default_knobs(block, feat: int, rows: int = 0, cols: int = 0, density: float = 0.3, fixed=None) -> dict:
    """The probes' best sets. 8 warps with 4 blocks each on 16-row blocks, 4 warps
    otherwise (``probe_bsr_lean_r3_H200.json``). Below 32 columns a long row is split 2 ways
    on blocks of 32 rows or more and not on 16 (MiniLM's 384-column weights at 16 columns:
    split=2 beat split=1 in 11 of 12 cases of 32- and 64-row blocks and in none of 6 of
    16-row blocks, ``results/bsr_small_feat_gather_H200.json``); from 32 columns 4 ways on
    16-row blocks, 2 on larger, with a row of 1.5x the mean stored blocks or more counted
    long. From 64 columns a row of the mean or more (at least 4) counted long, split 4 ways
    where there are at most ``FEW_BLOCK_ROWS`` block rows (the CTAs are few) and 2 ways
    otherwise: within 1.09x of the best of 28 sets on 9 MiniLM cases, against up to 1.17x
    for the 32-column rule (``results/sweep_bsr_gather64_H200.json``). On the 48 block rows
    of FFN-in 32x32 70 % 4 ways gave 0.86x dense and 2 ways 0.99x in two suite runs of one
    session (the second in ``results/bsr_small_feat_H200.json``). ``fixed``: knobs already
    chosen."""
    r, c = (int(b) for b in block)
    fixed = dict(fixed or {})
    cols = cols or 4096
    mean = max(-(-cols // c), 1) * max(min(float(density), 1.0), 0.0)
    if feat >= 64:
        split = 4 if rows and -(-rows // r) <= FEW_BLOCK_ROWS else 2
        heavy = max(4, next((h for h in KNOBS["heavy"] if h >= mean), KNOBS["heavy"][-1]))
    else:
        split = (4 if r == 16 else 2) if feat >= 32 else (1 if r == 16 else 2)
        heavy = next((h for h in KNOBS["heavy"] if h >= 1.5 * mean), KNOBS["heavy"][-1])
    knobs = {"warps": fixed.get("warps", 8 if r == 16 else 4), "per_warp": fixed.get("per_warp", 4),
             "split": fixed.get("split", split), "heavy": fixed.get("heavy", heavy)}
    if feat % (8 * knobs["split"]) and "split" not in fixed:
        knobs["split"] = 1
    while knobs["per_warp"] > 1 and "per_warp" not in fixed:
        try:
            plan(block, feat, **knobs)
            break
        except ValueError:
            knobs["per_warp"] //= 2
    return knobs


def spmm(block=(16, 16), feat: int = 64, warps: int = 8, per_warp: int = 4, split: int = 1, heavy: int = 8,
         name: str = "bsr_gather"):
    """The PrimFunc ``name(indptr, indices, values, B, C)``: ``indptr`` (int32, block rows +
    1), ``indices`` (int32, block columns) and ``values`` (float16, the blocks row-major one
    after another) as ``formats.bsr`` stores them; B (K, feat) float16; C (M, feat) float32,
    written whole (no zero fill before). M and K are read from the operands."""
    from tvm.script import tirx as T

    p = plan(block, feat, warps, per_warp, split, heavy)
    R, Cb, W, G, S, MT, AP = p.r, p.c, p.W, p.G, p.S, p.mt, p.apitch
    cp, ldm, ldm_t, ldm_t2, mma = mma_ops()
    commit = T.ptx["cp.async.commit_group"]
    wait = T.ptx["cp.async.wait_group"]
    full_mask = T.uint32(0xFFFFFFFF)
    a_iters = -(-p.a_chunks // 32)

    def at(base, halves):
        """A shared address ``halves`` float16 past ``base`` (held in a register: TVM's
        barrier planner does not see these accesses)."""
        return base + T.Cast("uint32", halves * 2)

    def syncwarp():
        return T.evaluate(T.call_extern("void", "__syncwarp", full_mask))

    def sum_warps(Red, at_row, red):
        """Element ``at_row`` of the warps' partial tiles (``red`` floats each), added."""
        total = Red[at_row]
        for w in range(1, W):
            total = total + Red[w * red + at_row]
        return total

    def part(FW):
        """The macro that computes columns [f0, f0 + FW) of the CTA's block row."""
        NTW, PW = FW // 8, FW + PAD
        b_chunks = Cb * FW // 8
        b_iters = -(-b_chunks // 32)
        per8 = FW // 8
        RP = red_pitch(FW)
        red = R * RP

        @T.macro
        def row_part(sb, acc, af, bf, col, Red, indices, values, B, C, K, M, q0, cnt, row0, f0, ty, tx):
            for i in T.unroll(MT * NTW * 4):
                acc[i] = T.float32(0)
            for rd in range((cnt + W * G - 1) // (W * G)):
                for g in T.unroll(G):  # this warp's blocks of the round, and their columns: one trip
                    i = T.meta_var(ty + (rd * G + g) * W)
                    slot = T.meta_var((ty * G + g) * p.slot_halves)
                    col[g] = 0
                    if i < cnt:
                        for it in T.unroll(a_iters):
                            e = T.meta_var(it * 32 + tx)
                            if e < p.a_chunks:
                                cp(at(sb[0], slot + e // (Cb // 8) * AP + e % (Cb // 8) * 8),
                                   values.access_ptr("r", offset=(q0 + i) * (R * Cb) + e * 8, extent=8), 16,
                                   T.uint32(16))
                        col[g] = indices[q0 + i]
                for g in T.unroll(G):  # B's rows for them: the next
                    i = T.meta_var(ty + (rd * G + g) * W)
                    slot = T.meta_var((ty * G + g) * p.slot_halves + p.a_halves)
                    if i < cnt:
                        for it in T.unroll(b_iters):
                            e = T.meta_var(it * 32 + tx)
                            k = T.meta_var(col[g] * Cb + e // per8)
                            if e < b_chunks:
                                cp(at(sb[0], slot + e // per8 * PW + e % per8 * 8),
                                   B.access_ptr("r", offset=T.min(k, K - 1) * feat + f0 + e % per8 * 8, extent=8),
                                   16, T.Cast("uint32", T.if_then_else(k < K, 16, 0)))
                commit()
                wait(0)
                syncwarp()
                for g in T.unroll(G):
                    i = T.meta_var(ty + (rd * G + g) * W)
                    a_base = T.meta_var((ty * G + g) * p.slot_halves)
                    b_base = T.meta_var(a_base + p.a_halves)
                    if i < cnt:
                        for kk in T.unroll(p.ks):
                            for m in T.unroll(MT):
                                ldm(af[0], af[1], af[2], af[3],
                                    at(sb[0], a_base + (m * 16 + tx % 16) * AP + kk * 16 + tx // 16 * 8))
                                for t in T.unroll(NTW // 2):
                                    ldm_t(bf[0], bf[1], bf[2], bf[3],
                                          at(sb[0], b_base + (kk * 16 + tx % 16) * PW + t * 16 + tx // 16 * 8))
                                    for h in T.unroll(2):
                                        a = T.meta_var((m * NTW + t * 2 + h) * 4)
                                        mma(acc[a], acc[a + 1], acc[a + 2], acc[a + 3], af[0], af[1], af[2], af[3],
                                            bf[h * 2], bf[h * 2 + 1], acc[a], acc[a + 1], acc[a + 2], acc[a + 3])
                                if NTW % 2 == 1:
                                    ldm_t2(bf[0], bf[1], at(sb[0], b_base + (kk * 16 + tx % 16) * PW + (NTW - 1) * 8))
                                    a = T.meta_var((m * NTW + NTW - 1) * 4)
                                    mma(acc[a], acc[a + 1], acc[a + 2], acc[a + 3], af[0], af[1], af[2], af[3],
                                        bf[0], bf[1], acc[a], acc[a + 1], acc[a + 2], acc[a + 3])
                syncwarp()
            # the warps' partial tiles added in shared memory (over the slots), C written row by row
            T.tvm_storage_sync("shared")
            for m in T.unroll(MT):
                for t in T.unroll(NTW):
                    for h in T.unroll(2):
                        for q in T.unroll(2):
                            Red[ty * red + (m * 16 + tx // 4 + h * 8) * RP + t * 8 + tx % 4 * 2 + q] = \
                                acc[(m * NTW + t) * 4 + h * 2 + q]
            T.tvm_storage_sync("shared")
            for it in T.unroll(-(-(R * FW) // p.threads)):
                e = T.meta_var(it * p.threads + ty * 32 + tx)
                if e < R * FW:
                    if row0 + e // FW < M:
                        C[row0 + e // FW, f0 + e % FW] = sum_warps(Red, e // FW * RP + e % FW, red)
        return row_part

    whole = part(feat) if held_columns(feat, S, heavy) == feat else None
    share = part(feat // S) if S > 1 else None

    @T.prim_func(s_tir=True)
    def bsr_gather(i_h: T.handle, j_h: T.handle, v_h: T.handle, b_h: T.handle, c_h: T.handle):
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
        bx = T.env_thread("blockIdx.x")
        ty = T.env_thread("threadIdx.y")
        tx = T.env_thread("threadIdx.x")
        T.launch_thread(bx, T.max(nbr, 1))
        if S > 1:
            by = T.env_thread("blockIdx.y")
            T.launch_thread(by, S)
        T.launch_thread(ty, W)
        T.launch_thread(tx, 32)
        Vs = T.alloc_buffer((p.smem // 2,), "float16", scope="shared.dyn", align=128)
        Red = T.decl_buffer((p.red_floats,), "float32", data=Vs.data, scope="shared.dyn")
        sb = T.alloc_buffer((1,), "uint32", scope="local")
        acc = T.alloc_buffer((MT * (held_columns(feat, S, heavy) // 8) * 4,), "float32", scope="local")
        af = T.alloc_buffer((4,), "uint32", scope="local")
        bf = T.alloc_buffer((4,), "uint32", scope="local")
        col = T.alloc_buffer((G,), "int32", scope="local")
        rng = T.alloc_buffer((2,), "int32", scope="local")  # the row's first stored block, its count
        live = T.meta_var(bx < nbr)
        sb[0] = T.call_extern("uint32", "__cvta_generic_to_shared", Vs.access_ptr("w"))
        rng[0] = T.if_then_else(live, indptr[T.min(bx, n_ptr - 1)], 0)
        rng[1] = T.if_then_else(live, indptr[T.min(bx + 1, n_ptr - 1)], 0) - rng[0]
        if S > 1 and heavy == 1:  # every row split, an empty one too (its shares of zeros)
            share(sb, acc, af, bf, col, Red, indices, values, B, C, K, M, rng[0], rng[1], bx * R,
                  by * (feat // S), ty, tx)
        elif S == 1:
            whole(sb, acc, af, bf, col, Red, indices, values, B, C, K, M, rng[0], rng[1], bx * R, 0, ty, tx)
        else:
            if rng[1] >= heavy:
                share(sb, acc, af, bf, col, Red, indices, values, B, C, K, M, rng[0], rng[1], bx * R,
                      by * (feat // S), ty, tx)
            elif by == 0:
                whole(sb, acc, af, bf, col, Red, indices, values, B, C, K, M, rng[0], rng[1], bx * R, 0, ty, tx)

    return bsr_gather


def build(block=(16, 16), feat: int = 64, arch: str = "sm_90a", **knobs):
    """The compiled module (TVM executable) of :func:`spmm` for ``arch``."""
    return compile_for(spmm(block, feat, **knobs), arch)
