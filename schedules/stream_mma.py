"""What the streaming Tensor Core SpMM kernels (``tiled_stream``, ``bsr_stream``) share once a
warp holds a dense tile of W in shared memory: B's rows for the CTA's part of K copied in
(phases), the tile times those rows (``ldmatrix`` + ``mma.m16n8k16``, float32 accumulators),
and the accumulators out to C, directly or summed across a thread-block cluster through
distributed shared memory (one launch, no atomics, no C to zero first).

:func:`macros` builds them for a kernel's plan ``p``: ``feat``, ``nb`` (columns of B a CTA
takes), ``nt`` / ``mt`` (8-column and 16-row MMA tiles of a warp), ``TR`` (rows a warp
owns), ``apitch`` / ``bpitch`` (row pitches, in halves, of the dense tile and of B's stage),
``kdim`` (columns of a dense tile), ``rows_b`` (rows of B a phase holds), ``bmode`` ("vec":
16-byte rows; "raw": fewer than 8 columns, the phase's rows one contiguous run; "reg":
stored by threads), ``threads``, ``S`` (cluster size) and ``red`` (floats of a CTA's partial
tile). Shared memory the kernel plans itself is reached through addresses held in registers
(``sb``: [.., .., B's stage, the dense tile]) so TVM's barrier planner leaves it alone.
"""
from __future__ import annotations

from types import SimpleNamespace

PAD = 8  # halves added to a row of a dense tile and of B's stage (16 bytes: ldmatrix rows in distinct banks)


def mma_ops():
    """The PTX instructions a warp's dense tile times B's rows takes: (16-byte cp.async,
    ldmatrix x4, ldmatrix x4 transposed, ldmatrix x2 transposed, mma.m16n8k16 f32 += f16)."""
    from tvm.script import tirx as T

    return (T.ptx["cp.async.cg.shared.global"], T.ptx["ldmatrix.sync.aligned.m8n8.x4.shared.b16"],
            T.ptx["ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"],
            T.ptx["ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16"],
            T.ptx["mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"])


def sum_share(red: int, S: int, threads: int) -> int:
    """Elements of a ``red``-float partial tile one thread of a CTA sums in a cluster of ``S``."""
    return -(-(-(-red // S)) // threads)


def cluster_sum(red: int, nb: int, feat: int, threads: int, S: int):
    """The macro ``sum_cluster(C, Red, mapped, sums, rank, row0, n0, tid)``: every CTA of the
    cluster holds a ``red``-float partial tile (rows of ``nb`` floats) where ``Red`` (a
    shared buffer of any type) starts; CTA ``rank`` adds its share of the elements across the cluster (distributed
    shared memory) and stores them to C from row ``row0``, column ``n0`` (columns past
    ``feat`` and rows past C's skipped). Barriers before (partials written) and after (no
    CTA leaves while another reads its tile)."""
    from tvm.ir import PointerType, PrimType
    from tvm.script import tirx as T
    from tvm.tirx import Var

    share = -(-red // S)  # elements of the partial tile a CTA of the cluster sums
    sum_each = sum_share(red, S, threads)  # of them, a thread's
    NT = threads

    @T.macro
    def sum_cluster(C, Red, mapped, sums, rank, row0, n0, tid):
        T.ptx.barrier.cluster.arrive()
        T.ptx.barrier.cluster.wait()
        for i in T.unroll(sum_each):
            sums[i] = T.float32(0)
        for q in range(S):  # a loop TVM keeps: the remote views are bound inside it
            T.evaluate(T.ptx.mapa.u64(mapped[0], Red.access_ptr("r"), T.Cast("uint32", q)))  # Red's base in CTA q
            remote_ptr = Var("remote_red", PointerType(PrimType("float32"), "shared"))
            T.Bind(T.reinterpret(PointerType(PrimType("float32"), "shared"), mapped[0]), var=remote_ptr)
            remote = T.decl_buffer((red,), "float32", data=remote_ptr, scope="shared")
            for i in T.unroll(sum_each):
                if T.And(i * NT + tid < share, rank * share + i * NT + tid < red):
                    sums[i] = sums[i] + remote[rank * share + i * NT + tid]
        for i in T.unroll(sum_each):
            e = T.meta_var(rank * share + i * NT + tid)
            row = T.meta_var(row0 + e // nb)
            col = T.meta_var(n0 + e % nb)
            if T.And(T.And(i * NT + tid < share, e < red), T.And(row < C.shape[0], col < feat)):
                C[row, col] = sums[i]
        T.ptx.barrier.cluster.arrive()
        T.ptx.barrier.cluster.wait()

    return sum_cluster


def macros(p) -> SimpleNamespace:
    """The shared macros of a streaming kernel with plan ``p`` (see the module docstring)."""
    from tvm.script import tirx as T

    feat, nb, nt, mt, TR, AP, BP, NT, S = p.feat, p.nb, p.nt, p.mt, p.TR, p.apitch, p.bpitch, p.threads, p.S
    cp, ldm, ldm_t, ldm_t2, mma = mma_ops()
    full = T.uint32(0xFFFFFFFF)

    def b_chunks(rows):
        """Copies (16-byte chunks, or halves with "reg") of ``rows`` rows of B's stage."""
        return {"vec": rows * (nb // 8), "raw": (rows * feat + 7) // 8, "reg": rows * nb}[p.bmode]
    sum_each = sum_share(p.red, S, NT)

    def syncwarp():
        return T.evaluate(T.call_extern("void", "__syncwarp", full))

    def shared_at(base, offset, dtype_bytes):
        """A shared-memory address ``offset`` elements past ``base`` (an address held in a
        register): accesses through it are invisible to TVM's barrier planner."""
        return base + T.Cast("uint32", offset * dtype_bytes)

    @T.macro
    def load_b(sb, Bs, B, kbase, rows, n0, tid):
        """B's rows ``kbase`` ... ``kbase + rows`` (``rows`` at most ``rows_b``; zero past K),
        columns ``n0`` on, into Bs."""
        for i in range((b_chunks(rows) + NT - 1) // NT):
            e = T.meta_var(i * NT + tid)
            if e < b_chunks(rows):
                if p.bmode == "raw":
                    src = T.meta_var(kbase * feat + e * 8)
                    cp(shared_at(sb[2], e * 8, 2),
                       B.access_ptr("r", offset=T.if_then_else(src < B.shape[0] * feat, src, 0), extent=8), 16,
                       T.Cast("uint32", T.if_then_else(src < B.shape[0] * feat,
                                                       T.min(B.shape[0] * feat - src, 8) * 2, 0)))
                elif p.bmode == "vec":
                    k = T.meta_var(kbase + e // (nb // 8))
                    n = T.meta_var(n0 + e % (nb // 8) * 8)
                    cp(shared_at(sb[2], e // (nb // 8) * BP + e % (nb // 8) * 8, 2),
                       B.access_ptr("r", offset=T.min(k, B.shape[0] - 1) * feat + T.min(n, feat - 8), extent=8), 16,
                       T.Cast("uint32", T.if_then_else(T.And(k < B.shape[0], n < feat), 16, 0)))
                else:
                    k = T.meta_var(kbase + e // nb)
                    n = T.meta_var(n0 + e % nb)
                    Bs[e // nb * BP + e % nb] = T.if_then_else(T.And(k < B.shape[0], n < feat),
                                                               B[T.min(k, B.shape[0] - 1), T.min(n, feat - 1)],
                                                               T.float16(0))

    @T.macro
    def multiply(Bs, af, bf, acc, a_base, brow, tx):
        """The dense tile at shared address ``a_base`` (``TR`` x ``kdim``, pitch ``apitch``)
        times B's stage rows ``brow`` ... ``brow + kdim``, into the accumulators."""
        for kk in T.unroll(p.kdim // 16):
            if p.bmode == "raw":  # B's run as copied: row k at k * feat
                for n in T.unroll(nt):
                    for r in T.unroll(2):
                        k = T.meta_var((brow + kk * 16 + r * 8 + tx % 4 * 2) * feat + T.min(n * 8 + tx // 4, feat - 1))
                        bf[n * 2 + r] = T.call_extern(
                            "uint32", "__pack_half2",
                            T.if_then_else(n * 8 + tx // 4 < feat, Bs[k], T.float16(0)),
                            T.if_then_else(n * 8 + tx // 4 < feat, Bs[k + feat], T.float16(0)))
            elif nb == 8:
                ldm_t2(bf[0], bf[1], Bs.access_ptr("r", offset=(brow + kk * 16 + tx % 16) * BP, extent=8))
            else:
                for q in T.unroll(nb // 16):
                    ldm_t(bf[q * 4], bf[q * 4 + 1], bf[q * 4 + 2], bf[q * 4 + 3],
                          Bs.access_ptr("r", offset=(brow + kk * 16 + tx % 16) * BP + q * 16 + tx // 16 * 8,
                                        extent=8))
            for m in T.unroll(mt):
                ldm(af[0], af[1], af[2], af[3], shared_at(a_base, (m * 16 + tx % 16) * AP + kk * 16 + tx // 16 * 8, 2))
                for n in T.unroll(nt):
                    a = T.meta_var((m * nt + n) * 4)
                    bi = T.meta_var(n * 2 if p.bmode == "raw" else (n // 2 * 4 + n % 2 * 2 if nb > 8 else 0))
                    mma(acc[a], acc[a + 1], acc[a + 2], acc[a + 3], af[0], af[1], af[2], af[3], bf[bi], bf[bi + 1],
                        acc[a], acc[a + 1], acc[a + 2], acc[a + 3])

    @T.macro
    def write_c(C, acc, row0, n0, tx):
        """Each lane's accumulators into C: rows from ``row0``, columns from ``n0``."""
        for m in T.unroll(mt):
            for n in T.unroll(nt):
                for h in T.unroll(2):
                    for e in T.unroll(2):
                        row = T.meta_var(row0 + m * 16 + tx // 4 + h * 8)
                        col = T.meta_var(n0 + n * 8 + tx % 4 * 2 + e)
                        if row < C.shape[0] and col < feat:
                            C[row, col] = acc[(m * nt + n) * 4 + h * 2 + e]

    sum_cluster = cluster_sum(p.red, nb, feat, NT, S)

    @T.macro
    def reduce_cluster(C, Red, Vs, acc, mapped, sums, rank, row0, n0, w, tx, tid):
        """The cluster's partial tiles summed: each CTA's in its shared memory (``Red``, over
        ``Vs``), then CTA ``rank`` adds its share of the elements across the cluster and
        stores them."""
        for m in T.unroll(mt):
            for n in T.unroll(nt):
                for h in T.unroll(2):
                    for e in T.unroll(2):
                        Red[(w * TR + m * 16 + tx // 4 + h * 8) * nb + n * 8 + tx % 4 * 2 + e] = \
                            acc[(m * nt + n) * 4 + h * 2 + e]
        sum_cluster(C, Vs, mapped, sums, rank, row0, n0, tid)

    return SimpleNamespace(syncwarp=syncwarp, shared_at=shared_at, load_b=load_b, multiply=multiply, write_c=write_c,
                           reduce_cluster=reduce_cluster, cp=cp, full=full, sum_each=sum_each)
