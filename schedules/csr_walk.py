"""What ``csr_split``'s kernels share: the warp intrinsics they call, a warp's 32-ary search
for the row that holds its first entry, and the second launch, which adds every warp's carry
into its row and zeroes the rows with no entry (no warp owns those)."""
from __future__ import annotations

from types import SimpleNamespace

SEARCH_STEPS = 7  # 32-ary steps of the row search: 32^7 rows > 2^31
FIXUP_THREADS = 256


def row_of(indptr, rows: int, entry: int) -> int:
    """The kernel's 32-ary search, step by step: the last row r with indptr[r] <= entry
    (lane l tests candidate lo + l * step, the ballot's highest set lane moves lo)."""
    lo, hi = 0, rows
    for _ in range(SEARCH_STEPS):
        if hi - lo > 32:
            step = (hi - lo + 31) // 32
            last = max(l for l in range(32) if lo + l * step < hi and indptr[min(lo + l * step, rows)] <= entry)
            lo, hi = lo + last * step, min(lo + last * step + step, hi)
    return lo + max(l for l in range(32) if lo + l < hi and indptr[min(lo + l, rows)] <= entry)


def warp_ops(T) -> SimpleNamespace:
    """``ballot``, ``highest`` (the highest set lane of a nonzero ballot), ``shfl`` and
    ``shfl_xor`` over the full warp, as TIR calls of the CUDA intrinsics."""
    full = T.uint32(0xFFFFFFFF)

    def ballot(pred):
        return T.call_extern("uint32", "__ballot_sync", full, T.Cast("int32", pred))

    def highest(mask):
        return 31 - T.call_extern("int32", "__clz", T.Cast("int32", mask))

    def shfl(value, lane, dtype):
        return T.call_extern(dtype, "__shfl_sync", full, value, lane)

    def shfl_xor(value, offset, dtype):
        return T.call_extern(dtype, "__shfl_xor_sync", full, value, offset)

    return SimpleNamespace(ballot=ballot, highest=highest, shfl=shfl, shfl_xor=shfl_xor)


def find_row(T, ops):
    """A macro: ``st[2]`` = the row holding entry ``p0`` (the last r with indptr[r] <= p0),
    found by ``SEARCH_STEPS`` 32-ary steps over [st[0], st[1]) (st[6], st[7]: scratch)."""

    @T.macro
    def find(st, indptr, rows, p0, lane):
        st[0] = 0
        st[1] = rows
        for _ in range(SEARCH_STEPS):
            if st[1] - st[0] > 32:
                st[7] = (st[1] - st[0] + 31) // 32  # candidates' spacing
                st[6] = ops.highest(ops.ballot(T.if_then_else(
                    st[0] + lane * st[7] < st[1], indptr[T.min(st[0] + lane * st[7], rows)] <= p0, False)))
                st[0] = st[0] + st[6] * st[7]
                st[1] = T.min(st[0] + st[7], st[1])
        st[2] = st[0] + ops.highest(ops.ballot(T.if_then_else(
            st[0] + lane < st[1], indptr[T.min(st[0] + lane, rows)] <= p0, False)))

    return find


def row_ends(T, ops):
    """Macros over the walk's state ``st`` (2: the row, 3: the first row of the ends the lanes
    hold, 4: this lane's end of row st[3] + lane, 5: the row's end): ``first`` loads the ends
    from the row found by the search; ``step`` moves to the next row, loading the next 32 ends
    when the row passes those held."""

    @T.macro
    def first(st, indptr, rows, stored, lane):
        st[3] = st[2]
        st[4] = T.if_then_else(st[3] + lane < rows, indptr[T.min(st[3] + lane + 1, rows)], stored)
        st[5] = ops.shfl(st[4], 0, "int32")

    @T.macro
    def step(st, indptr, rows, stored, lane):
        st[2] = st[2] + 1
        if st[2] - st[3] >= 32:
            st[3] = st[2]
            st[4] = T.if_then_else(st[3] + lane < rows, indptr[T.min(st[3] + lane + 1, rows)], stored)
        st[5] = ops.shfl(st[4], st[2] - st[3], "int32")

    return SimpleNamespace(first=first, step=step)


def fixup(T, F: int):
    """A macro: the second launch. Threads [0, warps * F) add carry w's feature f into its row
    (``atomicAdd``: a row may span many warps); then one thread a row zeroes a row with no entry."""

    @T.macro
    def launch(indptr, carry, carry_row, C, warps, rows):
        with T.launch_thread("blockIdx.x", T.max((warps * F + rows + FIXUP_THREADS - 1) // FIXUP_THREADS, 1)) as fx, \
                T.launch_thread("threadIdx.x", FIXUP_THREADS) as ft:
            t = T.meta_var(fx * FIXUP_THREADS + ft)
            if t < warps * F:
                if carry_row[t // F] >= 0:
                    T.evaluate(T.call_extern("float32", "atomicAdd",
                                             C.access_ptr("rw", offset=carry_row[t // F] * F + t % F),
                                             carry[t // F, t % F]))
            elif t - warps * F < rows:
                if indptr[t - warps * F] == indptr[t - warps * F + 1]:  # no entry: no warp owns the row
                    for f in range(F):
                        C[t - warps * F, f] = T.float32(0)

    return launch
