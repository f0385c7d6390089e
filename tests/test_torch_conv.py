"""sparsec.torch's one-node graph convolutions (issue 27): GCNConv and SAGEConv against a
float64 dense reference (outputs and every gradient) on awkward graphs in each format that
trains, against PyG's SAGEConv on the same weights, the composed fallback path, and bad input."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

torch = pytest.importorskip("torch")
st = pytest.importorskip("sparsec.torch")

from sparsec.torch_conv import fused as _fused  # noqa: E402


def awkward_graph(n: int, seed: int) -> sp.csr_matrix:
    """Random edges with explicit zeros, empty rows, a hub row and a hub column."""
    rng = np.random.default_rng(seed)
    m = sp.random(n, n, density=0.06, format="lil", random_state=seed, dtype=np.float64)
    m[: n // 8, :] = 0                            # empty rows
    m[n // 2, :] = rng.random(n)                  # a hub row
    m[:, n // 3] = rng.random((n, 1))             # a hub column
    m = m.tocsr()
    m.data[:: 7] = 0.0                            # explicit zeros stay stored
    return m


@pytest.fixture(autouse=True)
def nan_poisoned_empty():
    """torch.empty fills with NaN: an output element a kernel fails to write shows."""
    import torch.utils.deterministic as det

    old_mode, old_fill = torch.are_deterministic_algorithms_enabled(), det.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    det.fill_uninitialized_memory = True
    yield
    torch.use_deterministic_algorithms(old_mode, warn_only=True)
    det.fill_uninitialized_memory = old_fill


def dense_grads(fn, dense_a, params, x):
    """Output and gradients (x, params...) of ``fn`` on float64 copies, for a fixed weighting."""
    x64 = x.detach().cpu().double().requires_grad_(True)
    p64 = [p.detach().cpu().double().requires_grad_(True) for p in params]
    out = fn(torch.from_numpy(np.asarray(dense_a, dtype=np.float64)), x64, *p64)
    w = torch.linspace(-1, 1, out.numel(), dtype=torch.float64).reshape(out.shape)
    (out * w).sum().backward()
    return out.detach(), [x64.grad] + [p.grad for p in p64], w


def close(a, b, tol=2e-5):
    scale = max(float(b.abs().max()), 1.0)
    return float((a.double() - b).abs().max()) <= tol * scale


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])  # the GPU host runs this file too


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["csr", "hyb", "ell", "bsr:4x4"])
@pytest.mark.parametrize("widths", [(24, 8), (8, 24)])  # project first / aggregate first
@pytest.mark.parametrize("x_grad", [True, False])  # a first layer's x needs none: aggregate first
def test_gcn_and_sage_match_float64_dense_autograd(fmt, widths, device, x_grad):
    fin, fout = widths
    adj = awkward_graph(53, 0)
    torch.manual_seed(0)
    x = torch.randn(53, fin, device=device, requires_grad=x_grad)
    a_hat, a_mean = st.gcn_norm(adj), st.mean_adjacency(adj)
    gcn, sage = st.GCNConv(fin, fout).to(device), st.SAGEConv(fin, fout).to(device)
    cases = [
        (gcn, a_hat, lambda a, x, w, b: a @ (x @ w) + b, [gcn.weight, gcn.bias]),
        (sage, a_mean, lambda a, x, w, b: (a @ x) @ w[:fout].t() + x @ w[fout:].t() + b,  # w = [Wl; Wr]
         [sage.weight, sage.bias]),
    ]
    for layer, mat, ref, params in cases:
        A = st.SparseTensor(mat, fmt, device=device)
        assert _fused(A, x, *params)
        want, grads, w = dense_grads(ref, mat.toarray(), params, x)
        x.grad = None
        layer.zero_grad()
        out = layer(A, x)
        assert out.grad_fn is not None and type(out.grad_fn).__name__.startswith(("_GCN", "_SAGE"))
        if layer is sage:  # projecting first on [A | I] interleaved, except on bsr (it would lose its blocks)
            want_mode = "aggregate" if not (x_grad and fin > fout) else "project" if fmt.startswith("bsr") else "root"
            assert out.grad_fn.mode == want_mode
        assert close(out.detach().cpu(), want)
        (out * w.float().to(device)).sum().backward()
        got_grads = ([x.grad] if x_grad else []) + [p.grad for p in params]
        for got, exp in zip(got_grads, grads if x_grad else grads[1:]):
            assert close(got.cpu(), exp), (type(layer).__name__, fmt)


@pytest.mark.parametrize("widths", [(24, 8), (8, 24)])
def test_sage_with_frozen_weights_still_gives_x_its_gradient(widths):
    """Only x's gradient asked for (the weight and bias frozen): the stacked-gradient path
    skips the weight product and must still give dx = A^T dY Wl + dY Wr."""
    fin, fout = widths
    adj = awkward_graph(37, 6)
    a_mean = st.mean_adjacency(adj)
    sage = st.SAGEConv(fin, fout)
    sage.requires_grad_(False)
    x = torch.randn(37, fin, requires_grad=True)
    ref = lambda a, x, w, b: (a @ x) @ w[:fout].t() + x @ w[fout:].t() + b
    want, grads, w = dense_grads(ref, a_mean.toarray(), [sage.weight, sage.bias], x)
    out = sage(st.SparseTensor(a_mean, "hyb"), x)
    assert type(out.grad_fn).__name__.startswith("_SAGE")
    (out * w.float()).sum().backward()
    assert close(out.detach(), want) and close(x.grad, grads[0])
    assert sage.weight.grad is None and sage.weight_l.data_ptr() == sage.weight.data_ptr()


def test_root_augmented_matrix_is_kept_until_the_values_change():
    adj = awkward_graph(29, 7)
    A = st.SparseTensor(st.mean_adjacency(adj), "hyb")
    aug = st.root_augmented(A)
    assert aug is st.root_augmented(A) and aug.shape == (29, 58)
    want = np.zeros((29, 58))
    want[:, 0::2], want[np.arange(29), 2 * np.arange(29) + 1] = A.to_dense().numpy(), 1.0
    assert np.allclose(aug.to_dense().numpy(), want)
    with torch.no_grad():
        A.values.mul_(2)  # changed in place: rebuilt from the new values
    again = st.root_augmented(A)
    assert again is not aug and np.allclose(again.to_dense().numpy()[:, 0::2], 2 * want[:, 0::2])
    assert st.root_augmented(st.SparseTensor(st.mean_adjacency(adj), "bsr:2x2")) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU (the GPU host runs this)")
@pytest.mark.parametrize("fmt", ["csr", "hyb", "bsr:4x4"])
def test_a_captured_training_step_replays_the_eager_one(fmt):
    """Issue 27's captured path: a two-layer GCN and a two-layer GraphSAGE (both projection
    orders, SAGE's root-augmented matrix) trained by replaying one captured step, against a
    copy trained eagerly."""
    import copy

    adj = awkward_graph(61, 8)
    x = torch.randn(61, 24, device="cuda")
    y = torch.randint(0, 5, (61,), device="cuda")
    for layer, mat in ((st.GCNConv, st.gcn_norm(adj)), (st.SAGEConv, st.mean_adjacency(adj))):
        A = st.SparseTensor(mat, fmt, device="cuda")
        torch.manual_seed(0)
        net = torch.nn.ModuleList([layer(24, 12), layer(12, 5)]).cuda()
        twin = copy.deepcopy(net)
        opts = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (net, twin)]

        def step(m, opt):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m[1](A, torch.relu(m[0](A, x))), y).backward()
            opt.step()

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                step(net, opts[0])
                step(twin, opts[1])
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step(net, opts[0])
        for _ in range(3):
            graph.replay()
            step(twin, opts[1])
        torch.cuda.synchronize()
        for p, q in zip(net.parameters(), twin.parameters()):
            assert torch.allclose(p, q, rtol=1e-4, atol=1e-6), (layer.__name__, fmt)


def test_layers_compose_the_ops_where_the_matrix_trains():
    adj = awkward_graph(40, 1)
    x = torch.randn(40, 12)
    gcn = st.GCNConv(12, 5)
    fixed = st.SparseTensor(st.gcn_norm(adj))
    trained = st.SparseTensor(st.gcn_norm(adj), requires_grad=True)
    assert not _fused(trained, x, gcn.weight, gcn.bias)
    out = gcn(trained, x)
    assert type(out.grad_fn).__name__ == "AddBackward0"  # composed: Linear, SpMM, + bias
    assert torch.allclose(out, gcn(fixed, x), atol=1e-5)
    out.sum().backward()
    assert trained.values.grad is not None and gcn.weight.grad is not None


def test_sageconv_matches_torch_geometric_on_the_same_weights():
    pyg = pytest.importorskip("torch_geometric.nn")
    adj = awkward_graph(47, 2)
    coo = adj.tocoo()
    edge_index = torch.from_numpy(np.vstack([coo.col, coo.row]).astype(np.int64))  # j -> i: row i lists j
    torch.manual_seed(3)
    for fin, fout in ((16, 6), (6, 16)):
        ref = pyg.SAGEConv(fin, fout, aggr="mean")
        ours = st.SAGEConv(fin, fout).load_pyg(ref)
        A = st.SparseTensor(st.mean_adjacency(sp.csr_matrix((np.ones(adj.nnz), adj.indices, adj.indptr),
                                                            shape=adj.shape)))
        x = torch.randn(47, fin)
        assert torch.allclose(ours(A, x), ref(x, edge_index), atol=1e-5)


def test_gcnconv_matches_torch_geometric_on_the_same_weights():
    pyg = pytest.importorskip("torch_geometric.nn")
    adj = awkward_graph(41, 5)
    adj = ((adj + adj.T) > 0).astype(np.float32).tolil()
    adj.setdiag(0)  # PyG adds the self-loops, as gcn_norm does
    adj = adj.tocsr()
    adj.eliminate_zeros()
    coo = adj.tocoo()
    edge_index = torch.from_numpy(np.vstack([coo.col, coo.row]).astype(np.int64))
    torch.manual_seed(4)
    ref = pyg.GCNConv(9, 5)
    torch.nn.init.uniform_(ref.bias, -1, 1)  # PyG starts it at zero: make it count
    ours = st.GCNConv(9, 5).load_pyg(ref)
    x = torch.randn(41, 9)
    assert torch.allclose(ours(st.SparseTensor(st.gcn_norm(adj)), x), ref(x, edge_index), atol=1e-5)


def test_bad_input_is_named():
    A = st.SparseTensor(st.gcn_norm(awkward_graph(30, 4)))
    gcn, sage = st.GCNConv(8, 4), st.SAGEConv(8, 4)
    with pytest.raises(ValueError, match="x should have 8 features"):
        gcn(A, torch.randn(30, 7))
    with pytest.raises(ValueError, match="x should be 2-D with 30 rows"):
        sage(A, torch.randn(29, 8))
    with pytest.raises(TypeError, match="x should be torch.float32"):
        gcn(A, torch.randn(30, 8, dtype=torch.float64))
    with pytest.raises(TypeError, match="x should be a torch tensor"):
        gcn(A, np.zeros((30, 8), np.float32))
    with pytest.raises(TypeError, match="A should be a sparsec.torch.SparseTensor"):
        gcn(sp.identity(30, format="csr"), torch.randn(30, 8))
    rect = st.SparseTensor(sp.random(30, 20, density=0.2, format="csr", dtype=np.float32, random_state=0))
    with pytest.raises(ValueError, match="a_mean should be square"):
        sage(rect, torch.randn(20, 8))


def test_parameters_of_another_dtype_take_the_composed_ops_not_a_kernel():
    """A bias left in float64 beside float32 weights and matrix: the one-node path would hand
    it to a float32 kernel; the composed ops add it with torch's promotion instead."""
    adj = awkward_graph(33, 9)
    A = st.SparseTensor(st.mean_adjacency(adj), "hyb")
    sage = st.SAGEConv(6, 3)
    sage.bias = torch.nn.Parameter(sage.bias.detach().double())
    x = torch.randn(33, 6)
    assert not _fused(A, x, sage.weight, sage.bias)
    out = sage(A, x)
    want = torch.from_numpy(st.mean_adjacency(adj).toarray()) @ x @ sage.weight_l.t() + x @ sage.weight_r.t()
    assert out.dtype == torch.float64 and torch.allclose(out, want.double() + sage.bias, atol=1e-5)


def test_load_pyg_names_a_weight_of_the_wrong_shape():
    pyg = pytest.importorskip("torch_geometric.nn")
    with pytest.raises(ValueError, match=r"conv.lin_l.weight should be out x in = \(4, 8\)"):
        st.SAGEConv(8, 4).load_pyg(pyg.SAGEConv(8, 5, aggr="mean"))
    with pytest.raises(ValueError, match=r"conv.lin.weight should be out x in = \(4, 8\)"):
        st.GCNConv(8, 4).load_pyg(pyg.GCNConv(7, 4))
