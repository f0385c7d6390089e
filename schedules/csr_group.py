"""``csr_split``'s walk with a warp's lanes in groups, for narrow B: ``lanes_per_entry`` = G
lanes share an entry, each holding F / G consecutive features of its row of B (one vector
load: a float4 at F = 4 G), so a step gathers S = 32 / G entries side by side where
``csr_split``'s layout (G = 32) gathers one. At F = 32 a lane of that layout issues one
4-byte load an entry; here one 16-byte load every four entries.

The warp still owns the entries [w E, (w + 1) E) and finds its first row by the same search
(``csr_walk``). Where a row ends inside a step, the groups whose entries belong to it add
them, the groups' partial sums are added by xor-shuffles (``log2(S)`` rounds) and group 0
stores the row; the other groups' entries go to the next rows. The range's last row is
stored or left as a carry exactly as in ``csr_split``, and the same second launch adds the
carries and zeroes the empty rows.

Designed and timed first as CUDA (``benchmarks/probe_csr_split.py --group``, H200,
``results/probe_csr_group_H200.json``): at F = 32, G = 8 with 64 entries a warp, 4 warps a
block and 4 steps of loads in flight took 0.67-0.97x the time of the best of four
``csr_split`` knob sets on 6 graphs and 2 R-MATs (``results/probe_csr_split_sets_H200.json``);
at F = 128 (G = 32, float4 a lane) it was 1.02-1.19x slower, so wider B keeps
``csr_split``'s layout. Compiled (``probe_csr_split.py --knob-sets``, every case checked,
``results/probe_csr_group_compiled_H200.json``): 0.98-1.39x the speed of ``csr_split``'s
defaults at F = 32 on the same 8 matrices (geomean 1.11x; 1.10-2.71x cuSPARSE).
"""
from __future__ import annotations

from .csr_walk import find_row, fixup, row_ends, row_of, warp_ops

MAX_VECTOR = 4  # floats a lane loads of a row of B at once (a float4)


def check(feat: int, lanes_per_entry: int) -> None:
    """ValueError naming the problem when ``lanes_per_entry`` lanes cannot share a row of
    ``feat`` features (each takes feat / lanes consecutive floats, at most a float4)."""
    if feat % lanes_per_entry or feat // lanes_per_entry > MAX_VECTOR:
        raise ValueError(f"lanes_per_entry={lanes_per_entry} at feat={feat}: each lane takes feat / lanes_per_entry "
                         f"consecutive floats, which should be a whole number from 1 to {MAX_VECTOR}; take "
                         f"lanes_per_entry=32 (csr_split's layout) or one that divides feat into at most "
                         f"{MAX_VECTOR} a lane")


def replay(indptr, indices, values, B, entries_per_warp: int, lanes_per_entry: int):
    """``C = A @ B`` as the grouped walk computes it: each warp's steps of S entries, the
    groups' entries added to the row that holds them, a row ending inside a step summed over
    the groups and stored, the range's last row stored or carried; then the carries added
    and the empty rows zeroed. The tests hold it to scipy's product; the kernel follows the
    same steps."""
    import numpy as np

    indptr = np.asarray(indptr)
    rows, E, S = len(indptr) - 1, entries_per_warp, 32 // lanes_per_entry
    B = np.asarray(B, dtype=np.float32)
    C = np.full((rows, B.shape[1]), np.nan, dtype=np.float32)
    stored = int(indptr[rows])
    carries = []
    for w in range(-(-len(indices) // E)):
        p0, p1 = w * E, min(w * E + E, stored, len(indices))
        if p0 >= p1:
            continue
        r = row_of(indptr, rows, p0)
        row_end = int(indptr[r + 1])
        acc = np.zeros((S, B.shape[1]), dtype=np.float32)  # one partial sum a group
        for s0 in range(p0, p1, S):
            last = min(s0 + S, p1) - 1
            added = [False] * S
            while row_end <= last:  # row r ends inside the step
                for g in range(S):
                    if not added[g] and s0 + g < row_end:
                        acc[g] += np.float32(values[s0 + g]) * B[indices[s0 + g]]
                        added[g] = True
                C[r] = acc.sum(axis=0)
                acc[:] = 0
                prev = row_end
                while row_end <= prev:  # on to the next row holding an entry
                    r += 1
                    row_end = int(indptr[r + 1]) if r < rows else stored
            for g in range(S):
                if not added[g] and s0 + g <= last:
                    acc[g] += np.float32(values[s0 + g]) * B[indices[s0 + g]]
        if row_end <= p1:
            C[r] = acc.sum(axis=0)
        else:
            carries.append((r, acc.sum(axis=0)))
    for r, part in carries:
        C[r] += part
    C[np.flatnonzero(np.diff(indptr[:rows + 1]) == 0)] = 0
    return C


def spmm(p, name: str):
    """The PrimFunc of ``csr_split.spmm``'s signature for the plan ``p`` (``csr_split.plan``,
    ``p.lanes`` < 32): the grouped walk, then the second launch."""
    from tvm.script import tirx as T

    F, E, W, U, G = p.feat, p.E, p.W, p.U, p.lanes
    S, VW = 32 // G, F // G  # entries a step, floats a lane
    rounds = (S - 1).bit_length()  # xor-shuffle rounds over the groups: lanes G, 2G, ... apart
    ops = warp_ops(T)
    shfl, shfl_xor = ops.shfl, ops.shfl_xor
    find = find_row(T, ops)
    ends = row_ends(T, ops)
    second_launch = fixup(T, F)

    @T.macro
    def add_entry(acc, av, bv, u):
        for t in T.unroll(VW):
            acc[t] = acc[t] + av[u] * bv[u * VW + t]

    @T.macro
    def group_sum(dst, acc):
        """dst = the sum of acc over the warp's S groups (every lane takes part)."""
        for t in T.unroll(VW):
            dst[t] = acc[t]
        for r in T.unroll(rounds):
            for t in T.unroll(VW):
                dst[t] = dst[t] + shfl_xor(dst[t], G << r, "float32")

    @T.prim_func(s_tir=True)
    def csr_group(i_h: T.handle, j_h: T.handle, v_h: T.handle, b_h: T.handle, c_h: T.handle):
        T.func_attr({"global_symbol": name, "tirx.noalias": True})
        n_ptr = T.int32()
        n_entries = T.int32()
        K = T.int32()
        M = T.int32()
        indptr = T.match_buffer(i_h, (n_ptr,), "int32")
        indices = T.match_buffer(j_h, (n_entries,), "int32")
        values = T.match_buffer(v_h, (n_entries,), "float32")
        B = T.match_buffer(b_h, (K, F), "float32")
        C = T.match_buffer(c_h, (M, F), "float32")
        rows = T.meta_var(T.max(n_ptr - 1, 0))
        warps = T.meta_var((n_entries + E - 1) // E)
        carry = T.alloc_buffer((T.max(warps, 1), F), "float32", scope="global")
        carry_row = T.alloc_buffer((T.max(warps, 1),), "int32", scope="global")
        with T.launch_thread("blockIdx.x", T.max((warps + W - 1) // W, 1)) as bx, \
                T.launch_thread("threadIdx.y", W) as ty, T.launch_thread("threadIdx.x", 32) as lane:
            # st: 0-1 the search's bounds, 2 the row, 3 the first row of the ends held, 4 this
            # lane's row end, 5 the row's end, 6 a flag (or the search's ballot), 7 the search's
            # spacing, 8 this group's entry added, 9 the end of the row just stored
            st = T.alloc_buffer((10,), "int32", scope="local")
            acc = T.alloc_buffer((VW,), "float32", scope="local")
            total = T.alloc_buffer((VW,), "float32", scope="local")
            bv = T.alloc_buffer((U * VW,), "float32", scope="local")
            av = T.alloc_buffer((U,), "float32", scope="local")
            mine = T.alloc_buffer((2,), "int32", scope="local")  # this lane's column, a shuffled column
            myval = T.alloc_buffer((1,), "float32", scope="local")
            rng = T.alloc_buffer((2,), "int32", scope="local")  # indptr[M], the range's end
            w = T.meta_var(bx * W + ty)
            grp = T.meta_var(lane // G)
            gl = T.meta_var(lane % G)
            stored = T.meta_var(rng[0])
            p0 = T.meta_var(w * E)
            p1 = T.meta_var(rng[1])
            rng[0] = indptr[rows]
            rng[1] = T.min(w * E + E, T.min(rng[0], n_entries))
            if w < warps:
                if p0 >= p1:
                    if lane == 0:
                        carry_row[w] = -1
                else:
                    find(st, indptr, rows, p0, lane)  # st[2]: the row holding entry p0
                    ends.first(st, indptr, rows, stored, lane)  # lane l holds the end of row st[3] + l
                    for t in T.unroll(VW):
                        acc[t] = T.float32(0)
                    for bi in range(p.batches):
                        if p0 + bi * 32 < p1:
                            n = T.meta_var(T.min(32, p1 - p0 - bi * 32))
                            mine[0] = T.if_then_else(lane < n, indices[T.min(p0 + bi * 32 + lane, n_entries - 1)], 0)
                            myval[0] = T.if_then_else(lane < n, values[T.min(p0 + bi * 32 + lane, n_entries - 1)],
                                                      T.float32(0))
                            for j0 in range(32 // (S * U)):
                                if j0 * S * U < n:
                                    for u in T.unroll(U):  # U steps of S entries in flight before the first is used
                                        # every lane shuffles (the warp's own entries); a group past n adds 0
                                        av[u] = shfl(myval[0], j0 * S * U + u * S + grp, "float32")  # 0 past n
                                        mine[1] = shfl(mine[0], j0 * S * U + u * S + grp, "int32")
                                        for t in T.vectorized(VW):  # one vector load
                                            bv[u * VW + t] = B[T.min(T.max(mine[1], 0), K - 1), gl * VW + t]
                                        if j0 * S * U + u * S + grp >= n:  # past the range: zeros (B may hold NaN)
                                            for t in T.unroll(VW):
                                                bv[u * VW + t] = T.float32(0)
                                    for u in T.unroll(U):
                                        if j0 * S * U + u * S < n:
                                            s0 = T.meta_var(p0 + bi * 32 + j0 * S * U + u * S)  # the step's first
                                            st[8] = 0
                                            while st[5] <= T.min(s0 + S, p1) - 1:  # row st[2] ends in the step
                                                if st[8] == 0 and s0 + grp < st[5]:
                                                    add_entry(acc, av, bv, u)
                                                    st[8] = 1
                                                group_sum(total, acc)
                                                if grp == 0:
                                                    for t in T.vectorized(VW):
                                                        C[st[2], gl * VW + t] = total[t]
                                                for t in T.unroll(VW):
                                                    acc[t] = T.float32(0)
                                                st[9] = st[5]
                                                st[6] = 1
                                                while st[6] != 0:  # on to the next row holding an entry
                                                    ends.step(st, indptr, rows, stored, lane)
                                                    st[6] = T.Cast("int32", st[5] <= st[9])
                                            if st[8] == 0:
                                                add_entry(acc, av, bv, u)
                    group_sum(total, acc)
                    if st[5] <= p1:  # the last row ends in the range: stored here
                        if grp == 0:
                            for t in T.vectorized(VW):
                                C[st[2], gl * VW + t] = total[t]
                        if lane == 0:
                            carry_row[w] = -1
                    else:  # it goes on past the range: a carry for the second launch
                        if grp == 0:
                            for t in T.vectorized(VW):
                                carry[w, gl * VW + t] = total[t]
                        if lane == 0:
                            carry_row[w] = st[2]
        second_launch(indptr, carry, carry_row, C, warps, rows)

    return csr_group
