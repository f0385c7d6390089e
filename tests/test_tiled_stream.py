"""The streaming Tensor Core SpMM for tiled weights (schedules/tiled_stream.py), on the CPU:
what nvcc makes of it for sm_90a, its decode step for step in numpy, its refusals and its
defaults. benchmarks/check_tiled_stream.py checks it against float64 on the GPU host."""
import numpy as np
import pytest
import scipy.sparse as sp

from nvcc_tools import nvcc_ptx
from sparsec.schedules import tiled_stream as ts
from sparsec.schedules.warp_mma import cuda_source


@pytest.mark.parametrize("tile, feat, knobs", [((16, 64), 16, {}), ((16, 64), 1, {"cluster": 1}),
                                               ((32, 64), 17, {"warps": 4, "cap": 4})])
def test_builds_to_copies_mma_and_a_cluster_reduction(tile, feat, knobs):
    """16-byte cp.async with a source size (the slots and B), ldmatrix and mma.m16n8k16 in
    float32; split K reduced through the cluster's shared memory (mapa between two cluster
    barriers) or, with one CTA a tile row, stored directly; and no CTA barrier in a warp's
    walk over its tiles: two a phase of B's rows, one before the reduction."""
    kn = {**ts.default_knobs(feat, 300, 333, tile), **knobs}
    src = cuda_source(ts.build(tile, feat, **kn))
    ptx = nvcc_ptx(src, "sm_90a")
    assert "cp.async.cg.shared.global" in ptx and "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in ptx and "popc.b32" in ptx
    clustered = kn["cluster"] > 1
    assert ("mapa" in ptx) == clustered and ("barrier.cluster.arrive" in ptx) == clustered
    loop = src[src.index("for (int j = 0"):]
    loop = loop[:loop.index("tvm_builtin_ptx_cp_async_wait_group_async_wait_group_0")]
    assert "__syncthreads" not in loop and "__syncwarp" in loop
    assert src.count("__global__") // 2 == 1  # one launch: nothing zeroes C first


def _decode(words, offsets, values, tile, t):
    """Tile ``t`` rebuilt as the kernel's warp does: lane l takes half-words l*P ... l*P + P - 1
    of the tile, a prefix sum of popcounts over the lanes gives where its values start in the
    slot (which holds the tile's values from the 16-byte chunk below offsets[t]), and each set
    bit b of half-word h puts the next value at row (h // 2) // (TC / 8) * 8 + h % 2 * 4 + b // 8,
    column (h // 2) % (TC / 8) * 8 + b % 8."""
    TR, TC = tile
    subs = TR * TC // 64
    halves = words[t * subs:(t + 1) * subs].view(np.uint32)  # little-endian: low half first
    lo, hi = int(offsets[t]), int(offsets[t + 1])
    slot = values[lo - lo % 8:hi]  # what the copies put in the slot
    P = -(-len(halves) // 32)
    counts = [sum(bin(int(halves[h])).count("1") for h in range(lane * P, min(lane * P + P, len(halves))))
              for lane in range(32)]
    start = np.concatenate([[0], np.cumsum(counts)[:-1]]) + lo % 8
    dense = np.zeros((TR, TC), values.dtype)
    for lane in range(32):
        pos = int(start[lane])
        for h in range(lane * P, min(lane * P + P, len(halves))):
            bits = int(halves[h])
            while bits:
                b = (bits & -bits).bit_length() - 1
                sub = h // 2
                dense[sub // (TC // 8) * 8 + h % 2 * 4 + b // 8, sub % (TC // 8) * 8 + b % 8] = slot[pos]
                pos += 1
                bits &= bits - 1
    return dense


@pytest.mark.parametrize("tile", [(16, 64), (16, 128), (32, 64), (48, 32), (16, 16)])
def test_decode_rebuilds_every_tile(tile):
    """The kernel's decode, in numpy, rebuilds every tile of formats.tiled's layout from the
    bytes its copies stage: odd sizes, empty tiles, explicit zeros, values not 16-byte
    aligned at a tile's start."""
    from sparsec.formats import convert

    rng = np.random.default_rng(3)
    m = sp.random(70, 150, density=0.4, random_state=3, format="csr", dtype=np.float32).tolil()
    m[:, 20:70] = 0  # whole tiles empty
    m = sp.csr_matrix(m)
    m.data = rng.standard_normal(m.nnz).astype(np.float16).astype(np.float32)
    m.data[::5] = 0  # explicit zeros stay entries
    inst = convert(m, f"tiled:{tile[0]}x{tile[1]}", dtype=np.float16)
    words, offsets, values = inst.arrays["bitmap"], inst.arrays["tile_offsets"], inst.data
    TR, TC = tile
    ngo, ngc = -(-70 // TR), -(-150 // TC)
    full = np.zeros((ngo * TR, ngc * TC), np.float16)
    for t in range(ngo * ngc):
        full[t // ngc * TR:(t // ngc + 1) * TR, t % ngc * TC:(t % ngc + 1) * TC] = _decode(words, offsets, values, tile, t)
    np.testing.assert_array_equal(full[:70, :150], m.toarray().astype(np.float16))
    assert any(o % 8 for o in offsets)  # tiles whose values start inside a 16-byte chunk


@pytest.mark.parametrize("kw, match", [
    ({"tile": (80, 64)}, "tile rows should be 16, 32, 48 or 64"),
    ({"tile": (16, 8)}, "tile columns should be a multiple of 16"),
    ({"nb": 24}, r"nb should be one of \[8, 16, 32, 64\]"),
    ({"warps": 3}, "warps should be one of"),
    ({"cluster": 16}, "cluster should be one of"),
    ({"cap": 3}, "cap should be one of"),
    ({"feat": 0}, "feat should be a positive int"),
    ({"tile": (64, 256), "warps": 8, "nb": 64}, "static shared memory"),
    ({"tile": (32, 256), "warps": 2, "stages": 8, "nb": 16, "bk": 4}, "bytes of shared memory a CTA"),
])
def test_refuses_what_it_cannot_take_by_name(kw, match):
    args = {"tile": (16, 64), "feat": 16, "nb": 16, "warps": 8, "stages": 4, "cluster": 8, **kw}
    with pytest.raises(ValueError, match=match):
        ts.plan(args.pop("tile"), args.pop("feat"), **args)


def test_defaults_fit_and_follow_the_matrix():
    """Every default plan fits; B's columns round up to the MMA's; slots shrink with the
    density; the cluster keeps a 4096 x 4096 weight's CTAs in one wave at 132 SMs."""
    for feat in (1, 5, 8, 9, 16, 17, 32, 40, 64):
        for tile in ((16, 64), (16, 128), (32, 64), (64, 64)):
            for density in (0.05, 0.3, 1.0):
                k = ts.default_knobs(feat, 4096, 11008, tile, density)
                p = ts.plan(tile, feat, **k)
                assert k["nb"] >= min(feat, 64) and p.smem <= ts.SMEM_LIMIT
    assert [ts.default_knobs(16, 4096, 4096, density=d)["cap"] for d in (0.1, 0.3, 0.5)] == [4, 2, 1]
    k = ts.default_knobs(16, 4096, 4096, density=0.1)
    p = ts.plan((16, 64), 16, **k)
    ctas = 4096 // 16 // k["warps"] * k["cluster"]
    assert k["cluster"] == 8 and ctas <= 0.9 * ts.SMS * p.ctas_per_sm


def test_compile_reaches_it_by_capability_and_knobs_pick_the_kernel():
    """sparsec.compile builds the streaming kernel for float16 SpMM on tiled weights up to
    64 columns of B, with slots sized by the matrix's density; the expanding kernel's knobs
    (or a wider B) pick that one; a knob neither takes is refused by name."""
    import sparsec
    from sparsec.formats import tiled
    from sparsec.schedules.tensorcore_packed import tiled_stream_spmm

    assert set(tiled_stream_spmm.knobs) == set(ts.KNOBS)
    w = np.random.default_rng(0).standard_normal((200, 333)).astype(np.float16)
    inst, _ = tiled.prune(w, sparsity=0.9, tile=(16, 64))
    k = sparsec.compile("spmm", inst, target="cuda", feat=16)
    assert set(k.knobs) == set(ts.KNOBS) and k.knobs["cap"] == 4
    assert [(p.name, p.dtype) for p in k.params] == [
        ("bitmap", "uint64"), ("tile_offsets", "int32"), ("A", "float16"), ("B", "float16"), ("C", "float32")]
    assert "splits" in sparsec.compile("spmm", inst, target="cuda", feat=16, knobs={"splits": 4}).knobs
    assert "splits" in sparsec.compile("spmm", inst, target="cuda", feat=128).knobs
    with pytest.raises(ValueError, match="warps should be one of"):
        sparsec.compile("spmm", inst, target="cuda", feat=16, knobs={"warps": 3})
