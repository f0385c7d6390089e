"""Tensor Core SpMM for a linear layer's BSR weight on token-major activations:
``Y[n, i] = act(sum_j X[n, j] * W[i, j] + bias[i])`` with W a ``formats.bsr`` instance of
r x c float16 / bfloat16 blocks (out x in), X (tokens, in) and Y (tokens, out) as
``torch.nn.Linear`` holds them, so no transpose runs before or after the product.

Both MMA operands are K-major here: a CTA's tile of X is ``tokens x c`` with ``c`` (the
block's columns, K) contiguous, and a block is ``r x c`` with K contiguous, so ``ldmatrix``
without ``.trans`` gives the A fragments (tokens) and the B fragments (the block's rows, the
layer's outputs) of ``mma.m16n8k16``, whose accumulators hold pairs of neighbouring outputs
of one token: rows of Y. A CTA owns one block row (r outputs) and ``tile`` tokens and walks
the row's stored blocks in a ring of ``stages``:

* **one lane of a producer warp** issues TMA tensor copies a stage ahead: one box of the
  stage's ``per_stage`` blocks (consecutive in ``values``) and, for each block, one box of X
  (``tile`` tokens x the block's ``c`` columns; tokens and columns past X's zero-filled by the
  copy engine), into 1024-byte aligned stages swizzled so ``ldmatrix`` rows hit distinct
  banks, arming the stage's ``mbarrier`` with the byte count;
* **consumer warps** (``warps_m`` x ``warps_n``, each a ``tile / warps_m`` x ``r / warps_n``
  tile of Y) wait on the stage, multiply with float32 accumulators, fence their reads of the
  slot against the copy engine's next writes to it (``fence.proxy.async``: without it a
  refill overwrote a slot a warp was still reading, 1-4 of 20-40 calls wrong at 5 CTAs an SM
  on the H200, 0 of 80 with it, ``results/probe_bsr_tokens_fence_H200.json``) and release it;
* ``tiles`` tiles of tokens a CTA, one after the other in the same ring, so the walk of the
  next tile's blocks starts while a warp writes the last one's outputs;
* each warp's **epilogue** adds the bias, applies the activation, casts, packs pairs of
  outputs, stages its tile of Y in its own shared-memory rows and writes Y's rows in 16-byte
  stores (``direct=1``: 4-byte pairs straight from the fragments, no staging memory).

Consecutive CTAs take consecutive block rows of one tile of tokens, so the X tile they
gather is read from L2 by all of them while it is resident. At 90 % block sparsity the
product is bound by the bytes of X each stored block gathers (``tile`` x ``c`` halves for
``r x tile x c`` multiply-adds: r FLOP a byte), so larger blocks go further: on the H200 at
4096 tokens, through ``SparseLinear`` (``results/weights_tokens_H200.json``), the defaults
ran 32-row blocks at 93-250 TFLOP/s on their stored blocks and 64-row blocks at 111-354
(the low ends on BERT's FFN weights, a few blocks a row), against 632 for ``mma.sync``. The
defaults come from 13 knob sets timed on those layers (``results/probe_bsr_tokens_H200.json``).

The kernel trusts its operands (``sparsec.compile``'s kernel checks them) and needs
``values``, X and Y 16-byte aligned with rows of a multiple of 8 elements (``in`` and
``out`` multiples of 8: TMA's row stride)."""
from __future__ import annotations

from types import SimpleNamespace

from .bsr_ring import SWIZZLE
from .tc_pipeline_epilogue import activation_fn
from .tc_pipeline_plan import ACTIVATIONS
from .warp_mma import check_choice, check_knobs, check_sizes, compile_for

SMEM_LIMIT = 227 * 1024  # shared memory one CTA may take on sm_90
# the values checked on the H200 in the kernel's final form (results/check_bsr_tokens_H200.json);
# the plan also takes 1 or 2 warps along the tokens, 2 or 4 across a block's rows, 6 or 8 stages,
# 2 blocks a stage and 8 tiles a CTA, which the probe's checks cover for the next GPU session
KNOBS = {"tile": (256, 128, 64), "warps_m": (4, 8), "warps_n": (1,), "stages": (4, 3), "per_stage": (1,),
         "tiles": (1, 2, 4), "direct": (0, 1)}
UNCHECKED = {"warps_m": (1, 2), "warps_n": (2, 4), "stages": (6, 8), "per_stage": (2,), "tiles": (8,)}
DTYPES = ("float16", "bfloat16")
OUT_DTYPES = ("float16", "bfloat16", "float32")
BIAS_DTYPES = ("float32", "float16", "bfloat16")
MIN_CTAS = 64  # default_knobs: fewer CTAs than this take smaller shares of the tokens
ACC_LIMIT = 128  # float32 accumulators a lane holds at most (the registers left for fragments and addresses)


def takes(block) -> bool:
    """Whether the kernel takes blocks of this shape: 16-64 rows and 16, 32 or 64 columns
    (a block row of the copy engine's swizzle spans)."""
    r, c = (int(b) for b in block)
    return r in (16, 32, 48, 64) and c in (16, 32, 64)


def plan(block, tokens: int, tile: int = 128, warps_m: int = 4, warps_n: int = 1, stages: int = 4,
         per_stage: int = 1, tiles: int = 1, direct: int = 0, out_bytes: int = 2,
         unchecked: bool = False) -> SimpleNamespace:
    """The kernel's sizes, checked: ValueError naming the first thing it cannot take
    (``out_bytes``: bytes of an output, 2 or 4; ``unchecked``: the knob values of
    :data:`UNCHECKED` too, for the probe that checks them on the GPU)."""
    r, c = (int(b) for b in block)
    if r % 16 or not 16 <= r <= 64:
        raise ValueError(f"block rows should be 16, 32, 48 or 64 (16 outputs an MMA tile), got {r}")
    if c not in (16, 32, 64):
        raise ValueError(f"block columns should be 16, 32 or 64 (rows of 32-128 bytes, the copy engine's "
                         f"swizzle spans), got {c}")
    check_sizes(tokens=tokens, tile=tile, warps_m=warps_m, warps_n=warps_n, stages=stages, per_stage=per_stage,
                tiles=tiles)
    choices = {k: v + (UNCHECKED.get(k, ()) if unchecked else ()) for k, v in KNOBS.items()}
    check_knobs({"tile": tile, "warps_m": warps_m, "warps_n": warps_n, "stages": stages, "per_stage": per_stage,
                 "tiles": tiles, "direct": direct}, choices)
    wt = tile // warps_m
    if wt % 16:
        raise ValueError(f"tile={tile} tokens over warps_m={warps_m} warps leaves {wt} tokens a warp, "
                         f"not a multiple of 16 (the MMA's rows)")
    if r % (16 * warps_n):
        raise ValueError(f"warps_n={warps_n} warps do not split a {r}-row block into 16-output tiles: take fewer")
    mt, nt = wt // 16, r // warps_n // 8
    if mt * nt * 4 > ACC_LIMIT:
        raise ValueError(f"a warp's {wt} x {r // warps_n} tile of Y needs {mt * nt * 4} accumulators a lane, over "
                         f"{ACC_LIMIT}: take more warps or a smaller tile")
    if warps_m * warps_n > 8:
        raise ValueError(f"warps_m={warps_m} x warps_n={warps_n} consumer warps: at most 8")
    p = SimpleNamespace(r=r, c=c, TN=tile, WN=warps_n, W=warps_m * warps_n, D=stages, G=per_stage, TT=tiles,
                        direct=bool(direct), wt=wt, wo=r // warps_n, mt=mt, nt=nt, ks=c // 16)
    p.a_bytes = per_stage * r * c * 2  # a stage's blocks, one box
    p.x_bytes = tile * c * 2  # X's tile for one block
    p.a_region = -(-p.a_bytes // 1024) * 1024
    p.x_region = -(-p.x_bytes // 1024) * 1024
    p.stage_bytes = p.a_region + per_stage * p.x_region
    p.swizzle, p.mask = SWIZZLE[c * 2]  # both operands' rows are c halves
    p.ring_bytes = stages * p.stage_bytes
    p.bar_bytes = 16 * stages  # full and empty barriers, 8 bytes each
    p.out_bytes = out_bytes
    p.vo = 16 // out_bytes  # outputs a 16-byte store
    p.ldy = p.wo + p.vo  # a warp's staged row pitch in outputs: its r / warps_n, a 16-byte chunk of padding
    p.stage_y = 0 if direct else p.W * p.wt * p.ldy * p.out_bytes  # every warp's staged tile of Y
    p.smem = p.ring_bytes + 1024 + p.bar_bytes + p.stage_y  # + the slack that aligns the ring
    if p.smem > SMEM_LIMIT:
        raise ValueError(f"block {r}x{c} with tile={tile}, stages={stages} and per_stage={per_stage} needs "
                         f"{p.smem} bytes of shared memory, over {SMEM_LIMIT}: take fewer stages or a smaller tile")
    return p


def default_knobs(block, tokens: int, rows=None, out_bytes: int = 2) -> dict:
    """From the H200 sweep at 4096 tokens (``results/probe_bsr_tokens_H200.json``): 256 tokens
    a CTA in warps of 32 tokens x 64 outputs for 64-row blocks (8 warps), two tiles a CTA one
    after the other; 64 tokens x the block's rows (4 warps), one tile, for smaller blocks; 4
    stages. Up to 128 tokens a 64- or 128-token tile in 4 warps. ``rows`` (the matrix's, where
    known): fewer than 64 CTAs take one tile a CTA, then 128-token tiles. A float32 output
    (``out_bytes`` 4) whose staging rows do not fit beside 4 stages takes 3, then direct stores."""
    r, _ = (int(b) for b in block)
    if tokens <= 128:
        knobs = {"tile": 64 if tokens <= 64 else 128, "warps_m": 4, "warps_n": 1, "stages": 4, "per_stage": 1,
                 "tiles": 1, "direct": 0}
    else:
        knobs = {"tile": 256, "warps_m": 8 if r >= 64 else 4, "warps_n": 1, "stages": 4, "per_stage": 1,
                 "tiles": 2 if r >= 64 else 1, "direct": 0}
    if rows and tokens > 128:
        block_rows, token_tiles = -(-int(rows) // r), -(-tokens // 256)
        if block_rows * -(-token_tiles // knobs["tiles"]) < MIN_CTAS:
            knobs["tiles"] = 1
        if block_rows * token_tiles < MIN_CTAS:
            knobs.update(tile=128, warps_m=4)
    for fallback in ({"stages": 3}, {"direct": 1}):
        try:
            plan(block, tokens, **knobs, out_bytes=out_bytes)
            break
        except ValueError:
            knobs.update(fallback)
    return knobs


def spmm(block=(32, 32), tokens: int = 128, dtype: str = "float16", out_dtype: str = "float16",
         bias: bool = False, bias_dtype: str = "float32", activation: str = "none", name: str = "bsr_tokens",
         unchecked: bool = False, **knobs):
    """The PrimFunc ``name(indptr, indices, values, X, [bias,] Y)``: ``indptr`` (int32, block
    rows + 1), ``indices`` (int32, block columns) and ``values`` (``dtype``, the blocks
    row-major one after another) as ``formats.bsr`` stores them; X (tokens, K) ``dtype``;
    bias (M,) ``bias_dtype``; Y (tokens, M) ``out_dtype``, written whole. M and K are read
    from the operands; ``tokens`` is fixed when built."""
    from tvm.script import tirx as T

    check_choice("dtype", dtype, DTYPES)
    check_choice("out_dtype", out_dtype, OUT_DTYPES)
    check_choice("bias_dtype", bias_dtype, BIAS_DTYPES)
    check_choice("activation", activation, ACTIVATIONS)  # activation_fn passes any other name through
    out_bytes = 4 if out_dtype == "float32" else 2
    p = plan(block, tokens, **{**default_knobs(block, tokens, out_bytes=out_bytes), **knobs}, out_bytes=out_bytes,
             unchecked=unchecked)
    R, Cb, D, G, TN, W, TT = p.r, p.c, p.D, p.G, p.TN, p.W, p.TT
    mt, nt, ks, VO, LDY = p.mt, p.nt, p.ks, p.vo, p.ldy
    ty_ = "bf16" if dtype == "bfloat16" else "f16"
    ldm = T.ptx["ldmatrix.sync.aligned.m8n8.x4.shared.b16"]
    mma = T.ptx[f"mma.sync.aligned.m16n8k16.row.col.f32.{ty_}.{ty_}.f32"]
    arrive = T.ptx["mbarrier.arrive.shared::cta.b64"]
    expect_bytes = T.ptx["mbarrier.arrive.expect_tx.shared::cta.b64"]
    tensor_copy = T.ptx["cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"]
    st_word, st_pair, ld_chunk = T.ptx["st.shared.b32"], T.ptx["st.shared.v2.b32"], T.ptx["ld.shared.v4.b32"]
    pack = T.ptx["cvt.rn.bf16x2.f32" if out_dtype == "bfloat16" else "cvt.rn.f16x2.f32"]  # (d, high, low)
    fence_init, fence_async = T.ptx["fence.mbarrier_init.release.cluster"], T.ptx["fence.proxy.async.shared::cta"]
    full_mask = T.uint32(0xFFFFFFFF)
    activate = activation_fn(activation)
    chunks = p.wo // VO  # 16-byte chunks of a warp's staged row
    y_iters = -(-(p.wt * chunks) // 32)
    n_tiles = -(-tokens // TN)
    groups = -(-n_tiles // TT)  # CTAs along the tokens, each ``tiles`` tiles one after another

    def swizzled(base, offset):
        """``base`` (a 1024-byte aligned shared address) plus ``offset`` bytes as the copy engine
        laid them out: 16-byte chunk bits 4-6 XORed with bits 7-9 under the swizzle's mask."""
        return base + T.Cast("uint32", offset ^ ((offset >> 3) & p.mask))

    @T.macro
    def produce(sb, win, cols, indices, q0, cnt, n0, j, jj, tx, map_a, map_x):
        """Ring slot ``j``, the tile's stage ``jj``: every lane reads the stage's block columns
        (a window of 32, shuffled); lane 0 waits for the slot, arms the full barrier with the
        stage's bytes and issues one copy of its blocks and one of X's tile for each."""
        s = T.meta_var(j % D)
        for g in T.unroll(G):
            i = T.meta_var(jj * G + g)
            if i % 32 == 0:
                win[0] = T.if_then_else(i + tx < cnt, indices[T.min(q0 + i + tx, indices.shape[0] - 1)], 0)
            cols[g] = T.call_extern("int32", "__shfl_sync", full_mask, win[0], i % 32)
        if tx == 0:
            if j >= D:
                T.cuda.mbarrier_wait(sb[1] + T.Cast("uint32", (D + s) * 8), (j // D - 1) % 2)  # consumers done
            full = T.meta_var(sb[1] + T.Cast("uint32", s * 8))
            stage = T.meta_var(sb[0] + T.Cast("uint32", s * p.stage_bytes))
            expect_bytes(full, T.Cast("uint32", p.a_bytes + T.min(G, cnt - jj * G) * p.x_bytes))
            tensor_copy(stage, T.address_of(map_a), 0, (q0 + jj * G) * R, full)
            for g in T.unroll(G):
                if jj * G + g < cnt:
                    tensor_copy(stage + T.uint32(p.a_region + g * p.x_region), T.address_of(map_x), cols[g] * Cb,
                                n0, full)
        T.evaluate(T.call_extern("void", "__syncwarp", full_mask))

    @T.macro
    def consume(sb, af, bf, acc, cnt, j, jj, m0, o0, tx):
        """Wait for ring slot ``j`` (the tile's stage ``jj``), multiply its blocks into the
        accumulators, release it."""
        s = T.meta_var(j % D)
        T.cuda.mbarrier_wait(sb[1] + T.Cast("uint32", s * 8), (j // D) % 2)
        stage = T.meta_var(sb[0] + T.Cast("uint32", s * p.stage_bytes))
        for g in T.unroll(G):
            if jj * G + g < cnt:
                for kk in T.unroll(ks):
                    for mi in T.unroll(mt):  # X's rows (tokens): A fragments
                        ldm(af[mi * 4], af[mi * 4 + 1], af[mi * 4 + 2], af[mi * 4 + 3],
                            swizzled(stage + T.uint32(p.a_region + g * p.x_region),
                                     (m0 + mi * 16 + tx % 16) * (Cb * 2) + (kk * 16 + tx // 16 * 8) * 2))
                    for n2 in T.unroll(nt // 2):  # the block's rows (outputs): B fragments, two 8-row tiles
                        ldm(bf[n2 * 4], bf[n2 * 4 + 1], bf[n2 * 4 + 2], bf[n2 * 4 + 3],
                            swizzled(stage, (g * R + o0 + n2 * 16 + tx // 16 * 8 + tx % 8) * (Cb * 2)
                                     + (kk * 16 + tx // 8 % 2 * 8) * 2))
                    for mi in T.unroll(mt):
                        for ni in T.unroll(nt):
                            a = T.meta_var((mi * nt + ni) * 4)
                            mma(acc[a], acc[a + 1], acc[a + 2], acc[a + 3], af[mi * 4], af[mi * 4 + 1],
                                af[mi * 4 + 2], af[mi * 4 + 3], bf[ni * 2], bf[ni * 2 + 1],
                                acc[a], acc[a + 1], acc[a + 2], acc[a + 3])
        # the warp's ldmatrix reads (generic proxy) ordered before the copy engine's next writes
        # to the slot (async proxy): without it a refill overwrote a slot a warp was still
        # reading (H200: 1-4 of 20-40 calls wrong at 5 CTAs an SM, 0 of 80 with it;
        # benchmarks/probe_bsr_tokens.py --repeat)
        fence_async()
        T.evaluate(T.call_extern("void", "__syncwarp", full_mask))
        if tx == 0:
            arrive(sb[1] + T.Cast("uint32", (D + s) * 8))

    def finished(Bias, v, out):
        if bias:
            v = v + (Bias[out] if bias_dtype == "float32" else T.Cast("float32", Bias[out]))
        return activate(v)

    @T.macro
    def write_y(Yw, Bias, acc, words, sb, M, br, n0, m0, o0, ty, tx):
        """The warp's tile of Y (``wt`` tokens x ``wo`` outputs): finished, cast and packed in
        pairs into its own staging rows (shared addresses in registers: only the warp reads
        them, after ``__syncwarp``, which TVM's barrier planner cannot know), then out in
        16-byte stores along Y's rows."""
        base = T.meta_var(sb[2] + T.Cast("uint32", ty * (p.wt * LDY * out_bytes)))
        for mi in T.unroll(mt):
            for ni in T.unroll(nt):
                for h in T.unroll(2):
                    row = T.meta_var(mi * 16 + tx // 4 + h * 8)
                    col = T.meta_var(ni * 8 + tx % 4 * 2)
                    a = T.meta_var((mi * nt + ni) * 4 + h * 2)
                    out = T.meta_var(T.min(br * R + o0 + col, M - 2))
                    at = T.meta_var(base + T.Cast("uint32", (row * LDY + col) * out_bytes))
                    word = T.meta_var(((n0 + m0 + row) * M + br * R + o0 + col) * out_bytes // 4)
                    if out_dtype == "float32":
                        if p.direct:
                            if T.And(n0 + m0 + row < tokens, br * R + o0 + col < M):
                                Yw[word] = T.reinterpret("uint32", finished(Bias, acc[a], out))
                                Yw[word + 1] = T.reinterpret("uint32", finished(Bias, acc[a + 1], out + 1))
                        else:
                            st_pair(at, T.reinterpret("uint32", finished(Bias, acc[a], out)),
                                    T.reinterpret("uint32", finished(Bias, acc[a + 1], out + 1)))
                    else:
                        pack(words[0], finished(Bias, acc[a + 1], out + 1), finished(Bias, acc[a], out))
                        if p.direct:
                            if T.And(n0 + m0 + row < tokens, br * R + o0 + col < M):
                                Yw[word] = words[0]
                        else:
                            st_word(at, words[0])
        if not p.direct:
            T.evaluate(T.call_extern("void", "__syncwarp", full_mask))
            for it in T.unroll(y_iters):
                e = T.meta_var(it * 32 + tx)
                row = T.meta_var(e // chunks)
                col = T.meta_var(e % chunks * VO)
                if T.And(e < p.wt * chunks, T.And(n0 + m0 + row < tokens, br * R + o0 + col < M)):
                    ld_chunk(words[0], words[1], words[2], words[3],
                             base + T.Cast("uint32", (row * LDY + col) * out_bytes))
                    for v in T.vectorized(4):
                        Yw[((n0 + m0 + row) * M + br * R + o0 + col) * out_bytes // 4 + v] = words[v]
            T.evaluate(T.call_extern("void", "__syncwarp", full_mask))

    @T.macro
    def body(indptr, indices, values, X, Bias, Y, n_ptr, nnzb, n_vals, M, K):
        nbr = T.meta_var(T.max(n_ptr - 1, 0))
        # host side, every call: the tensor maps of the blocks (as rows of c) and of X
        map_a: T.let[T.TensorMap()] = T.tvm_stack_alloca("tensormap", 1)
        T.tensormap_encode_tiled(map_a, values.data, Cb, T.max(n_vals // Cb, 1), Cb * 2, Cb, G * R, 1, 1,
                                 descriptor_dtype=dtype, rank=2, interleave=0, swizzle=p.swizzle,
                                 l2_promotion=2, oob_fill=0, force_cu_dtype=-1)
        map_x: T.let[T.TensorMap()] = T.tvm_stack_alloca("tensormap", 1)
        T.tensormap_encode_tiled(map_x, X.data, T.max(K, 1), tokens, K * 2, Cb, TN, 1, 1,
                                 descriptor_dtype=dtype, rank=2, interleave=0, swizzle=p.swizzle,
                                 l2_promotion=2, oob_fill=0, force_cu_dtype=-1)
        bx = T.env_thread("blockIdx.x")
        ty = T.env_thread("threadIdx.y")
        tx = T.env_thread("threadIdx.x")
        T.launch_thread(bx, T.max(nbr, 1) * groups)
        T.launch_thread(ty, W + 1)
        T.launch_thread(tx, 32)
        ring = T.alloc_buffer((p.smem,), "uint8", scope="shared.dyn", align=128)
        Yw = T.decl_buffer((tokens * M * out_bytes // 4,), "uint32", data=Y.data)  # Y as 4-byte words
        sb = T.alloc_buffer((3,), "uint32", scope="local")  # shared addresses: the ring, the barriers, Y's staging
        words = T.alloc_buffer((4,), "uint32", scope="local")
        acc = T.alloc_buffer((mt * nt * 4,), "float32", scope="local")
        af = T.alloc_buffer((mt * 4,), "uint32", scope="local")
        bf = T.alloc_buffer((nt * 2,), "uint32", scope="local")
        # the row's first stored block, its count, its stages a tile, the CTA's tiles
        rng = T.alloc_buffer((4,), "int32", scope="local")
        win = T.alloc_buffer((1,), "int32", scope="local")  # lane l: the column of the window's l-th block
        cols = T.alloc_buffer((G,), "int32", scope="local")  # the block columns of the stage being copied
        br = T.meta_var(bx % T.max(nbr, 1))
        t0 = T.meta_var(bx // T.max(nbr, 1) * TT)  # the CTA's first tile
        live = T.meta_var(br < nbr)
        tid = T.meta_var(ty * 32 + tx)
        sb[0] = T.call_extern("uint32", "__cvta_generic_to_shared", ring.access_ptr("w"))
        sb[1] = sb[0] + T.uint32(p.ring_bytes + 1024)
        sb[2] = sb[1] + T.uint32(p.bar_bytes)
        sb[0] = (sb[0] + T.uint32(1023)) & T.uint32(0xFFFFFC00)  # the swizzle follows address bits
        rng[0] = T.if_then_else(live, indptr[T.min(br, n_ptr - 1)], 0)
        rng[1] = T.if_then_else(live, indptr[T.min(br + 1, n_ptr - 1)], 0) - rng[0]
        rng[2] = (rng[1] + G - 1) // G
        rng[3] = T.if_then_else(live, T.min(TT, n_tiles - t0), 0)
        if tid == 0:
            for s in T.unroll(D):
                T.ptx.mbarrier.init.shared__cta.b64(sb[1] + T.uint32(s * 8), 1)  # the producer's lane 0
                T.ptx.mbarrier.init.shared__cta.b64(sb[1] + T.uint32((D + s) * 8), W)  # a lane of each consumer
            fence_init()  # the initialised barriers visible to the copy engine
            fence_async()
        T.tvm_storage_sync("shared")
        m0 = T.meta_var(ty // p.WN * p.wt)
        o0 = T.meta_var(ty % p.WN * p.wo)
        if ty == W:
            for j in range(rng[2] * rng[3]):
                produce(sb, win, cols, indices, rng[0], rng[1], (t0 + j // rng[2]) * TN, j, j % rng[2], tx,
                        map_a, map_x)
        else:
            for t in range(rng[3]):
                for i in T.unroll(mt * nt * 4):
                    acc[i] = T.float32(0)
                for jj in range(rng[2]):
                    consume(sb, af, bf, acc, rng[1], t * rng[2] + jj, jj, m0, o0, tx)
                write_y(Yw, Bias, acc, words, sb, M, br, (t0 + t) * TN, m0, o0, ty, tx)

    # TVMScript takes a signature as written: the kernel with a bias and without, one body
    if bias:
        @T.prim_func(s_tir=True)
        def bsr_tokens(i_h: T.handle, j_h: T.handle, v_h: T.handle, x_h: T.handle, b_h: T.handle, y_h: T.handle):
            T.func_attr({"global_symbol": name, "tirx.noalias": True})
            n_ptr = T.int32()
            nnzb = T.int32()
            n_vals = T.int32()
            M = T.int32()
            K = T.int32()
            indptr = T.match_buffer(i_h, (n_ptr,), "int32")
            indices = T.match_buffer(j_h, (nnzb,), "int32")
            values = T.match_buffer(v_h, (n_vals,), dtype)
            X = T.match_buffer(x_h, (tokens, K), dtype)
            Bias = T.match_buffer(b_h, (M,), bias_dtype)
            Y = T.match_buffer(y_h, (tokens, M), out_dtype)
            body(indptr, indices, values, X, Bias, Y, n_ptr, nnzb, n_vals, M, K)
    else:
        @T.prim_func(s_tir=True)
        def bsr_tokens(i_h: T.handle, j_h: T.handle, v_h: T.handle, x_h: T.handle, y_h: T.handle):
            T.func_attr({"global_symbol": name, "tirx.noalias": True})
            n_ptr = T.int32()
            nnzb = T.int32()
            n_vals = T.int32()
            M = T.int32()
            K = T.int32()
            indptr = T.match_buffer(i_h, (n_ptr,), "int32")
            indices = T.match_buffer(j_h, (nnzb,), "int32")
            values = T.match_buffer(v_h, (n_vals,), dtype)
            X = T.match_buffer(x_h, (tokens, K), dtype)
            Y = T.match_buffer(y_h, (tokens, M), out_dtype)
            body(indptr, indices, values, X, None, Y, n_ptr, nnzb, n_vals, M, K)
    return bsr_tokens


def build(block=(32, 32), tokens: int = 128, arch: str = "sm_90a", **kw):
    """The compiled module (TVM executable) of :func:`spmm` for ``arch``."""
    return compile_for(spmm(block, tokens, **kw), arch)
