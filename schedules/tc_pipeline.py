"""Pipelined Tensor Core SpMM ``C = A @ B`` for weights whose rows share their K positions
tile by tile, in two modes:

* ``"sp24"``: A 2:4-sparse (``formats.mma_sp.pack``: compressed values (Mp, Kp/2), metadata
  (Mp/16, Kp/32, 16) uint32), ``mma.sp::ordered_metadata`` m16n8k32: B's rows are read in
  order and the hardware skips the pruned half of the math;
* ``"gather"``: A vector-wise N:M (``formats.nm_tc.pack``: values (Mp, Kc), cols (Mp/V, Kc)),
  dense ``mma`` m16n8k16 on the B rows at the row vector's kept columns, so only N/M of B
  is loaded and multiplied.

Schedule (CUTLASS's multistage GEMM, written out in TVMScript): a 1-D grid of blocks
walked ``group_m`` row tiles at a time (Triton's grouped order, for L2 reuse); a block owns
``16*warp_m_tiles*warps_m`` rows x ``8*warp_n_tiles*warps_n`` columns of C; each stage copies
``k_steps`` MMA k-steps of A (and metadata) and of B into shared memory with 16-byte
``cp.async`` (rows out of range zero-filled), ``stages - 1`` stages ahead of the math.
Shared rows are XOR-swizzled by 16-byte chunk, so both the copies and the ``ldmatrix``
reads (A plain, B ``.trans``) are free of bank conflicts. Accumulators are fp32; C is
float32 or float16. B's row pitch must be 16-byte aligned for ``cp.async``; when N is not a
multiple of 8 the B tiles are copied element by element instead (correct, slower).
"""
from __future__ import annotations

from .warp_mma import check_choice, check_knobs, check_sizes, compile_for

MODES = ("sp24", "gather")
DTYPES = {"float16": "f16", "bfloat16": "bf16"}
OUT_DTYPES = ("float32", "float16")
ACTIVATIONS = ("none", "gelu", "gelu_tanh", "relu")
KNOBS = {
    "warps_m": (2, 1, 4),
    "warps_n": (2, 1, 4),
    "warp_m_tiles": (4, 1, 2),
    "warp_n_tiles": (4, 2, 8),
    "k_steps": (2, 4),  # even, so two register sets alternate within a stage
    "stages": (3, 2, 4),
    # blocks are numbered down ``group_m`` row tiles before moving one column tile right,
    # so the blocks resident at once share their B columns (and, in gather mode, the
    # gathered rows) in L2 instead of streaming all of B per row tile; 1 = row-major order
    "group_m": (8, 1, 4, 16, 64),
    # 2: fragments of the next k-step load while this one multiplies (more registers);
    # 1: one set, so wider warp tiles fit in 255 registers
    "frag_sets": (2, 1),
}
SMEM_LIMIT = 227 * 1024  # bytes of shared memory a Hopper block may use


def block_shape(knobs) -> tuple:
    """(rows, columns) of C one block computes."""
    return 16 * knobs["warp_m_tiles"] * knobs["warps_m"], 8 * knobs["warp_n_tiles"] * knobs["warps_n"]


def _swizzle(row, chunk, chunks: int):
    """Physical 16-byte chunk of logical ``chunk`` in a shared row of ``chunks`` chunks: 8
    consecutive rows read at one logical chunk land in 8 different bank groups."""
    if chunks >= 8:
        return chunk ^ (row % 8)
    if chunks == 4:
        return chunk ^ (row // 2 % 4)
    if chunks == 2:
        return chunk ^ (row // 4 % 2)
    return chunk


def grouped_tile(pid, grid_m: int, grid_n: int, group_m: int):
    """(row tile, column tile) of block ``pid`` (an int, or the block index in a kernel) when
    blocks walk ``group_m`` row tiles down before one column tile right; the last group
    holds what rows are left."""
    group = min(group_m, grid_m)
    in_group = group * grid_n
    first = pid // in_group * group
    if grid_m % group == 0:
        rows = group
    elif isinstance(pid, int):
        rows = min(grid_m - first, group)
    else:
        from tvm.script import tirx as T

        rows = T.min(grid_m - first, group)
    return first + pid % in_group % rows, pid % in_group // rows


def smem_bytes(mode: str, knobs) -> int:
    bm, bn = block_shape(knobs)
    ks, st = knobs["k_steps"], knobs["stages"]
    bk = (32 if mode == "sp24" else 16) * ks
    per_stage = bk * bn * 2 + bm * 16 * ks * 2 + (bm // 16 * ks * 64 if mode == "sp24" else 0)
    return per_stage * st


def check(mode, M, K, N, dtype, out_dtype, vec, knobs):
    check_choice("mode", mode, MODES)
    check_sizes(M=M, K=K, N=N)
    check_choice("dtype", dtype, sorted(DTYPES))
    check_choice("out_dtype", out_dtype, OUT_DTYPES)
    check_knobs(knobs, KNOBS)
    bm, _ = block_shape(knobs)
    if mode == "gather":
        check_sizes(vec=vec)
        if vec % bm:
            raise ValueError(f"the row vector (V={vec}) should be a multiple of the block's rows "
                             f"(16 x warp_m_tiles x warps_m = {bm}): a block gathers one vector's columns")
        if knobs["warp_n_tiles"] % 2:
            raise ValueError("warp_n_tiles should be even in gather mode (ldmatrix.x4.trans loads two n-tiles)")
    if smem_bytes(mode, knobs) > SMEM_LIMIT:
        raise ValueError(f"knobs {knobs} need {smem_bytes(mode, knobs)} bytes of shared memory, "
                         f"more than {SMEM_LIMIT}")


def spmm(mode: str, M: int, K: int, N: int, *, dtype: str = "float16", out_dtype: str = "float32",
         vec: int = 0, kc: int = 0, bias: bool = False, activation: str = "none", transpose_c: bool = False,
         **knobs):
    """The PrimFunc ``tc_spmm(A, E, B, C)`` (``tc_spmm(A, E, B, bias, C)`` with ``bias``): A
    the packed values, E the metadata (sp24) or the gathered columns (gather: ``kc`` is their
    row length), B (K, N), C (M, N), or (N, M) with ``transpose_c``.

    The epilogue adds ``bias`` (float32, one per row of C, i.e. per output feature) and
    applies ``activation`` to the fp32 accumulator before the cast, so a linear layer's bias
    and activation cost no extra pass over its output. ``transpose_c`` writes C as (N, M):
    with B holding activations feature-major (in x tokens), the product comes back
    token-major, as the next layer or the caller wants it, without a transpose kernel."""
    from tvm.script import tirx as T

    from sparsec.formats.mma_sp import padded_shape

    knobs = {**{k: v[0] for k, v in KNOBS.items()}, **knobs}
    check(mode, M, K, N, dtype, out_dtype, vec, knobs)
    check_choice("activation", activation, ACTIVATIONS)
    wm_, wn_, mt, nt, ks, S = (knobs[k] for k in ("warps_m", "warps_n", "warp_m_tiles", "warp_n_tiles",
                                                  "k_steps", "stages"))
    sets = knobs["frag_sets"]
    sp = mode == "sp24"
    BM, BN = block_shape(knobs)
    WM, WN = 16 * mt, 8 * nt
    NT = 32 * wm_ * wn_
    BK = (32 if sp else 16) * ks  # rows of B per stage
    CB, CA = BN // 8, 2 * ks  # 16-byte chunks per shared row of B and of A
    if sp:
        mp, kp = padded_shape(M, K)
        a_rows, a_cols, k_rows = mp, kp // 2, kp
        tiles_m, tiles_k = mp // 16, kp // 32
        e_shape, e_dtype = (tiles_m, tiles_k, 16), "uint32"
    else:
        check_sizes(kc=kc)
        if kc % 16:
            raise ValueError(f"kc (the gathered row length) should be a multiple of 16, got {kc}")
        mp = -(-M // vec) * vec
        a_rows, a_cols, k_rows = mp, kc, kc
        e_shape, e_dtype = (mp // vec, kc), "int32"
    nk = -(-k_rows // BK)
    grid_m, grid_n = -(-M // BM), -(-N // BN)
    b_elems = S * BK * BN
    a_base = b_elems
    e_base = a_base + S * BM * CA * 8
    pipeline_total = e_base + (S * (BM // 16) * ks * 32 if sp else 0)
    out_bytes = 4 if out_dtype == "float32" else 2
    VO = 16 // out_bytes  # outputs per 16-byte store
    # The epilogue stages the block's outputs in shared memory (reusing the pipeline's
    # buffers) so that C is written with 16-byte row stores: one store instruction per 8
    # fp16 outputs instead of one per pair. Rows are padded by 16 bytes (bank spread).
    staged = (M % VO == 0) if transpose_c else (N % VO == 0)
    LDC = (BM if transpose_c else BN) + VO
    stage_elems = (BN if transpose_c else BM) * LDC
    total = max(pipeline_total, stage_elems * out_bytes // 2 if staged else 0)
    b_it = -(-BK * CB // NT)
    a_it = -(-BM * CA // NT)
    e_it = -(-(BM // 16) * ks * 4 // NT)
    aligned = N % 8 == 0
    ty_ = DTYPES[dtype]
    cp = T.ptx["cp.async.cg.shared.global"]
    commit = T.ptx["cp.async.commit_group"]
    wait = T.ptx["cp.async.wait_group"]
    ldm = T.ptx["ldmatrix.sync.aligned.m8n8.x4.shared.b16"]
    ldm_t = T.ptx["ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"]
    mma_sp = T.ptx[f"mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.{ty_}.{ty_}.f32"]
    mma = T.ptx[f"mma.sync.aligned.m16n8k16.row.col.f32.{ty_}.{ty_}.f32"]
    zero = T.float16(0) if dtype == "float16" else T.bfloat16(0)

    def sw_b(r, c):
        return _swizzle(r, c, CB)

    def sw_a(r, c):
        return _swizzle(r, c, CA)

    k_valid = K if sp else k_rows  # sp24 walks B's rows up to K; gather walks kc slots
    # Shapes that fill every tile need no bounds checks: the copies and stores are emitted
    # without them (fewer integer instructions per MMA in the main loop).
    k_full = k_valid % BK == 0 and k_rows == k_valid
    n_full = aligned and N % BN == 0
    m_full = a_rows % BM == 0 and M % BM == 0

    def all_of(*conds):
        """The conjunction of the conditions not known to hold (``True``) at build time."""
        live = [c for c in conds if c is not True]
        if not live:
            return True
        out = live[0]
        for c in live[1:]:
            out = T.And(out, c)
        return out

    def clamp(x, hi, full):
        return x if full else T.min(x, hi)

    def b_row(E, nidx, bm0, kk, it, prefetched):
        """The row of B at step ``kk`` of the K walk: ``kk`` itself for sp24; for gather the
        row vector's kept column, read from ``E`` or, in the loop, from ``nidx``."""
        if sp:
            return kk
        if prefetched:
            return nidx[it]
        return E[bm0 // vec, T.min(kk, k_rows - 1)]

    def b_src(row):
        """B's row as read: sp24 rows stay in range when K fills the stages; a gathered
        index is clamped into B whatever the caller passed."""
        return row if sp and k_full else T.max(T.min(row, K - 1), 0)

    # Copies whose chunks all land in range keep their per-thread offsets in registers
    # (``plan_copies``), so a stage's copy is an add and a cp.async per chunk.
    fast_b = n_full and k_full and BK * CB % NT == 0
    fast_a = m_full and k_full and BM * CA % NT == 0

    @T.macro
    def copy16(dst, src, ok):
        """16-byte cp.async; where ``ok`` is not known at build time, a false ``ok`` copies
        nothing and zero-fills (src-size 0)."""
        if ok is True:
            cp(dst, src, 16)
        else:
            cp(dst, src, 16, T.Cast("uint32", T.if_then_else(ok, 16, 0)))

    @T.macro
    def plan_copies(cb, ca, bm0, bn0, tid):
        """Shared destination and global source offsets of this thread's chunks, stage 0."""
        if fast_b:
            for it in T.unroll(b_it):
                r = (it * NT + tid) // CB
                c = (it * NT + tid) % CB
                cb[it] = (r * CB + sw_b(r, c)) * 8
                if sp:
                    cb[b_it + it] = r * N + bn0 + c * 8
                else:
                    cb[b_it + it] = bn0 + c * 8
        if fast_a:
            for it in T.unroll(a_it):
                row = (it * NT + tid) // CA
                c = (it * NT + tid) % CA
                ca[it] = a_base + (row * CA + sw_a(row, c)) * 8
                ca[a_it + it] = (bm0 + row) * a_cols + c * 8

    @T.macro
    def load_b_checked(Sm, B, E, nidx, bm0, bn0, q, s, tid, prefetched):
        for it in T.unroll(b_it):
            ch = it * NT + tid
            if ch < BK * CB:
                r = ch // CB
                c = ch % CB
                kk = q * BK + r
                src = b_src(b_row(E, nidx, bm0, kk, it, prefetched))
                ok = all_of(k_full or kk < k_valid, n_full or bn0 + c * 8 < N)
                dst = ((s * BK + r) * CB + sw_b(r, c)) * 8
                if aligned:
                    copy16(Sm.access_ptr("w", offset=dst, extent=8),
                           B.access_ptr("r", offset=src * N + clamp(bn0 + c * 8, N - 8, n_full), extent=8), ok)
                else:
                    for e in T.unroll(8):
                        Sm[dst + e] = T.if_then_else(T.And(ok, bn0 + c * 8 + e < N),
                                                     B[src, T.min(bn0 + c * 8 + e, N - 1)], zero)

    @T.macro
    def load_b(Sm, B, E, nidx, cb, bm0, bn0, q, s, tid, prefetched):
        if fast_b:
            for it in T.unroll(b_it):
                if sp:
                    copy16(Sm.access_ptr("w", offset=s * BK * CB * 8 + cb[it], extent=8),
                           B.access_ptr("r", offset=q * BK * N + cb[b_it + it], extent=8), True)
                else:
                    src = b_src(b_row(E, nidx, bm0, q * BK + (it * NT + tid) // CB, it, prefetched))
                    copy16(Sm.access_ptr("w", offset=s * BK * CB * 8 + cb[it], extent=8),
                           B.access_ptr("r", offset=src * N + cb[b_it + it], extent=8), True)
        else:
            load_b_checked(Sm, B, E, nidx, bm0, bn0, q, s, tid, prefetched)

    @T.macro
    def prefetch_rows(E, nidx, bm0, q, tid):
        """gather: the B rows stage ``q`` will copy, loaded a stage early so the copy
        does not wait for them."""
        if not sp:
            for it in T.unroll(b_it):
                nidx[it] = E[bm0 // vec, T.min(q * BK + (it * NT + tid) // CB, k_rows - 1)]

    @T.macro
    def load_e(Sm, E, bm0, q, s, tid):
        for it in T.unroll(e_it):
            ch = it * NT + tid
            if ch < BM // 16 * ks * 4:
                i = ch // (ks * 4)
                j = ch // 4 % ks
                w4 = ch % 4
                tm = bm0 // 16 + i
                tk = q * ks + j
                copy16(Sm.access_ptr("w", offset=e_base + ((s * (BM // 16) + i) * ks + j) * 32 + w4 * 8, extent=8),
                       E.access_ptr("r", offset=(clamp(tm, tiles_m - 1, m_full) * tiles_k
                                                 + clamp(tk, tiles_k - 1, k_full)) * 16 + w4 * 4, extent=4),
                       all_of(m_full or tm < tiles_m, k_full or tk < tiles_k))

    @T.macro
    def load_a_checked(Sm, A, bm0, q, s, tid):
        for it in T.unroll(a_it):
            ch = it * NT + tid
            if ch < BM * CA:
                row = ch // CA
                c = ch % CA
                col = q * CA * 8 + c * 8
                copy16(Sm.access_ptr("w", offset=a_base + ((s * BM + row) * CA + sw_a(row, c)) * 8, extent=8),
                       A.access_ptr("r", offset=clamp(bm0 + row, a_rows - 1, m_full) * a_cols
                                    + clamp(col, a_cols - 8, k_full), extent=8),
                       all_of(m_full or bm0 + row < a_rows, k_full or col < a_cols))

    @T.macro
    def load_a(Sm, A, E, ca, bm0, q, s, tid):
        if fast_a:
            for it in T.unroll(a_it):
                copy16(Sm.access_ptr("w", offset=s * BM * CA * 8 + ca[it], extent=8),
                       A.access_ptr("r", offset=q * CA * 8 + ca[a_it + it], extent=8), True)
        else:
            load_a_checked(Sm, A, bm0, q, s, tid)
        if sp:
            load_e(Sm, E, bm0, q, s, tid)

    @T.macro
    def load_frags(Sm, Sw, af, bf, ef, s, j, f, wr, wc, tx):
        """Fragments of k-step ``j`` of shared stage ``s`` into register set ``f``."""
        for i in T.unroll(mt):
            row = wr + i * 16 + tx % 16
            ldm(af[f * mt * 4 + i * 4], af[f * mt * 4 + i * 4 + 1], af[f * mt * 4 + i * 4 + 2],
                af[f * mt * 4 + i * 4 + 3],
                Sm.access_ptr("r", offset=a_base + ((s * BM + row) * CA + sw_a(row, j * 2 + tx // 16)) * 8, extent=8))
            if sp:
                ef[f * mt + i] = Sw[e_base // 2 + ((s * (BM // 16) + wr // 16 + i) * ks + j) * 16 + tx // 4 * 2
                                    + tx % 2]
        if sp:
            for n in T.unroll(nt):
                kr = j * 32 + tx
                ldm_t(bf[f * nt * 4 + n * 4], bf[f * nt * 4 + n * 4 + 1], bf[f * nt * 4 + n * 4 + 2],
                      bf[f * nt * 4 + n * 4 + 3],
                      Sm.access_ptr("r", offset=((s * BK + kr) * CB + sw_b(kr, wc // 8 + n)) * 8, extent=8))
        else:
            for p in T.unroll(nt // 2):
                kr = j * 16 + tx % 16
                ldm_t(bf[f * nt * 4 + p * 4], bf[f * nt * 4 + p * 4 + 1], bf[f * nt * 4 + p * 4 + 2],
                      bf[f * nt * 4 + p * 4 + 3],
                      Sm.access_ptr("r", offset=((s * BK + kr) * CB + sw_b(kr, wc // 8 + p * 2 + tx // 16)) * 8,
                                    extent=8))

    @T.macro
    def mmas(acc, af, bf, ef, f):
        for i in T.unroll(mt):
            for n in T.unroll(nt):
                if sp:
                    mma_sp(acc[(i * nt + n) * 4], acc[(i * nt + n) * 4 + 1], acc[(i * nt + n) * 4 + 2],
                           acc[(i * nt + n) * 4 + 3],
                           af[f * mt * 4 + i * 4], af[f * mt * 4 + i * 4 + 1], af[f * mt * 4 + i * 4 + 2],
                           af[f * mt * 4 + i * 4 + 3],
                           bf[f * nt * 4 + n * 4], bf[f * nt * 4 + n * 4 + 1], bf[f * nt * 4 + n * 4 + 2],
                           bf[f * nt * 4 + n * 4 + 3],
                           acc[(i * nt + n) * 4], acc[(i * nt + n) * 4 + 1], acc[(i * nt + n) * 4 + 2],
                           acc[(i * nt + n) * 4 + 3], ef[f * mt + i], 0)
                else:
                    mma(acc[(i * nt + n) * 4], acc[(i * nt + n) * 4 + 1], acc[(i * nt + n) * 4 + 2],
                        acc[(i * nt + n) * 4 + 3],
                        af[f * mt * 4 + i * 4], af[f * mt * 4 + i * 4 + 1], af[f * mt * 4 + i * 4 + 2],
                        af[f * mt * 4 + i * 4 + 3],
                        bf[f * nt * 4 + n // 2 * 4 + n % 2 * 2], bf[f * nt * 4 + n // 2 * 4 + n % 2 * 2 + 1],
                        acc[(i * nt + n) * 4], acc[(i * nt + n) * 4 + 1], acc[(i * nt + n) * 4 + 2],
                        acc[(i * nt + n) * 4 + 3])

    def tile_m(pid):
        return grouped_tile(pid, grid_m, grid_n, knobs["group_m"])[0]

    def tile_n(pid):
        return grouped_tile(pid, grid_m, grid_n, knobs["group_m"])[1]

    @T.macro
    def k_iteration(Sm, Sw, A, B, E, af, bf, ef, acc, nidx, cb, ca, bm0, bn0, kt, s, wr, wc, tx, tid):
        """One stage of the K walk: its MMAs, and the copy of stage ``kt + S`` into the
        shared buffer it frees (``s`` = kt % S, a constant once unrolled)."""
        if sets == 2:
            for j in T.unroll(ks - 1):
                load_frags(Sm, Sw, af, bf, ef, s, j + 1, (j + 1) % 2, wr, wc, tx)
                mmas(acc, af, bf, ef, j % 2)
        else:
            for j in T.unroll(ks - 1):
                load_frags(Sm, Sw, af, bf, ef, s, j, 0, wr, wc, tx)
                mmas(acc, af, bf, ef, 0)
            load_frags(Sm, Sw, af, bf, ef, s, ks - 1, 0, wr, wc, tx)
        # last k-step of the stage: its fragments are in registers, so the stage's
        # shared buffer takes stage kt + S while the next stage's first fragments load
        wait(S - 2)
        T.tvm_storage_sync("shared")
        if kt + S < nk:
            load_b(Sm, B, E, nidx, cb, bm0, bn0, kt + S, s, tid, True)
            load_a(Sm, A, E, ca, bm0, kt + S, s, tid)
        commit()
        if kt + S + 1 < nk:
            prefetch_rows(E, nidx, bm0, kt + S + 1, tid)
        if sets == 2:
            if kt + 1 < nk:
                load_frags(Sm, Sw, af, bf, ef, (s + 1) % S, 0, 0, wr, wc, tx)
            mmas(acc, af, bf, ef, 1)
        else:
            mmas(acc, af, bf, ef, 0)

    def erf(x):
        """erf by Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7, float32's own precision):
        one exp and one reciprocal. CUDA's erff made the FFN's first kernel twice as slow
        (H200: 27.2 vs 14.4 us at 4096 tokens; tanh GELU 17.8 us)."""
        ax = T.abs(x)
        t = T.float32(1) / (T.float32(1) + T.float32(0.3275911) * ax)
        poly = t * (T.float32(0.254829592) + t * (T.float32(-0.284496736) + t * (
            T.float32(1.421413741) + t * (T.float32(-1.453152027) + t * T.float32(1.061405429)))))
        e = T.float32(1) - poly * T.exp(-ax * ax)
        return T.if_then_else(x < T.float32(0), -e, e)

    def activate(v):
        if activation == "gelu":  # erf GELU, as BERT's FFN
            return T.float32(0.5) * v * (T.float32(1) + erf(v * T.float32(0.7071067811865476)))
        if activation == "gelu_tanh":  # PyTorch's gelu(approximate="tanh")
            return T.float32(0.5) * v * (T.float32(1) + T.tanh(
                T.float32(0.7978845608028654) * (v + T.float32(0.044715) * v * v * v)))
        if activation == "relu":
            return T.max(v, T.float32(0))
        return v

    def epilogue(Bias, v, row, act: bool = True):
        """The fp32 accumulator of output row ``row`` with the bias (and, with ``act``, the
        activation) applied."""
        if bias:
            v = v + Bias[T.min(row, M - 1)]
        return activate(v) if act else v

    o_per_line = (BM if transpose_c else BN) // VO  # 16-byte chunks per staged line
    o_it = -(-(BN if transpose_c else BM) * o_per_line // NT)

    def out_line(it, tid):
        return (it * NT + tid) // o_per_line

    def out_off(it, tid):
        return (it * NT + tid) % o_per_line * VO

    def staged_at(it, tid, e):
        return out_line(it, tid) * LDC + out_off(it, tid) + e

    @T.macro
    def copy_out(C, Cs, ob, bm0, bn0, tid):
        """The staged block to C, 16 bytes per thread and store, guarded at C's edges (the
        indices are written out inline: a named intermediate would hide the contiguous
        16-byte access from TVM's vectorizer). The activation is applied here, to the
        output-precision values, in registers and in a loop that is not unrolled: unrolled
        over the whole fragment, the inlined erf made the kernel twice as slow. (Dense
        PyTorch also activates the layer's rounded fp16 output.)"""
        for it in T.unroll(o_it) if activation == "none" else T.serial(o_it):
            if activation != "none":
                for e in T.unroll(VO):
                    ob[e] = T.Cast(out_dtype, activate(T.Cast("float32", Cs[staged_at(it, tid, e)])))
            if transpose_c:
                if T.And(it * NT + tid < BN * o_per_line,
                         T.And(bn0 + out_line(it, tid) < N, bm0 + out_off(it, tid) < M)):
                    for e in T.vectorized(VO):
                        C[bn0 + out_line(it, tid), bm0 + out_off(it, tid) + e] = \
                            (Cs[staged_at(it, tid, e)] if activation == "none" else ob[e])
            else:
                if T.And(it * NT + tid < BM * o_per_line,
                         T.And(bm0 + out_line(it, tid) < M, bn0 + out_off(it, tid) < N)):
                    for e in T.vectorized(VO):
                        C[bm0 + out_line(it, tid), bn0 + out_off(it, tid) + e] = \
                            (Cs[staged_at(it, tid, e)] if activation == "none" else ob[e])

    c_shape = (N, M) if transpose_c else (M, N)

    @T.macro
    def body(A, E, B, Bias, C):
        bx = T.env_thread("blockIdx.x")
        ty = T.env_thread("threadIdx.y")
        tx = T.env_thread("threadIdx.x")
        T.launch_thread(bx, grid_m * grid_n)
        T.launch_thread(ty, wm_ * wn_)
        T.launch_thread(tx, 32)
        Sm = T.decl_buffer([total], dtype, scope="shared.dyn")
        Sw = T.decl_buffer([total // 2], "uint32", data=Sm.data, scope="shared.dyn")
        Cs = T.decl_buffer([total * 2 // out_bytes], out_dtype, data=Sm.data, scope="shared.dyn")
        ob = T.decl_buffer([VO], out_dtype, scope="local")
        acc = T.decl_buffer([mt * nt * 4], "float32", scope="local")
        af = T.decl_buffer([sets * mt * 4], "uint32", scope="local")
        bf = T.decl_buffer([sets * nt * 4], "uint32", scope="local")
        ef = T.decl_buffer([sets * mt], "uint32", scope="local")
        nidx = T.decl_buffer([b_it], "int32", scope="local")
        cb = T.decl_buffer([2 * b_it], "int32", scope="local")
        ca = T.decl_buffer([2 * a_it], "int32", scope="local")
        bm0 = tile_m(bx) * BM
        bn0 = tile_n(bx) * BN
        tid = ty * 32 + tx
        wr = ty // wn_ * WM  # the warp's first row and column inside the block
        wc = ty % wn_ * WN
        for i in T.unroll(mt * nt * 4):
            acc[i] = T.float32(0)
        plan_copies(cb, ca, bm0, bn0, tid)
        for q in T.unroll(S):
            if q < nk:
                load_b(Sm, B, E, nidx, cb, bm0, bn0, q, q, tid, False)
                load_a(Sm, A, E, ca, bm0, q, q, tid)
            commit()
        prefetch_rows(E, nidx, bm0, S, tid)
        wait(S - 1)
        T.tvm_storage_sync("shared")
        if sets == 2:
            load_frags(Sm, Sw, af, bf, ef, 0, 0, 0, wr, wc, tx)
        for kt0 in range(nk // S):
            # unrolled by the stage count, so every shared-memory offset is a constant
            for u in T.unroll(S):
                k_iteration(Sm, Sw, A, B, E, af, bf, ef, acc, nidx, cb, ca, bm0, bn0, kt0 * S + u, u, wr, wc, tx, tid)
        for kt in range(nk // S * S, nk):  # the stages left over
            k_iteration(Sm, Sw, A, B, E, af, bf, ef, acc, nidx, cb, ca, bm0, bn0, kt, kt % S, wr, wc, tx, tid)
        if staged:
            wait(0)
            T.tvm_storage_sync("shared")
            for i in T.unroll(mt):
                for n in T.unroll(nt):
                    for hh in T.unroll(2):
                        for h in T.unroll(2):
                            r = wr + i * 16 + tx // 4 + hh * 8
                            c = wc + n * 8 + tx % 4 * 2 + h
                            v = epilogue(Bias, acc[(i * nt + n) * 4 + hh * 2 + h], bm0 + r, False)
                            if transpose_c:
                                Cs[c * LDC + r] = T.Cast(out_dtype, v)
                            else:
                                Cs[r * LDC + c] = T.Cast(out_dtype, v)
            T.tvm_storage_sync("shared")
            copy_out(C, Cs, ob, bm0, bn0, tid)
        else:
            for i in T.unroll(mt):
                for n in T.unroll(nt):
                    for hh in T.unroll(2):
                        for h in T.unroll(2):
                            row = bm0 + wr + i * 16 + tx // 4 + hh * 8
                            col = bn0 + wc + n * 8 + tx % 4 * 2 + h
                            if T.And(row < M, col < N):
                                v = epilogue(Bias, acc[(i * nt + n) * 4 + hh * 2 + h], row)
                                if transpose_c:
                                    C[col, row] = T.Cast(out_dtype, v)
                                else:
                                    C[row, col] = T.Cast(out_dtype, v)

    if bias:
        @T.prim_func(s_tir=True)
        def tc_spmm(a_h: T.handle, e_h: T.handle, b_h: T.handle, bias_h: T.handle, c_h: T.handle):
            T.func_attr({"global_symbol": "tc_spmm", "tirx.noalias": True})
            A = T.match_buffer(a_h, (a_rows, a_cols), dtype)
            E = T.match_buffer(e_h, e_shape, e_dtype)
            B = T.match_buffer(b_h, (K, N), dtype)
            Bias = T.match_buffer(bias_h, (M,), "float32")
            C = T.match_buffer(c_h, c_shape, out_dtype)
            body(A, E, B, Bias, C)
    else:
        @T.prim_func(s_tir=True)
        def tc_spmm(a_h: T.handle, e_h: T.handle, b_h: T.handle, c_h: T.handle):
            T.func_attr({"global_symbol": "tc_spmm", "tirx.noalias": True})
            A = T.match_buffer(a_h, (a_rows, a_cols), dtype)
            E = T.match_buffer(e_h, e_shape, e_dtype)
            B = T.match_buffer(b_h, (K, N), dtype)
            C = T.match_buffer(c_h, c_shape, out_dtype)
            body(A, E, B, None, C)
    return tc_spmm


def build(mode: str, M: int, K: int, N: int, *, arch: str = "sm_90a", **kw):
    """The compiled module (TVM executable) of :func:`spmm` for ``arch``."""
    return compile_for(spmm(mode, M, K, N, **kw), arch)
