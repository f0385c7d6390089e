"""Safe kernel calls (issue 21): index arrays are checked before launch unless ``convert``
sealed them, awkward inputs are made to fit, and what cannot be made to fit (``out=``, a
meta tensor, no GPU) is refused by name before anything runs; operator x format x dtype
combinations the pipeline cannot compile are refused before lowering."""
from __future__ import annotations

import os
import pickle
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

import sparsec
from sparsec import cli
from sparsec.build import compile as build_compile
from sparsec.formats import FormatInstance, convert, validate

from conftest import check, dense

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS, COLS, FEAT = 41, 37, 8


def matrix(seed=3, rows=ROWS, cols=COLS, density=0.15):
    m = sp.random(rows, cols, density=density, format="lil", random_state=seed, dtype=np.float32)
    m[2, :] = 0  # an empty row
    return m.tocsr()


@pytest.fixture(scope="module")
def m():
    return matrix()


@pytest.fixture(scope="module")
def A(m):
    return convert(m, "csr")


@pytest.fixture(scope="module")
def spmm():
    return sparsec.compile("spmm", "csr", target="llvm", feat=FEAT)


@pytest.fixture
def B():
    return dense(np.random.default_rng(1), (COLS, FEAT))


def by_hand(inst, **arrays):
    """A FormatInstance built directly from copies of ``inst``'s arrays, some replaced."""
    own = {n: np.array(a) for n, a in inst.arrays.items()}
    own.update(arrays)
    return FormatInstance(inst.format, inst.shape, own, inst.data.copy(), inst.nnz)


def _set(a, k, v):
    a = np.array(a)
    a[k] = v
    return a


# ------------------------------------------------------------------ index arrays: hand-built


HAND_BUILT_SCRIPT = """
import numpy as np, scipy.sparse as sp, sparsec
from sparsec.formats import FormatInstance, convert
m = sp.random(400, 300, density=0.05, format="csr", random_state=0, dtype=np.float32)
A = convert(m, "csr")
indices = np.array(A.arrays["indices"]); indices[17] = 10**8
bad = FormatInstance(A.format, A.shape, {"indptr": np.array(A.arrays["indptr"]), "indices": indices},
                     A.data.copy(), A.nnz)
k = sparsec.compile("spmm", "csr", target="llvm", feat=64)
try:
    k(bad, np.ones((300, 64), np.float32))
except ValueError as e:
    print("REFUSED", e)
"""


def test_column_index_1e8_is_a_value_error_not_a_segfault():
    """A CPU kernel given a column index of 1e8 read out of bounds (exit 139); in a subprocess,
    so that a regression fails this test instead of killing the test run."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, "-c", HAND_BUILT_SCRIPT], capture_output=True, text=True, env=env,
                         timeout=300)
    assert res.returncode == 0, f"exit {res.returncode}: {res.stderr[-2000:]}"
    assert "REFUSED" in res.stdout, res.stdout
    msg = res.stdout
    assert "column index 100000000" in msg and "indices[17]" in msg and "in row " in msg, msg


@pytest.mark.parametrize("value", [10**8, -1, COLS])
def test_hand_built_out_of_range_column(spmm, A, B, value):
    k = int(np.flatnonzero(np.diff(A.arrays["indptr"]))[3])  # a row with entries
    pos = int(A.arrays["indptr"][k])
    bad = by_hand(A, indices=_set(A.arrays["indices"], pos, value))
    with pytest.raises(ValueError, match=rf"column index {value} in row {k} is out of range.*indices\[{pos}\]"):
        spmm(bad, B)


def test_hand_built_indptr_not_monotone(spmm, A, B):
    indptr = _set(A.arrays["indptr"], 5, A.arrays["indptr"][7] + 3)
    with pytest.raises(ValueError, match=r"indptr should be non-decreasing, got indptr\[6\]"):
        spmm(by_hand(A, indptr=indptr), B)


def test_hand_built_wrong_data_length(spmm, A, B):
    bad = by_hand(A)
    bad.data = bad.data[:-3].copy()
    with pytest.raises(ValueError, match=r"data should have one value per index"):
        spmm(bad, B)


def test_valid_hand_built_instance_runs_and_is_checked_every_call(spmm, A, B, m, monkeypatch):
    calls = []
    real = validate._full_check
    monkeypatch.setattr(validate, "_full_check", lambda inst: (calls.append(1), real(inst)))
    good = by_hand(A)
    check(spmm(good, B), m @ B)
    check(spmm(good, B), m @ B)
    assert len(calls) == 2
    spmm(A, B)  # sealed by convert: no check
    assert len(calls) == 2


@pytest.mark.parametrize("spec", ["csr", "bsr:4x4", "bsr:2x3", "ell:16", "rell:8,dup", "nm:2:4", "srbcrs:v8,float16"])
def test_every_family_refuses_an_out_of_range_index(spec, m):
    src = m if not spec.startswith("nm") else _nm_matrix()
    inst = convert(src, spec)
    name = [n for n in inst.format.index_array_names() if n not in ("indptr", "row_offsets", "row_ids")][0]
    arr = inst.arrays[name]
    k = int(np.flatnonzero(arr >= 0)[0])
    bad = by_hand(inst, **{name: _set(arr, k, 10**8)})
    dtype = inst.value_dtype
    kernel = sparsec.compile("spmm", inst.format, target="llvm", feat=FEAT, dtype=dtype)
    B = np.ones((inst.shape[1], FEAT), dtype)
    with pytest.raises(ValueError, match=r"failed the index check.*(out of range|should be in)"):
        kernel(bad, B)
    kernel(inst, B)  # the sealed original still runs


def _nm_matrix():
    rng = np.random.default_rng(2)
    d = np.zeros((16, 32), np.float32)
    for r in range(16):
        for w in range(8):
            d[r, w * 4 + rng.choice(4, 2, replace=False)] = rng.standard_normal(2)
    return sp.csr_matrix(d)


# ------------------------------------------------------------------ index arrays: after convert


def test_converted_instance_is_sealed_and_read_only(A):
    assert A.is_sealed() and validate.is_trusted(A)
    with pytest.raises(ValueError, match="read-only"):
        A.arrays["indices"][0] = 10**8


def test_replaced_array_after_convert_is_checked(spmm, m, B):
    A = convert(m, "csr")
    A.arrays["indices"] = _set(A.arrays["indices"], 4, 10**8)
    assert not A.is_sealed()
    with pytest.raises(ValueError, match=r"not sealed by convert.*column index 100000000.*indices\[4\]"):
        spmm(A, B)


def test_array_made_writeable_again_is_checked(spmm, m, B):
    A = convert(m, "csr")
    A.arrays["indices"].flags.writeable = True
    A.arrays["indices"][4] = -5
    with pytest.raises(ValueError, match=r"column index -5"):
        spmm(A, B)


def test_changed_shape_after_convert_is_checked(spmm, m, B):
    A = convert(m, "csr")
    A.shape = (ROWS + 10, COLS)
    with pytest.raises(ValueError, match=r"indptr has \d+ entries, should be rows \+ 1"):
        spmm(A, np.ones((COLS, FEAT), np.float32))
    A = convert(m, "csr")
    A.shape = (ROWS, 3)  # fewer columns than the indices reach: B would be read out of bounds
    with pytest.raises(ValueError, match=r"out of range: should be in \[0, 3\)"):
        spmm(A, np.ones((3, FEAT), np.float32))


def test_data_of_another_length_after_convert_is_refused(spmm, m, B):
    A = convert(m, "csr")
    A.data = A.data[:-1].copy()
    with pytest.raises(ValueError, match=r"data should have one value per index"):
        spmm(A, B)


def test_with_data_and_astype_keep_the_seal(A):
    assert A.with_data(A.data * 2).is_sealed()
    assert A.astype(np.float64).is_sealed()


def test_unpickled_instance_is_checked_then_runs(spmm, A, B, m):
    back = pickle.loads(pickle.dumps(A))
    assert not back.is_sealed() and back._seal is None
    check(spmm(back, B), m @ B)
    back.arrays["indices"][0] = 10**8  # an unpickled instance's arrays are its own
    with pytest.raises(ValueError, match="column index 100000000"):
        spmm(back, B)


def test_seal_by_hand_checks_and_takes_a_private_copy(spmm, A, B, m):
    bad = by_hand(A, indices=_set(A.arrays["indices"], 0, 10**8))
    with pytest.raises(ValueError, match="column index 100000000"):
        bad.seal()
    assert not bad.is_sealed()
    mine = np.array(A.arrays["indices"])
    good = by_hand(A, indices=mine).seal()
    assert good.is_sealed()
    mine[0] = 10**8  # the caller's array is no longer the instance's
    check(spmm(good, B), m @ B)


@pytest.mark.parametrize("spec", ["hyb:1:1/2/4/8", "bsr+csr:4x4,0.5"])
def test_composite_parts_are_checked(spec, m):
    inst = convert(m, spec)
    kernel = sparsec.compile("spmm", inst, target="llvm", feat=FEAT)
    B = np.ones((COLS, FEAT), np.float32)
    check(kernel(inst, B), m @ B)
    assert validate.is_trusted(inst)
    k = len(inst.parts) - 1
    part = inst.parts[k]
    name = [n for n in part.format.index_array_names() if n in ("indices", "col_ids")][0]
    arr = part.arrays[name]
    part.arrays[name] = _set(arr, int(np.flatnonzero(arr >= 0)[0]), 10**8)
    assert not validate.is_trusted(inst)
    with pytest.raises(ValueError, match=rf"{re.escape(inst.format.name)}.*part {k} \({part.format.spec}\).*100000000"):
        kernel(inst, B)


# ------------------------------------------------------------------ dense operands and out=


def test_non_contiguous_numpy_inputs_are_copied(spmm, A, m):
    wide = dense(np.random.default_rng(2), (COLS, 2 * FEAT))
    B = wide[:, ::2]
    assert not B.flags.c_contiguous
    check(spmm(A, B), m @ B)
    Bt = np.asfortranarray(B)
    check(spmm(A, Bt), m @ B)


def test_read_only_inputs_work(spmm, m, B):
    A = convert(m, "csr")
    A.data.flags.writeable = False
    ro = B.copy()
    ro.flags.writeable = False
    check(spmm(A, ro), m @ B)


def test_non_native_byte_order_input_is_converted(spmm, A, B, m):
    check(spmm(A, B.astype(">f4")), m @ B)


def test_non_contiguous_out_is_refused_by_name(spmm, A, B):
    out = np.zeros((ROWS, 2 * FEAT), np.float32)[:, ::2]
    with pytest.raises(ValueError, match=r"spmm: out C should be C-contiguous"):
        spmm(A, B, out=out)


def test_read_only_out_is_refused_by_name(spmm, A, B):
    out = np.zeros((ROWS, FEAT), np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match=r"spmm: out C is a read-only numpy array"):
        spmm(A, B, out=out)


def test_non_native_out_is_refused_by_name(spmm, A, B):
    with pytest.raises(ValueError, match=r"spmm: out C has non-native byte order"):
        spmm(A, B, out=np.zeros((ROWS, FEAT), ">f4"))


def test_contiguous_out_is_written(spmm, A, B, m):
    out = np.full((ROWS, FEAT), 7, np.float32)
    res = spmm(A, B, out=out)
    assert res is out
    check(out, m @ B)


def test_torch_inputs(spmm, A, B, m):
    torch = pytest.importorskip("torch")
    Bt = torch.from_numpy(np.ascontiguousarray(B.T)).t()  # a transposed view: not contiguous
    check(spmm(A, Bt).numpy(), m @ B)
    with pytest.raises(ValueError, match=r"spmm: B is a torch meta tensor"):
        spmm(A, torch.empty((COLS, FEAT), device="meta"))
    with pytest.raises(ValueError, match=r"spmm: B requires grad"):
        spmm(A, torch.from_numpy(B).requires_grad_())
    out = torch.zeros((FEAT, ROWS)).t()
    with pytest.raises(ValueError, match=r"spmm: out C should be C-contiguous"):
        spmm(A, torch.from_numpy(B), out=out)
    with pytest.raises(ValueError, match=r"spmm: out C is a torch meta tensor"):
        spmm(A, torch.from_numpy(B), out=torch.empty((ROWS, FEAT), device="meta"))


def test_torch_input_inside_an_allocation_reaches_the_kernel_aligned(spmm, A, B, m):
    """A contiguous view that starts inside its allocation (``big[1:]``) is copied to a
    16-byte boundary before the call: Tensor Core kernels copy operands in 16-byte chunks,
    and a misaligned one would fault on the GPU; an aligned tensor is passed as it is."""
    torch = pytest.importorskip("torch")
    big = torch.zeros(COLS * FEAT + 1)
    big[1:] = torch.from_numpy(B).reshape(-1)
    Bv = big[1:].view(COLS, FEAT)
    assert Bv.data_ptr() % 16
    args, _, _ = spmm.prepare(A, Bv)
    b_arg = next(a for a, p in zip(args, spmm.params) if p.name == "B")
    assert b_arg.data_ptr() % 16 == 0 and torch.equal(b_arg, Bv)
    check(spmm(A, Bv).numpy(), m @ B)
    Bt = torch.from_numpy(B)
    args, _, _ = spmm.prepare(A, Bt)
    assert next(a for a, p in zip(args, spmm.params) if p.name == "B") is Bt


# ------------------------------------------------------------------ no GPU


def gpu_visible():
    from sparsec.kernel import _gpu_visible

    return _gpu_visible()


@pytest.mark.skipif(gpu_visible(), reason="a GPU is visible")
def test_cuda_kernel_without_a_gpu_is_refused_first(A, B):
    """The no-GPU refusal comes before the index check: nothing about the arguments can make
    the call run, and a full check of a large matrix would be paid for nothing."""
    k = sparsec.compile("spmm", "csr", target="cuda:sm_90a", feat=FEAT)
    with pytest.raises(RuntimeError, match=r"targets CUDA \(cuda:sm_90a\) but no CUDA GPU is visible.*llvm"):
        k(A, B)
    bad = by_hand(A, indices=_set(A.arrays["indices"], 0, 10**8))
    with pytest.raises(RuntimeError, match="no CUDA GPU is visible"):
        k(bad, B)


# ------------------------------------------------------------------ exported modules


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    path = tmp_path_factory.mktemp("safe") / "spmm.so"
    sparsec.compile("spmm", "csr", target="llvm", feat=FEAT).export(str(path))
    return sparsec.load(str(path))


def test_loaded_module_checks_like_a_compiled_one(loaded, A, B, m):
    ro = B[:, ::1].copy()
    ro.flags.writeable = False
    check(loaded(A, ro), m @ B)
    check(loaded(A, np.asfortranarray(B)), m @ B)
    with pytest.raises(ValueError, match=r"out C should be C-contiguous"):
        loaded(A, B, out=np.zeros((ROWS, 2 * FEAT), np.float32)[:, ::2])
    with pytest.raises(ValueError, match=r"column index 100000000"):
        loaded(by_hand(A, indices=_set(A.arrays["indices"], 0, 10**8)), B)


@pytest.mark.skipif(shutil.which("nvcc") is None or gpu_visible(), reason="needs nvcc and no GPU")
def test_loading_a_cuda_module_without_a_gpu_is_refused(tmp_path):
    from sparsec.runtime import IncompatibleModuleError

    path = tmp_path / "spmm_cuda.so"
    sparsec.compile("spmm", "csr", target="cuda:sm_90a", feat=FEAT).export(str(path))
    with pytest.raises(IncompatibleModuleError, match=r"no CUDA GPU is visible.*export an llvm build"):
        sparsec.load(str(path))


# ------------------------------------------------------------------ sparsec.torch


def test_torch_sparse_tensor_checks_a_hand_built_instance(A, m):
    st = pytest.importorskip("sparsec.torch")
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match=r"column index 100000000"):
        st.SparseTensor(by_hand(A, indices=_set(A.arrays["indices"], 0, 10**8)), grad=False)
    mine = by_hand(A)
    T = st.SparseTensor(mine, grad=False)
    mine.arrays["indices"][:] = 10**8  # the SparseTensor holds its own copy
    B = torch.ones((COLS, FEAT))
    check(st.spmm(T, B).numpy(), m @ np.ones((COLS, FEAT), np.float32))
    meta = st.spmm(T, torch.empty((COLS, FEAT), device="meta"))  # traced: shapes only, no kernel runs
    assert meta.device.type == "meta" and tuple(meta.shape) == (ROWS, FEAT)


def test_torch_sparse_tensor_refuses_other_devices(A):
    st = pytest.importorskip("sparsec.torch")
    with pytest.raises(ValueError, match=r"device should be cpu or cuda"):
        st.SparseTensor(A, device="meta", grad=False)


# ------------------------------------------------------------------ refusals before compiling


def _no_lowering(monkeypatch):
    import sparsec.build as b

    def fail(*a, **k):
        raise AssertionError("lowered: the refusal should come first")
    monkeypatch.setattr(b, "lower_program", fail)


@pytest.mark.parametrize("fmt, dtype", [("srbcrs:v8,int8", "int8"), ("srbcrs:v4,int4", "int4")])
def test_attention_on_integer_srbcrs_is_refused_before_lowering(fmt, dtype, monkeypatch):
    _no_lowering(monkeypatch)
    want = rf"attention x srbcrs:\d,{dtype} x {dtype} is not supported: attention calls exp.*float dtype"
    with pytest.raises(ValueError, match=want):
        build_compile("attention", fmt, dtype=dtype, feat=16)
    with pytest.raises(ValueError, match=want):
        sparsec.compile("attention", fmt, dtype=dtype, feat=16)


@pytest.mark.parametrize("cmd, argv", [
    ("run", ["--format", "srbcrs", "--vec", "8", "--dtype", "int8", "--random", "64,64,0.1"]),
    ("run", ["--format", "srbcrs:v4,int4", "--random", "64,64,0.1"]),
    ("build", ["--format", "srbcrs:v8,int8", "--emit-source"]),
])
def test_attention_on_integer_srbcrs_from_the_cli(capsys, cmd, argv):
    code = cli.main([cmd, "attention", *argv, "--feat", "16"])
    _, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in err and "TVMScript" not in err
    assert "is not supported: attention calls exp" in err, err


def test_integer_precision_refusals_by_capability(monkeypatch):
    _no_lowering(monkeypatch)
    from sparsec import dsl

    op = dsl.Operator("halve", "O = 0.5 * A")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    Am = op.sparse_input("A", (I, J))
    O = op.sparse_output("O", (I, J))
    with op.iterate([I, J], "SS") as (i, j):
        O[i, j] = 0.5 * Am[i, j]
    with pytest.raises(ValueError, match=r"halve x srbcrs:8,int8 x int8 .*uses the constant 0.5"):
        build_compile(op, "srbcrs:v8,int8", dtype="int8")
    with pytest.raises(ValueError, match=r"spmm x csr x int8 .*csr stores float values.*srbcrs"):
        build_compile("spmm", "csr", dtype="int8", feat=16)
    with pytest.raises(ValueError, match=r"spmm x srbcrs:2,float16 x float32 .*stores float16 values.*'float16'"):
        build_compile("spmm", "srbcrs:v2,float16", dtype="float32", feat=16)


# ------------------------------------------------------------------ the checks themselves


@pytest.mark.parametrize("where", ["last block row", "last block column"])
def test_bsr_full_check_finds_values_past_the_edge(m, where):
    """The edge check looks only at the last block row and column (cheap at any size)."""
    from sparsec.formats import bsr

    inst = convert(m, "bsr:4x4")  # 41 x 37: one row and one column past the edge in the last blocks
    bsr.check(inst, full=True)
    blocks = inst.data.copy().reshape(-1, 4, 4)
    indptr, indices = inst.arrays["indptr"], inst.arrays["indices"]
    if where == "last block row":
        blocks[int(indptr[-2]), 3, 0] = 1.0  # row 43 of block row 10: past row 40
    else:
        blocks[int(np.flatnonzero(indices == 9)[0]), 0, 3] = 1.0  # column 39 of block column 9: past column 36
    with pytest.raises(ValueError, match="past the logical edge should hold 0"):
        bsr.check(by_hand(inst, **{}).with_data(blocks.reshape(-1)), full=True)


def test_has_repeats():
    assert not validate.has_repeats(np.array([3, 1, 2], np.int64))
    assert validate.has_repeats(np.array([3, 1, 3], np.int64))
    assert not validate.has_repeats(np.zeros(1, np.int64)) and not validate.has_repeats(np.zeros(0, np.int64))


def test_slot_mask_replaced_after_convert_is_refused_before_launch(m):
    """The seal covers the index arrays; the slot mask of a padded format is checked on every
    call (its size bounds what a guarding kernel reads)."""
    import dsl_ops

    A = convert(m, "bsr:4x4")
    kernel = sparsec.compile(dsl_ops.row_max(), A, target="llvm")
    assert A.is_sealed()
    A.arrays["valid"] = A.arrays["valid"][:-3].copy()
    with pytest.raises(ValueError, match=r"slot mask.*one entry per stored slot"):
        kernel(A)
