"""The tiled format's Tensor Core SpMM (schedules/tiled_tensorcore.py), CPU side: it builds
for sm_90a and nvcc turns it into ldmatrix + mma with popcount expansion; bad arguments are
refused by name. Its results are checked on the GPU host (benchmarks/check_tiled_tc.py)."""
import pytest

from sparsec.schedules import tiled_tensorcore as tt
from sparsec.schedules.warp_mma import cuda_source


@pytest.mark.parametrize("tile, nb, splits", [((64, 64), 32, 1), ((32, 128), 16, 4)])
def test_builds_to_mma_on_expanded_tiles(tile, nb, splits):
    from nvcc_tools import nvcc_ptx

    src = cuda_source(tt.build(tile, nb, splits, arch="sm_90a"))
    assert "__popcll" in src and ("atomicAdd" in src) == (splits > 1)
    ptx = nvcc_ptx(src, "sm_90a")
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx and "popc.b64" in ptx


def test_batched_loads_go_out_before_their_stores():
    """loads=16: a thread issues 16 loads of the tile's values (and 8 of B's slice at nb=16)
    before it stores any of them to shared memory, where loads=1 stores each value as it
    arrives; loads=1 is the kernel measured on the H200, unchanged."""
    import re

    from nvcc_tools import nvcc_ptx

    def runs(loads):
        ptx = nvcc_ptx(cuda_source(tt.build((64, 64), 16, 64, loads=loads)), "sm_90a")
        body = ptx[ptx.index("tiled_spmm_kernel_1("):]
        ops = re.findall(r"(ld\.global\.nc\.u16|st\.shared\.u16)", body)
        out, last, n = [], None, 0
        for op in ops:
            if op == last:
                n += 1
            else:
                if last is not None:
                    out.append((last, n))
                last, n = op, 1
        return out + [(last, n)]

    assert max(n for op, n in runs(16) if op.startswith("ld")) == 16
    assert max(n for op, n in runs(1) if op.startswith("ld")) == 1


@pytest.mark.parametrize("tile, nb, splits, pipeline", [((64, 64), 16, 64, 2), ((48, 48), 32, 4, 1),
                                                      ((32, 128), 16, 1, 2)])
def test_staged_kernel_moves_a_tiles_bytes_in_one_batch_and_expands_from_shared(tile, nb, splits, pipeline):
    """pipeline 1 / 2 (schedules/tiled_tensorcore_staged.py): a thread's loads of the tile's
    value range (TR * TC / threads of them, predicated) go out back to back, and the
    expansion reads the values from shared memory; the compiled kernel is the one
    sparsec.compile builds for knobs={"pipeline": ...}."""
    import re

    import numpy as np

    import sparsec
    from nvcc_tools import nvcc_ptx
    from sparsec.formats import tiled
    from sparsec.schedules import tiled_tensorcore_staged as ts

    src = cuda_source(ts.build(tile, nb, splits, pipeline))
    assert ("atomicAdd" in src) == (splits > 1) and src.count("__global__") // 2 == (2 if splits > 1 else 1)
    ptx = nvcc_ptx(src, "sm_90a")
    body = ptx[ptx.index("tiled_spmm_kernel_1(" if splits > 1 else "tiled_spmm_kernel("):]
    ops = re.findall(r"ld\.global\.nc\.u16|st\.shared\.u16|bar\.sync|ld\.shared\.u16", body)
    runs, run = [], 0  # back-to-back global loads, cut by any shared access or barrier
    for op in ops:
        run = run + 1 if op.startswith("ld.global") else 0
        runs.append(run)
    assert max(runs) >= tile[0] * tile[1] // (tile[0] // 16 * 32)  # the value range: TR * TC / threads
    assert "ld.shared.u16" in ops and "mma.sync.aligned.m16n8k16" in ptx
    inst, _ = tiled.prune(np.random.default_rng(2).standard_normal((90, 100)), sparsity=0.8, tile=tile,
                          dtype=np.float16)
    k = sparsec.compile("spmm", inst, target="cuda", feat=nb, knobs={"pipeline": pipeline, "splits": splits})
    assert k.knobs["pipeline"] == pipeline and "Vs" in k.source()


@pytest.mark.parametrize("kw, match", [
    ({"loads": 4}, "loads should be one of"),
    ({"tile": (24, 64)}, "tile rows should be a multiple of 16"),
    ({"tile": (64, 8)}, "tile columns should be a multiple of 16"),
    ({"nb": 24}, "nb should be 16, 32, 48 or 64"),
    ({"splits": 0}, "splits should be a positive int"),
])
def test_refuses_shapes_it_cannot_take(kw, match):
    with pytest.raises(ValueError, match=match):
        tt.spmm(**kw)


# ---------------------------------------------------------------- reached from sparsec.compile


def _uses(op, spec, dtype, kind="cuda", feat=16):
    from sparsec.formats.registry import make_format
    from sparsec.lower import lower_program
    from sparsec.schedules import templates

    _, program = lower_program(op, make_format(spec), {"feat": feat}, dtype, atomics=kind == "cuda")
    return [u.transformation.name for u in templates(program, kind)]


def test_float16_spmm_on_tiled_runs_the_kernel_by_capability():
    """Any SpMM nest over a tiled float16 matrix on CUDA -- the library's and a user's own
    DSL operator alike -- gets the kernel; float32 values, an epilogue it does not carry,
    tiles its warps cannot cover and the CPU keep the generic lowering."""
    from dense_ops import _spmm, spmm_row_bias_relu
    from sparsec import ops

    mine, *_ = _spmm("my_product", "C = A @ B, written by a user")
    tiled = {"tiled_tc_spmm", "tiled_stream_spmm"}
    assert _uses(ops.get("spmm"), "tiled", "float16") == ["tiled_stream_spmm"]  # 16 columns of B
    assert _uses(mine, "tiled:32x128", "float16") == ["tiled_stream_spmm"]
    assert _uses(mine, "tiled:32x128", "float16", feat=128) == ["tiled_tc_spmm"]  # wide B: the expanding kernel
    assert _uses(mine, "tiled:128x64", "float16") == ["tiled_tc_spmm"]  # tile rows past the streaming warps
    assert not tiled & set(_uses(ops.get("spmm"), "tiled", "float32"))
    assert not tiled & set(_uses(spmm_row_bias_relu(), "tiled", "float16"))
    assert not tiled & set(_uses(ops.get("spmm"), "tiled:24x64", "float16"))
    assert not tiled & set(_uses(ops.get("spmm"), "tiled", "float16", "llvm"))


@pytest.mark.parametrize("feat, knobs, launches, popcount", [(16, None, 1, "__popc("), (16, {"splits": 4}, 2, "__popcll"),
                                                             (40, {"splits": 1, "nb": 48}, 1, "__popcll"),
                                                             (128, None, 2, "__popcll")])
def test_compiled_kernel_reads_the_instance_arrays_and_zeroes_c_where_splits_add(feat, knobs, launches, popcount):
    """The compiled kernel takes the instance's bitmap, tile offsets and float16 values as
    they are, then B and C. The streaming kernel (the default up to 64 columns) writes C
    whole in one launch; the expanding kernel (wider B, or its knobs given) zeroes C in a
    first launch where split K adds, so a NaN-poisoned or reused output comes back right."""
    import numpy as np

    import sparsec
    from sparsec.formats import tiled

    w = np.random.default_rng(0).standard_normal((200, 333)).astype(np.float16)
    inst, _ = tiled.prune(w, sparsity=0.9)
    k = sparsec.compile("spmm", inst, target="cuda", feat=feat, knobs=knobs)
    assert [(p.name, p.dtype) for p in k.params] == [
        ("bitmap", "uint64"), ("tile_offsets", "int32"), ("A", "float16"), ("B", "float16"), ("C", "float32")]
    src = k.source()
    assert src.count("__global__") // 2 == launches and popcount in src and "mma.sync" in src


def test_knobs_are_declared_once_and_refused_by_name():
    import numpy as np

    import sparsec
    from sparsec.formats import tiled
    from sparsec.schedules.tensorcore_packed import tiled_tc_spmm

    assert set(tiled_tc_spmm.knobs) == set(tt.KNOBS)
    assert tt.default_knobs(1) == {"nb": 16, "splits": 64, "loads": 1, "pipeline": 0}
    assert tt.default_knobs(1024) == {"nb": 64, "splits": 8, "loads": 1, "pipeline": 0}
    inst, _ = tiled.prune(np.ones((64, 64), np.float16), sparsity=0.5)
    with pytest.raises(ValueError, match="splits"):
        sparsec.compile("spmm", inst, target="cuda", feat=16, knobs={"splits": 3})
    with pytest.raises(ValueError, match="vec"):
        sparsec.compile("spmm", inst, target="cuda", feat=16, knobs={"vec": 4})
    with pytest.raises(ValueError, match="loads=16 applies to pipeline 0 only"):
        sparsec.compile("spmm", inst, target="cuda", feat=16, knobs={"pipeline": 2, "loads": 16})


def test_every_array_the_kernel_reads_comes_from_the_instance():
    """The kernel's index parameters are the instance's own bitmap and tile offsets (which
    the generic lowering does not read, so ``index_arrays`` leaves them out): the call
    resolves them through ``tc_operands`` as they are, no copy, no packing."""
    import numpy as np

    import sparsec
    from sparsec.formats import tiled
    from sparsec.kernel import index_arrays
    from sparsec.tc_operands import packed_operands

    inst, _ = tiled.prune(np.random.default_rng(1).standard_normal((70, 130)), sparsity=0.7, dtype=np.float16)
    k = sparsec.compile("spmm", inst, target="cuda", feat=8)
    wanted = [p.name for p in k.params if p.role == "index" and p.name not in index_arrays(inst)]
    assert wanted == ["bitmap", "tile_offsets"]
    got = packed_operands(inst, wanted)
    assert all(got[n] is inst.arrays[n] for n in wanted)
    with pytest.raises(ValueError, match="does not carry"):
        packed_operands(inst, ["sparsec_nothing"])


def test_staged_decode_rebuilds_every_tile_from_its_staged_bytes():
    """The staged kernel's decode, step for step in numpy (tiled_tensorcore_staged: a tile's
    value range values[offsets[t]:offsets[t + 1]] staged as it is, subtile starts relative
    to the tile by a scan of popcounts, then two adjacent bits per step, the second value at
    the first's index plus the first bit) rebuilds every tile of formats.tiled's layout:
    odd sizes, empty tiles, explicit zeros, tile shapes the kernel takes."""
    import numpy as np
    import scipy.sparse as sp

    from sparsec.formats import convert

    rng = np.random.default_rng(5)
    for tile in ((64, 64), (32, 128), (48, 48)):
        TR, TC = tile
        m = sp.random(150, 170, density=0.3, random_state=5, format="csr", dtype=np.float32)
        m.data[::7] = 0  # explicit zeros stay entries
        m = m.tolil()
        m[:, 60:100] = 0  # whole tiles empty
        m = sp.csr_matrix(m)
        m.data = rng.standard_normal(m.nnz).astype(np.float16).astype(np.float32)
        inst = convert(m, f"tiled:{TR}x{TC}", dtype=np.float16)
        words, offsets, values = inst.arrays["bitmap"], inst.arrays["tile_offsets"], inst.data
        subs, ngc = TR * TC // 64, -(-m.shape[1] // TC)
        dense = np.zeros((-(-m.shape[0] // TR) * TR, ngc * TC), np.float32)
        dense[:m.shape[0], :m.shape[1]] = m.toarray()
        for t in range(offsets.shape[0] - 1):
            Vs = values[offsets[t]:offsets[t + 1]].astype(np.float32)  # staged as it is
            Ws = words[t * subs:(t + 1) * subs]
            counts = np.array([bin(int(w)).count("1") for w in Ws])
            So = np.concatenate([[0], np.cumsum(counts)[:-1]])  # the warp scan, relative
            As = np.full((TR, TC), np.nan, np.float32)
            for e in range(TR * TC // 2):  # every pair, as (i, tid) enumerate them
                sub, b0 = e // 32, e % 32 * 2
                word = int(Ws[sub])
                at = int(So[sub]) + bin(word & ((1 << b0) - 1)).count("1")
                bit0, bit1 = (word >> b0) & 1, (word >> (b0 + 1)) & 1
                row = sub // (TC // 8) * 8 + b0 // 8
                col = sub % (TC // 8) * 8 + b0 % 8
                As[row, col] = Vs[min(at, TR * TC - 1)] if bit0 else 0
                As[row, col + 1] = Vs[min(at + bit0, TR * TC - 1)] if bit1 else 0
            go, gc = divmod(t, ngc)
            np.testing.assert_array_equal(As, dense[go * TR:(go + 1) * TR, gc * TC:(gc + 1) * TC])
