"""The producer side of ``tc_pipeline``: TVMScript macros that copy one pipeline stage of B,
A and (sp24) the metadata from global to shared memory with 16-byte ``cp.async``.

Rows and chunks out of range are zero-filled (src-size 0) or, where the :class:`Plan` says a
shape fills its tiles, emitted without checks; when every chunk of a stage is in range the
per-thread offsets are worked out once (``plan_copies``) and a stage's copy is an add and a
``cp.async`` per chunk. Shared rows are XOR-swizzled by chunk (``Plan.swizzle_*``) so the
``ldmatrix`` reads of the main loop are free of bank conflicts."""
from __future__ import annotations

from types import SimpleNamespace

from .tc_pipeline_plan import Plan


def copy_macros(p: Plan) -> SimpleNamespace:
    """The macros ``plan_copies``, ``load_b``, ``load_a`` and ``prefetch_rows`` for plan ``p``
    (``load_a`` also copies sp24's metadata)."""
    from tvm.script import tirx as T

    cp = T.ptx["cp.async.cg.shared.global"]
    zero = T.float16(0) if p.dtype == "float16" else T.bfloat16(0)

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
        if p.sp:
            return kk
        if prefetched:
            return nidx[it]
        return E[bm0 // p.vec, T.min(kk, p.k_rows - 1)]

    def b_src(row):
        """B's row as read: sp24 rows stay in range when K fills the stages; a gathered
        index is clamped into B whatever the caller passed."""
        return row if p.sp and p.k_full else T.max(T.min(row, p.K - 1), 0)

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
        if p.fast_b:
            for it in T.unroll(p.b_it):
                r = (it * p.NT + tid) // p.CB
                c = (it * p.NT + tid) % p.CB
                cb[it] = (r * p.CB + p.swizzle_b(r, c)) * 8
                if p.sp:
                    cb[p.b_it + it] = r * p.N + bn0 + c * 8
                else:
                    cb[p.b_it + it] = bn0 + c * 8
        if p.fast_a:
            for it in T.unroll(p.a_it):
                row = (it * p.NT + tid) // p.CA
                c = (it * p.NT + tid) % p.CA
                ca[it] = p.a_base + (row * p.CA + p.swizzle_a(row, c)) * 8
                ca[p.a_it + it] = (bm0 + row) * p.a_cols + c * 8

    @T.macro
    def load_b_checked(Sm, B, E, nidx, bm0, bn0, q, s, tid, prefetched):
        """Stage ``q`` of B into shared stage ``s``, each chunk's bounds checked; element by
        element where N is not a multiple of 8 (B's rows not 16-byte aligned)."""
        for it in T.unroll(p.b_it):
            ch = it * p.NT + tid
            if ch < p.BK * p.CB:
                r = ch // p.CB
                c = ch % p.CB
                kk = q * p.BK + r
                src = b_src(b_row(E, nidx, bm0, kk, it, prefetched))
                ok = all_of(p.k_full or kk < p.k_valid, p.n_full or bn0 + c * 8 < p.N)
                dst = ((s * p.BK + r) * p.CB + p.swizzle_b(r, c)) * 8
                if p.aligned:
                    copy16(Sm.access_ptr("w", offset=dst, extent=8),
                           B.access_ptr("r", offset=src * p.N + clamp(bn0 + c * 8, p.N - 8, p.n_full), extent=8),
                           ok)
                else:
                    for e in T.unroll(8):
                        Sm[dst + e] = T.if_then_else(T.And(ok, bn0 + c * 8 + e < p.N),
                                                     B[src, T.min(bn0 + c * 8 + e, p.N - 1)], zero)

    @T.macro
    def load_b(Sm, B, E, nidx, cb, bm0, bn0, q, s, tid, prefetched):
        """Stage ``q`` of B into shared stage ``s`` (the gathered rows for gather mode)."""
        if p.fast_b:
            for it in T.unroll(p.b_it):
                if p.sp:
                    copy16(Sm.access_ptr("w", offset=s * p.BK * p.CB * 8 + cb[it], extent=8),
                           B.access_ptr("r", offset=q * p.BK * p.N + cb[p.b_it + it], extent=8), True)
                else:
                    src = b_src(b_row(E, nidx, bm0, q * p.BK + (it * p.NT + tid) // p.CB, it, prefetched))
                    copy16(Sm.access_ptr("w", offset=s * p.BK * p.CB * 8 + cb[it], extent=8),
                           B.access_ptr("r", offset=src * p.N + cb[p.b_it + it], extent=8), True)
        else:
            load_b_checked(Sm, B, E, nidx, bm0, bn0, q, s, tid, prefetched)

    @T.macro
    def prefetch_rows(E, nidx, bm0, q, tid):
        """gather: the B rows stage ``q`` will copy, loaded a stage early so the copy
        does not wait for them."""
        if not p.sp:
            for it in T.unroll(p.b_it):
                nidx[it] = E[bm0 // p.vec, T.min(q * p.BK + (it * p.NT + tid) // p.CB, p.k_rows - 1)]

    @T.macro
    def load_e(Sm, E, bm0, q, s, tid):
        """sp24: stage ``q`` of the metadata (16 uint32 per 16 x 32 tile of A)."""
        for it in T.unroll(p.e_it):
            ch = it * p.NT + tid
            if ch < p.BM // 16 * p.ks * 4:
                i = ch // (p.ks * 4)
                j = ch // 4 % p.ks
                w4 = ch % 4
                tm = bm0 // 16 + i
                tk = q * p.ks + j
                copy16(Sm.access_ptr("w", offset=p.e_base + ((s * (p.BM // 16) + i) * p.ks + j) * 32 + w4 * 8,
                                     extent=8),
                       E.access_ptr("r", offset=(clamp(tm, p.tiles_m - 1, p.m_full) * p.tiles_k
                                                 + clamp(tk, p.tiles_k - 1, p.k_full)) * 16 + w4 * 4, extent=4),
                       all_of(p.m_full or tm < p.tiles_m, p.k_full or tk < p.tiles_k))

    @T.macro
    def load_a_checked(Sm, A, bm0, q, s, tid):
        """Stage ``q`` of A into shared stage ``s``, each chunk's row and column checked."""
        for it in T.unroll(p.a_it):
            ch = it * p.NT + tid
            if ch < p.BM * p.CA:
                row = ch // p.CA
                c = ch % p.CA
                col = q * p.CA * 8 + c * 8
                copy16(Sm.access_ptr("w", offset=p.a_base + ((s * p.BM + row) * p.CA + p.swizzle_a(row, c)) * 8,
                                     extent=8),
                       A.access_ptr("r", offset=clamp(bm0 + row, p.a_rows - 1, p.m_full) * p.a_cols
                                    + clamp(col, p.a_cols - 8, p.k_full), extent=8),
                       all_of(p.m_full or bm0 + row < p.a_rows, p.k_full or col < p.a_cols))

    @T.macro
    def load_a(Sm, A, E, ca, bm0, q, s, tid):
        """Stage ``q`` of A (and of sp24's metadata) into shared stage ``s``."""
        if p.fast_a:
            for it in T.unroll(p.a_it):
                copy16(Sm.access_ptr("w", offset=s * p.BM * p.CA * 8 + ca[it], extent=8),
                       A.access_ptr("r", offset=q * p.CA * 8 + ca[p.a_it + it], extent=8), True)
        else:
            load_a_checked(Sm, A, bm0, q, s, tid)
        if p.sp:
            load_e(Sm, E, bm0, q, s, tid)

    return SimpleNamespace(plan_copies=plan_copies, load_b=load_b, load_a=load_a, prefetch_rows=prefetch_rows)
