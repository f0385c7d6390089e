"""Tensor Core SpMM for ``tiled`` weights where the product is bound by reading the weight
(decoding, small batches): ``C = W @ B`` with W the bitmap tiles of ``formats.tiled``, B
(K, N) float16 and C (M, N) float32, N fixed when the kernel is built.

What it is built around: at 1-32 columns of B the weight's bytes are the work, so each byte
is read once, as bytes (16-byte ``cp.async``, a few tiles ahead), and no arithmetic is spent
on the zeros of a sparse tile beyond one zero-fill of a dense buffer:

* **a warp owns one tile row** (TR rows) of W and walks the tile columns of its CTA's part of
  K on its own, with no barrier across the CTA: it owns its tiles' bytes (a slot per
  pipeline stage: the values ``values[offsets[t] : offsets[t + 1]]`` moved in 16-byte chunks
  from the one below ``offsets[t]``, and the tile's bitmap words), its dense TR x TC buffer
  and its accumulators, and waits only for its own copies;
* **decoding scatters the non-zeros**: lane l takes a run of the tile's 32-bit half-words
  (the bit order of the values, so a warp-wide prefix sum of popcounts gives each lane where
  its values start) and walks its set bits with ``__ffs``, storing value after value at its
  row and column of the zeroed buffer: the cost follows the non-zeros, not the elements;
* **B's rows for the CTA's part of K stay in shared memory** (copied once, ``bk`` tile
  columns at a time), shared by the W warps of W consecutive tile rows; the MMAs read the
  dense buffer and B with ``ldmatrix`` (rows padded by 16 bytes: conflict-free) into
  ``mma.m16n8k16``, float32 accumulators;
* **the CTAs of a cluster split K** and add their partial tiles through distributed shared
  memory (Hopper's ``mapa``): one launch, no atomics, no C to zero first.

Tiles without values are skipped. TVM plans barriers for shared memory itself and cannot
tell pipeline slots or warps apart, so every copy into shared memory and every read of the
dense buffers goes through an address held in a register, and the kernel places its own
``__syncwarp`` and barriers. Knobs (declared once here, made a transformation's by
``schedules.tensorcore_packed``): ``nb`` (columns of B a CTA takes), ``warps``, ``stages``
(tiles in flight per warp, the one being decoded included), ``cluster`` (CTAs that share a
tile row's K), ``cap`` (a slot holds 1/cap of a tile's elements; a denser tile is read in
place, from global memory) and ``bk`` (tile columns of B resident at once). The kernel
trusts its operands (a ``formats.tiled`` instance's own arrays; ``sparsec.compile``'s kernel
checks them) and needs ``values`` and ``bitmap`` 16-byte aligned.
"""
from __future__ import annotations

from types import SimpleNamespace

from .stream_mma import PAD, macros
from .warp_mma import check_sizes, compile_for

SUB = 8  # a subtile is 8 x 8 elements: one 64-bit bitmap word, two 32-bit half-words
SMEM_LIMIT = 227 * 1024  # shared memory one CTA may take on sm_90
STATIC_LIMIT = 48 * 1024  # of it, statically declared
KNOBS = {"nb": (16, 8, 32, 64), "warps": (8, 4, 2), "stages": (4, 3, 2, 6, 8), "cluster": (8, 4, 2, 1),
         "cap": (1, 2, 4), "bk": (16, 8, 4, 32, 2, 1)}
SMS = 132  # streaming multiprocessors of an H100 / H200 SXM: the default grid is sized for them
SM_SHARED = 228 * 1024  # shared memory of one


def default_knobs(feat: int, rows: int = 0, cols: int = 0, tile=(16, 64), density: float = 1.0) -> dict:
    """Columns of B a CTA takes (the tokens, rounded up to 8, 16, 32 or 64); slots sized for
    the matrix's ``density`` (a quarter of a tile up to 15 % non-zeros, half up to 35 %); then,
    among the warps (8, 4, 2), cluster sizes (8, 4, 2) and B phases (``bk``) whose buffers
    fit, the least estimated time for a matrix of ``rows`` x ``cols``: waves of CTAs (a
    second, partial wave costs as much as a full one; H100/H200, 132 SMs) times a warp's
    tiles, a phase of B's rows beyond the first costing about two tiles. More warps (B shared
    more widely) and larger clusters break ties."""
    feat = max(int(feat), 1)
    nb = next((n for n in (8, 16, 32, 64) if n >= feat), 64)
    tr, tc = (int(t) for t in tile)
    cap = 4 if density <= 0.15 else (2 if density <= 0.35 else 1)
    k_tiles = -(-cols // tc) if cols else 64
    best = None
    for warps in (8, 4, 2):
        for cluster in (8, 4, 2):
            per = -(-k_tiles // cluster)
            for bk in (32, 16, 8, 4, 2, 1):
                knobs = {"nb": nb, "warps": warps, "stages": 4, "cluster": cluster, "cap": cap, "bk": bk}
                if not _fits(tile, feat, knobs):
                    continue
                p = plan(tile, feat, **knobs)
                slots = int(0.9 * SMS * p.ctas_per_sm)  # CTAs at once, less what cluster placement loses
                ctas = -(-(-(-max(rows, 1) // tr)) // warps) * p.nch * cluster
                cost = -(-ctas // slots) * (per + 2 * (-(-per // bk) - 1))
                key = (cost, -warps, -cluster, -bk)
                if best is None or key < best[0]:
                    best = (key, knobs)
    return best[1] if best else {"nb": nb, "warps": 2, "stages": 2, "cluster": 8, "cap": 4, "bk": 1}


def _fits(tile, feat, knobs) -> bool:
    try:
        plan(tile, feat, **knobs)
    except ValueError:
        return False
    return True


def plan(tile, feat: int, nb: int, warps: int, stages: int, cluster: int, cap: int = 1,
         bk: int = 16) -> SimpleNamespace:
    """The kernel's sizes, checked: ValueError naming the first thing it cannot take."""
    TR, TC = (int(t) for t in tile)
    check_sizes(tile_rows=TR, tile_cols=TC, feat=feat, nb=nb, warps=warps, stages=stages, cluster=cluster, cap=cap,
                bk=bk)
    for name, value in (("nb", nb), ("warps", warps), ("stages", stages), ("cluster", cluster), ("cap", cap),
                        ("bk", bk)):
        if value not in KNOBS[name]:
            raise ValueError(f"{name} should be one of {sorted(KNOBS[name])}, got {value!r}")
    if TR % 16 or TR > 64:
        raise ValueError(f"tile rows should be 16, 32, 48 or 64 (a warp owns a tile row, 16 rows an MMA), got {TR}")
    if TC % 16 or TC > 256:
        raise ValueError(f"tile columns should be a multiple of 16 up to 256 (the MMA's k-step), got {TC}")
    # B's rows: "vec" -- 16-byte aligned, cp.async chunks of a row; "raw" -- fewer than 8
    # columns: the rows of a phase are one contiguous run of B, copied as it is and read a
    # half at a time into fragments; "reg" -- other widths, loaded and stored by threads
    bmode = "vec" if feat % 8 == 0 else ("raw" if feat < 8 else "reg")
    words = TR * TC // (SUB * SUB)
    halves = 2 * words  # 32-bit half-words of a tile, in value order
    p = SimpleNamespace(
        TR=TR, TC=TC, feat=feat, nb=nb, W=warps, D=stages, S=cluster, bk=bk, vec=bmode == "vec", bmode=bmode,
        words=words, per_lane=-(-halves // 32), halves=halves,
        cap=cap, vcap=TR * TC // cap + 8,  # a slot's values: 1 / cap of a tile, and the 16-byte chunk's lead-in
        apitch=TC + PAD, bpitch=max(nb, 16) + PAD, nt=nb // 8, mt=TR // 16, threads=warps * 32,
        nch=-(-feat // nb), kdim=TC, rows_b=bk * TC)
    p.v_chunks = -(-p.vcap // 8)  # 16-byte chunks a slot takes at most
    p.red = warps * TR * nb  # floats of a CTA's partial tile (cluster reduction)
    p.b_halves = bk * TC * (p.bpitch if bmode != "raw" else feat) + 8
    # static: the dense buffers (and B where threads store it, "reg"); dynamic: what cp.async
    # writes. TVM's runtime raises a kernel's dynamic limit only for 48 KiB or more, so a
    # launch over 48 KiB in all takes at least that much dynamic memory
    p.static = warps * TR * p.apitch * 2 + (p.b_halves * 2 if bmode == "reg" else 0)
    p.vs_halves = max(warps * stages * p.vcap, 2 * p.red if cluster > 1 else 0)
    dyn = p.vs_halves * 2 + warps * stages * words * 8 + (0 if bmode == "reg" else p.b_halves * 2)
    if p.static + dyn > STATIC_LIMIT and dyn < STATIC_LIMIT:
        p.vs_halves += (STATIC_LIMIT - dyn) // 2 + 64
        dyn = STATIC_LIMIT + 128
    p.smem = p.static + dyn
    if p.static > STATIC_LIMIT:
        raise ValueError(f"tile {TR}x{TC} with warps={warps}, nb={nb}, bk={bk} needs {p.static} bytes of static "
                         f"shared memory, over {STATIC_LIMIT}: take fewer warps, or a smaller bk or nb")
    if p.smem > SMEM_LIMIT:
        raise ValueError(f"tile {TR}x{TC} with warps={warps}, stages={stages}, nb={nb}, bk={bk} needs {p.smem} "
                         f"bytes of shared memory a CTA, over {SMEM_LIMIT}: take fewer warps or stages, or a "
                         f"smaller bk or nb")
    p.ctas_per_sm = max(1, min(SM_SHARED // (p.smem + 1024), 2048 // p.threads, 32))
    return p


def spmm(tile=(16, 64), feat: int = 16, nb: int = 16, warps: int = 8, stages: int = 4, cluster: int = 8,
         cap: int = 1, bk: int = 16, name: str = "tiled_stream"):
    """The PrimFunc ``name(words, offsets, values, B, C)``: ``words`` (uint64, one per
    subtile), ``offsets`` (int32, one per tile and the end) and ``values`` (float16) as
    ``formats.tiled`` stores them; B (K, feat) float16; C (M, feat) float32, written whole
    (no zero fill before). M and K are read from the operands."""
    from tvm.script import tirx as T

    p = plan(tile, feat, nb, warps, stages, cluster, cap, bk)
    TR, TC, W, D, S = p.TR, p.TC, p.W, p.D, p.S
    VCAP, WCAP, AP, mt, nt, P = p.vcap, p.words, p.apitch, p.mt, p.nt, p.per_lane
    commit = T.ptx["cp.async.commit_group"]
    wait = T.ptx["cp.async.wait_group"]
    w_chunks = WCAP // 2  # 16-byte chunks of a tile's words
    ms = macros(p)
    cp, full, sum_each = ms.cp, ms.full, ms.sum_each
    syncwarp, shared_at, load_b, multiply_tile = ms.syncwarp, ms.shared_at, ms.load_b, ms.multiply
    write_c, reduce_cluster = ms.write_c, ms.reduce_cluster

    @T.macro
    def issue(sb, words, values, t, lo, hi, tile_id, w, tx):
        """This warp's copies of its local tile ``t``: the values (from the 16-byte chunk
        holding ``lo``, as many as the slot takes) and the words, into slot ``t % D``."""
        slot = T.meta_var(t % D)
        c0 = T.meta_var(lo // 8)
        for i in T.unroll(-(-p.v_chunks // 32)):
            c = T.meta_var(c0 + i * 32 + tx)
            if T.And(c * 8 < hi, i * 32 + tx < p.v_chunks):
                cp(shared_at(sb[0], (w * D + slot) * VCAP + (i * 32 + tx) * 8, 2),
                   values.access_ptr("r", offset=c * 8, extent=8), 16,
                   T.Cast("uint32", T.min(values.shape[0] - c * 8, 8) * 2))
        for i in T.unroll(-(-w_chunks // 32)):
            q = T.meta_var(i * 32 + tx)
            if q < w_chunks:
                cp(shared_at(sb[1], (w * D + slot) * WCAP + q * 2, 8),
                   words.access_ptr("r", offset=tile_id * WCAP + q * 2, extent=2), 16)

    @T.macro
    def tile_range(ow, oc, offsets, first, t, live, tx):
        """``oc`` = the value range of local tile ``t`` from the offsets window ``ow`` (lane
        l: the l-th offset of the current window, and of the next); ``t`` uniform across the
        warp and met in increasing order, the window moving on at each multiple of 32."""
        if t % 32 == 0:
            if t > 0:
                ow[0] = ow[1]
                ow[1] = T.if_then_else(live, offsets[T.min(first + t + 32 + tx, offsets.shape[0] - 1)], 0)
        oc[0] = T.call_extern("int32", "__shfl_sync", full, ow[0], t % 32)
        oc[1] = T.if_then_else(t % 32 == 31, T.call_extern("int32", "__shfl_sync", full, ow[1], 0),
                               T.call_extern("int32", "__shfl_sync", full, ow[0], t % 32 + 1))

    @T.macro
    def scatter(As, src, hw, bits, pos, w, slot, tx, in_place):
        """Each lane's values, from ``src`` at ``pos`` on, stored at its half-words' set bits."""
        for i in T.unroll(P):
            h = T.meta_var(tx * P + i)
            sub = T.meta_var(h // 2)
            base = T.meta_var(w * TR * AP + (sub // (TC // SUB) * SUB + h % 2 * 4) * AP + sub % (TC // SUB) * SUB)
            bits[0] = hw[i]
            while bits[0] != T.uint32(0):  # one step per non-zero
                b = T.call_extern("int32", "__ffs", T.Cast("int32", bits[0])) - 1
                if in_place:
                    As[base + b // 8 * AP + b % 8] = src[pos[0]]
                else:
                    As[base + b // 8 * AP + b % 8] = src[(w * D + slot) * VCAP + pos[0]]
                pos[0] = pos[0] + 1
                bits[0] = T.bitwise_and(bits[0], bits[0] - T.uint32(1))

    @T.macro
    def decode(As, Vs, Ws32, values, hw, bits, run, pos, dc, w, slot, tx):
        """The tile in ``slot`` (values ``dc[0]`` to ``dc[1]``) into the warp's dense
        buffer: zero it, then each lane stores the values of its half-words at their set bits."""
        for i in T.unroll(TR * TC // 8 // 32):
            e = T.meta_var(i * 32 + tx)
            As[T.ramp(w * TR * AP + e // (TC // 8) * AP + e % (TC // 8) * 8, 1, 8)] = T.broadcast(T.float16(0), 8)
        run[0] = 0
        for i in T.unroll(P):
            hw[i] = T.if_then_else(tx * P + i < p.halves, Ws32[(w * D + slot) * WCAP * 2 + T.min(tx * P + i, p.halves - 1)],
                                   T.uint32(0))
            run[0] = run[0] + T.call_extern("int32", "__popc", hw[i])
        pos[0] = run[0]  # inclusive scan of the lanes' counts
        for d in T.unroll(5):
            run[1] = T.call_extern("int32", "__shfl_up_sync", full, pos[0], 1 << d)
            if tx >= (1 << d):
                pos[0] = pos[0] + run[1]
        pos[0] = pos[0] - run[0] + dc[0] % 8  # where this lane's values start in the slot
        syncwarp()
        if p.cap == 1:
            scatter(As, Vs, hw, bits, pos, w, slot, tx, False)
        elif dc[1] - dc[0] + dc[0] % 8 <= VCAP:
            scatter(As, Vs, hw, bits, pos, w, slot, tx, False)
        else:  # a tile with more values than the slot: read them where they are
            pos[0] = pos[0] + dc[0] - dc[0] % 8
            scatter(As, values, hw, bits, pos, w, slot, tx, True)

    @T.prim_func(s_tir=True)
    def tiled_stream(w_h: T.handle, o_h: T.handle, v_h: T.handle, b_h: T.handle, c_h: T.handle):
        T.func_attr({"global_symbol": name, "tirx.noalias": True})
        n_words = T.int32()
        n_offsets = T.int32()
        nnz = T.int32()
        M = T.int32()
        K = T.int32()
        words = T.match_buffer(w_h, (n_words,), "uint64")
        offsets = T.match_buffer(o_h, (n_offsets,), "int32")
        values = T.match_buffer(v_h, (nnz,), "float16")
        B = T.match_buffer(b_h, (K, feat), "float16")
        C = T.match_buffer(c_h, (M, feat), "float32")
        ngo = T.meta_var((M + TR - 1) // TR)
        ngc = T.meta_var((K + TC - 1) // TC)
        per = T.meta_var((ngc + S - 1) // S)
        bx = T.env_thread("blockIdx.x")
        ty = T.env_thread("threadIdx.y")
        tx = T.env_thread("threadIdx.x")
        T.launch_thread(bx, T.max((ngo + W - 1) // W, 1) * p.nch * S)
        if S > 1:
            cx = T.env_thread("clusterCtaIdx.x")
            T.launch_thread(cx, S)
        T.launch_thread(ty, W)
        T.launch_thread(tx, 32)
        Vs = T.alloc_buffer((p.vs_halves,), "float16", scope="shared.dyn", align=128)
        Ws = T.alloc_buffer((W * D * WCAP,), "uint64", scope="shared.dyn", align=128)
        As = T.alloc_buffer((W * TR * AP,), "float16", scope="shared", align=128)
        Bs = T.alloc_buffer((p.b_halves,), "float16", scope="shared" if p.bmode == "reg" else "shared.dyn",
                            align=128)
        Ws32 = T.decl_buffer((W * D * WCAP * 2,), "uint32", data=Ws.data, scope="shared.dyn")
        Red = T.decl_buffer((p.red,), "float32", data=Vs.data, scope="shared.dyn")
        sb = T.alloc_buffer((4,), "uint32", scope="local")  # shared addresses of Vs, Ws, Bs, As
        acc = T.alloc_buffer((mt * nt * 4,), "float32", scope="local")
        af = T.alloc_buffer((4,), "uint32", scope="local")
        bf = T.alloc_buffer((max(nt // 2, 1) * 4,), "uint32", scope="local")
        hw = T.alloc_buffer((P,), "uint32", scope="local")
        bits = T.alloc_buffer((1,), "uint32", scope="local")
        run = T.alloc_buffer((2,), "int32", scope="local")
        pos = T.alloc_buffer((1,), "int32", scope="local")
        oc = T.alloc_buffer((2,), "int32", scope="local")  # the value range of the tile being copied
        dc = T.alloc_buffer((2,), "int32", scope="local")  # ... and of the tile being decoded
        ow = T.alloc_buffer((2,), "int32", scope="local")  # offsets: lane l holds a window's l-th, the next's
        od = T.alloc_buffer((2,), "int32", scope="local")  # the same, for the tile being decoded
        mapped = T.alloc_buffer((1,), "uint64", scope="local")
        sums = T.alloc_buffer((sum_each,), "float32", scope="local")
        rank = T.meta_var(bx % S)
        cta = T.meta_var(bx // S)
        go = T.meta_var(cta // p.nch * W + ty)  # this warp's tile row
        n0 = T.meta_var(cta % p.nch * nb)
        g0 = T.meta_var(rank * per)  # the CTA's first tile column
        cnt = T.meta_var(T.max(T.min(g0 + per, ngc) - g0, 0))  # its tile columns (the same for every warp)
        live = T.meta_var(go < ngo)
        tid = T.meta_var(ty * 32 + tx)
        first = T.meta_var(go * ngc + g0)  # this warp's first tile
        sb[0] = T.call_extern("uint32", "__cvta_generic_to_shared", Vs.access_ptr("w"))
        sb[1] = T.call_extern("uint32", "__cvta_generic_to_shared", Ws.access_ptr("w"))
        sb[2] = T.call_extern("uint32", "__cvta_generic_to_shared", Bs.access_ptr("w"))
        sb[3] = T.call_extern("uint32", "__cvta_generic_to_shared", As.access_ptr("r"))
        for i in T.unroll(mt * nt * 4):
            acc[i] = T.float32(0)
        # the warp's tile offsets, 32 at a time across its lanes (this window and the next):
        # a tile's value range is two shuffles away, never a load the copies would wait for
        ow[0] = T.if_then_else(live, offsets[T.min(first + tx, offsets.shape[0] - 1)], 0)
        ow[1] = T.if_then_else(live, offsets[T.min(first + 32 + tx, offsets.shape[0] - 1)], 0)
        od[0] = ow[0]
        od[1] = ow[1]
        for ph in range((cnt + bk - 1) // bk):  # B's rows for bk tile columns at a time
            t0 = T.meta_var(ph * bk)
            tn = T.meta_var(T.min(bk, cnt - ph * bk))
            load_b(sb, Bs, B, (g0 + t0) * TC, p.rows_b, n0, tid)
            commit()
            for s in T.unroll(D - 1):  # each warp's first stages
                if T.And(live, s < tn):
                    tile_range(ow, oc, offsets, first, t0 + s, live, tx)
                    issue(sb, words, values, t0 + s, oc[0], oc[1], first + t0 + s, ty, tx)
                commit()
            wait(D - 1)
            T.tvm_storage_sync("shared")  # B's rows landed for every warp
            for j in range(T.if_then_else(live, tn, 0)):  # each warp on its own
                wait(D - 2)
                syncwarp()  # tile j has landed for every lane
                if j + D - 1 < tn:
                    tile_range(ow, oc, offsets, first, t0 + j + D - 1, live, tx)
                    issue(sb, words, values, t0 + j + D - 1, oc[0], oc[1], first + t0 + j + D - 1, ty, tx)
                commit()
                tile_range(od, dc, offsets, first, t0 + j, live, tx)
                if dc[1] > dc[0]:  # tiles without values add nothing
                    decode(As, Vs, Ws32, values, hw, bits, run, pos, dc, ty, (t0 + j) % D, tx)
                    syncwarp()
                    multiply_tile(Bs, af, bf, acc, sb[3] + T.Cast("uint32", ty * TR * AP * 2), j * TC, tx)
                    syncwarp()  # the MMAs' reads of the dense buffer before the next decode
            wait(0)
            T.tvm_storage_sync("shared")  # every warp done with B's rows before the next phase's
        if S == 1:
            write_c(C, acc, go * TR, n0, tx)
        else:
            reduce_cluster(C, Red, Vs, acc, mapped, sums, rank, cta // p.nch * W * TR, n0, ty, tx, tid)

    return tiled_stream


def build(tile=(16, 64), feat: int = 16, arch: str = "sm_90a", **knobs):
    """The compiled module (TVM executable) of :func:`spmm` for ``arch``."""
    return compile_for(spmm(tile, feat, **knobs), arch)
