"""The GNN layers users would otherwise pick, for side-by-side runs with sparsec: PyG's
``RGCNConv``, ``FastRGCNConv``, ``GATConv`` and ``GCNConv``, and RGCN as a loop of
``torch.sparse.mm`` over relations. Also the shared inputs: graphs from the benchmark cache
with one relation drawn per edge (fixed seed), and two-layer models built from any layer.

Why a module of its own: ``examples/rgcn.py``, ``examples/gat.py`` and
``benchmarks/time_gnn_peers.py`` must compare against exactly the same peers on exactly
the same inputs and weights.

Edge direction follows PyG (``flow="source_to_target"``): for an adjacency matrix whose
row i lists the neighbours j that node i aggregates, ``edge_index = [j, i]``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import scipy.sparse as sp

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "benchmarks" / "data" / "cache"
RELATION_SEED = 22  # relations drawn per edge with this seed, for every graph and R


def load_graph(name: str) -> sp.csr_matrix:
    """A cached graph (``benchmarks/data``: real graphs, ``rmat-s<k>`` generated with the
    suite's fixed seeds), symmetrised, pattern only (float32 ones), no self-loops."""
    from sparsec.bench.suites import RMAT_SPECS, rmat_graph
    from sparsec.datasets import default_matrix, load_npz

    rmat = {s.name: s for s in RMAT_SPECS}
    if name in rmat:
        m = rmat_graph(CACHE, rmat[name], pattern_only=True)
    elif (CACHE / f"{name}.npz").exists():
        m = load_npz(CACHE / f"{name}.npz")
    elif name == "power-grid":
        m = default_matrix()
    else:
        raise SystemExit(f"no graph {name!r}: not in {CACHE} (run benchmarks/data/fetch.py) and not an R-MAT "
                         f"of the suite ({', '.join(rmat)})")
    m = sp.csr_matrix((np.ones(m.nnz, np.float32), m.indices, m.indptr), shape=m.shape)
    m = ((m + m.T) > 0).astype(np.float32).tocsr()
    m.setdiag(0)
    m.eliminate_zeros()
    m.sort_indices()
    return m


def draw_relations(adj: sp.csr_matrix, relations: int, seed: int = RELATION_SEED) -> np.ndarray:
    """One relation in [0, relations) per stored entry of ``adj`` (CSR order), uniform."""
    return np.random.default_rng(seed).integers(0, relations, adj.nnz).astype(np.int64)


def node_inputs(torch, n: int, features: int, classes: int, device):
    """(x, labels): the random node features and class labels every GNN comparison feeds
    its models, drawn with one fixed seed so that every script sees the same ones."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, features, generator=gen).to(device)
    labels = torch.randint(0, classes, (n,), generator=gen).to(device)
    return x, labels


def edge_index(adj: sp.csr_matrix) -> np.ndarray:
    """PyG's ``[2, E]`` (source j, target i) for CSR order."""
    rows = np.repeat(np.arange(adj.shape[0]), np.diff(adj.indptr))
    return np.stack([adj.indices.astype(np.int64), rows.astype(np.int64)])


def relation_mean_matrices(adj: sp.csr_matrix, etype: np.ndarray, relations: int) -> List[sp.csr_matrix]:
    """A_r = D_r^-1 (entries of relation r), the mean aggregation RGCNConv computes per relation."""
    rows = np.repeat(np.arange(adj.shape[0]), np.diff(adj.indptr))
    out = []
    for r in range(relations):
        keep = etype == r
        a = sp.csr_matrix((np.ones(int(keep.sum()), np.float32), (rows[keep], adj.indices[keep])), shape=adj.shape)
        deg = np.asarray(a.sum(axis=1)).ravel()
        out.append((sp.diags(np.where(deg > 0, 1.0 / np.maximum(deg, 1), 0.0)) @ a).tocsr().astype(np.float32))
    return out


def pyg_paths() -> Dict[str, bool]:
    """Which optional compiled backends PyG found: without them it runs on torch's own
    scatter / index_select / matmul paths (what the results were measured with)."""
    import torch_geometric.typing as t

    return {name: bool(getattr(t, name, False)) for name in
            ("WITH_PYG_LIB", "WITH_TORCH_SCATTER", "WITH_TORCH_SPARSE", "WITH_SEGMM", "WITH_SAMPLED_OP",
             "WITH_INDEX_SORT", "WITH_SOFTMAX")}


def torch_csr(torch, m: sp.csr_matrix, device):
    return torch.sparse_csr_tensor(torch.from_numpy(m.indptr.astype(np.int64)),
                                   torch.from_numpy(m.indices.astype(np.int64)),
                                   torch.from_numpy(m.data.astype(np.float32)), m.shape).to(device)


def rgcn_layers(torch, relations: int) -> Dict[str, type]:
    """name -> layer class ``(in, out) -> module(x, graph)`` computing PyG's RGCNConv
    (aggr="mean", root weight, bias): out_i = x_i W_root + b + sum_r mean_{j in N_r(i)} x_j W_r.
    ``graph`` is the dict of :func:`rgcn_graph`."""
    from torch_geometric.nn import FastRGCNConv, RGCNConv

    class PyG(torch.nn.Module):
        conv_cls = RGCNConv

        def __init__(self, n_in, n_out):
            super().__init__()
            self.conv = self.conv_cls(n_in, n_out, relations, aggr="mean")

        def forward(self, x, g):
            return self.conv(x, g["edge_index"], g["edge_type"])

    class PyGFast(PyG):
        conv_cls = FastRGCNConv

    class TorchSparseLoop(torch.nn.Module):
        """One torch.sparse.mm (cuSPARSE) per relation on the row-normalised A_r, then its
        weight: aggregate, then transform, as RGCNConv does."""

        def __init__(self, n_in, n_out):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.empty(relations, n_in, n_out))
            self.root = torch.nn.Parameter(torch.empty(n_in, n_out))
            self.bias = torch.nn.Parameter(torch.zeros(n_out))
            torch.nn.init.xavier_uniform_(self.weight)
            torch.nn.init.xavier_uniform_(self.root)

        def forward(self, x, g):
            out = x @ self.root + self.bias
            for r, a in enumerate(g["mean_csr"]):
                out = out + torch.sparse.mm(a, x) @ self.weight[r]
            return out

    return {"pyg_RGCNConv": PyG, "pyg_FastRGCNConv": PyGFast, "torch_sparse_loop": TorchSparseLoop}


def set_rgcn_weights(torch, layer, weights) -> None:
    """Give ``layer`` (any layer of :func:`rgcn_layers`) the ``(W, W_root, bias)`` tensors."""
    with torch.no_grad():
        for dst, src in zip(rgcn_weights(layer), weights):
            dst.copy_(src)


def rgcn_weights(layer):
    """(W [R, in, out], W_root [in, out], bias [out]) of a layer of :func:`rgcn_layers`."""
    if hasattr(layer, "conv"):
        return layer.conv.weight, layer.conv.root, layer.conv.bias
    return layer.weight, layer.root, layer.bias


def rgcn_graph(torch, adj: sp.csr_matrix, etype: np.ndarray, relations: int, device) -> Dict[str, object]:
    """Everything the RGCN peers take, on ``device``: PyG's edge_index / edge_type and the
    loop's per-relation mean matrices."""
    return {"edge_index": torch.from_numpy(edge_index(adj)).to(device),
            "edge_type": torch.from_numpy(etype).to(device),
            "mean_csr": [torch_csr(torch, a, device) for a in relation_mean_matrices(adj, etype, relations)]}


def gat_layer(torch, heads: int):
    """PyG's GATConv (concat heads, self-loops added, LeakyReLU 0.2, no dropout)."""
    from torch_geometric.nn import GATConv

    class PyGGAT(torch.nn.Module):
        def __init__(self, n_in, n_out):
            super().__init__()
            if n_out % heads:
                raise ValueError(f"output width {n_out} should be a multiple of heads={heads}")
            self.conv = GATConv(n_in, n_out // heads, heads=heads)

        def forward(self, x, g):
            return self.conv(x, g["edge_index"])

    return PyGGAT


def two_layer(torch, layer_cls, n_in: int, hidden: int, classes: int):
    """layer -> ReLU -> layer: the model timed for forward and for a training step."""

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l1, self.l2 = layer_cls(n_in, hidden), layer_cls(hidden, classes)

        def forward(self, x, g):
            return self.l2(torch.relu(self.l1(x, g)), g)

    return Model


def step_functions(torch, model, x, g, labels) -> Tuple[object, object]:
    """(forward without grad, one SGD training step with cross-entropy) as zero-argument calls."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def forward():
        with torch.no_grad():
            return model(x, g)

    def train_step():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x, g), labels).backward()
        opt.step()

    return forward, train_step
