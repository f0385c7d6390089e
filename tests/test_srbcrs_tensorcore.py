"""int8 SR-BCRS SpMM on Tensor Cores (schedules.srbcrs_tensorcore): the lanes' registers
(word loads of B's rows, prmt byte transposes, permuted columns), replayed through
mma.m16n8k32's fragment layout on the CPU, give the exact integer product on converted
matrices (empty rows, a dense row, sizes off every tile, V = 2/4/8, every lane width);
the kernel compiles for sm_80 and sm_90a with each epilogue, and nvcc's PTX holds the
integer mma, the byte permutes and the vector loads."""
import numpy as np
import pytest
import scipy.sparse as sp

from nvcc_tools import nvcc_ptx, nvcc_sources
from sparsec.schedules import srbcrs_tensorcore as stc
from sparsec.schedules.warp_mma import cuda_source
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
@pytest.mark.parametrize("shape, n_bytes", [((37, 70, 13), 16), ((64, 128, 40), 4), ((8, 16, 16), 8), ((1, 1, 1), 16),
                                            ((100, 300, 160), 8)])
def test_replayed_lanes_give_the_exact_integer_product(vec, shape, n_bytes):
    M, K, N = shape
    a = _int8_matrix(M, K, 0.15, seed=M + K + vec)
    inst = convert(a, f"srbcrs:v{vec},int8")
    b = np.random.default_rng(N).integers(-128, 128, (K, N)).astype(np.int8)
    got = stc.emulate(inst.arrays["indptr"], inst.arrays["indices"], inst.data, b, M, vec, n_bytes)
    assert np.array_equal(got, a.toarray().astype(np.int64) @ b.astype(np.int64))


def test_operands_are_one_aligned_word_of_a_chunk_row():
    """b0 of lane (g, t) is slots 4t..4t+3 of row g of the first chunk: 4 consecutive bytes
    at chunk * 16V + 16g + 4t (Magicube's row-major V x 16 chunks)."""
    a = _int8_matrix(8, 64, 0.5, seed=1)
    inst = convert(a, "srbcrs:v8,int8")
    b = np.zeros((64, 16), np.int8)
    _, regs = stc.operands(inst.arrays["indptr"], inst.arrays["indices"], inst.data, b, 0, 0, 0, lane=13, V=8)
    words = inst.data.view("<u4")
    assert regs[0] == words[(3 * 16 + 4) // 4]  # g = 3, t = 1
    assert regs[1] == words[(8 * 16 + 3 * 16 + 4) // 4]  # second chunk


def test_byte_transpose_puts_four_slots_of_one_column_in_a_register():
    """Lane (g, t) loads columns g*w .. g*w + w - 1 of its slot rows; register (tile c // 2,
    half c % 2) holds column c of slots 4t .. 4t + 3, lowest slot in the lowest byte."""
    K, N, w = 64, 128, 16
    b = np.random.default_rng(3).integers(-128, 128, (K, N)).astype(np.int8)
    a = sp.csr_matrix(np.ones((8, K)))
    inst = convert(a, "srbcrs:v8,int8")
    regs, _ = stc.operands(inst.arrays["indptr"], inst.arrays["indices"], inst.data, b, 0, 0, 0, lane=6, V=8,
                           n_bytes=w)
    g, t = 1, 2
    cols = inst.arrays["indices"][t * 4: t * 4 + 4]
    for c in range(w):
        want = b[cols, g * w + c].view(np.uint8).astype(np.uint32)
        assert regs[c // 2, c % 2] == int((want << np.arange(0, 32, 8, dtype=np.uint32)).sum())


@pytest.mark.parametrize("out_dtype", ["int32", "float32", "float16"])
def test_kernel_emits_integer_mma_for_hopper_and_ampere(out_dtype):
    src = cuda_source(stc.build(37, 70, 13, 4, out_dtype=out_dtype, arch="sm_90a"))
    assert INSTR in src
    ptx = nvcc_ptx(src, "sm_90a")
    assert ptx.count(INSTR) == 8  # n_bytes = 16: eight m16 tiles per warp
    assert ptx.count("prmt.b32") >= 64  # 2 chunks x 4 byte groups x 8 permutes
    sm80 = stc.build(100, 300, 33, 8, out_dtype=out_dtype, arch="sm_80", n_bytes=8, warps=2)
    results = nvcc_sources({("hopper", "sm_90a"): src,
                            ("ampere", "sm_80"): cuda_source(sm80)})
    assert all(ok for ok, _ in results.values()), results


@pytest.mark.parametrize("kwargs, match", [
    ({"vec": 3}, r"vec \(V\) should be one of \[2, 4, 8\], got 3"),
    ({"out_dtype": "bfloat16"}, "out_dtype should be one of"),
    ({"n_bytes": 32}, "n_bytes should be one of"),
    ({"K": -1}, "K should be a positive int"),
])
def test_bad_kernel_arguments_name_the_problem(kwargs, match):
    args = {"M": 32, "K": 64, "N": 16, "vec": 8, **kwargs}
    with pytest.raises(ValueError, match=match):
        stc.spmm_srbcrs_int8(args.pop("M"), args.pop("K"), args.pop("N"), args.pop("vec"), **args)


def test_full_tiles_load_each_slot_row_with_one_vector_load():
    src = cuda_source(stc.build(3072, 768, 8192, 8, arch="sm_90a"))
    ptx = nvcc_ptx(src, "sm_90a")
    assert ptx.count("ld.global.nc.v4.u32") == 8  # 8 slot rows x 16 bytes per k step
    assert "ld.global.nc.u8" not in ptx and "ld.global.s8" not in ptx  # no byte gathers left


def test_out_of_range_columns_are_clamped_into_b_not_read_past_it():
    """A corrupted column index reads B's last row (as the kernel's clamp does), never
    past B."""
    a = _int8_matrix(16, 40, 0.3, seed=5)
    inst = convert(a, "srbcrs:v8,int8")
    indices = inst.arrays["indices"].copy()
    real = np.flatnonzero(indices >= 0)[0]
    indices[real] = 10**6
    b = np.random.default_rng(2).integers(-128, 128, (40, 16)).astype(np.int8)
    got = stc.emulate(inst.arrays["indptr"], indices, inst.data, b, 16, 8)
    fixed = indices.copy()
    fixed[real] = 39
    want = stc.emulate(inst.arrays["indptr"], fixed, inst.data, b, 16, 8)
    assert np.array_equal(got, want)


def test_any_size_kernel_carries_a_body_sized_for_one_matrix():
    """``fast_for=(M, K)``: beside the any-size body (grid and bounds read from the operands)
    the kernel holds the hand-built one for that size (constant grid, M and K), chosen on the
    host by the operands' sizes; the arguments are the any-size kernel's, and both bodies
    compile with the scaling epilogue."""
    from sparsec.schedules.warp_mma import compile_for

    general = stc.spmm_srbcrs_int8(None, None, 16, 8, out_dtype="float32")
    sized = stc.spmm_srbcrs_int8(None, None, 16, 8, out_dtype="float32", fast_for=(21, 40))
    script = sized.script()
    assert script.count('range(T.Cast("int32", M == 21 and K == 40 and vector_rows_1 == 4))') == 1
    assert 'range(1 - T.Cast("int32", M == 21 and K == 40 and vector_rows_1 == 4))' in script
    assert 'T.launch_thread("blockIdx.y", 3)' in script  # 21 rows: 3 vector rows of 8
    assert 'T.launch_thread("blockIdx.y", vector_rows_1 - 1)' in script
    assert "== 21" not in general.script()
    def signature(f):  # the arguments, their dtypes and shapes
        return next(line for line in f.script().splitlines() if line.startswith("def srbcrs_spmm("))
    assert signature(sized) == signature(general) and 'Dv: T.Buffer((slots * 8,), "int8")' in signature(sized)
    src = cuda_source(compile_for(sized, "sm_90a"))
    fast_kernel = src[src.index("srbcrs_spmm_kernel("):src.index("srbcrs_spmm_kernel_1(")]
    assert "int M" not in fast_kernel and "int K" not in fast_kernel
    assert nvcc_ptx(src, "sm_90a").count(INSTR) == 2 * 8  # two bodies, 8 m16 tiles per warp each


@pytest.mark.parametrize("fast_for, match", [((21,), r"fast_for should be the \(M, K\)"),
                                              ((0, 40), "fast_for M should be a positive int"),
                                              ("21x40", r"fast_for should be the \(M, K\)")])
def test_bad_fast_for_names_the_problem(fast_for, match):
    with pytest.raises(ValueError, match=match):
        stc.spmm_srbcrs_int8(None, None, 16, 8, fast_for=fast_for)
