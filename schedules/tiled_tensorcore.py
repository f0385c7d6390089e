"""Tensor Core SpMM for the ``tiled`` format (``formats.tiled``): load the weight as sparse,
compute it as dense (Flash-LLM's and SpInfer's idea) -- ``C = W @ B`` with W the bitmap
tiles, B (K, N) float16, C (M, N) float32.

A thread block owns one tile row of W (TR rows, one warp per 16 of them) and N columns
``NB`` at a time, and walks the tile columns of its split of K (``splits`` blocks per tile
row share K; their partial sums are added atomically, into a C that a launch before the
kernel's sets to zero). Per tile:

1. the tile's bitmap words into shared memory;
2. where each 8 x 8 subtile's values start: the tile's offset plus the popcounts of the
   subtiles before it (warp 0: each lane sums a run of words, a shuffle scan over the lanes);
3. the tile expanded into a dense TR x TC float16 tile in shared memory: thread t takes
   element bits in order, so a warp reads consecutive values of one subtile (coalesced), a
   set bit's value at ``start + popcount(word & ((1 << bit) - 1))``, a clear bit 0;
4. B's TC x NB slice into shared memory (zero past K and N);
5. per 16-deep k-step, ``ldmatrix`` A (x4) and B (x4.trans, two 8-column tiles) and
   ``mma.m16n8k16`` into fp32 accumulators.

Shared rows are padded by 8 halves (16 bytes), so the eight row addresses of an
``ldmatrix`` fall in eight different 16-byte bank groups. This is the first, unpipelined
version: a tile's expansion and its MMAs alternate, separated by barriers, so a block's time
is a chain of dependent loads per tile and the kernel is latency-bound (H200: 0.31x dense
cuBLAS at 4096 x 4096, 90 %, 16 tokens; ``benchmarks/results/unstructured_quick_H200.json``).
``sparsec.compile`` reaches it through ``schedules.tensorcore_packed`` (layout
``tiled_bitmap``) beyond 64 columns of B, or where its knobs are given (``schedules.tiled_stream``
takes fewer columns); ``benchmarks/check_tiled_tc.py`` checks it on the GPU host.
"""
from __future__ import annotations

from types import SimpleNamespace

from .warp_mma import check_sizes, compile_for

SUB = 8  # a subtile is 8 x 8 elements: one 64-bit bitmap word
PAD = 8  # halves added to every shared row (16 bytes)
# the knobs, declared once (``schedules.tensorcore_packed`` makes them a transformation's):
# columns of B a block takes, blocks that share a tile row's K, and the global loads a thread
# issues before it stores them to shared memory (B's slice and the tile's values): at 1 each
# load's value is stored at once, so the next load waits (a bit test branches around each
# value's load, and ptxas does not hoist loads over it) and a tile costs a chain of round
# trips; at 8 or 16 the loads of a batch go out together and their values land in registers.
# ``pipeline`` 1 and 2 are ``tiled_tensorcore_staged``'s kernel (a tile's bytes staged in one
# round trip; 2: a tile ahead), where ``loads`` does not apply
KNOBS = {"nb": (16, 32, 48, 64), "splits": (1, 2, 4, 8, 16, 32, 64), "loads": (1, 8, 16), "pipeline": (0, 1, 2)}


def default_knobs(feat: int) -> dict:
    """The knobs when none are given, from the H200 sweep of splits 1-64 over 4096 x 4096,
    11008 x 4096 and 4096 x 11008 at 50 % and 90 % (``results/unstructured_quick_H200.json``):
    up to 32 tokens, 64 splits (a block per tile or two: the unpipelined kernel needs blocks
    in flight more than anything) won or came within 6 % of the best; at 1024 tokens 8 splits
    won 4 of 6 and was within 2 % of the best in the others. Columns of B a block takes:
    the tokens, rounded up to 16, at most 64. ``loads`` 1 and ``pipeline`` 0, the settings
    measured so far, until the batched and staged kernels are measured on the GPU host."""
    feat = max(int(feat), 1)
    return {"nb": min(64, -(-feat // 16) * 16), "splits": 64 if feat <= 32 else 8, "loads": 1, "pipeline": 0}


def check(tile, nb: int, splits: int, loads: int = 1, pipeline: int = 0) -> None:
    """ValueError naming the first argument the kernel cannot take."""
    r, c = tile
    check_sizes(tile_rows=r, tile_cols=c, nb=nb, splits=splits, loads=loads)
    if loads not in KNOBS["loads"]:
        raise ValueError(f"loads should be one of {KNOBS['loads']} (global loads a thread keeps in flight), got {loads}")
    if pipeline not in KNOBS["pipeline"]:
        raise ValueError(f"pipeline should be one of {KNOBS['pipeline']} (0: loads into place, 1: a tile's bytes "
                         f"staged, 2: staged a tile ahead), got {pipeline!r}")
    if r % 16 or r > 128:
        raise ValueError(f"tile rows should be a multiple of 16 up to 128 (one warp per 16 rows), got {r}")
    if c % 16 or c > 256:
        raise ValueError(f"tile columns should be a multiple of 16 up to 256 (the MMA's k-step), got {c}")
    if nb % 16 or nb > 64:
        raise ValueError(f"nb should be 16, 32, 48 or 64 (two 8-column MMA tiles per ldmatrix.x4.trans), got {nb}")


def shared_steps(TR: int, TC: int, nb: int, splits: int) -> SimpleNamespace:
    """The TVMScript macros both tiled kernels (this one and ``tiled_tensorcore_staged``)
    share: ``zero_c`` (C to zero, a launch of its own, where splits add into it), ``scan``
    (the subtile starts of the tile in shared memory), ``multiply`` (per 16-deep k-step of the expanded tile: ldmatrix A and B, mma into the
    accumulators) and ``write_c`` (the accumulators into C: stored, or added where K is
    split)."""
    from tvm.script import tirx as T

    pa, pb, nt = TC + PAD, nb + PAD, nb // 8
    ldm = T.ptx["ldmatrix.sync.aligned.m8n8.x4.shared.b16"]
    ldm_t = T.ptx["ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"]
    mma = T.ptx["mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"]

    @T.macro
    def zero_c(C, M, N):
        if splits > 1:  # the splits add into C: it starts at zero (a launch of its own)
            with T.launch_thread("blockIdx.x", T.max(M, 1)) as zr:
                with T.launch_thread("threadIdx.x", 128) as zc:
                    for zi in range((N + 127) // 128):
                        if zr < M and zi * 128 + zc < N:
                            C[zr, zi * 128 + zc] = T.float32(0)

    subs = (TR // SUB) * (TC // SUB)
    per_lane = (subs + 31) // 32  # subtile words a lane of warp 0 sums for the scan

    @T.macro
    def scan(Ws, So, part, start, up, ty, tx, base):
        """Warp 0: where each subtile's values start, ``base`` plus the popcounts of the
        subtiles before it (each lane sums a run of words, a shuffle scan over the lanes)."""
        if ty == 0:
            part[0] = 0
            for q in range(per_lane):
                if tx * per_lane + q < subs:
                    part[0] = part[0] + T.call_extern("int32", "__popcll", Ws[tx * per_lane + q])
            start[0] = part[0]
            for d in T.unroll(5):
                up[0] = T.call_extern("int32", "__shfl_up_sync", T.uint32(0xFFFFFFFF), start[0], 1 << d)
                if tx >= (1 << d):
                    start[0] = start[0] + up[0]
            start[0] = start[0] - part[0] + base
            for q in range(per_lane):
                if tx * per_lane + q < subs:
                    So[tx * per_lane + q] = start[0]
                    start[0] = start[0] + T.call_extern("int32", "__popcll", Ws[tx * per_lane + q])

    @T.macro
    def multiply(As, Bs, af, bf, acc, ty, tx):
        for j in range(TC // 16):
            ldm(af[0], af[1], af[2], af[3],
                As.access_ptr("r", offset=(ty * 16 + tx % 16) * pa + j * 16 + tx // 16 * 8, extent=8))
            for p in T.unroll(nt // 2):
                ldm_t(bf[p * 4], bf[p * 4 + 1], bf[p * 4 + 2], bf[p * 4 + 3],
                      Bs.access_ptr("r", offset=(j * 16 + tx % 16) * pb + p * 16 + tx // 16 * 8, extent=8))
            for n in T.unroll(nt):
                mma(acc[n * 4], acc[n * 4 + 1], acc[n * 4 + 2], acc[n * 4 + 3],
                    af[0], af[1], af[2], af[3],
                    bf[n // 2 * 4 + n % 2 * 2], bf[n // 2 * 4 + n % 2 * 2 + 1],
                    acc[n * 4], acc[n * 4 + 1], acc[n * 4 + 2], acc[n * 4 + 3])

    @T.macro
    def write_c(C, acc, go, n0, ty, tx):
        for n in T.unroll(nt):
            for h in T.unroll(2):
                for e in T.unroll(2):
                    row = go * TR + ty * 16 + tx // 4 + h * 8
                    col = n0 + n * 8 + tx % 4 * 2 + e
                    if row < C.shape[0] and col < C.shape[1]:
                        if splits == 1:
                            C[row, col] = acc[n * 4 + h * 2 + e]
                        else:
                            T.evaluate(T.call_extern("float32", "atomicAdd", T.address_of(C[row, col]),
                                                     acc[n * 4 + h * 2 + e]))

    return SimpleNamespace(zero_c=zero_c, scan=scan, multiply=multiply, write_c=write_c)


def kernel(tile, nb: int, splits: int, name: str, steps: SimpleNamespace, walk):
    """The PrimFunc ``name(words, offsets, values, B, C)`` both tiled kernels are: operands,
    C's zero fill, the grid (block ``bx``: tile row ``go``, split ``s`` of K, columns ``n0``
    of B), the shared tile buffers and accumulators, then ``walk`` -- a macro that multiplies
    the block's tiles into ``acc`` -- and the accumulators into C."""
    from tvm.script import tirx as T

    TR, TC = (int(t) for t in tile)
    warps = TR // 16
    subs = (TR // SUB) * (TC // SUB)
    nt = nb // 8

    @T.prim_func(s_tir=True)
    def tiled_spmm(w_h: T.handle, o_h: T.handle, v_h: T.handle, b_h: T.handle, c_h: T.handle):
        T.func_attr({"global_symbol": name, "tirx.noalias": True})
        n_words = T.int32()
        n_offsets = T.int32()
        nnz = T.int32()
        M = T.int32()
        K = T.int32()
        N = T.int32()
        words = T.match_buffer(w_h, (n_words,), "uint64")
        offsets = T.match_buffer(o_h, (n_offsets,), "int32")
        values = T.match_buffer(v_h, (nnz,), "float16")
        B = T.match_buffer(b_h, (K, N), "float16")
        C = T.match_buffer(c_h, (M, N), "float32")
        steps.zero_c(C, M, N)
        ngo = T.meta_var((M + TR - 1) // TR)
        ngc = T.meta_var((K + TC - 1) // TC)
        nch = T.meta_var((N + nb - 1) // nb)
        per = T.meta_var((ngc + splits - 1) // splits)
        bx = T.env_thread("blockIdx.x")
        ty = T.env_thread("threadIdx.y")
        tx = T.env_thread("threadIdx.x")
        T.launch_thread(bx, T.max(ngo * splits * nch, 1))
        T.launch_thread(ty, warps)
        T.launch_thread(tx, 32)
        As = T.alloc_buffer((TR * (TC + PAD),), "float16", scope="shared", align=64)
        Bs = T.alloc_buffer((TC * (nb + PAD),), "float16", scope="shared", align=64)
        Ws = T.alloc_buffer((subs,), "uint64", scope="shared", align=64)
        So = T.alloc_buffer((subs,), "int32", scope="shared", align=64)
        acc = T.alloc_buffer((nt * 4,), "float32", scope="local")
        af = T.alloc_buffer((4,), "uint32", scope="local")
        bf = T.alloc_buffer((nt * 2,), "uint32", scope="local")
        start = T.alloc_buffer((1,), "int32", scope="local")
        part = T.alloc_buffer((1,), "int32", scope="local")
        up = T.alloc_buffer((1,), "int32", scope="local")
        go = T.meta_var(bx // (splits * nch))
        n0 = T.meta_var(bx % nch * nb)
        for i in T.unroll(nt * 4):
            acc[i] = T.float32(0)
        walk(words, offsets, values, B, As, Bs, Ws, So, acc, af, bf, start, part, up,
             go, bx // nch % splits, n0, per, ngc, ngo, ty, tx)
        steps.write_c(C, acc, go, n0, ty, tx)

    return tiled_spmm


def spmm(tile=(64, 64), nb: int = 32, splits: int = 1, name: str = "tiled_spmm", loads: int = 1):
    """The PrimFunc ``tiled_spmm(words, offsets, values, B, C)``: ``words`` (uint64, one per
    subtile), ``offsets`` (int32, one per tile plus the end) and ``values`` (float16) as
    ``formats.tiled`` stores them; B (K, N) float16; C (M, N) float32. M, K and N are read
    from the operands. With ``splits`` > 1 a first launch zeroes C. The kernel trusts its
    operands (a ``formats.tiled`` instance's own arrays, for the M and K of B and C):
    ``sparsec.compile``'s kernel checks them before every call."""
    from tvm.script import tirx as T

    TR, TC = (int(t) for t in tile)
    check((TR, TC), nb, splits, loads)
    warps = TR // 16
    threads = warps * 32
    subs = (TR // SUB) * (TC // SUB)
    pa, pb = TC + PAD, nb + PAD
    b_each, a_each = -(-TC * nb // threads), TR * TC // threads  # B and A elements a thread moves a tile
    b_batch, a_batch = min(loads, b_each), min(loads, a_each)
    steps = shared_steps(TR, TC, nb, splits)

    @T.macro
    def walk(words, offsets, values, B, As, Bs, Ws, So, acc, af, bf, start, part, up, go, s, n0, per, ngc, ngo, ty, tx):
        """Per tile of the block: words, scan, B's slice and the expansion loaded into place."""
        K, N, nnz = B.shape[0], B.shape[1], values.shape[0]
        held = T.alloc_buffer((max(b_batch, a_batch),), "float16", scope="local")
        tid = T.meta_var(ty * 32 + tx)
        # no tile columns where the grid's one block has no tile row (M = 0): words is empty
        for gc in range(s * per, T.min(s * per + per, T.if_then_else(go < ngo, ngc, 0))):
            tile = go * ngc + gc
            for i in range((subs + threads - 1) // threads):
                e = i * threads + tid
                if e < subs:
                    Ws[e] = words[tile * subs + e]
            T.tvm_storage_sync("shared")
            steps.scan(Ws, So, part, start, up, ty, tx, offsets[tile])  # the subtile starts, from the tile's offset
            if loads == 1:  # each load's value stored at once (the kernel measured on the H200)
                for i in range((TC * nb + threads - 1) // threads):
                    e = i * threads + tid
                    if e < TC * nb:
                        k = gc * TC + e // nb
                        n = n0 + e % nb
                        Bs[e // nb * pb + e % nb] = T.if_then_else(T.And(k < K, n < N),
                                                                   B[T.min(k, K - 1), T.min(n, N - 1)], T.float16(0))
                T.tvm_storage_sync("shared")
                for i in range(TR * TC // threads):
                    e = i * threads + tid
                    sub = e // 64
                    bit = e % 64
                    word = Ws[sub]
                    r = sub // (TC // SUB) * SUB + bit // SUB
                    c = sub % (TC // SUB) * SUB + bit % SUB
                    below = T.bitwise_and(word, T.shift_left(T.uint64(1), T.Cast("uint64", bit)) - T.uint64(1))
                    As[r * pa + c] = T.if_then_else(
                        T.bitwise_and(T.shift_right(word, T.Cast("uint64", bit)), T.uint64(1)) != T.uint64(0),
                        values[T.min(So[sub] + T.call_extern("int32", "__popcll", below), nnz - 1)], T.float16(0))
                T.tvm_storage_sync("shared")
            else:
                for i0 in range(-(-b_each // b_batch)):  # B's slice: a batch of loads, then their stores
                    for u in T.unroll(b_batch):
                        e = (i0 * b_batch + u) * threads + tid
                        k = gc * TC + e // nb
                        n = n0 + e % nb
                        held[u] = T.if_then_else(T.And(T.And(e < TC * nb, k < K), n < N),
                                                 B[T.min(k, K - 1), T.min(n, N - 1)], T.float16(0))
                    for u in T.unroll(b_batch):
                        e = (i0 * b_batch + u) * threads + tid
                        if e < TC * nb:
                            Bs[e // nb * pb + e % nb] = held[u]
                T.tvm_storage_sync("shared")
                for i0 in range(-(-a_each // a_batch)):  # the tile, expanded: a batch of value loads, then stores
                    for u in T.unroll(a_batch):
                        e = (i0 * a_batch + u) * threads + tid
                        sub = T.min(e // 64, subs - 1)  # past the tile (a last, partial batch): read, not stored
                        bit = e % 64
                        word = Ws[sub]
                        below = T.bitwise_and(word, T.shift_left(T.uint64(1), T.Cast("uint64", bit)) - T.uint64(1))
                        held[u] = T.if_then_else(
                            T.bitwise_and(T.shift_right(word, T.Cast("uint64", bit)), T.uint64(1)) != T.uint64(0),
                            values[T.min(So[sub] + T.call_extern("int32", "__popcll", below), nnz - 1)], T.float16(0))
                    for u in T.unroll(a_batch):
                        e = (i0 * a_batch + u) * threads + tid
                        sub = e // 64
                        bit = e % 64
                        if e < TR * TC:
                            As[(sub // (TC // SUB) * SUB + bit // SUB) * pa + sub % (TC // SUB) * SUB + bit % SUB] = held[u]
                T.tvm_storage_sync("shared")
            steps.multiply(As, Bs, af, bf, acc, ty, tx)
            T.tvm_storage_sync("shared")

    return kernel((TR, TC), nb, splits, name, steps, walk)


def build(tile=(64, 64), nb: int = 32, splits: int = 1, arch: str = "sm_90a", loads: int = 1):
    """The compiled module (TVM executable) of :func:`spmm` for ``arch``."""
    return compile_for(spmm(tile, nb, splits, loads=loads), arch)
