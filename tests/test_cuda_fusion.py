"""hyb SpMM on CUDA: parts fused into one launch, split rows accumulated in registers and
added atomically once per output element (schedules/fusion.py, schedules/atomics.py).
CUDA source only (no GPU in CI); the GPU results are in benchmarks/results/spmm_check_*.json."""
import re

import numpy as np
import pytest
import scipy.sparse as sp

import sparsec
from sparsec.formats import convert
from sparsec.lower import lower_program
from sparsec.schedules.fusion import fusable_groups


def skewed(n=400, seed=0):
    """Rows of 0..3 entries plus two rows longer than the widest bucket (split, atomic)."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(0, 4, n)
    lens[[7, 300]] = [150, 97]
    rows = np.repeat(np.arange(n), lens)
    cols = np.concatenate([rng.choice(n, k, replace=False) for k in lens])
    return sp.csr_matrix((rng.standard_normal(rows.size).astype(np.float32), (rows, cols)), shape=(n, n))


def definitions(src):
    """Kernel bodies (definitions, not forward declarations)."""
    parts = re.split(r'extern "C" __global__ ', src)
    return [p for p in parts[1:] if p.split("\n", 1)[0].rstrip().endswith("{")]


def test_hyb_parts_share_one_launch_after_the_fill():
    A = convert(skewed(), "hyb:1:1/2/4/8/16/32")
    k = sparsec.compile("spmm", A, target="cuda", feat=64)
    bodies = definitions(k.source())
    assert len(bodies) == 2, "a fill kernel, then every part in one kernel"
    fused = bodies[1]
    for p in range(len(A.format.parts)):
        assert f"p{p}_row_ids" in fused


def test_split_rows_add_once_per_feature():
    A = convert(skewed(), "hyb:1:1/2/4/8/16/32")
    src = definitions(sparsec.compile("spmm", A, target="cuda", feat=64).source())[1]
    assert src.count("atomicAdd") == 1
    # the atomic is the write-back of a register accumulator, outside the loop over entries
    tail = src[src.index("atomicAdd") - 400:src.index("atomicAdd")]
    assert "_local" in src[src.index("atomicAdd"):src.index("atomicAdd") + 300]
    assert "condval" not in src[src.index("atomicAdd"):src.index("atomicAdd") + 300], tail


def test_parts_that_add_without_atomics_stay_separate_launches():
    """Several column ranges add into the same rows without atomics: their order matters."""
    A = convert(skewed(), "hyb:2:1/2/4")
    func, program = lower_program(sparsec.ops.get("spmm"), A.format, {"feat": 32}, "float32", atomics=True)
    unsafe = [i for i, n in enumerate(program.nests) if n.part is not None and not (n.init or n.atomic)]
    assert unsafe
    assert not any(i in g for g in fusable_groups(program) for i in unsafe)


def test_fixed_width_parts_unroll_their_entries_and_load_vectors():
    """The template's rule (knobs="default": the learned default may pick narrower loads for
    this matrix) unrolls each fixed-width part's entries and loads B four floats at a time."""
    A = convert(skewed(), "hyb:1:1/2/4/8/16/32")
    src = definitions(sparsec.compile("spmm", A, target="cuda", feat=64, knobs="default").source())[1]
    assert "*(float4*)(B_ptr" in src


@pytest.mark.parametrize("fmt", ["csr", "hyb:1:1/2/4/8/16/32"])
def test_spmm_cpu_results_unchanged(fmt):
    m = skewed()
    A = convert(m, fmt)
    B = np.random.default_rng(1).standard_normal((m.shape[1], 16)).astype(np.float32)
    out = sparsec.compile("spmm", A, feat=16)(A, B)
    np.testing.assert_allclose(out, m.astype(np.float64) @ B, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spec", ["csr", "hyb:1:1/2/4/8/16/32"])
def test_feature_tiles_run_on_blockIdx_y_in_every_kernel(spec):
    """feat_tiles=4 at F=256: every kernel (fill, fused parts) indexes its 64-feature slice
    with blockIdx.y, and the source compiles for sm_90a."""
    from nvcc_tools import nvcc_sources

    A = convert(skewed(), spec)
    k = sparsec.compile("spmm", A, target="cuda:sm_90a", feat=256, knobs={"feat_tiles": 4})
    assert k.knobs["feat_tiles"] == 4
    bodies = definitions(k.source())
    assert bodies and all("blockIdx.y) * 64)" in b for b in bodies), "each slice is 64 features wide"
    (ok, log), = nvcc_sources({("tiles", "sm_90a"): k.source()}).values()
    assert ok, log[-2000:]
