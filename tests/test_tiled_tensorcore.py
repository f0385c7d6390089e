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


@pytest.mark.parametrize("kw, match", [
    ({"tile": (24, 64)}, "tile rows should be a multiple of 16"),
    ({"tile": (64, 8)}, "tile columns should be a multiple of 16"),
    ({"nb": 24}, "nb should be 16, 32, 48 or 64"),
    ({"splits": 0}, "splits should be a positive int"),
])
def test_refuses_shapes_it_cannot_take(kw, match):
    with pytest.raises(ValueError, match=match):
        tt.spmm(**kw)
