"""The ``tiled`` format family: conversion, the bitmap layout a Tensor Core kernel expands,
magnitude pruning, validation, what a kernel streams, and operators over it on llvm."""
import numpy as np
import pytest
import scipy.sparse as sp

import sparsec
from sparsec import cli
from sparsec.formats import convert, tiled
from sparsec.reference import max_rel_err


def _matrix(rows=75, cols=133, density=0.3, seed=0):
    """Odd sizes (edge tiles), an empty row, a full row, explicit zeros."""
    rng = np.random.default_rng(seed)
    a = sp.random(rows, cols, density=density, random_state=seed, format="lil", dtype=np.float32)
    a[4, :] = 0
    a[9, :] = rng.standard_normal(cols).astype(np.float32)
    a = sp.csr_matrix(a)
    a.data[::5] = 0.0
    return a


def expand(inst) -> np.ndarray:
    """The dense matrix from the bitmap, the tile offsets and the values alone, as a warp
    does it: per 8x8 subtile, lane l takes bits 2l and 2l + 1 and finds its values at the
    popcount of the lower bits past the subtile's start (a tile's subtiles in order)."""
    (r, c), (rows, cols) = inst.format.param("tile"), inst.shape
    ngo, ngc = -(-rows // r), -(-cols // c)
    words, offsets, values = inst.arrays["bitmap"], inst.arrays["tile_offsets"], inst.data
    out = np.zeros((ngo * r, ngc * c), values.dtype)
    subs = (r // 8) * (c // 8)
    for t in range(ngo * ngc):
        start = int(offsets[t])
        for s in range(subs):
            word = int(words[t * subs + s])
            r0, c0 = (t // ngc) * r + (s // (c // 8)) * 8, (t % ngc) * c + (s % (c // 8)) * 8
            for lane in range(32):
                for bit in (2 * lane, 2 * lane + 1):
                    if word >> bit & 1:
                        out[r0 + bit // 8, c0 + bit % 8] = values[start + bin(word & ((1 << bit) - 1)).count("1")]
            start += bin(word).count("1")
        assert start == offsets[t + 1]
    return out[:rows, :cols]


@pytest.mark.parametrize("spec", ["tiled", "tiled:8x8", "tiled:16x32", "tiled:256x8"])
def test_round_trip_and_full_check(spec):
    a = _matrix()
    inst = convert(a, spec)
    assert inst.format.spec == (spec if ":" in spec else "tiled:64x64")
    m = inst.to_scipy()
    assert m.nnz == a.nnz and (m != a).nnz == 0  # explicit zeros stay entries
    tiled.check(inst, full=True)


@pytest.mark.parametrize("spec", ["tiled", "tiled:16x32"])
def test_bitmap_layout_expands_to_the_matrix(spec):
    a = _matrix(seed=3)
    inst = convert(a, spec)
    dense = a.toarray()
    np.testing.assert_array_equal(expand(inst), dense)
    # explicit zeros are marked in the bitmap too: one bit per entry
    assert sum(bin(int(w)).count("1") for w in inst.arrays["bitmap"]) == a.nnz


def test_prune_keeps_the_largest_magnitudes():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((96, 200)).astype(np.float32)
    w[0, :10] = 0.0
    w[5, 7] = np.nan
    inst, keep = tiled.prune(w, sparsity=0.8, tile=(32, 64))
    assert keep.sum() == round(0.2 * w.size) == inst.nnz
    assert keep[5, 7]  # NaN counts as largest
    kept, dropped = np.abs(w[keep & ~np.isnan(w)]), np.abs(w[~keep])
    assert kept.min() >= dropped.max()
    np.testing.assert_array_equal(np.nan_to_num(expand(inst), nan=99), np.nan_to_num(np.where(keep, w, 0), nan=99))
    # zeros are never kept: a weight sparser than asked keeps its non-zeros only
    few = np.zeros((16, 16), np.float32)
    few[3, 4] = 2.0
    inst, keep = tiled.prune(few, sparsity=0.5)
    assert inst.nnz == 1 and keep.sum() == 1


def test_prune_breaks_ties_by_row_major_order():
    """Equal magnitudes at the cut: the earliest elements (row-major) are kept."""
    w = np.ones((8, 10), np.float32)
    w[2, 3] = -5.0
    _, keep = tiled.prune(w, sparsity=0.75, tile=(8, 8))  # 20 kept: the 5, then the 19 earliest ones
    assert np.flatnonzero(keep).tolist() == list(range(19)) + [23]


def test_prune_takes_torch_and_scipy_weights():
    torch = pytest.importorskip("torch")
    w = torch.randn(40, 24, dtype=torch.bfloat16)
    inst, keep = tiled.prune(w, sparsity=0.5, tile=(8, 8), dtype="float32")
    assert inst.nnz == keep.sum() == 480 and inst.data.dtype == np.float32
    inst2, _ = tiled.prune(sp.csr_matrix(w.float().numpy()), sparsity=0.5, tile=(8, 8))
    assert inst2.nnz == 480


@pytest.mark.parametrize("kw, match", [
    ({"sparsity": 1.0}, "sparsity should be a fraction in"),
    ({"sparsity": -0.1}, "sparsity should be a fraction in"),
    ({"sparsity": "0.9"}, "sparsity should be a fraction in"),
    ({"sparsity": 0.5, "tile": (12, 8)}, "multiples of 8"),
    ({"sparsity": 0.5, "tile": (512, 8)}, "up to 256"),
])
def test_prune_refuses_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        tiled.prune(np.ones((8, 8), np.float32), **kw)


@pytest.mark.parametrize("spec, match", [("tiled:12x8", "multiples of 8"), ("tiled:64", "multiples of 8"),
                                         ("tiled:axb", "tile shape RxC")])
def test_bad_specs_say_what_to_write(spec, match):
    with pytest.raises(ValueError, match=match):
        convert(_matrix(), spec)


def test_full_check_names_a_corrupted_array():
    inst = convert(_matrix(), "tiled:16x16")
    bad = dict(inst.arrays)
    bad["bitmap"] = bad["bitmap"].copy()
    bad["bitmap"][3] ^= np.uint64(1 << 9)
    with pytest.raises(ValueError, match="'bitmap'\\] word 3"):
        tiled.check(type(inst)(inst.format, inst.shape, bad, inst.data, inst.nnz), full=True)
    bad = dict(inst.arrays)
    bad["tile_offsets"] = bad["tile_offsets"].copy()
    bad["tile_offsets"][2] += 1
    with pytest.raises(ValueError, match="'tile_offsets'\\]\\[2\\]"):
        tiled.check(type(inst)(inst.format, inst.shape, bad, inst.data, inst.nnz), full=True)
    bad = dict(inst.arrays)
    bad["indices"] = bad["indices"].copy()
    bad["indices"][0] = 8
    with pytest.raises(ValueError, match="out of range: should be in \\[0, 8\\)"):
        tiled.check(type(inst)(inst.format, inst.shape, bad, inst.data, inst.nnz), full=True)
    with pytest.raises(ValueError, match="'bitmap'\\] should be uint64"):
        tiled.check(type(inst)(inst.format, inst.shape, {**inst.arrays, "bitmap": inst.arrays["indptr"]},
                               inst.data, inst.nnz))


def test_stream_bytes_at_ninety_percent():
    """float16 at 90 %: 0.1 x 2 bytes of values + 1/8 byte of bitmap per element (+ 4 bytes
    per 4096-element tile) = 16.3 % of the dense weight."""
    w = np.random.default_rng(2).standard_normal((512, 1024)).astype(np.float16)
    inst, _ = tiled.prune(w, sparsity=0.9)
    b = tiled.stream_bytes(inst)
    assert b["values"] == 2 * inst.nnz and b["bitmap"] == 512 * 1024 // 8 and b["tile_offsets"] == 4 * (8 * 16 + 1)
    assert b["of_dense"] == pytest.approx(0.1 + 1 / 16 + 4 * 129 / (2 * 512 * 1024), rel=1e-3)
    d = sparsec.describe(inst) if hasattr(sparsec, "describe") else None
    from sparsec.inspect import describe

    assert describe(inst)["stream_bytes"] == b
    assert d is None or d["stream_bytes"] == b


@pytest.mark.parametrize("spec", ["tiled", "tiled:8x16"])
def test_spmm_and_sddmm_on_llvm_match_float64(spec):
    """Tile columns sit above a tile's rows in the chain, so the output is filled first and
    only added into (a T.init would run once per tile column)."""
    rng = np.random.default_rng(4)
    a = _matrix(seed=5)
    inst = convert(a, spec)
    X = rng.standard_normal((a.shape[1], 6)).astype(np.float32)
    k = sparsec.compile("spmm", inst, target="llvm", feat=6)
    assert max_rel_err(k(inst, X, poison=True), a.astype(np.float64) @ X.astype(np.float64)) < 1e-5
    P, Q = rng.standard_normal((a.shape[0], 5)).astype(np.float32), rng.standard_normal((a.shape[1], 5)).astype(np.float32)
    k = sparsec.compile("sddmm", inst, target="llvm", feat=5)
    out = inst.coordinate_values(k(inst, P, Q, poison=True))
    ref = a.copy().astype(np.float64)
    ref.data = a.data * np.einsum("ij,ij->i", P[np.repeat(np.arange(a.shape[0]), np.diff(a.indptr))].astype(np.float64),
                                  Q[a.indices].astype(np.float64))
    assert max_rel_err(out, ref.data) < 1e-5


def test_cli_tile_option(capsys):
    assert cli.main(["formats", "--describe", "tiled", "--tile", "32x128", "--json"]) == 0
    out = capsys.readouterr().out
    assert '"tiled:32x128"' in out
    assert cli.main(["formats", "--describe", "csr", "--tile", "32x128"]) != 0
    assert "--tile does not apply to format csr" in capsys.readouterr().err


def test_sparse_linear_takes_a_tiled_weight():
    """``SparseLinear.from_dense(w, fmt="tiled:...")``: inference on the pruned weight (the
    values are not trained: no transpose is converted for a tiled weight)."""
    torch = pytest.importorskip("torch")
    from sparsec.torch import SparseLinear

    w = np.random.default_rng(6).standard_normal((48, 40)).astype(np.float32)
    _, keep = tiled.prune(w, sparsity=0.7, tile=(16, 16))
    pruned = torch.from_numpy(np.where(keep, w, 0).astype(np.float32))
    bias = torch.randn(48)
    lin = SparseLinear.from_dense(pruned, bias=bias, fmt="tiled:16x16")
    x = torch.randn(3, 5, 40)
    y = lin(x)
    ref = x.double() @ pruned.double().T + bias.double()
    assert lin.weight.format == "tiled:16x16" and y.shape == (3, 5, 48)
    assert max_rel_err(y.detach().numpy(), ref.numpy()) < 1e-5


def test_sparse_linear_in_float16_hands_back_float16():
    """A float16 tiled layer sums in float32 (the kernel's output) and returns its input's
    precision, so layers chain (an MLP's next layer takes float16, as its weight is)."""
    torch = pytest.importorskip("torch")
    from sparsec.torch import SparseLinear

    w = np.random.default_rng(7).standard_normal((40, 48)).astype(np.float16)
    _, keep = tiled.prune(w, sparsity=0.8)
    pruned = torch.from_numpy(np.where(keep, w, 0))
    lin = SparseLinear.from_dense(pruned, fmt="tiled")
    x = torch.randn(5, 48).half()
    y = lin(x)
    assert y.dtype == torch.float16 and y.shape == (5, 40)
    ref = x.double() @ pruned.double().T
    assert max_rel_err(y.double().numpy(), ref.numpy()) < 1e-2
    assert lin(y[:, :40].repeat(1, 2)[:, :48]).dtype == torch.float16  # the next layer takes it


def test_llm_mlp_example_runs_small_on_the_cpu(tmp_path):
    """examples/llm_mlp.py: a Llama-style MLP with tiled weights matches the float64 MLP of
    the same pruned weights (CPU, small dims; the GPU run times it against dense fp16)."""
    pytest.importorskip("torch")
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "llm_mlp.py"
    spec = importlib.util.spec_from_file_location("llm_mlp", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    out = tmp_path / "mlp.json"
    assert example.main(["--device", "cpu", "--dims", "64", "176", "--sparsity", "0.8", "--tokens", "3",
                         "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert row["ok"] and row["max_rel_err"] < 1e-4 and row["fmt"] == "tiled"
