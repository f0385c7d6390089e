"""The consumer side of ``tc_pipeline``: TVMScript macros that fill the pipeline, then walk K
one stage at a time, reading fragments out of shared memory with ``ldmatrix`` (A plain, B
``.trans``) and multiplying them with ``mma.sp`` m16n8k32 (sp24, with the metadata) or
``mma`` m16n8k16 (gather), while the copy of a stage ``stages - 1`` ahead runs."""
from __future__ import annotations

from types import SimpleNamespace

from .tc_pipeline_plan import DTYPES, Plan


def mma_macros(plan: Plan, copies: SimpleNamespace) -> SimpleNamespace:
    """The macros ``fill_pipeline`` and ``walk_k`` for ``plan``; ``copies`` are
    :func:`tc_pipeline_copies.copy_macros`'s."""
    from tvm.script import tirx as T

    plan_copies, load_b, load_a, prefetch_rows = copies.plan_copies, copies.load_b, copies.load_a, copies.prefetch_rows
    ty_ = DTYPES[plan.dtype]
    commit = T.ptx["cp.async.commit_group"]
    wait = T.ptx["cp.async.wait_group"]
    ldm = T.ptx["ldmatrix.sync.aligned.m8n8.x4.shared.b16"]
    ldm_t = T.ptx["ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"]
    mma_sp = T.ptx[f"mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.{ty_}.{ty_}.f32"]
    mma = T.ptx[f"mma.sync.aligned.m16n8k16.row.col.f32.{ty_}.{ty_}.f32"]
    sp, mt, nt, ks, S, nk, sets = plan.sp, plan.mt, plan.nt, plan.ks, plan.stages, plan.nk, plan.frag_sets
    BM, BK, CA, CB, a_base, e_base = plan.BM, plan.BK, plan.CA, plan.CB, plan.a_base, plan.e_base
    sw_a, sw_b = plan.swizzle_a, plan.swizzle_b

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
            for p in T.unroll(nt // 2):  # one x4.trans load holds two n-tiles
                kr = j * 16 + tx % 16
                ldm_t(bf[f * nt * 4 + p * 4], bf[f * nt * 4 + p * 4 + 1], bf[f * nt * 4 + p * 4 + 2],
                      bf[f * nt * 4 + p * 4 + 3],
                      Sm.access_ptr("r", offset=((s * BK + kr) * CB + sw_b(kr, wc // 8 + p * 2 + tx // 16)) * 8,
                                    extent=8))

    @T.macro
    def mmas(acc, af, bf, ef, f):
        """The warp tile's MMAs on register set ``f``."""
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

    @T.macro
    def fill_pipeline(Sm, Sw, A, B, E, af, bf, ef, acc, nidx, cb, ca, bm0, bn0, wr, wc, tx, tid):
        """Zeroed accumulators, the first ``S`` stages in flight, the first of them landed
        (and, with two register sets, its first fragments loaded)."""
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

    @T.macro
    def walk_k(Sm, Sw, A, B, E, af, bf, ef, acc, nidx, cb, ca, bm0, bn0, wr, wc, tx, tid):
        """Every stage of K; unrolled by the stage count, so every shared-memory offset is a
        constant, then the stages left over."""
        for kt0 in range(nk // S):
            for u in T.unroll(S):
                k_iteration(Sm, Sw, A, B, E, af, bf, ef, acc, nidx, cb, ca, bm0, bn0, kt0 * S + u, u, wr, wc, tx, tid)
        for kt in range(nk // S * S, nk):
            k_iteration(Sm, Sw, A, B, E, af, bf, ef, acc, nidx, cb, ca, bm0, bn0, kt, kt % S, wr, wc, tx, tid)

    return SimpleNamespace(fill_pipeline=fill_pipeline, walk_k=walk_k)
