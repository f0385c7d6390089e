"""Tensor Core SpMM for BSR weights at few columns of B (1-64): ``C = A @ B`` with A a
``formats.bsr`` instance of float16 r x c blocks (rows and columns multiples of 16), B (K, N)
float16 and C (M, N) float32, N fixed when the kernel is built.

At a few columns of B the weight's blocks are the bytes to move, and a thread block that
owns one block row (the template of ``schedules.tensorcore``) gathers B's rows again for
every block, so its reads of B outweigh the weight's. Here:

* **a warp owns a slice of a block row** (``TR`` = 16 or 32 of its rows) and walks the
  row's stored blocks on its own, with no barrier across the thread block: each block's
  slice is moved by 16-byte ``cp.async`` into the warp's slot a few blocks ahead, and
  multiplied from there (``ldmatrix`` + ``mma.m16n8k16``);
* **B's rows for the CTA's part of K stay in shared memory** (copied once, ``bk`` block
  columns at a time) and are shared by all the CTA's warps, i.e. by ``warps`` consecutive
  slices: B is read from L2 once per CTA, not once per block;
* **the CTAs of a cluster split K** (each takes a range of block columns; a warp finds
  where its row's blocks enter that range with a warp-wide ballot over the sorted block
  columns) and add their partial tiles through distributed shared memory: one launch, no
  atomics, no C to zero first.

A block's column comes from a window of 32 block columns held across the lanes (a shuffle,
never a dependent load). Knobs (declared once, as a transformation's, by
``schedules.tensorcore_packed``): ``nb`` (columns of B a CTA takes), ``warps``, ``stages``
(blocks in flight per warp, the one multiplied included), ``cluster`` (CTAs that share a
block row's K) and ``bk`` (block columns of B resident at once). The kernel trusts its
operands (a ``formats.bsr`` instance's own sorted arrays; ``sparsec.compile``'s kernel checks
them) and needs ``values`` 16-byte aligned.
"""
from __future__ import annotations

from types import SimpleNamespace

from .stream_mma import PAD, macros
from .warp_mma import check_knobs, check_sizes, compile_for

SMEM_LIMIT = 227 * 1024  # shared memory one CTA may take on sm_90
STATIC_LIMIT = 48 * 1024  # of it, statically declared
KNOBS = {"nb": (16, 8, 32, 64), "warps": (8, 4, 2, 16), "stages": (4, 3, 2, 6, 8), "cluster": (8, 4, 2, 1),
         "bk": (64, 32, 16, 8, 4, 128, 256)}
SMS = 132  # streaming multiprocessors of an H100 / H200 SXM: the default grid is sized for them
SM_SHARED = 228 * 1024  # shared memory of one
MAX_FEAT = 64  # wider B: the block-row template, whose gathers of B are then worth their bytes


def slice_rows(block) -> int:
    """Rows of a block a warp owns: 32 where they divide it, else 16."""
    return 32 if int(block[0]) % 32 == 0 else 16


def check_block(block) -> None:
    """ValueError unless the kernel takes blocks of this shape."""
    r, c = (int(b) for b in block)
    if r % 16 or r > 64 or r < 16:
        raise ValueError(f"block rows should be 16, 32, 48 or 64 (16 rows an MMA), got {r}")
    if c % 16 or c > 128 or c < 16:
        raise ValueError(f"block columns should be a multiple of 16 up to 128 (the MMA's k-step), got {c}")


def plan(block, feat: int, nb: int, warps: int, stages: int, cluster: int, bk: int) -> SimpleNamespace:
    """The kernel's sizes, checked: ValueError naming the first thing it cannot take."""
    check_block(block)
    r, c = (int(b) for b in block)
    check_sizes(feat=feat, nb=nb, warps=warps, stages=stages, cluster=cluster, bk=bk)
    check_knobs({"nb": nb, "warps": warps, "stages": stages, "cluster": cluster, "bk": bk}, KNOBS)
    if feat > MAX_FEAT:
        raise ValueError(f"feat should be at most {MAX_FEAT} (wider B takes the block-row template), got {feat}")
    TR = slice_rows(block)
    bmode = "vec" if feat % 8 == 0 else ("raw" if feat < 8 else "reg")
    p = SimpleNamespace(
        r=r, c=c, TR=TR, SL=r // TR, feat=feat, nb=nb, W=warps, D=stages, S=cluster, bk=bk, bmode=bmode,
        apitch=c + PAD, bpitch=max(nb, 16) + PAD, nt=nb // 8, mt=TR // 16, threads=warps * 32,
        nch=-(-feat // nb), kdim=c, rows_b=bk * c)
    p.slot = TR * p.apitch  # halves of a block slice in its slot
    p.chunks = TR * c // 8  # 16-byte chunks of a block slice
    p.red = warps * TR * nb  # floats of a CTA's partial tile (cluster reduction)
    p.b_halves = bk * c * (p.bpitch if bmode != "raw" else feat) + 8
    p.static = p.b_halves * 2 if bmode == "reg" else 0
    p.vs_halves = max(warps * stages * p.slot, 2 * p.red if cluster > 1 else 0)
    dyn = p.vs_halves * 2 + (0 if bmode == "reg" else p.b_halves * 2)
    # TVM's runtime raises a kernel's dynamic limit only for 48 KiB or more: a launch over
    # 48 KiB in all takes at least that much dynamic memory
    if p.static + dyn > STATIC_LIMIT and dyn < STATIC_LIMIT:
        p.vs_halves += ((STATIC_LIMIT - dyn) // 2 + 64 + 63) // 64 * 64  # B's stage stays 128-byte aligned
        dyn = p.vs_halves * 2 + (0 if bmode == "reg" else p.b_halves * 2)
    p.smem = p.static + dyn
    if p.static > STATIC_LIMIT:
        raise ValueError(f"block {r}x{c} with nb={nb}, bk={bk} needs {p.static} bytes of static shared memory "
                         f"for B (feat={feat}), over {STATIC_LIMIT}: take a smaller bk or nb")
    if p.smem > SMEM_LIMIT:
        raise ValueError(f"block {r}x{c} with warps={warps}, stages={stages}, nb={nb}, bk={bk} needs {p.smem} "
                         f"bytes of shared memory a CTA, over {SMEM_LIMIT}: take fewer warps or stages, or a "
                         f"smaller bk or nb")
    p.ctas_per_sm = max(1, min(SM_SHARED // (p.smem + 1024), 2048 // p.threads, 32))
    return p


def _fits(block, feat, knobs) -> bool:
    try:
        plan(block, feat, **knobs)
    except ValueError:
        return False
    return True


SM_BYTES_PER_NS = 40.0  # what one SM moves from L2 / HBM into shared memory (H100 / H200, about)
CLUSTERS_OF_8 = 15  # clusters of 8 CTAs co-resident a CTA an SM (GPCs of 16-18 SMs)
STEP_NS = 700.0  # one dependent round trip to memory: the prologue's loads, a phase of B, a cluster barrier


def estimate_ns(block, feat: int, knobs: dict, rows: int, cols: int, density: float) -> float:
    """A rough time for ``knobs`` on a ``rows`` x ``cols`` matrix with ``density`` of its
    blocks stored, per wave of CTAs: the CTAs an SM holds move their bytes (B's rows for
    their part of K, once per CTA, and their slices' blocks) through that SM's share of the
    memory bandwidth, after a few dependent round trips (the row's offsets and columns, each
    phase of B, the cluster's reduction)."""
    r, c = (int(b) for b in block)
    p = plan(block, feat, **knobs)
    k_blocks = max(-(-cols // c), 1)
    per = -(-k_blocks // p.S)
    slices = max(-(-max(rows, 1) // r), 1) * p.SL
    ctas = -(-slices // p.W) * p.nch * p.S
    b_bytes = per * c * p.nb * 2
    w_bytes = p.W * p.TR * per * c * max(density, 0.01) * 2 * p.nch
    # CTAs at once: clusters are placed whole inside a GPC, which leaves SMs idle; about 15
    # clusters of 8 a CTA an SM fit an H100 / H200 at once (at 128 CTAs of a 4096 x 4096
    # weight, clusters of 8 measured 1.5x slower than of 4: results/sweep_bsr_stream_H200.json)
    at_once = SMS * p.ctas_per_sm if p.S == 1 else (
        CLUSTERS_OF_8 * 8 * p.ctas_per_sm if p.S == 8 else int(0.9 * (SMS * p.ctas_per_sm // p.S) * p.S))
    waves = -(-ctas // max(int(at_once), 1))
    phases = -(-per // p.bk)
    per_sm = -(-min(ctas, max(int(at_once), 1)) // SMS)  # CTAs an SM holds in a wave
    return waves * (per_sm * (b_bytes + w_bytes) / SM_BYTES_PER_NS + STEP_NS * (2 + phases + (1 if p.S > 1 else 0)))


def default_knobs(block, feat: int, rows: int = 0, cols: int = 0, density: float = 0.3, fixed=None) -> dict:
    """Columns of B a CTA takes (the features, rounded up to 8, 16, 32 or 64); then, among
    warps (16, 8, 4, 2) and cluster sizes (8, 4, 2, 1), each with the fewest phases of B
    (the narrowest stage that holds the CTA's part of K, else the widest that fits), the
    least :func:`estimate_ns` for a matrix of ``rows`` x ``cols`` (4096 x 4096 where
    unknown) with ``density`` of its blocks stored. ``fixed``: knobs already chosen (the
    search then runs over the others)."""
    feat = max(int(feat), 1)
    fixed = dict(fixed or {})
    nb = fixed.get("nb", next((n for n in (8, 16, 32, 64) if n >= feat), 64))
    rows, cols = rows or 4096, cols or 4096
    k_blocks = max(-(-cols // int(block[1])), 1)
    best = None
    for warps in (fixed["warps"],) if "warps" in fixed else (8, 16, 4, 2):
        for cluster in (fixed["cluster"],) if "cluster" in fixed else (8, 4, 2, 1):
            per = -(-k_blocks // cluster)
            widths = sorted(KNOBS["bk"])
            order = [w for w in widths if w >= per][:1] + sorted((w for w in widths if w < per), reverse=True)
            for bk in (fixed["bk"],) if "bk" in fixed else order:
                knobs = {"nb": nb, "warps": warps, "stages": fixed.get("stages", 4), "cluster": cluster, "bk": bk}
                if not _fits(block, feat, knobs):
                    continue
                key = estimate_ns(block, feat, knobs, rows, cols, density)
                if best is None or key < best[0] * 0.98:  # a clear gain over the earlier choice
                    best = (key, knobs)
                break  # the first that fits: fewest phases, least shared memory
    return best[1] if best else {"nb": nb, "warps": 2, "stages": 2, "cluster": 8, "bk": 4, **fixed}


def spmm(block=(16, 16), feat: int = 16, nb: int = 16, warps: int = 8, stages: int = 4, cluster: int = 8,
         bk: int = 64, name: str = "bsr_stream"):
    """The PrimFunc ``name(indptr, indices, values, B, C)``: ``indptr`` (int32, block rows + 1),
    ``indices`` (int32, sorted block columns per block row) and ``values`` (float16, the
    blocks row-major one after another) as ``formats.bsr`` stores them; B (K, feat) float16;
    C (M, feat) float32, written whole (no zero fill before). M and K are read from the
    operands."""
    from tvm.script import tirx as T

    p = plan(block, feat, nb, warps, stages, cluster, bk)
    R, Cb, TR, SL, W, D, S, AP = p.r, p.c, p.TR, p.SL, p.W, p.D, p.S, p.apitch
    mt, nt = p.mt, p.nt
    commit = T.ptx["cp.async.commit_group"]
    wait = T.ptx["cp.async.wait_group"]
    ms = macros(p)
    cp, full, sum_each = ms.cp, ms.full, ms.sum_each
    syncwarp, shared_at, load_b, multiply = ms.syncwarp, ms.shared_at, ms.load_b, ms.multiply
    write_c, reduce_cluster = ms.write_c, ms.reduce_cluster
    per_lane = -(-p.chunks // 32)
    BIG = T.int32(0x7FFFFFFF)

    @T.macro
    def issue(sb, values, q, slot, s, w, tx):
        """This warp's copy of its slice ``s`` of stored block ``q`` into its slot ``slot``."""
        for i in T.unroll(per_lane):
            e = T.meta_var(i * 32 + tx)
            if e < p.chunks:
                cp(shared_at(sb[0], (w * D + slot) * p.slot + e // (Cb // 8) * AP + e % (Cb // 8) * 8, 2),
                   values.access_ptr("r", offset=(q * R + s * TR) * Cb + e * 8, extent=8), 16)

    @T.macro
    def count_below(cnt, go, indices, cur, hi, limit, tx):
        """``cnt[0]``: the stored blocks from ``cur`` to ``hi`` whose column is below
        ``limit`` (the row's columns are sorted), 32 at a time by ballot."""
        cnt[0] = 0
        go[0] = 1
        while go[0] == 1:
            q = T.meta_var(cur + cnt[0] + tx)
            bal = T.call_extern("uint32", "__ballot_sync", full,
                                T.if_then_else(q < hi, indices[T.min(q, indices.shape[0] - 1)], BIG) < limit)
            got = T.call_extern("int32", "__popc", bal)
            cnt[0] = cnt[0] + got
            if got < 32:
                go[0] = 0

    @T.macro
    def column_window(iw, indices, at, hi, tx):
        """Lane l: the column of stored block ``at + l`` (0 past the row)."""
        iw[0] = T.if_then_else(at + tx < hi, indices[T.min(at + tx, indices.shape[0] - 1)], 0)

    @T.prim_func(s_tir=True)
    def bsr_stream(i_h: T.handle, j_h: T.handle, v_h: T.handle, b_h: T.handle, c_h: T.handle):
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
        slices = T.meta_var(T.max(n_ptr - 1, 0) * SL)
        ngc = T.meta_var((K + Cb - 1) // Cb)
        per = T.meta_var((ngc + S - 1) // S)
        bx = T.env_thread("blockIdx.x")
        ty = T.env_thread("threadIdx.y")
        tx = T.env_thread("threadIdx.x")
        T.launch_thread(bx, T.max((slices + W - 1) // W, 1) * p.nch * S)
        if S > 1:
            cx = T.env_thread("clusterCtaIdx.x")
            T.launch_thread(cx, S)
        T.launch_thread(ty, W)
        T.launch_thread(tx, 32)
        # one dynamic buffer: the slots (and the cluster's partial tiles), then B's stage
        Vs = T.alloc_buffer((p.vs_halves + (0 if p.bmode == "reg" else p.b_halves),), "float16", scope="shared.dyn",
                            align=128)
        if p.bmode == "reg":
            Bs = T.alloc_buffer((p.b_halves,), "float16", scope="shared", align=128)
        else:
            Bs = T.decl_buffer((p.b_halves,), "float16", data=Vs.data, elem_offset=p.vs_halves, scope="shared.dyn")
        Red = T.decl_buffer((p.red,), "float32", data=Vs.data, scope="shared.dyn")
        sb = T.alloc_buffer((4,), "uint32", scope="local")  # shared addresses of Vs, -, Bs, -
        acc = T.alloc_buffer((mt * nt * 4,), "float32", scope="local")
        af = T.alloc_buffer((4,), "uint32", scope="local")
        bf = T.alloc_buffer((max(nt // 2, 1) * 4,), "uint32", scope="local")
        rng = T.alloc_buffer((3,), "int32", scope="local")  # the row's first and end stored block, the cursor
        cnt = T.alloc_buffer((1,), "int32", scope="local")
        go = T.alloc_buffer((1,), "int32", scope="local")
        iw = T.alloc_buffer((2,), "int32", scope="local")  # lane l: the columns of the window's l-th block, the next's
        mapped = T.alloc_buffer((1,), "uint64", scope="local")
        sums = T.alloc_buffer((sum_each,), "float32", scope="local")
        rank = T.meta_var(bx % S)
        cta = T.meta_var(bx // S)
        g = T.meta_var(cta // p.nch * W + ty)  # this warp's slice
        n0 = T.meta_var(cta % p.nch * p.nb)
        g0 = T.meta_var(rank * per)  # the CTA's first block column
        cnt_cols = T.meta_var(T.max(T.min(g0 + per, ngc) - g0, 0))  # its block columns
        live = T.meta_var(g < slices)
        tid = T.meta_var(ty * 32 + tx)
        sb[0] = T.call_extern("uint32", "__cvta_generic_to_shared", Vs.access_ptr("w"))
        sb[2] = T.call_extern("uint32", "__cvta_generic_to_shared", Bs.access_ptr("w"))
        for i in T.unroll(mt * nt * 4):
            acc[i] = T.float32(0)
        rng[0] = T.if_then_else(live, indptr[T.min(g // SL, n_ptr - 1)], 0)
        rng[1] = T.if_then_else(live, indptr[T.min(g // SL + 1, n_ptr - 1)], 0)
        rng[2] = rng[0]
        if S > 1:  # where the row's blocks reach this CTA's columns
            count_below(cnt, go, indices, rng[0], rng[1], g0, tx)
            rng[2] = rng[0] + cnt[0]
        for ph in range((cnt_cols + bk - 1) // bk):  # B's rows for bk block columns at a time
            c0 = T.meta_var(g0 + ph * bk)  # the phase's first block column
            load_b(sb, Bs, B, c0 * Cb, T.min(bk, cnt_cols - ph * bk) * Cb, n0, tid)  # the phase's rows only
            commit()
            count_below(cnt, go, indices, rng[2], rng[1], T.min(c0 + bk, g0 + per), tx)
            column_window(iw, indices, rng[2], rng[1], tx)
            if cnt[0] > 32:
                iw[1] = T.if_then_else(rng[2] + 32 + tx < rng[1],
                                       indices[T.min(rng[2] + 32 + tx, indices.shape[0] - 1)], 0)
            for s in T.unroll(D - 1):  # each warp's first stages
                if s < cnt[0]:
                    issue(sb, values, rng[2] + s, s, g % SL, ty, tx)
                commit()
            wait(D - 1)
            T.tvm_storage_sync("shared")  # B's rows landed for every warp
            for j in range(cnt[0]):  # each warp on its own
                wait(D - 2)
                syncwarp()  # block j has landed for every lane; every lane is done with block j - 1's slot
                if j + D - 1 < cnt[0]:
                    issue(sb, values, rng[2] + j + D - 1, (j + D - 1) % D, g % SL, ty, tx)
                commit()
                if T.And(j % 32 == 0, j > 0):
                    iw[0] = iw[1]
                    if j + 32 < cnt[0]:
                        iw[1] = T.if_then_else(rng[2] + j + 32 + tx < rng[1],
                                               indices[T.min(rng[2] + j + 32 + tx, indices.shape[0] - 1)], 0)
                col = T.call_extern("int32", "__shfl_sync", full, iw[0], j % 32)
                multiply(Bs, af, bf, acc, sb[0] + T.Cast("uint32", (ty * D + j % D) * p.slot * 2), (col - c0) * Cb,
                         tx)
            rng[2] = rng[2] + cnt[0]
            wait(0)
            T.tvm_storage_sync("shared")  # every warp done with B's rows before the next phase's
        if S == 1:
            write_c(C, acc, g * TR, n0, tx)
        else:
            reduce_cluster(C, Red, Vs, acc, mapped, sums, rank, cta // p.nch * W * TR, n0, ty, tx, tid)

    return bsr_stream


def build(block=(16, 16), feat: int = 16, arch: str = "sm_90a", **knobs):
    """The compiled module (TVM executable) of :func:`spmm` for ``arch``."""
    return compile_for(spmm(block, feat, **knobs), arch)
