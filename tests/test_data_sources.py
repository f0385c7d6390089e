"""Readers of benchmarks/data/sources.py on tiny hand-written files (no network), and the
embedded power-grid matrix."""

from __future__ import annotations

import gzip
import importlib.util
import struct
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parent.parent


def _load_sources():
    path = ROOT / "benchmarks" / "data" / "sources.py"
    spec = importlib.util.spec_from_file_location("sparsec_benchmark_data_sources", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sources = _load_sources()


def write_gt(path, n, adjacency, directed, big_endian=False, compress=False, comment=b"test"):
    """Write a graph-tool binary file by hand: ``adjacency[v]`` lists v's out-neighbours
    (for an undirected graph, each edge in one list only). One vertex property map
    follows the adjacency so that readers must stop where the adjacency ends."""
    e = ">" if big_endian else "<"
    if n <= 0xFF:
        id_fmt = "B"
    elif n <= 0xFFFF:
        id_fmt = "H"
    elif n <= 0xFFFFFFFF:
        id_fmt = "I"
    else:
        id_fmt = "Q"
    out = bytearray("\u26fe gt".encode("utf-8"))
    assert len(out) == 6
    out += bytes([1, 1 if big_endian else 0])
    out += struct.pack(e + "Q", len(comment)) + comment
    out += bytes([1 if directed else 0]) + struct.pack(e + "Q", n)
    for v in range(n):
        nbrs = adjacency.get(v, [])
        out += struct.pack(e + "Q", len(nbrs))
        out += struct.pack(f"{e}{len(nbrs)}{id_fmt}", *nbrs)
    # property maps: 1 vertex map "w" of int32 (type index 0x02)
    out += struct.pack(e + "Q", 1) + bytes([1]) + struct.pack(e + "Q", 1) + b"w" + bytes([2])
    out += struct.pack(f"{e}{n}i", *range(n))
    data = gzip.compress(bytes(out)) if compress else bytes(out)
    Path(path).write_bytes(data)
    return path


def dense_from_edges(n, edges, symmetric):
    d = np.zeros((n, n), dtype=np.float32)
    for u, v in edges:
        d[u, v] = 1
        if symmetric:
            d[v, u] = 1
    return d


def check_canonical(a, n):
    assert isinstance(a, sp.csr_matrix)
    assert a.shape == (n, n)
    assert a.dtype == np.float32
    assert np.all(a.data == 1.0)
    assert a.indices.dtype == np.int32 and a.indptr.dtype == np.int32
    for r in range(n):
        row = a.indices[a.indptr[r] : a.indptr[r + 1]]
        assert np.all(np.diff(row) > 0), "row indices must be sorted and unique"


# 5 vertices -> 1-byte ids. A parallel edge (0-1 twice, once from each end) and a self-loop.
UNDIRECTED = {0: [1, 2], 1: [0], 3: [2, 4, 3], 4: []}
UNDIRECTED_EDGES = [(0, 1), (0, 2), (3, 2), (3, 4), (3, 3)]


@pytest.mark.parametrize("big_endian", [False, True])
@pytest.mark.parametrize("compress", [False, True])
def test_read_gt_undirected_is_symmetrised(tmp_path, big_endian, compress):
    path = write_gt(tmp_path / "g.gt", 5, UNDIRECTED, directed=False,
                    big_endian=big_endian, compress=compress)
    n, directed, src, dst = sources.read_gt_edges(path)
    assert (n, directed) == (5, False)
    assert sorted(zip(src.tolist(), dst.tolist())) == sorted(
        [(0, 1), (0, 2), (1, 0), (3, 2), (3, 4), (3, 3)])
    a = sources.read_gt(path)
    check_canonical(a, 5)
    np.testing.assert_array_equal(a.toarray(), dense_from_edges(5, UNDIRECTED_EDGES, True))
    # 0-1 (stored from both ends) collapses to one pair; the self-loop is one entry
    assert a.nnz == 9


def test_read_gt_directed_keeps_direction(tmp_path):
    adjacency = {0: [1, 1, 5], 2: [0], 5: [5, 4]}
    edges = [(0, 1), (0, 5), (2, 0), (5, 5), (5, 4)]
    path = write_gt(tmp_path / "d.gt.gz", 6, adjacency, directed=True, compress=True)
    a = sources.read_gt(path)
    check_canonical(a, 6)
    np.testing.assert_array_equal(a.toarray(), dense_from_edges(6, edges, False))
    assert a.nnz == 5  # the parallel 0->1 collapses
    s = sources.read_gt(path, symmetrize=True)
    np.testing.assert_array_equal(s.toarray(), dense_from_edges(6, edges, True))


def test_gt_id_width_follows_graph_tool():
    # graph-tool picks the id type with N <= numeric_limits<T>::max()
    assert [sources.gt_id_width(n) for n in (1, 255, 256, 65535, 65536, 2**32 - 1, 2**32)] == [
        1, 1, 2, 2, 4, 4, 8]


@pytest.mark.parametrize("n", [255, 256])
def test_read_gt_width_boundary(tmp_path, n):
    adjacency = {0: [n - 1], n - 1: [1, n - 2]}
    path = write_gt(tmp_path / "b.gt", n, adjacency, directed=True)
    a = sources.read_gt(path)
    check_canonical(a, n)
    assert sorted(zip(*a.nonzero())) == [(0, n - 1), (n - 1, 1), (n - 1, n - 2)]


def test_read_gt_rejects_other_files(tmp_path):
    bad = tmp_path / "bad.gt"
    bad.write_bytes(b"not a graph-tool file at all")
    with pytest.raises(ValueError):
        sources.read_gt(bad)
    truncated = tmp_path / "t.gt"
    write_gt(truncated, 5, UNDIRECTED, directed=False)
    truncated.write_bytes(truncated.read_bytes()[:40])
    with pytest.raises(ValueError):
        sources.read_gt(truncated)


METIS_EDGES = [(0, 1), (0, 2), (1, 2), (2, 3)]  # vertex 4 (index) is isolated


def test_read_metis_plain(tmp_path):
    path = tmp_path / "g.graph"
    path.write_text(
        "% a comment line\n"
        "5 4\n"
        "2 3\n"
        "1 3\n"
        "% comment between vertex lines\n"
        " 1  2\t4 \n"
        "3\n"
        "\n"
    )
    a = sources.read_metis(path)
    check_canonical(a, 5)
    np.testing.assert_array_equal(a.toarray(), dense_from_edges(5, METIS_EDGES, True))
    assert a.nnz == 8


def test_read_metis_weights_are_skipped(tmp_path):
    # fmt 011: one vertex weight per line, then (neighbour, edge weight) pairs
    path = tmp_path / "w.graph"
    path.write_text(
        "5 4 011\n"
        "7 2 10 3 20\n"
        "8 1 10 3 30\n"
        "9 1 20 2 30 4 40\n"
        "1 3 40\n"
        "6"  # isolated vertex with a weight, no trailing newline
    )
    a = sources.read_metis(path)
    check_canonical(a, 5)
    np.testing.assert_array_equal(a.toarray(), dense_from_edges(5, METIS_EDGES, True))

    # fmt 111 with 2 constraints: size, 2 vertex weights, then pairs
    path2 = tmp_path / "w2.graph"
    path2.write_text(
        "5 4 111 2\n"
        "1 7 7 2 10 3 20\n"
        "1 8 8 1 10 3 30\n"
        "1 9 9 1 20 2 30 4 40\n"
        "1 1 1 3 40\n"
        "1 6 6\n"
    )
    np.testing.assert_array_equal(sources.read_metis(path2).toarray(), a.toarray())


def test_read_metis_rejects_bad_ids(tmp_path):
    path = tmp_path / "bad.graph"
    path.write_text("2 1\n3\n1\n")
    with pytest.raises(ValueError):
        sources.read_metis(path)


def test_embedded_power_grid():
    path = ROOT / "sparsec" / "data" / "power_grid.npz"
    assert path.stat().st_size < 100_000
    a = sp.load_npz(path)
    assert a.format == "csr"
    assert a.shape == (4941, 4941)
    assert a.nnz == 2 * 6594 == 13188
    assert a.dtype == np.float32 and np.all(a.data == 1.0)
    assert (a != a.T).nnz == 0
    assert a.diagonal().sum() == 0
    a.has_canonical_format = False
    a.sum_duplicates()
    assert a.nnz == 13188
    deg = np.diff(a.indptr)
    assert deg.min() >= 1  # the grid is connected: no isolated station
