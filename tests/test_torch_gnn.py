"""sparsec.torch's graph attention and multi-head products (CPU, llvm): outputs and gradients
against dense torch autograd implementations of the same definitions (GAT's aggregation on csr,
ell, bsr and hyb), torch.autograd.gradcheck in float64 on a tiny graph (csr and hyb), the
format gat_graph picks (hyb for a hub, where GATConv trains as on csr), GATConv against torch_geometric's on the same weights (when it
imports), the generic launcher's argument checks, and examples/gat.py's CPU smoke run."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

torch = pytest.importorskip("torch")

import sparsec.torch as st  # noqa: E402
from sparsec import ops  # noqa: E402
from sparsec.torch_launch import MatrixArgs, run  # noqa: E402

from edge_ops import edge_matrix  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _mask(m: sp.csr_matrix) -> torch.Tensor:
    """The pattern (explicit zeros included) as a dense bool matrix."""
    return torch.from_numpy(sp.csr_matrix((np.ones(m.nnz), m.indices, m.indptr), shape=m.shape).toarray() > 0)


def dense_gat(M, Z, el, er, slope=ops.GAT_SLOPE):
    e = torch.nn.functional.leaky_relu(el[:, None, :] + er[None, :, :], slope)
    alpha = torch.softmax(e.masked_fill(~M[..., None], float("-inf")), dim=1).nan_to_num(0.0)  # empty rows: 0
    return torch.einsum("ijh,jhf->ihf", alpha, Z), alpha


def _dense_per_entry(M, x):
    """(stored, heads) per-entry values (CSR order) -> (rows, cols, heads) dense."""
    out = x.new_zeros(M.shape + x.shape[1:])
    out[M] = x
    return out


@pytest.fixture(scope="module")
def graph64():
    m = edge_matrix()  # 9 x 7: an empty row, a long row, an explicit zero
    return m, st.SparseTensor(m, "csr", dtype="float64", grad=True)


def _leaf(*shape, gen):
    return torch.randn(*shape, dtype=torch.float64, generator=gen).requires_grad_()


def test_gat_aggregate_and_gradients_match_dense_autograd(graph64):
    m, _ = graph64
    gen = torch.Generator().manual_seed(0)
    M = _mask(m)
    for spec in ("csr", "ell", "bsr:2x2", "hyb:1:1/2/4"):  # hyb: the long row split into pieces
        A = st.SparseTensor(m, spec, grad=True)
        Z, el, er = (x.float().detach().requires_grad_() for x in (_leaf(7, 3, 4, gen=gen), _leaf(9, 3, gen=gen),
                                                                      _leaf(7, 3, gen=gen)))
        out = st.gat_aggregate(A, Z, el, er)
        ref, _ = dense_gat(M, Z, el, er)
        assert torch.allclose(out, ref, atol=1e-5) and (out[3] == 0).all()
        g = torch.randn_like(out)
        got = torch.autograd.grad(out, (Z, el, er), g)
        want = torch.autograd.grad(ref, (Z, el, er), g)
        for a, b in zip(got, want):
            assert torch.allclose(a, b, atol=1e-5), (spec, (a - b).abs().max())
        with torch.no_grad():
            assert torch.allclose(st.gat_aggregate(A, Z, el, er), ref, atol=1e-5)


def test_edge_softmax_and_multihead_products_match_dense(graph64):
    m, A = graph64
    gen = torch.Generator().manual_seed(1)
    M = _mask(m)
    el, er = _leaf(9, 2, gen=gen), _leaf(7, 2, gen=gen)
    alpha = st.edge_softmax(A, el, er)
    assert torch.allclose(_dense_per_entry(M, alpha), dense_gat(M, torch.zeros(7, 2, 1, dtype=torch.float64),
                                                                el, er)[1])
    P, B, X = _leaf(m.nnz, 2, gen=gen), _leaf(7, 2, 3, gen=gen), _leaf(9, 2, 3, gen=gen)
    C = st.multihead_spmm(A, P, B)
    assert torch.allclose(C, torch.einsum("ijh,jhf->ihf", _dense_per_entry(M, P), B))
    S = st.multihead_sddmm(A, X, B)
    vals = torch.from_numpy(m.data.astype(np.float64))
    assert torch.allclose(S, vals[:, None] * torch.einsum("ihk,jhk->ijh", X, B)[M])


def test_gradcheck_float64(graph64):
    _, A = graph64
    gen = torch.Generator().manual_seed(2)
    Z, el, er = _leaf(7, 2, 3, gen=gen), _leaf(9, 2, gen=gen), _leaf(7, 2, gen=gen)
    P, X = _leaf(A.instance.stored, 2, gen=gen), _leaf(9, 2, 3, gen=gen)
    assert torch.autograd.gradcheck(lambda z, a, b: st.gat_aggregate(A, z, a, b, 0.1), (Z, el, er))
    hyb = st.SparseTensor(A.instance.to_scipy(), "hyb:1:1/2/4", dtype="float64", grad=True)
    assert torch.autograd.gradcheck(lambda z, a, b: st.gat_aggregate(hyb, z, a, b), (Z, el, er))
    assert torch.autograd.gradcheck(lambda a, b: st.edge_softmax(A, a, b), (el, er))
    assert torch.autograd.gradcheck(lambda p, b: st.multihead_spmm(A, p, b), (P, Z))
    assert torch.autograd.gradcheck(lambda x, y: st.multihead_sddmm(A, x, y), (X, Z))


def test_gatconv_matches_torch_geometric_on_the_same_weights():
    pyg = pytest.importorskip("torch_geometric.nn")
    n = 40
    rng = np.random.default_rng(3)
    pairs = np.unique(rng.integers(0, n, 160) * n + rng.integers(0, n, 160))
    edge_index = torch.from_numpy(np.stack([pairs // n, pairs % n]))  # distinct edges, some self-loops
    x = torch.randn(n, 8, generator=torch.Generator().manual_seed(3))
    A = st.gat_graph(edge_index, n)
    for heads, concat in ((3, True), (2, False)):
        torch.manual_seed(4)
        theirs = pyg.GATConv(8, 5, heads=heads, concat=concat)
        torch.nn.init.normal_(theirs.bias)
        ours = st.GATConv(8, 5, heads=heads, concat=concat).load_pyg(theirs)
        y_theirs, y_ours = theirs(x, edge_index), ours(A, x)
        assert torch.allclose(y_ours, y_theirs, atol=1e-5)
        g = torch.randn_like(y_ours)
        for a, b in zip(torch.autograd.grad(y_ours, [ours.lin.weight, ours.att_src, ours.att_dst, ours.bias], g),
                        torch.autograd.grad(y_theirs, [theirs.lin.weight, theirs.att_src, theirs.att_dst,
                                                       theirs.bias], g)):
            assert torch.allclose(a, b, atol=1e-4)


def test_gat_graph_follows_pyg_edge_direction_and_self_loops():
    edge_index = torch.tensor([[0, 1, 2, 2], [1, 2, 0, 2]])  # 0->1, 1->2, 2->0 and a self-loop 2->2
    m = st.gat_adjacency(edge_index, 4)
    assert m.toarray().tolist() == [[1, 0, 1, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 0, 1]]
    assert st.gat_adjacency(edge_index, 3, add_self_loops=False).nnz == 4
    with pytest.raises(ValueError, match=r"edge_index holds node 2, out of range for num_nodes=2"):
        st.gat_adjacency(edge_index, 2)


def test_gat_graph_takes_hyb_for_a_hub_and_gatconv_trains_on_it_as_on_csr():
    n = 400  # a ring, and node 0 the target of every node's edge: a row of 400 entries, mean 3
    src = np.concatenate([np.arange(n), np.arange(1, n)])
    dst = np.concatenate([(np.arange(n) + 1) % n, np.zeros(n - 1, np.int64)])
    edge_index = torch.from_numpy(np.stack([src, dst]))
    assert st.gat_format(st.gat_adjacency(edge_index, n)) == "hyb"
    assert st.gat_format(st.gat_adjacency(edge_index[:, :n], n)) == "csr"  # the ring alone: even rows
    hub = st.gat_graph(edge_index, n)  # fmt="auto"
    assert hub.format.startswith("hyb") and hub.transpose is not None
    csr = st.gat_graph(edge_index, n, fmt="csr")
    x = torch.randn(n, 6, generator=torch.Generator().manual_seed(5))
    torch.manual_seed(6)
    conv = st.GATConv(6, 4, heads=2)
    got, want = conv(hub, x), conv(csr, x)
    assert torch.allclose(got, want, atol=1e-5)
    g = torch.randn_like(got)
    params = [conv.lin.weight, conv.att_src, conv.att_dst, conv.bias]
    for a, b in zip(torch.autograd.grad(got, params, g), torch.autograd.grad(want, params, g)):
        assert torch.allclose(a, b, atol=1e-4), (a - b).abs().max()


def test_bad_arguments_are_refused_by_name(graph64):
    m, A = graph64
    Z, el, er = torch.zeros(7, 2, 3, dtype=torch.float64), torch.zeros(9, 2, dtype=torch.float64), \
        torch.zeros(7, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"Z should be \(nodes=7, heads, feat\)"):
        st.gat_aggregate(A, Z[:, 0], el, er)
    with pytest.raises(ValueError, match=r"er should be \(cols=7, heads=2\)"):
        st.gat_aggregate(A, Z, el, er[:, :1])
    with pytest.raises(TypeError, match=r"A should be a sparsec.torch.SparseTensor"):
        st.gat_aggregate(m, Z, el, er)
    no_t = st.SparseTensor(m, "csr", dtype="float64", grad=False)
    with pytest.raises(ValueError, match=r"needs A's transpose"):
        st.gat_aggregate(no_t, Z.requires_grad_(), el, er)
    args = MatrixArgs.of(A)
    with pytest.raises(TypeError, match=r"gat takes the inputs \['el', 'er', 'Z'\]"):
        run(ops.gat(), args, {"el": el, "er": er}, heads=2, feat=3)
    with pytest.raises(TypeError, match=r"gat: Z should be float64, got float32"):
        run(ops.gat(), args, {"el": el, "er": er, "Z": Z.float()}, heads=2, feat=3)
    with pytest.raises(ValueError, match=r"gat: er should have shape \(7, 2\)"):
        run(ops.gat(), args, {"el": el, "er": er[:5], "Z": Z}, heads=2, feat=3)


def test_gat_example_smoke_on_cpu(tmp_path):
    pytest.importorskip("torch_geometric")
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import gat as example
    finally:
        sys.path.remove(str(ROOT / "examples"))
    out = tmp_path / "res"
    (out).mkdir()
    (out / "gnn_ops_cpu.json").write_text(json.dumps({"rows": [{"model": "RGCN", "graph": "x"}]}))
    assert example.main(["--graph", "tiny", "--out", str(out), "--runs", "2"]) == 0
    res = json.loads((out / "gnn_ops_cpu.json").read_text())
    models = [r["model"] for r in res["rows"]]
    assert models.count("RGCN") == 1 and models.count("GAT") == 1  # merged, other models' rows kept
    row = next(r for r in res["rows"] if r["model"] == "GAT")
    assert row["max_rel_err_out"] < 1e-4 and row["max_rel_err_grad"] < 1e-3
