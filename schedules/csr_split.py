"""CUDA-core SpMM for CSR-like float32 matrices whose rows differ wildly in length: ``C = A @
B`` with the stored entries, not the rows, split evenly over warps.

The CUDA-core template gives each row a thread group, so on a power-law graph one hub row of
10^4 entries is walked by one group while the rest of the GPU idles (10-20x slower than hyb
there). Here warp w owns the entries [w E, (w + 1) E) (``entries_per_warp`` = E):

* it finds the row holding its first entry by a 32-ary search of ``indptr`` (each lane tests
  one candidate a step, ``__ballot_sync`` picks the last that is not past the entry: about
  four dependent loads for 10^6 rows);
* it walks its entries 32 at a time (columns and values loaded by all lanes at once and
  passed round by ``__shfl_sync``; the ends of the next 32 rows likewise), each lane
  accumulating the features lane, lane + 32, ... of the current row, ``loads_ahead`` rows of B
  in flight before the first is used;
* where a row ends inside the range the warp stores it (its *end owner*: a plain store,
  whatever earlier warps hold of it); a row that goes on past the range leaves its partial
  sum in a carry slot of the warp;
* a second launch adds every carry into its row (``atomicAdd``: a row may span many warps)
  and zeroes the rows with no entry, which no warp owns.

No C zeroed first and no atomics on the main path. Designed and timed first as CUDA
(``benchmarks/probe_csr_split.py``, ``benchmarks/results/probe_csr_split_H200.json``: 1.27x
cuSPARSE geomean over 6 graphs and 2 R-MATs at F = 32 and 128, where the CSR template took
0.11-0.38x on the power-law graphs). The default for a matrix whose rows are
:func:`skewed`; reached on any other by its own knobs (``knobs={"entries_per_warp": 128}``).
The structure it takes is any single-part matrix of a dense row axis over a variable sparse
column axis (CSR's), float32 throughout, computing ``C[i, k] = sum_j A[i, j] * B[j, k]``
with no epilogue.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

from . import csr_group
from .csr_walk import find_row, fixup, row_ends, row_of, warp_ops
from .knobs import ANY, Knob, check_applicable, transformation
from .spmm_structure import spmm_structure
from .warp_mma import check_knobs, check_sizes, compile_for

# the probe's most frequent best setting first (probe_csr_split_H200.json: 64 entries a warp
# in 16 of 16 timed cases, 4 warps a block in 12, 4 loads ahead in 11); default_knobs below
KNOBS = {"entries_per_warp": (64, 128, 256, 512), "warps_per_block": (4, 8), "loads_ahead": (4, 2, 8),
         "lanes_per_entry": (32, 8, 16)}  # below 32: lanes in groups, an entry each (csr_group)
MAX_FEAT = 512  # 16 floats a lane accumulates
MAX_IN_FLIGHT = 64  # floats of B a lane holds in flight (loads_ahead x feat / 32): registers
LONG_ROW = 512  # entries: the default (skewed) reads the longest row and its ratio to the mean
SKEW = 64


def plan(feat: int, entries_per_warp: int, warps_per_block: int, loads_ahead: int,
         lanes_per_entry: int = 32) -> SimpleNamespace:
    """The kernel's sizes, checked: ValueError naming the first thing it cannot take."""
    check_sizes(feat=feat, entries_per_warp=entries_per_warp, warps_per_block=warps_per_block,
                loads_ahead=loads_ahead, lanes_per_entry=lanes_per_entry)
    check_knobs({"entries_per_warp": entries_per_warp, "warps_per_block": warps_per_block,
                 "loads_ahead": loads_ahead, "lanes_per_entry": lanes_per_entry}, KNOBS)
    if feat > MAX_FEAT:
        raise ValueError(f"feat should be at most {MAX_FEAT} (a lane holds feat / 32 sums), got {feat}")
    if lanes_per_entry < 32:
        csr_group.check(feat, lanes_per_entry)
    per_lane = feat // lanes_per_entry if lanes_per_entry < 32 else -(-feat // 32)  # floats of a row of B
    if loads_ahead * per_lane > MAX_IN_FLIGHT:
        raise ValueError(f"loads_ahead={loads_ahead} at feat={feat} holds {loads_ahead * per_lane} floats of B "
                         f"a lane in flight, over {MAX_IN_FLIGHT}: take fewer loads ahead")
    return SimpleNamespace(feat=feat, E=entries_per_warp, W=warps_per_block, U=loads_ahead, vec=-(-feat // 32),
                           batches=-(-entries_per_warp // 32), lanes=lanes_per_entry)


def replay(indptr, indices, values, B, entries_per_warp: int = 64):
    """``C = A @ B`` as the two launches compute it, warp by warp (a lane's features as one
    numpy row): each warp's search, its walk with the rows it stores and its carry, then the
    carries added and the empty rows zeroed. The tests hold it to scipy's product; the
    kernel follows the same steps."""
    import numpy as np

    indptr = np.asarray(indptr)
    rows, E = len(indptr) - 1, entries_per_warp
    B = np.asarray(B, dtype=np.float32)
    C = np.full((rows, B.shape[1]), np.nan, dtype=np.float32)  # every row written by someone
    stored = int(indptr[rows])
    carries = []
    for w in range(-(-len(indices) // E)):
        p0, p1 = w * E, min(w * E + E, stored, len(indices))
        if p0 >= p1:
            continue
        r = row_of(indptr, rows, p0)
        end = int(indptr[r + 1])
        acc = np.zeros(B.shape[1], dtype=np.float32)
        for q in range(p0, p1):
            while q >= end:  # the row ended before entry q: this warp holds its end
                C[r] = acc
                acc = np.zeros_like(acc)
                r += 1
                while int(indptr[r + 1]) <= q:  # past empty rows
                    r += 1
                end = int(indptr[r + 1])
            acc = acc + np.float32(values[q]) * B[indices[q]]
        if end <= p1:
            C[r] = acc
        else:
            carries.append((r, acc))
    for r, acc in carries:  # the second launch
        C[r] += acc
    empty = np.flatnonzero(np.diff(indptr[:rows + 1]) == 0)
    C[empty] = 0
    return C


def spmm(feat: int, entries_per_warp: int = 64, warps_per_block: int = 4, loads_ahead: int = 4,
         lanes_per_entry: int = 32, name: str = "csr_split"):
    """The PrimFunc ``name(indptr, indices, values, B, C)``: ``indptr`` (int32, rows + 1),
    ``indices`` (int32) and ``values`` (float32) as a CSR instance stores them (the entries
    [0, indptr[M]) are read); B (K, feat) and C (M, feat) float32, C written whole. Two
    launches (the walk, then the carries and empty rows) and a workspace of one carry row and
    its row number a warp. ``lanes_per_entry`` below 32: the grouped walk (``csr_group``)."""
    from tvm.script import tirx as T

    p = plan(feat, entries_per_warp, warps_per_block, loads_ahead, lanes_per_entry)
    if p.lanes < 32:
        return csr_group.spmm(p, name)
    F, E, W, U, V = p.feat, p.E, p.W, p.U, p.vec
    ops = warp_ops(T)
    shfl = ops.shfl
    find = find_row(T, ops)
    ends = row_ends(T, ops)
    second_launch = fixup(T, F)

    @T.macro
    def store_row(dst, row, acc, lane):
        for v in T.unroll(V):
            if v * 32 + lane < F:
                dst[row, v * 32 + lane] = acc[v]

    @T.prim_func(s_tir=True)
    def csr_split(i_h: T.handle, j_h: T.handle, v_h: T.handle, b_h: T.handle, c_h: T.handle):
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
            # the walk's state: lo, hi (the search), row, first row of the ends held, this lane's
            # row end, the row's end, a flag (or the search's ballot), the search's spacing
            st = T.alloc_buffer((8,), "int32", scope="local")
            acc = T.alloc_buffer((V,), "float32", scope="local")
            bv = T.alloc_buffer((U * V,), "float32", scope="local")
            av = T.alloc_buffer((U,), "float32", scope="local")
            mine = T.alloc_buffer((2,), "int32", scope="local")  # this lane's column, the value's bits
            myval = T.alloc_buffer((1,), "float32", scope="local")
            rng = T.alloc_buffer((2,), "int32", scope="local")  # indptr[M], the range's end
            w = T.meta_var(bx * W + ty)
            stored = T.meta_var(rng[0])  # entries [0, indptr[M]) are the matrix's
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
                    for v in T.unroll(V):
                        acc[v] = T.float32(0)
                    for bi in range(p.batches):
                        if p0 + bi * 32 < p1:
                            n = T.meta_var(T.min(32, p1 - p0 - bi * 32))
                            mine[0] = T.if_then_else(lane < n, indices[T.min(p0 + bi * 32 + lane, n_entries - 1)], 0)
                            myval[0] = T.if_then_else(lane < n, values[T.min(p0 + bi * 32 + lane, n_entries - 1)],
                                                      T.float32(0))
                            for j0 in range(32 // U):
                                if j0 * U < n:
                                    for u in T.unroll(U):  # U rows of B in flight before the first is used
                                        av[u] = shfl(myval[0], j0 * U + u, "float32")
                                        mine[1] = shfl(mine[0], j0 * U + u, "int32")
                                        for v in T.unroll(V):
                                            bv[u * V + v] = T.if_then_else(
                                                j0 * U + u < n and v * 32 + lane < F,
                                                B[T.min(T.max(mine[1], 0), K - 1), T.min(v * 32 + lane, F - 1)],
                                                T.float32(0))
                                    for u in T.unroll(U):
                                        if j0 * U + u < n:
                                            # rows that end before this entry: this warp stores them
                                            st[6] = T.Cast("int32", p0 + bi * 32 + j0 * U + u >= st[5])
                                            while st[6] != 0:
                                                store_row(C, st[2], acc, lane)
                                                for v in T.unroll(V):
                                                    acc[v] = T.float32(0)
                                                st[6] = 1
                                                while st[6] != 0:  # on to the row holding the entry, past empty rows
                                                    ends.step(st, indptr, rows, stored, lane)
                                                    st[6] = T.Cast("int32", st[5] <= p0 + bi * 32 + j0 * U + u)
                                                st[6] = T.Cast("int32", p0 + bi * 32 + j0 * U + u >= st[5])
                                            for v in T.unroll(V):
                                                acc[v] = acc[v] + av[u] * bv[u * V + v]
                    if st[5] <= p1:  # the last row ends in the range: stored here
                        store_row(C, st[2], acc, lane)
                        if lane == 0:
                            carry_row[w] = -1
                    else:  # it goes on past the range: a carry for the second launch
                        store_row(carry, w, acc, lane)
                        if lane == 0:
                            carry_row[w] = st[2]
        second_launch(indptr, carry, carry_row, C, warps, rows)

    return csr_split


def match(program) -> Optional[int]:
    """The feature count when ``program`` is an SpMM this kernel computes, else None: on
    structure alone, one part whose axes are a dense row axis over a variable sparse column
    axis (no padding, no value chunks or slot masks), float32 throughout, ``C[i, k] = sum_j
    A[i, j] * B[j, k]`` with no epilogue."""
    bound = program.bound
    if bound.composite or len(bound.parts) != 1 or bound.op.outer_axes():
        return None
    fmt = bound.parts[0]
    if len(fmt.axes) != 2 or fmt.value_chunk or fmt.value_bits or fmt.slot_mask:
        return None
    rows, cols = fmt.axes
    if rows.sparse or rows.variable or not (cols.sparse and cols.variable) or getattr(cols, "padded", False):
        return None
    if {program.dtype.sparse, program.dtype.dense, program.dtype.out} != {"float32"}:
        return None
    found = spmm_structure(program)
    if found is None:
        return None
    _, _, bias, activation, feat, transpose_c, _, declared = found
    if bias is not None or activation != "none" or transpose_c or declared:  # feat: plan() refuses by name
        return None
    return feat


def skewed(longest: int, mean: float) -> bool:
    """True for row lengths where this kernel is the default: a row of ``LONG_ROW`` entries
    or more and ``SKEW`` times the mean. On the H200 the template took 0.11-0.38x cuSPARSE
    on the four matrices of that kind (longest 1 383-15 864, 138-1 040x the mean) and this
    kernel 0.60-1.18x; on the meshes and the 25-32x-skewed collaboration graphs the template
    stayed ahead or level (``results/probe_csr_split_compiled_H200.json`` beside
    ``results/probe_csr_split_H200.json``)."""
    return longest >= LONG_ROW and longest >= SKEW * mean


def applies(program, target_kind: str, knobs=None, rows=None) -> bool:
    """True on CUDA for a program :func:`match` takes when one of this kernel's own knobs is
    given, or when no knob is given and ``rows`` ((the longest row's entries, the mean) of
    the matrix compiled for) are :func:`skewed` and the feature count fits."""
    if target_kind != "cuda":
        return False
    feat = match(program)
    if feat is None:
        return False
    if set(knobs or {}) & set(KNOBS):
        return True
    return not knobs and rows is not None and feat <= MAX_FEAT and skewed(*rows)


def default_knobs(feat: int) -> dict:
    """64 entries a warp, 4 warps a block; 8 rows of B in flight at 65-128 columns, 4 elsewhere.
    H200, four knob sets on 6 graphs and 2 R-MATs (``results/probe_csr_split_sets_H200.json``):
    at F = 128, 8 ahead beat 4 on 5 of 8 (geomean 1.05x, 1.08x on the four skewed ones this
    kernel is the default for); at F = 32, 4 ahead was ahead or level on 6 of 8. At exactly 32
    columns, lanes in groups of 8 (``csr_group``, compiled: 0.98-1.39x the speed of this
    kernel's defaults on the same 8 matrices, geomean 1.11x, and 1.10-2.71x cuSPARSE,
    ``results/probe_csr_group_compiled_H200.json``)."""
    return {"entries_per_warp": 64, "warps_per_block": 4, "loads_ahead": 8 if 3 <= -(-feat // 32) <= 4 else 4,
            "lanes_per_entry": 8 if feat == 32 else 32}


def _resolve(program, knobs) -> dict:
    """The knobs given, the rest by :func:`default_knobs` for the program's width."""
    return {**default_knobs(match(program)), **knobs}


def _prune(program, knobs) -> Optional[str]:
    """Why these knobs build no kernel for ``program`` (None where they do)."""
    try:
        plan(match(program), **_resolve(program, knobs))
    except ValueError as e:
        return str(e)
    return None


@transformation(knobs={k: Knob(tuple(v), small=v[:2]) for k, v in KNOBS.items()}, resolve=_resolve,
                prune=_prune)
def csr_split_spmm(built, program, *, entries_per_warp: int, warps_per_block: int, loads_ahead: int,
                   lanes_per_entry: int):
    """Build :func:`spmm` for ``program`` into ``built.mod``: its feature count, any matrix
    (two launches and a workspace a call)."""
    built.mod, _ = schedule(program, entries_per_warp=entries_per_warp, warps_per_block=warps_per_block,
                            loads_ahead=loads_ahead, lanes_per_entry=lanes_per_entry)


def schedule(program, **knobs):
    """(IRModule of :func:`spmm` for ``program``, the knobs used): knobs not given take their
    defaults; a knob of another schedule given beside these is refused by name."""
    from tvm import IRModule

    check_applicable(knobs, [(csr_split_spmm, (ANY,))], f"{program.name} on cuda (csr_split)")
    chosen = _resolve(program, knobs)
    plan(match(program), **chosen)
    return IRModule({program.name: spmm(match(program), name=program.name, **chosen)}), chosen


def kernel_params(program):
    """The kernel's arguments in order, as (name, role, dtype, shape, sparse, matrix): the
    instance's ``indptr`` and ``indices``, its values, B and C ("rows"/"cols" as the Kernel's
    calling convention names them)."""
    b_name, c_name = spmm_structure(program)[:2]
    feat = match(program)
    matrix = next(b for b in program.bound.op.buffers if b.sparse and b.matrix)
    return [("indptr", "index", "int32", (None,), False, False), ("indices", "index", "int32", (None,), False, False),
            (matrix.name, "input", "float32", (None,), True, True),
            (b_name, "input", "float32", ("cols", feat), False, False),
            (c_name, "output", "float32", ("rows", feat), False, False)]


def build(feat: int = 32, arch: str = "sm_90a", **knobs):
    """The compiled module (TVM executable) of :func:`spmm` for ``arch``."""
    return compile_for(spmm(feat, **knobs), arch)
