"""int8 SR-BCRS SpMM on Tensor Cores (Magicube's format): ``C = A @ B`` with A (M, K) in
``srbcrs:vV,int8`` (V = 2, 4, 8), B (K, N) int8 row-major, C (M, N) int32 (exact), or
float32 / float16 after scaling by ``row_scale[M]`` and ``b_scale`` (dequantisation).

The product is computed transposed, ``C^T = B^T A^T``, with ``mma.m16n8k32.s8.s8.s32``:
the instruction's A operand is columns of B gathered at a vector row's 32 slot columns,
its B operand the vector row's values (32 slots x 8 rows, the first V real), so one
vector row fills the n = 8 side and its slots run along k. Each lane's B-operand
registers are four consecutive slots of one row of a value chunk (Magicube's row-major
V x 16 chunks): one aligned 32-bit load.

The A operand wants four *slots* (four gathered rows of B) per register, for one column.
B is row-major, so a lane instead loads whole words along its rows -- ``n_bytes``
consecutive columns of each of its 8 slot rows, one vector load per row -- and transposes
4 x 4 byte blocks in registers with ``prmt`` (Magicube's online transpose). The columns
are permuted to make that free: lane group g = lane / 4 owns the ``n_bytes`` consecutive
columns ``n0 + n_bytes*g + c``, and column c is row ``g + 8*(c % 2)`` of MMA tile ``c // 2``;
the epilogue undoes it, so each lane stores ``n_bytes`` consecutive outputs per row. A
warp covers one vector row x ``8 * n_bytes`` columns, ``warps`` warps of a block share the
vector row; no shared memory. ``operands`` spells the lanes' registers out and
``emulate`` replays them through the MMA's fragment layout on the CPU.
"""
from __future__ import annotations

import numpy as np

from .warp_mma import check_choice, check_knobs, check_sizes, compile_for

VECS = (2, 4, 8)
OUT_DTYPES = ("int32", "float32", "float16")
KNOBS = {"n_bytes": (16, 4, 8), "warps": (4, 1, 2, 8)}
# prmt selectors of a 4 x 4 byte transpose: interleave bytes 0,1 / 2,3 of two words, then halves
_LO, _HI, _LO16, _HI16 = 0x5140, 0x7362, 0x5410, 0x7632


def check(M, K, N: int, vec: int, out_dtype: str, n_bytes: int, warps: int):
    if (M is None) != (K is None):
        raise ValueError(f"M and K should both be sizes or both be None (any size), got M={M!r}, K={K!r}")
    check_sizes(N=N, **{k: v for k, v in (("M", M), ("K", K)) if v is not None})
    check_choice("vec (V)", vec, VECS)
    check_choice("out_dtype", out_dtype, OUT_DTYPES)
    check_knobs({"n_bytes": n_bytes, "warps": warps}, KNOBS)


def spmm_srbcrs_int8(M, K, N: int, vec: int, *, out_dtype: str = "int32", n_bytes: int = 16,
                     warps: int = 4, name: str = "srbcrs_spmm", fast_for=None):
    """PrimFunc ``srbcrs_spmm(indptr, indices, values, B, C[, row_scale, b_scale])`` over an
    ``srbcrs:v{vec},int8`` instance's arrays: ``indptr``, ``indices`` (int32) and ``data``
    passed as uint32 words (``data.view(np.uint32)``). Whatever the arrays hold, every read
    stays inside them: row bounds are clamped to ``indices``, gathered rows to B.

    ``M = K = None`` gives a kernel for any size (what ``sparsec.compile`` builds for the
    format): M, K and the vector rows are read from C, B and ``indptr`` when it is called,
    and ``data`` is passed as the instance holds it (int8), read a word at a time all the
    same. ``name`` is the kernel's symbol.

    ``fast_for = (M, K)`` with ``M = K = None``: the any-size kernel also carries the body
    built for that one size (M, K, the vector rows and the grid constants; the row checks
    that constants make unneeded gone) and runs it when the operands have that size, e.g.
    the matrix a kernel is compiled for; every other matrix runs the any-size body."""
    from tvm.script import tirx as T

    check(M, K, N, vec, out_dtype, n_bytes, warps)
    if fast_for is not None:
        check_fast_for(fast_for)
    V = vec
    dynamic = M is None
    if dynamic:
        from tvm import tirx

        M, K, ip_len = tirx.Var("M", "int32"), tirx.Var("K", "int32"), tirx.Var("vector_rows_1", "int32")
    else:
        ip_len = -(-M // V) + 1
    scaled = out_dtype != "int32"

    def body_for(M, K, ip_len):
        return _body(M, K, ip_len - 1, N, V, out_dtype=out_dtype, n_bytes=n_bytes, warps=warps)

    body = body_for(M, K, ip_len)
    if dynamic and fast_for is not None:
        sized = (fast_for[0], fast_for[1], -(-fast_for[0] // V) + 1)  # M, K, indptr's length
        body = _sized(body, body_for(*sized), (M, K, ip_len), sized, N, out_dtype)

    @T.macro
    def operands_of(indptr_h, indices_h, values_h, b_h, c_h, scale_h, b_scale):
        slots = T.int32()
        IP = T.match_buffer(indptr_h, (ip_len,), "int32")
        IX = T.match_buffer(indices_h, (slots,), "int32")
        # int8 values, read a word at a time: as words (uint32), or as the instance holds them
        Dv = T.match_buffer(values_h, (slots * V,) if dynamic else (slots * V // 4,), "int8" if dynamic else "uint32")
        B = T.match_buffer(b_h, (K, N), "int8")
        C = T.match_buffer(c_h, (M, N), out_dtype)
        if scaled:
            RS = T.match_buffer(scale_h, (M,), "float32")
            body(IP, IX, Dv, B, C, RS, b_scale)
        else:
            body(IP, IX, Dv, B, C, None, None)

    if scaled:
        @T.prim_func(s_tir=True)
        def srbcrs_spmm(indptr_h: T.handle, indices_h: T.handle, values_h: T.handle, b_h: T.handle,
                        c_h: T.handle, scale_h: T.handle, b_scale: T.float32):
            T.func_attr({"global_symbol": "srbcrs_spmm", "tirx.noalias": True})
            operands_of(indptr_h, indices_h, values_h, b_h, c_h, scale_h, b_scale)
        return srbcrs_spmm.with_attr("global_symbol", name)

    @T.prim_func(s_tir=True)
    def srbcrs_spmm(indptr_h: T.handle, indices_h: T.handle, values_h: T.handle, b_h: T.handle, c_h: T.handle):
        T.func_attr({"global_symbol": "srbcrs_spmm", "tirx.noalias": True})
        operands_of(indptr_h, indices_h, values_h, b_h, c_h, None, None)
    return srbcrs_spmm.with_attr("global_symbol", name)


def check_fast_for(fast_for):
    """``fast_for`` a pair of positive ints (M, K), else ValueError naming it."""
    if not isinstance(fast_for, (tuple, list)) or len(fast_for) != 2:
        raise ValueError(f"fast_for should be the (M, K) of the matrix to carry a sized body for, got {fast_for!r}")
    check_sizes(**{"fast_for M": fast_for[0], "fast_for K": fast_for[1]})


def _sized(body, fast_body, sizes, fast_sizes, N: int, out_dtype: str):
    """``body`` (any size), with ``fast_body`` beside it: run when the operands' (M, K,
    indptr length) are ``fast_sizes``, on views of them with those constant shapes."""
    from tvm.script import tirx as T

    (M, K, ip_len), (Mf, Kf, ip_f) = sizes, fast_sizes
    same = T.And(T.And(M == Mf, K == Kf), ip_len == ip_f)
    scaled = out_dtype != "int32"

    # the choice is a host loop run once or not at all, as tc_pipeline's: TVM plans a kernel's
    # barriers itself and refuses to plan them under a condition
    @T.macro
    def dispatch(IP, IX, Dv, B, C, RS, bs):
        for _ in range(T.Cast("int32", same)):
            IPf = T.decl_buffer((ip_f,), "int32", data=IP.data)
            Bf = T.decl_buffer((Kf, N), "int8", data=B.data)
            Cf = T.decl_buffer((Mf, N), out_dtype, data=C.data)
            if scaled:
                RSf = T.decl_buffer((Mf,), "float32", data=RS.data)
                fast_body(IPf, IX, Dv, Bf, Cf, RSf, bs)
            else:
                fast_body(IPf, IX, Dv, Bf, Cf, None, None)
        for _ in range(1 - T.Cast("int32", same)):
            body(IP, IX, Dv, B, C, RS, bs)

    return dispatch


def _body(M, K, m_vec, N: int, V: int, *, out_dtype: str, n_bytes: int, warps: int):
    """The macro of the whole kernel launch for sizes ``M``, ``K`` and ``m_vec`` vector rows
    (constants, or variables of the any-size kernel): its grid, registers, K walk and stores."""
    from tvm.script import tirx as T

    w = n_bytes
    tiles, groups = w // 2, w // 4  # MMA tiles per warp; 4-byte groups per slot row
    per_warp = 8 * w
    grid_n = -(-N // (per_warp * warps))
    full = N % (per_warp * warps) == 0  # every column a lane touches is in range
    mma = T.ptx["mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32"]
    prmt = T.ptx["prmt.b32"]
    ld_v4 = T.ptx["ld.global.nc.v4.u32"]
    ld_v2 = T.ptx["ld.global.nc.v2.u32"]
    ld_v1 = T.ptx["ld.global.nc.u32"]
    scaled = out_dtype != "int32"

    @T.macro
    def gather_rows(IX, Dw, B, rows, rw, idx, bw, start, end, kt, n0, tx):
        """Slot rows of k step ``kt``: their column indices, the lane's value words (b0,
        b1) and ``w`` bytes of each of the 8 rows of B it gathers. Rows hold whole
        16-slot chunks, so a chunk is in the vector row or not at all."""
        for q in T.unroll(2):
            base = start + kt * 32 + q * 16
            if base + 16 <= end:
                for s in T.unroll(4):
                    idx[q * 4 + s] = T.min(T.max(IX[base + tx % 4 * 4 + s], 0), K - 1)
                if tx // 4 < V:
                    bw[q] = Dw[(base * V + tx // 4 * 16 + tx % 4 * 4) // 4]
                else:
                    bw[q] = T.uint32(0)
            else:
                for s in T.unroll(4):
                    idx[q * 4 + s] = 0
                bw[q] = T.uint32(0)
        for r in T.unroll(8):  # padding slots (index -1) read row 0; their values are 0
            if full:  # one vector load of the row's w bytes (TVM would gather them byte by byte)
                if w == 16:
                    ld_v4(rw[r * 4], rw[r * 4 + 1], rw[r * 4 + 2], rw[r * 4 + 3],
                          B.access_ptr("r", offset=idx[r] * N + n0, extent=16))
                elif w == 8:
                    ld_v2(rw[r * 2], rw[r * 2 + 1], B.access_ptr("r", offset=idx[r] * N + n0, extent=8))
                else:
                    ld_v1(rw[r], B.access_ptr("r", offset=idx[r] * N + n0, extent=4))
            else:
                for b in T.unroll(w):
                    rows[r * w + b] = T.if_then_else(n0 + b < N, B[idx[r], T.min(n0 + b, N - 1)],
                                                     T.int8(0))

    @T.macro
    def transpose(rw, xy, ia):
        """A-operand registers from the slot rows: column 4G + u of slots q*16 + 4t..+3 is
        register (tile 2G + u // 2, row half u % 2, chunk q)."""
        for q in T.unroll(2):
            for G in T.unroll(groups):
                prmt(xy[0], rw[(q * 4) * groups + G], rw[(q * 4 + 1) * groups + G], T.uint32(_LO))
                prmt(xy[1], rw[(q * 4) * groups + G], rw[(q * 4 + 1) * groups + G], T.uint32(_HI))
                prmt(xy[2], rw[(q * 4 + 2) * groups + G], rw[(q * 4 + 3) * groups + G], T.uint32(_LO))
                prmt(xy[3], rw[(q * 4 + 2) * groups + G], rw[(q * 4 + 3) * groups + G], T.uint32(_HI))
                prmt(ia[(2 * G) * 4 + q * 2], xy[0], xy[2], T.uint32(_LO16))
                prmt(ia[(2 * G) * 4 + q * 2 + 1], xy[0], xy[2], T.uint32(_HI16))
                prmt(ia[(2 * G + 1) * 4 + q * 2], xy[1], xy[3], T.uint32(_LO16))
                prmt(ia[(2 * G + 1) * 4 + q * 2 + 1], xy[1], xy[3], T.uint32(_HI16))

    @T.macro
    def store(C, acc_s32, out, RS, bs, row, v2, n0):
        """The lane's ``w`` consecutive outputs of one row (column c is tile c // 2, half c % 2)."""
        for c in T.unroll(w):
            if scaled:
                out[v2 * w + c] = T.Cast(out_dtype, T.Cast("float32", acc_s32[c // 2 * 4 + c % 2 * 2 + v2])
                                         * RS[row] * bs)
            else:
                out[v2 * w + c] = acc_s32[c // 2 * 4 + c % 2 * 2 + v2]
        if full:
            for c4 in T.unroll(w // 4):
                for e in T.vectorized(4):
                    C[row, n0 + c4 * 4 + e] = out[v2 * w + c4 * 4 + e]
        else:
            for c in T.unroll(w):
                if n0 + c < N:
                    C[row, n0 + c] = out[v2 * w + c]

    @T.macro
    def body(IP, IX, Dv, B, C, RS, bs):
        bx = T.env_thread("blockIdx.x")
        by = T.env_thread("blockIdx.y")
        ty = T.env_thread("threadIdx.y")
        tx = T.env_thread("threadIdx.x")
        T.launch_thread(bx, grid_n)
        T.launch_thread(by, m_vec)
        T.launch_thread(ty, warps)
        T.launch_thread(tx, 32)
        Dw = T.decl_buffer((IX.shape[0] * V // 4,), "uint32", data=Dv.data)  # the values as words
        rows = T.decl_buffer([8 * w], "int8", scope="local")
        rw = T.decl_buffer([2 * w], "uint32", data=rows.data, scope="local")
        idx = T.decl_buffer([8], "int32", scope="local")
        bw = T.decl_buffer([2], "uint32", scope="local")
        xy = T.decl_buffer([4], "uint32", scope="local")
        ia = T.decl_buffer([4 * tiles], "uint32", scope="local")
        acc = T.decl_buffer([4 * tiles], "uint32", scope="local")  # the instruction's s32, as .u32 registers
        acc_s32 = T.decl_buffer([4 * tiles], "int32", data=acc.data, scope="local")
        out = T.decl_buffer([2 * w], out_dtype, scope="local")
        n0 = (bx * warps + ty) * per_warp + tx // 4 * w
        end = T.min(IP[by + 1], IX.shape[0])
        start = T.max(T.min(IP[by], end), 0)
        for i in T.unroll(4 * tiles):
            acc[i] = T.uint32(0)
        for kt in range((end - start + 31) // 32):
            gather_rows(IX, Dw, B, rows, rw, idx, bw, start, end, kt, n0, tx)
            transpose(rw, xy, ia)
            for j in T.unroll(tiles):
                mma(acc[j * 4], acc[j * 4 + 1], acc[j * 4 + 2], acc[j * 4 + 3],
                    ia[j * 4], ia[j * 4 + 1], ia[j * 4 + 2], ia[j * 4 + 3],
                    bw[0], bw[1], acc[j * 4], acc[j * 4 + 1], acc[j * 4 + 2], acc[j * 4 + 3])
        for v2 in T.unroll(2):  # accumulator columns 2t, 2t + 1: rows of the vector
            if T.And(tx % 4 * 2 + v2 < V, by * V + tx % 4 * 2 + v2 < M):
                store(C, acc_s32, out, RS, bs, by * V + tx % 4 * 2 + v2, v2, n0)

    return body


def build(M: int, K: int, N: int, vec: int, *, arch: str = "sm_90a", **knobs):
    """The compiled module (TVM executable) of :func:`spmm_srbcrs_int8` for ``arch``."""
    return compile_for(spmm_srbcrs_int8(M, K, N, vec, **knobs), arch)


# ---- the layout, spelled out and replayed on the CPU --------------------------------------

def _byte_perm(a: int, b: int, sel: int) -> int:
    """PTX ``prmt.b32`` (default mode): byte i of the result is byte ``sel`` nibble i of b:a."""
    src = (a & 0xFFFFFFFF) | ((b & 0xFFFFFFFF) << 32)
    return sum(((src >> (8 * ((sel >> (4 * i)) & 7))) & 0xFF) << (8 * i) for i in range(4))


def operands(indptr, indices, values, B, vr: int, kt: int, n0: int, lane: int, V: int, n_bytes: int = 16):
    """The registers lane ``lane`` builds for vector row ``vr``, k step ``kt`` and warp
    columns from ``n0``, with the kernel's index arithmetic and byte transposes: ``a``
    (tiles, 4) uint32 A-operand registers and ``b`` (2,) uint32 (b0, b1)."""
    g, t, w = lane // 4, lane % 4, n_bytes
    start, end = int(indptr[vr]), int(indptr[vr + 1])
    K, N = B.shape
    col0 = n0 + g * w
    words = np.zeros((8, w // 4), np.uint32)  # slot row r = q*4 + s: bytes col0 .. col0 + w - 1
    b = np.zeros(2, np.uint32)
    for q in range(2):
        base = start + kt * 32 + q * 16
        if base + 16 > end:
            continue
        if g < V:
            b[q] = np.frombuffer(values[base * V + g * 16 + t * 4: base * V + g * 16 + t * 4 + 4].tobytes(), "<u4")[0]
        for s in range(4):
            row = min(max(int(indices[base + t * 4 + s]), 0), K - 1)
            cols = [B[row, c] if c < N else 0 for c in range(col0, col0 + w)]
            words[q * 4 + s] = np.frombuffer(np.array(cols, np.int8).tobytes(), "<u4")
    a = np.zeros((w // 2, 4), np.uint32)
    for q in range(2):
        for G in range(w // 4):
            r = [int(words[q * 4 + s, G]) for s in range(4)]
            x0, x1 = _byte_perm(r[0], r[1], _LO), _byte_perm(r[0], r[1], _HI)
            y0, y1 = _byte_perm(r[2], r[3], _LO), _byte_perm(r[2], r[3], _HI)
            a[2 * G, q * 2], a[2 * G, q * 2 + 1] = _byte_perm(x0, y0, _LO16), _byte_perm(x0, y0, _HI16)
            a[2 * G + 1, q * 2], a[2 * G + 1, q * 2 + 1] = _byte_perm(x1, y1, _LO16), _byte_perm(x1, y1, _HI16)
    return a, b


def emulate(indptr, indices, values, B, M: int, V: int, n_bytes: int = 16) -> np.ndarray:
    """``A @ B`` (int64) as the warps compute it: per vector row, warp and k step, the 32
    lanes' registers are put back into the 16 x 32 and 32 x 8 operands of each
    mma.m16n8k32 (PTX ISA fragment layout) and multiplied; the accumulators land where
    the kernel's epilogue stores them."""
    K, N = B.shape
    w = n_bytes
    C = np.zeros((-(-M // V) * V, N), np.int64)

    def s8(word):
        return np.frombuffer(np.uint32(word).tobytes(), np.int8).astype(np.int64)

    for vr in range(len(indptr) - 1):
        steps = (int(indptr[vr + 1]) - int(indptr[vr]) + 31) // 32
        for n0 in range(0, N, 8 * w):
            acc = np.zeros((w // 2, 16, 8), np.int64)  # (tile, MMA row, vector row)
            for kt in range(steps):
                opa = np.zeros((w // 2, 16, 32), np.int64)
                opb = np.zeros((32, 8), np.int64)
                for lane in range(32):
                    g, t = lane // 4, lane % 4
                    a, b = operands(indptr, indices, values, B, vr, kt, n0, lane, V, w)
                    for j in range(w // 2):
                        for reg in range(4):  # a0: row g, k 4t..; a1: row g + 8; a2/a3: k + 16
                            opa[j, g + reg % 2 * 8, reg // 2 * 16 + t * 4: reg // 2 * 16 + t * 4 + 4] = s8(a[j, reg])
                    for q in range(2):
                        opb[q * 16 + t * 4: q * 16 + t * 4 + 4, g] = s8(b[q])
                acc += opa @ opb
            for lane in range(32):
                g, t = lane // 4, lane % 4
                for v2 in range(2):
                    for c in range(w):
                        n, row = n0 + g * w + c, t * 2 + v2
                        if row < V and n < N:
                            C[vr * V + row, n] = acc[c // 2, g + c % 2 * 8, row]
    return C[:M]
