"""int8 SR-BCRS SpMM on Tensor Cores (schedules.srbcrs_tensorcore): the lanes' registers,
replayed through mma.m16n8k32's fragment layout on the CPU, give the exact integer
product on converted matrices (empty rows, a dense row, sizes off every tile, V = 2/4/8);
the kernel compiles for sm_80 and sm_90a with each epilogue, and nvcc's PTX holds the
integer mma."""
import numpy as np
import pytest
import scipy.sparse as sp

from nvcc_tools import nvcc_ptx, nvcc_sources
from schedules import srbcrs_tensorcore as stc
from schedules.warp_mma import cuda_source
from sparsec.formats import convert

INSTR = "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32"


def _int8_matrix(rows, cols, density, seed):
    rng = np.random.default_rng(seed)
    a = sp.random(rows, cols, density, format="lil", random_state=rng,
                  data_rvs=lambda n: rng.integers(-128, 128, n).astype(np.float64))
    a.rows[0], a.data[0] = [], []
    if rows > 2:
        a[rows // 2, :] = rng.integers(-128, 128, cols)  # one dense row: many chunks in its vector row
    return a.tocsr()


@pytest.mark.parametrize("vec", [2, 4, 8])
@pytest.mark.parametrize("shape", [(37, 70, 13), (64, 128, 40), (8, 16, 16), (1, 1, 1), (100, 300, 33)])
def test_replayed_lanes_give_the_exact_integer_product(vec, shape):
    M, K, N = shape
    a = _int8_matrix(M, K, 0.15, seed=M + K + vec)
    inst = convert(a, f"srbcrs:v{vec},int8")
    b = np.random.default_rng(N).integers(-128, 128, (K, N)).astype(np.int8)
    got = stc.emulate(inst.arrays["indptr"], inst.arrays["indices"], inst.data, b, M, vec)
    assert np.array_equal(got, a.toarray().astype(np.int64) @ b.astype(np.int64))


def test_operands_are_one_aligned_word_of_a_chunk_row():
    """b0 of lane (g, t) is slots 4t..4t+3 of row g of the first chunk: 4 consecutive bytes
    at chunk * 16V + 16g + 4t (Magicube's row-major V x 16 chunks)."""
    a = _int8_matrix(8, 64, 0.5, seed=1)
    inst = convert(a, "srbcrs:v8,int8")
    b = np.zeros((64, 16), np.int8)
    _, regs = stc.operands(inst.arrays["indptr"], inst.arrays["indices"], inst.data, b, 0, 0, 0, lane=13, V=8)
    assert np.array_equal(regs[:4], inst.data[3 * 16 + 4: 3 * 16 + 8])  # g = 3, t = 1
    assert np.array_equal(regs[4:], inst.data[8 * 16 + 3 * 16 + 4: 8 * 16 + 3 * 16 + 8])  # second chunk


@pytest.mark.parametrize("out_dtype", ["int32", "float32", "float16"])
def test_kernel_emits_integer_mma_for_hopper_and_ampere(out_dtype):
    src = cuda_source(stc.build(37, 70, 13, 4, out_dtype=out_dtype, arch="sm_90a"))
    assert INSTR in src
    assert nvcc_ptx(src, "sm_90a").count(INSTR) == 2  # warp_n_tiles = 2
    sm80 = stc.build(100, 300, 33, 8, out_dtype=out_dtype, arch="sm_80", warp_n_tiles=4, warps=2)
    results = nvcc_sources({("hopper", "sm_90a"): src,
                            ("ampere", "sm_80"): cuda_source(sm80)})
    assert all(ok for ok, _ in results.values()), results


@pytest.mark.parametrize("kwargs, match", [
    ({"vec": 3}, r"vec \(V\) should be one of \[2, 4, 8\], got 3"),
    ({"out_dtype": "bfloat16"}, "out_dtype should be one of"),
    ({"warp_n_tiles": 8}, "warp_n_tiles should be one of"),
    ({"K": -1}, "K should be a positive int"),
])
def test_bad_kernel_arguments_name_the_problem(kwargs, match):
    args = {"M": 32, "K": 64, "N": 16, "vec": 8, **kwargs}
    with pytest.raises(ValueError, match=match):
        stc.spmm_srbcrs_int8(args.pop("M"), args.pop("K"), args.pop("N"), args.pop("vec"), **args)
