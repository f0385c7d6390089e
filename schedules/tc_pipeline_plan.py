"""The build-time plan of a ``tc_pipeline`` kernel: the knob table, the argument checks, and
every number the emitted code needs (tile shapes, the shared-memory layout, which bounds
checks a shape lets the kernel skip), worked out once into a frozen :class:`Plan`. The
emitting modules (``tc_pipeline_copies``, ``_mma``, ``_epilogue``) only read it, so a
reader finds each number's meaning, and its reason, in one place."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from .warp_mma import check_choice, check_knobs, check_sizes

MODES = ("sp24", "gather")
DTYPES = {"float16": "f16", "bfloat16": "bf16"}
OUT_DTYPES = ("float32", "float16", "bfloat16")
BIAS_AXES = ("row", "col")  # one bias per row of C (a linear layer's output feature) or per column
ACTIVATIONS = ("none", "gelu", "gelu_tanh", "relu")
KNOBS = {
    "warps_m": (2, 1, 4),
    "warps_n": (2, 1, 4),
    "warp_m_tiles": (4, 1, 2),
    "warp_n_tiles": (4, 2, 8),
    "k_steps": (2, 4),  # even, so two register sets alternate within a stage
    "stages": (3, 2, 4),
    # blocks are numbered down ``group_m`` row tiles before moving one column tile right,
    # so the blocks resident at once share their B columns (and, in gather mode, the
    # gathered rows) in L2 instead of streaming all of B per row tile; 1 = row-major order
    "group_m": (8, 1, 4, 16, 64),
    # 2: fragments of the next k-step load while this one multiplies (more registers);
    # 1: one set, so wider warp tiles fit in 255 registers
    "frag_sets": (2, 1),
}
SMEM_LIMIT = 227 * 1024  # bytes of shared memory a Hopper block may use


def block_shape(knobs) -> tuple:
    """(rows, columns) of C one block computes."""
    return 16 * knobs["warp_m_tiles"] * knobs["warps_m"], 8 * knobs["warp_n_tiles"] * knobs["warps_n"]


def swizzle(row, chunk, chunks: int):
    """Physical 16-byte chunk of logical ``chunk`` in a shared row of ``chunks`` chunks: 8
    consecutive rows read at one logical chunk land in 8 different bank groups."""
    if chunks >= 8:
        return chunk ^ (row % 8)
    if chunks == 4:
        return chunk ^ (row // 2 % 4)
    if chunks == 2:
        return chunk ^ (row // 4 % 2)
    return chunk


def grouped_tile(pid, grid_m, grid_n: int, group_m: int):
    """(row tile, column tile) of block ``pid`` (an int, or the block index in a kernel) when
    blocks walk ``group_m`` row tiles down before one column tile right; the last group
    holds what rows are left. ``grid_m`` may be a PrimExpr (a kernel for any row count)."""
    if not isinstance(grid_m, int):
        from tvm.script import tirx as T

        group = T.min(group_m, grid_m)
        in_group = group * grid_n
        first = pid // in_group * group
        rows = T.min(grid_m - first, group)
        return first + pid % in_group % rows, pid % in_group // rows
    group = min(group_m, grid_m)
    in_group = group * grid_n
    first = pid // in_group * group
    if grid_m % group == 0:
        rows = group
    elif isinstance(pid, int):
        rows = min(grid_m - first, group)
    else:
        from tvm.script import tirx as T

        rows = T.min(grid_m - first, group)
    return first + pid % in_group % rows, pid % in_group // rows


def smem_bytes(mode: str, knobs) -> int:
    """Shared memory the pipeline's stages take (B, A and, for sp24, the metadata)."""
    bm, bn = block_shape(knobs)
    ks, st = knobs["k_steps"], knobs["stages"]
    bk = (32 if mode == "sp24" else 16) * ks
    per_stage = bk * bn * 2 + bm * 16 * ks * 2 + (bm // 16 * ks * 64 if mode == "sp24" else 0)
    return per_stage * st


def check(mode, M, K, N, dtype, out_dtype, vec, knobs):
    """ValueError naming the argument or knob the kernel cannot take (M and K None: a
    kernel for any size, read from its operands' shapes)."""
    check_choice("mode", mode, MODES)
    check_sizes(N=N, **{k: v for k, v in (("M", M), ("K", K)) if v is not None})
    check_choice("dtype", dtype, sorted(DTYPES))
    check_choice("out_dtype", out_dtype, OUT_DTYPES)
    check_knobs(knobs, KNOBS)
    bm, _ = block_shape(knobs)
    if mode == "gather":
        check_sizes(vec=vec)
        if vec % bm:
            raise ValueError(f"the row vector (V={vec}) should be a multiple of the block's rows "
                             f"(16 x warp_m_tiles x warps_m = {bm}): a block gathers one vector's columns")
        if knobs["warp_n_tiles"] % 2:
            raise ValueError("warp_n_tiles should be even in gather mode (ldmatrix.x4.trans loads two n-tiles)")
    if smem_bytes(mode, knobs) > SMEM_LIMIT:
        raise ValueError(f"knobs {knobs} need {smem_bytes(mode, knobs)} bytes of shared memory, "
                         f"more than {SMEM_LIMIT}")


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Plan:
    """Every build-time number of one kernel. Sizes of shared memory are in elements of
    ``dtype`` unless named ``*_bytes``; "chunk" is 16 bytes, the unit of ``cp.async``,
    ``ldmatrix`` rows and the epilogue's stores."""

    # the call
    mode: str
    M: int
    K: int
    N: int
    dtype: str
    out_dtype: str
    vec: int  # gather: rows per row vector (they share their gathered columns)
    bias: bool
    bias_dtype: str  # the bias operand's dtype (added in float32)
    bias_axis: str  # "row": Bias[i] (M entries); "col": Bias[k] (N entries, along the dense axis)
    activation: str
    transpose_c: bool
    # the knobs
    warps_m: int
    warps_n: int
    mt: int  # 16-row MMA tiles per warp (warp_m_tiles)
    nt: int  # 8-column MMA tiles per warp (warp_n_tiles)
    ks: int  # MMA k-steps per pipeline stage (k_steps)
    stages: int
    frag_sets: int
    group_m: int
    # tiles
    BM: int  # rows of C per block
    BN: int  # columns of C per block
    WM: int  # rows of C per warp
    WN: int  # columns of C per warp
    NT: int  # threads per block
    BK: int  # rows of B per stage (32 per k-step for sp24's m16n8k32, 16 for m16n8k16)
    CB: int  # chunks per shared row of B
    CA: int  # chunks per shared row of A
    grid_m: int
    grid_n: int
    # operands
    a_rows: int  # A's packed shape
    a_cols: int
    k_rows: int  # length of the K walk: padded K (sp24) or the gathered row length kc
    k_valid: int  # how far the walk holds data: K (sp24) or kc
    tiles_m: int  # sp24: metadata tiles (16 x 32 of A each); 0 for gather
    tiles_k: int
    e_shape: Tuple[int, ...]
    e_dtype: str
    c_shape: Tuple[int, int]
    nk: int  # pipeline stages in the K walk
    # shared memory: B's stages at 0, then A's, then sp24's metadata; the epilogue reuses it
    a_base: int
    e_base: int
    total: int
    # per-thread copy counts of one stage (chunks / threads, rounded up)
    b_it: int
    a_it: int
    e_it: int
    # bounds a shape makes true at build time, so their checks are not emitted
    aligned: bool  # N % 8 == 0: B rows may be copied 16 bytes at a time
    k_full: bool
    n_full: bool
    m_full: bool
    fast_b: bool  # every B / A chunk of a stage in range: offsets precomputed in registers
    fast_a: bool
    # epilogue: C leaves through shared memory in 16-byte row stores when its rows allow
    out_bytes: int
    VO: int  # outputs per 16-byte store
    # True / False, or (transposed C of any row count) a run-time condition: C's stored rows
    # are whole 16-byte chunks only when M is a multiple of VO, known when the kernel is called
    staged: object
    LDC: int  # pitch of a staged line (padded by one chunk to spread the banks)
    o_per_line: int  # chunks per staged line
    o_it: int  # staged chunks per thread

    @property
    def sp(self) -> bool:
        """sp24 mode (mma.sp on 2:4 A) rather than gather (dense mma on gathered B rows)."""
        return self.mode == "sp24"

    def swizzle_b(self, row, chunk):
        return swizzle(row, chunk, self.CB)

    def swizzle_a(self, row, chunk):
        return swizzle(row, chunk, self.CA)

    def tile_m(self, pid):
        """Row tile of block ``pid`` in the grouped order."""
        return grouped_tile(pid, self.grid_m, self.grid_n, self.group_m)[0]

    def tile_n(self, pid):
        return grouped_tile(pid, self.grid_m, self.grid_n, self.group_m)[1]


def _dynamic_operands(mode: str) -> dict:
    """A kernel for any size: M, K and the packed shapes are variables bound from the
    operands' shapes when it is called (each read stays inside its own operand)."""
    from tvm import tirx as tir

    def var(name):
        return tir.Var(name, "int32")

    M, K, a_rows, a_cols = var("M"), var("K"), var("a_rows"), var("a_cols")
    if mode == "sp24":
        tiles_m, tiles_k = var("tiles_m"), var("tiles_k")
        return dict(M=M, K=K, a_rows=a_rows, a_cols=a_cols, k_rows=a_cols * 2, k_valid=K, tiles_m=tiles_m,
                    tiles_k=tiles_k, e_shape=(tiles_m, tiles_k, 16), e_dtype="uint32")
    return dict(M=M, K=K, a_rows=a_rows, a_cols=a_cols, k_rows=a_cols, k_valid=a_cols, tiles_m=0, tiles_k=0,
                e_shape=(var("vectors"), a_cols), e_dtype="int32")


def _operands(mode: str, M: int, K: int, vec: int, kc: int) -> dict:
    """A's packed shape, the K walk and the index operand E: formats.mma_sp's padded 2:4
    packing (E the metadata) or formats.nm_tc's gathered columns (E the column indices)."""
    from sparsec.formats.mma_sp import padded_shape

    if M is None:
        return _dynamic_operands(mode)
    if mode == "sp24":
        mp, kp = padded_shape(M, K)
        return dict(a_rows=mp, a_cols=kp // 2, k_rows=kp, k_valid=K, tiles_m=mp // 16, tiles_k=kp // 32,
                    e_shape=(mp // 16, kp // 32, 16), e_dtype="uint32")
    check_sizes(kc=kc)
    if kc % 16:
        raise ValueError(f"kc (the gathered row length) should be a multiple of 16, got {kc}")
    mp = _ceil(M, vec) * vec
    return dict(a_rows=mp, a_cols=kc, k_rows=kc, k_valid=kc, tiles_m=0, tiles_k=0, e_shape=(mp // vec, kc),
                e_dtype="int32")


def make_plan(mode: str, M, K, N: int, *, dtype: str, out_dtype: str, vec: int, kc: int, bias: bool,
              activation: str, transpose_c: bool, knobs: dict, bias_dtype: str = "float32",
              bias_axis: str = "row") -> Plan:
    """The checked :class:`Plan` of ``spmm``'s arguments; knobs not given take their first
    choice. ``M = K = None``: a kernel for any size (``_dynamic_operands``), whose bounds
    checks all stay."""
    knobs = {**{k: v[0] for k, v in KNOBS.items()}, **knobs}
    if (M is None) != (K is None):
        raise ValueError(f"M and K should both be sizes or both be None (any size), got M={M!r}, K={K!r}")
    check(mode, M, K, N, dtype, out_dtype, vec, knobs)
    check_choice("bias_dtype", bias_dtype, ("float32",) + tuple(DTYPES))
    check_choice("activation", activation, ACTIVATIONS)
    check_choice("bias_axis", bias_axis, BIAS_AXES)
    mt, nt, ks, stages = knobs["warp_m_tiles"], knobs["warp_n_tiles"], knobs["k_steps"], knobs["stages"]
    sp = mode == "sp24"
    BM, BN = block_shape(knobs)
    NT = 32 * knobs["warps_m"] * knobs["warps_n"]
    BK = (32 if sp else 16) * ks
    CB, CA = BN // 8, 2 * ks
    ops = _operands(mode, M, K, vec, kc)
    dynamic = M is None
    M, K = ops.pop("M", M), ops.pop("K", K)
    # shared memory: the stages of B, of A, and of sp24's metadata (32 uint32 per tile)
    a_base = stages * BK * BN
    e_base = a_base + stages * BM * CA * 8
    pipeline_total = e_base + (stages * (BM // 16) * ks * 32 if sp else 0)
    # The epilogue stages the block's outputs in shared memory (reusing the pipeline's
    # buffers) so that C is written with 16-byte row stores: one store instruction per 8
    # fp16 outputs instead of one per pair. Rows are padded by 16 bytes (bank spread).
    out_bytes = 4 if out_dtype == "float32" else 2
    VO = 16 // out_bytes
    staged = (M % VO == 0) if transpose_c else (N % VO == 0)  # a PrimExpr for a transposed C of any M
    line, lines = (BM, BN) if transpose_c else (BN, BM)  # a staged line is a row of C as stored
    LDC = line + VO
    total = max(pipeline_total, lines * LDC * out_bytes // 2 if staged is not False else 0)
    # Shapes that fill every tile need no bounds checks: the copies and stores are emitted
    # without them (fewer integer instructions per MMA in the main loop).
    aligned = N % 8 == 0
    k_full = not dynamic and ops["k_valid"] % BK == 0 and ops["k_rows"] == ops["k_valid"]
    n_full = aligned and N % BN == 0
    m_full = not dynamic and ops["a_rows"] % BM == 0 and M % BM == 0
    return Plan(
        mode=mode, M=M, K=K, N=N, dtype=dtype, out_dtype=out_dtype, vec=vec, bias=bias, bias_dtype=bias_dtype,
        bias_axis=bias_axis,
        activation=activation,
        transpose_c=transpose_c, warps_m=knobs["warps_m"], warps_n=knobs["warps_n"], mt=mt, nt=nt, ks=ks,
        stages=stages, frag_sets=knobs["frag_sets"], group_m=knobs["group_m"],
        BM=BM, BN=BN, WM=16 * mt, WN=8 * nt, NT=NT, BK=BK, CB=CB, CA=CA, grid_m=_ceil(M, BM), grid_n=_ceil(N, BN),
        **ops, c_shape=(N, M) if transpose_c else (M, N), nk=_ceil(ops["k_rows"], BK),
        a_base=a_base, e_base=e_base, total=total,
        b_it=_ceil(BK * CB, NT), a_it=_ceil(BM * CA, NT), e_it=_ceil(BM // 16 * ks * 4, NT),
        aligned=aligned, k_full=k_full, n_full=n_full, m_full=m_full,
        # copies whose chunks all land in range keep their per-thread offsets in registers
        # (``plan_copies``), so a stage's copy is an add and a cp.async per chunk
        fast_b=n_full and k_full and BK * CB % NT == 0, fast_a=m_full and k_full and BM * CA % NT == 0,
        out_bytes=out_bytes, VO=VO, staged=staged, LDC=LDC, o_per_line=line // VO,
        o_it=_ceil(lines * (line // VO), NT))
