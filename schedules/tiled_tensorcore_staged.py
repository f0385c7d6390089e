"""The ``tiled`` Tensor Core SpMM with each tile's bytes staged one round trip at a time
(``pipeline`` 1) or one tile ahead (``pipeline`` 2) -- the memory side of
``schedules.tiled_tensorcore``, rebuilt for bandwidth.

The kernel of ``tiled_tensorcore`` waits on a chain of dependent loads per tile: the bitmap
words, then (after the scan that needs them) each value, loaded where the expansion puts it.
Here a tile's compressed bytes are moved as bytes first, without decoding: its words, its
whole value range ``values[offsets[t] : offsets[t + 1]]`` (coalesced, no bitmap needed) and
B's slice go to registers in one batch of independent loads, then to shared memory; the scan
and the expansion read shared memory only. So a tile costs one round trip, and with
``pipeline`` 2 the next tile's batch is issued before this tile's expansion and MMAs and
lands while they run (its offsets are read a tile earlier still). The expansion takes two
adjacent bits of a subtile per thread and step (one popcount for both; they sit in one row).
Block layout, split-K and the MMA step are ``tiled_tensorcore``'s.
"""
from __future__ import annotations

from .tiled_tensorcore import PAD, SUB, check, kernel, shared_steps
from .warp_mma import compile_for


def spmm(tile=(64, 64), nb: int = 32, splits: int = 1, pipeline: int = 2, name: str = "tiled_spmm"):
    """The PrimFunc ``tiled_spmm(words, offsets, values, B, C)`` with the operands and
    conventions of ``tiled_tensorcore.spmm`` (a first launch zeroes C where splits add),
    ``pipeline`` 1 (staged) or 2 (staged, one tile ahead)."""
    from tvm.script import tirx as T

    TR, TC = (int(t) for t in tile)
    check((TR, TC), nb, splits)
    if pipeline not in (1, 2):
        raise ValueError(f"pipeline should be 1 (staged) or 2 (staged, a tile ahead) here, got {pipeline!r}")
    prefetch = pipeline == 2
    warps = TR // 16
    threads = warps * 32
    subs = (TR // SUB) * (TC // SUB)
    cap = TR * TC  # values a tile holds at most
    pa, pb = TC + PAD, nb + PAD
    w_each, v_each, b_each = -(-subs // threads), -(-cap // threads), -(-TC * nb // threads)
    pairs = cap // 2 // threads  # bit pairs a thread expands per tile
    steps = shared_steps(TR, TC, nb, splits)

    @T.macro
    def value_range(oc, offsets, base, gi, cnt, lo, hi):
        """Where local tile ``gi``'s values start and end (0, 0 past the block's tiles)."""
        t = base + gi
        oc[lo] = T.if_then_else(gi < cnt, offsets[T.min(t, offsets.shape[0] - 1)], 0)
        oc[hi] = T.if_then_else(gi < cnt, offsets[T.min(t + 1, offsets.shape[0] - 1)], 0)

    @T.macro
    def issue(rw, rv, rb, words, values, B, base, gc0, n0, gi, cnt, o0, o1, tid):
        """Local tile ``gi``'s words, values and B slice into registers: independent loads,
        all in flight together (zeros past the block's tiles)."""
        t = base + gi
        for q in T.unroll(w_each):
            e = q * threads + tid
            rw[q] = T.if_then_else(T.And(gi < cnt, e < subs), words[T.min(t * subs + e, words.shape[0] - 1)],
                                   T.uint64(0))
        for q in T.unroll(v_each):
            e = o0 + q * threads + tid
            rv[q] = T.if_then_else(e < o1, values[T.min(e, values.shape[0] - 1)], T.float16(0))
        for q in T.unroll(b_each):
            e = q * threads + tid
            k = (gc0 + gi) * TC + e // nb
            n = n0 + e % nb
            rb[q] = T.if_then_else(T.And(T.And(gi < cnt, e < TC * nb), T.And(k < B.shape[0], n < B.shape[1])),
                                   B[T.min(k, B.shape[0] - 1), T.min(n, B.shape[1] - 1)], T.float16(0))

    @T.macro
    def store(Ws, Vs, Bs, rw, rv, rb, tid):
        """The registers of :func:`issue` into the shared tile buffers."""
        for q in T.unroll(w_each):
            if q * threads + tid < subs:
                Ws[q * threads + tid] = rw[q]
        for q in T.unroll(v_each):
            if q * threads + tid < cap:
                Vs[q * threads + tid] = rv[q]
        for q in T.unroll(b_each):
            e = q * threads + tid
            if e < TC * nb:
                Bs[e // nb * pb + e % nb] = rb[q]

    @T.macro
    def expand(As, Ws, So, Vs, tid):
        """The dense tile in As from Ws, So and Vs: two adjacent bits (one row) per step."""
        for i in range(pairs):
            e = i * threads + tid
            sub = e // 32
            b0 = e % 32 * 2
            word = Ws[sub]
            at = So[sub] + T.call_extern(
                "int32", "__popcll", T.bitwise_and(word, T.shift_left(T.uint64(1), T.Cast("uint64", b0)) - T.uint64(1)))
            bit0 = T.Cast("int32", T.bitwise_and(T.shift_right(word, T.Cast("uint64", b0)), T.uint64(1)))
            bit1 = T.Cast("int32", T.bitwise_and(T.shift_right(word, T.Cast("uint64", b0 + 1)), T.uint64(1)))
            row = sub // (TC // SUB) * SUB + b0 // SUB
            col = sub % (TC // SUB) * SUB + b0 % SUB
            As[row * pa + col] = T.if_then_else(bit0 != 0, Vs[T.min(at, cap - 1)], T.float16(0))
            As[row * pa + col + 1] = T.if_then_else(bit1 != 0, Vs[T.min(at + bit0, cap - 1)], T.float16(0))

    @T.macro
    def walk(words, offsets, values, B, As, Bs, Ws, So, acc, af, bf, start, part, up, go, s, n0, per, ngc, ngo, ty, tx):
        """The block's tiles: each one's bytes staged (a tile ahead with ``prefetch``), then
        scanned, expanded from shared memory and multiplied."""
        Vs = T.alloc_buffer((cap,), "float16", scope="shared", align=64)
        rw = T.alloc_buffer((w_each,), "uint64", scope="local")
        rv = T.alloc_buffer((v_each,), "float16", scope="local")
        rb = T.alloc_buffer((b_each,), "float16", scope="local")
        oc = T.alloc_buffer((4,), "int32", scope="local")  # value ranges: the next tile's (0, 1), the one after's (2, 3)
        tid = T.meta_var(ty * 32 + tx)
        g0 = T.meta_var(s * per)
        base = T.meta_var(go * ngc + s * per)
        cnt = T.meta_var(T.if_then_else(go < ngo, T.max(T.min(s * per + per, ngc) - s * per, 0), 0))
        value_range(oc, offsets, base, 0, cnt, 0, 1)
        issue(rw, rv, rb, words, values, B, base, g0, n0, 0, cnt, oc[0], oc[1], tid)
        store(Ws, Vs, Bs, rw, rv, rb, tid)
        value_range(oc, offsets, base, 1, cnt, 2, 3)
        T.tvm_storage_sync("shared")
        for gi in range(cnt):
            steps.scan(Ws, So, part, start, up, ty, tx, 0)  # starts within the tile: Vs holds its values alone
            T.tvm_storage_sync("shared")
            if prefetch:  # the next tile's bytes in flight during this tile's expansion and MMAs
                issue(rw, rv, rb, words, values, B, base, g0, n0, gi + 1, cnt, oc[2], oc[3], tid)
                value_range(oc, offsets, base, gi + 2, cnt, 0, 1)
            expand(As, Ws, So, Vs, tid)
            T.tvm_storage_sync("shared")
            steps.multiply(As, Bs, af, bf, acc, ty, tx)
            T.tvm_storage_sync("shared")
            if not prefetch:
                issue(rw, rv, rb, words, values, B, base, g0, n0, gi + 1, cnt, oc[2], oc[3], tid)
                value_range(oc, offsets, base, gi + 2, cnt, 0, 1)
            store(Ws, Vs, Bs, rw, rv, rb, tid)
            oc[2] = oc[0]
            oc[3] = oc[1]
            T.tvm_storage_sync("shared")

    return kernel((TR, TC), nb, splits, name, steps, walk)


def build(tile=(64, 64), nb: int = 32, splits: int = 1, pipeline: int = 2, arch: str = "sm_90a"):
    """The compiled module (TVM executable) of :func:`spmm` for ``arch``."""
    return compile_for(spmm(tile, nb, splits, pipeline), arch)
