"""Graph attention and multi-head sparse products for PyTorch, with autograd (re-exported by
``sparsec.torch``).

    import sparsec.torch as st
    A = st.gat_graph(edge_index, num_nodes, device="cuda")   # CSR of the edges j -> i, self-loops added
    conv = st.GATConv(64, 16, heads=4)                        # PyG's GATConv, same parameters
    h = conv(A, x)                                            # (nodes, 4 * 16)

Every sparse step is a library operator of ``sparsec.ops`` launched through
``sparsec.torch_launch.run``: the forward pass of a GAT layer's aggregation is one operator
(``ops.gat``: logits, edge softmax and the weighted sum; 3 launches on CUDA on CSR, for the
row max, the row sum and the aggregation; ``gat(stats=True)`` when training, which also
returns the row max and sum). No per-edge tensor is kept or made for the backward pass: with
``lse = mx + log(s)`` it rebuilds alpha from node arrays inside two operators,

    d_el     = sum over A's rows of de                        (``ops.gat_grad_rows`` on A)
    dZ, d_er = sum over A^T's rows of alpha dO, and of de     (``ops.gat_grad_cols`` on A's transpose)
    de       = alpha * leaky_relu'(el[i] + er[j]) * dO[i] . (Z[j] - O[i])

each an SpMM-like row reduction into dense outputs, so GATConv trains on any format with a
transpose (csr, ell, bsr, and hyb, whose split rows cut the hubs of power-law graphs:
``gat_format`` picks it for ``gat_graph(..., fmt="auto")``).

Layouts: node features per head are ``(nodes, heads, feat)``, per-node logits ``(nodes,
heads)``, per-edge values ``(stored, heads)`` in the matrix's slot layout (for CSR, the
canonical CSR order of ``A.instance.to_scipy()``). A's values are not read by GAT (its
pattern is the neighbourhood); :func:`multihead_sddmm` scales by them.
"""
from __future__ import annotations

import functools
import math
from typing import Optional, Tuple

import numpy as np
import scipy.sparse as sp
import torch

from . import ops
from .torch_launch import MatrixArgs, run, transpose_values

__all__ = ["gat_adjacency", "gat_format", "multihead_spmm", "multihead_sddmm", "edge_softmax", "gat_aggregate", "GATConv"]


@functools.lru_cache(maxsize=64)
def _op(name: str, *args):
    """The library operator ``ops.<name>(*args)``, built once (building a DSL operator costs
    ~0.1 ms of host time, too much for every call of a training step)."""
    return getattr(ops, name)(*args)


# ---- the graph ----------------------------------------------------------------------------------
def gat_adjacency(edges, num_nodes: Optional[int] = None, *, add_self_loops: bool = True) -> sp.csr_matrix:
    """The adjacency GAT aggregates over, float32 ones in canonical CSR: row i lists the sources j
    of the edges j -> i (``sparsec.torch.gat_graph`` makes it a SparseTensor).

    ``edges`` is PyG's ``edge_index`` (``[2, E]``: source j, target i; a torch tensor or numpy
    array) or a scipy matrix whose row i lists i's neighbours. As PyG's GATConv does by default,
    ``add_self_loops`` removes existing self-loops and adds one per node. Duplicate edges are
    merged (counted once in the softmax; PyG would count a repeated edge twice)."""
    if sp.issparse(edges):
        if edges.shape[0] != edges.shape[1]:
            raise ValueError(f"the adjacency should be square (nodes x nodes), got {edges.shape}")
        n = edges.shape[0]
        coo = sp.coo_matrix(edges)
        rows, cols = coo.row.astype(np.int64), coo.col.astype(np.int64)
    else:
        e = edges.detach().cpu().numpy() if isinstance(edges, torch.Tensor) else np.asarray(edges)
        if e.ndim != 2 or e.shape[0] != 2:
            raise ValueError(f"edge_index should have shape [2, E] (source j, target i), got {tuple(e.shape)}")
        e = e.astype(np.int64)
        n = int(num_nodes) if num_nodes is not None else (int(e.max()) + 1 if e.size else 0)
        if e.size and (e.min() < 0 or e.max() >= n):
            bad = int(e.min()) if e.min() < 0 else int(e.max())
            raise ValueError(f"edge_index holds node {bad}, out of range for num_nodes={n}")
        rows, cols = e[1], e[0]
    if add_self_loops:
        keep = rows != cols
        loops = np.arange(n, dtype=np.int64)
        rows, cols = np.concatenate([rows[keep], loops]), np.concatenate([cols[keep], loops])
    m = sp.csr_matrix((np.ones(rows.size, np.float32), (rows, cols)), shape=(n, n))
    m.sum_duplicates()
    m.data[:] = 1.0
    m.sort_indices()
    return m


HUB_RATIO = 32   # gat_format: hyb where the longest row (or column) holds more than this many times the mean
HUB_MIN = 256    # ... and more than this many entries


def gat_format(adj: sp.spmatrix) -> str:
    """The format ``gat_graph(..., fmt="auto")`` takes for the adjacency ``adj``: ``"hyb"`` where
    its row or column lengths are skewed -- the longest row of A or of A's transpose holds more
    than ``HUB_RATIO`` (32) times the mean and more than ``HUB_MIN`` (256) entries -- else ``"csr"``.

    Why: on CSR every GAT kernel (forward on A; backward on A and on A's transpose, whose rows
    are A's columns) gives a row to one group of threads (16 for 4 heads x 16 features, one
    for the row max and sum), so it lasts at least as long as its longest row's serial chain
    of gathers. An H100 holds about 17K such groups at once: a graph of n nodes is done in
    about n / 17K waves of mean-length rows, and a row longer than 32x the mean outlasts them
    up to n ~ 500K nodes (R-MAT s18: 262K nodes, mean 29, longest 25.6K: the hub's chain is
    ~50x the ~15 waves of the other rows; a mesh's rows never reach 32x the mean). hyb splits
    such rows into pieces of its widest bucket, added atomically, at the price of more
    launches (a zero-fill before each split reduction: 14 instead of 8 per layer and training
    step) and atomics: under 256 entries the longest row costs a few microseconds, less than
    those launches, so small or even graphs stay on CSR. Thresholds from this estimate, not a
    sweep: ``examples/gat.py --format csr|hyb`` measures both."""
    m = sp.csr_matrix(adj)
    if m.nnz == 0:
        return "csr"
    longest = max(int(np.diff(m.indptr).max()), int(np.bincount(m.indices, minlength=m.shape[1]).max()))
    mean = m.nnz / max(1, max(m.shape))
    return "hyb" if longest > HUB_RATIO * mean and longest > HUB_MIN else "csr"


def _slots(A):
    """Per stored slot of A (cached on it): row and column (0 at padding), the ones used as the
    matrix's values where only its pattern counts, and the same for A's transpose."""
    cache = A.__dict__.get("_gnn_slots")
    if cache is None or cache[0] != A.values.device:
        rows, cols = A.instance.stored_coords()
        dev = A.values.device
        t_stored = int(A.transpose[2].numel()) if A.transpose is not None else 0
        cache = (A.values.device,
                 torch.from_numpy(np.maximum(rows, 0).astype(np.int64)).to(dev),
                 torch.from_numpy(np.maximum(cols, 0).astype(np.int64)).to(dev),
                 torch.ones(A.values.shape, dtype=A.values.dtype, device=dev) if A.entries is None else A.entries,
                 torch.ones(t_stored, dtype=A.values.dtype, device=dev))
        A.__dict__["_gnn_slots"] = cache
    return cache[1:]


def _check_graph(A):
    if not all(hasattr(A, a) for a in ("key", "index", "instance", "transpose")):  # a sparsec.torch.SparseTensor
        raise TypeError(f"A should be a sparsec.torch.SparseTensor (e.g. sparsec.torch.gat_graph), got "
                        f"{type(A).__name__}")


def _heads_feat(name: str, x: torch.Tensor, rows: int) -> Tuple[int, int]:
    if x.dim() != 3 or x.shape[0] != rows:
        raise ValueError(f"{name} should be (nodes={rows}, heads, feat), got shape {tuple(x.shape)}")
    return int(x.shape[1]), int(x.shape[2])


def _needs_transpose(A, why: str):
    if A.transpose is None:
        raise ValueError(f"{why} needs A's transpose: build A with grad=True (sparsec.torch.SparseTensor(..., "
                         f"grad=True) or gat_graph) in csr, ell, hyb or bsr")


# ---- multi-head SpMM ----------------------------------------------------------------------------
def _mh_spmm(A: MatrixArgs, P, B):
    H, F = int(B.shape[1]), int(B.shape[2])
    return run(_op("multihead_spmm"), A, {"P": P.contiguous(), "B": B.contiguous()}, heads=H, feat=F)[0]


def _mh_sddmm(A: MatrixArgs, X, Y):
    H, F = int(X.shape[1]), int(X.shape[2])
    return run(_op("multihead_sddmm"), A, {"X": X.contiguous(), "Y": Y.contiguous()}, heads=H, feat=F)[0]


class _MultiheadSpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, P, B, A):
        ctx.A = A
        ctx.save_for_backward(P, B)
        return _mh_spmm(MatrixArgs.of(A), P, B)

    @staticmethod
    def backward(ctx, dC):
        P, B = ctx.saved_tensors
        A = ctx.A
        _, _, ones, t_ones = _slots(A)
        dC = dC.contiguous()
        dP = dB = None
        if ctx.needs_input_grad[0]:  # dP[i, j, h] = dC[i, h, :] . B[j, h, :] on A's pattern (0 at padding)
            dP = _mh_sddmm(MatrixArgs.of(A, ones), dC, B)
        if ctx.needs_input_grad[1]:  # dB[j, h, f] = sum_i P[i, j, h] dC[i, h, f]: A^T's multi-head SpMM
            dB = _mh_spmm(MatrixArgs.transpose_of(A, t_ones), transpose_values(A, P), dC)
        return dP, dB, None


def multihead_spmm(A, P: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """``C[i, h, f] = sum_j P[i, j, h] * B[j, h, f]`` over A's stored entries (A's values not read).
    P: ``(stored, heads)`` per-slot weights; B: ``(cols, heads, feat)``; C: ``(rows, heads,
    feat)``. Differentiable in P and B (the backward pass needs A built with ``grad=True``)."""
    _check_graph(A)
    _heads_feat("B", B, A.shape[1])
    if (P.requires_grad or B.requires_grad) and torch.is_grad_enabled():
        _needs_transpose(A, "the backward pass of multihead_spmm")
        return _MultiheadSpMM.apply(P, B, A)
    return _mh_spmm(MatrixArgs.of(A), P, B)


class _MultiheadSDDMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, X, Y, A):
        ctx.A = A
        ctx.save_for_backward(X, Y)
        return _mh_sddmm(MatrixArgs.of(A), X, Y)

    @staticmethod
    def backward(ctx, dC):
        X, Y = ctx.saved_tensors
        A = ctx.A
        _, _, _, t_ones = _slots(A)
        W = dC * A.values.detach().unsqueeze(-1)  # dC[i, j, h] * A[i, j]
        dX = dY = None
        if ctx.needs_input_grad[0]:
            dX = _mh_spmm(MatrixArgs.of(A), W, Y)
        if ctx.needs_input_grad[1]:
            dY = _mh_spmm(MatrixArgs.transpose_of(A, t_ones), transpose_values(A, W), X)
        return dX, dY, None


def multihead_sddmm(A, X: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    """``C[i, j, h] = A[i, j] * sum_k X[i, h, k] * Y[j, h, k]`` at A's stored slots, ``(stored,
    heads)`` (0 at padding). X: ``(rows, heads, feat)``, Y: ``(cols, heads, feat)``.
    Differentiable in X and Y (not in A's values)."""
    _check_graph(A)
    _heads_feat("X", X, A.shape[0])
    _heads_feat("Y", Y, A.shape[1])
    if (X.requires_grad or Y.requires_grad) and torch.is_grad_enabled():
        _needs_transpose(A, "the backward pass of multihead_sddmm")
        return _MultiheadSDDMM.apply(X, Y, A)
    return _mh_sddmm(MatrixArgs.of(A), X, Y)


# ---- edge softmax and GAT's aggregation ------------------------------------------------------------
def _alpha(A, el, er, slope: float):
    return run(_op("edge_softmax", slope), MatrixArgs.of(A), {"el": el.contiguous(), "er": er.contiguous()},
               heads=int(el.shape[1]))[0]


def _logit_grad(A, alpha, dalpha, row_dot, el, er, slope: float):
    """(del, der) from the softmax's backward pass: de = alpha * (dalpha - row_dot[i]) through
    the LeakyReLU at e = el[i] + er[j], summed over each row (el) and each column (er)."""
    rows, cols, _, _ = _slots(A)
    de = alpha * (dalpha - row_dot[rows])
    de = torch.where(el[rows] + er[cols] > 0, de, de * slope)
    d_el = torch.zeros_like(el).index_add_(0, rows, de)
    d_er = torch.zeros_like(er).index_add_(0, cols, de)
    return d_el, d_er


class _EdgeSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, el, er, A, slope):
        alpha = _alpha(A, el, er, slope)
        ctx.A, ctx.slope = A, slope
        ctx.save_for_backward(el, er, alpha)
        return alpha

    @staticmethod
    def backward(ctx, dalpha):
        el, er, alpha = ctx.saved_tensors
        rows, _, _, _ = _slots(ctx.A)
        row_dot = torch.zeros_like(el).index_add_(0, rows, alpha * dalpha)  # sum_j alpha * dalpha per (i, h)
        d_el, d_er = _logit_grad(ctx.A, alpha, dalpha.contiguous(), row_dot, el, er, ctx.slope)
        return d_el, d_er, None, None


def _check_logits(A, el, er) -> int:
    if el.dim() != 2 or el.shape[0] != A.shape[0]:
        raise ValueError(f"el should be (rows={A.shape[0]}, heads), got shape {tuple(el.shape)}")
    if er.dim() != 2 or er.shape[0] != A.shape[1] or er.shape[1] != el.shape[1]:
        raise ValueError(f"er should be (cols={A.shape[1]}, heads={el.shape[1]}), got shape {tuple(er.shape)}")
    return int(el.shape[1])


def edge_softmax(A, el: torch.Tensor, er: torch.Tensor,
                 negative_slope: float = ops.GAT_SLOPE) -> torch.Tensor:
    """GAT's attention weights ``softmax_j(leaky_relu(el[i, h] + er[j, h]))`` per stored slot and
    head, ``(stored, heads)`` (``ops.edge_softmax``). Differentiable in el and er."""
    _check_graph(A)
    _check_logits(A, el, er)
    if (el.requires_grad or er.requires_grad) and torch.is_grad_enabled():
        return _EdgeSoftmax.apply(el, er, A, float(negative_slope))
    return _alpha(A, el, er, float(negative_slope))


def _transpose_args(A) -> MatrixArgs:
    """A's transpose for the GAT gradient operators, which read its pattern only: ones as its
    values (made once, cached on A)."""
    t_ones = A.__dict__.get("_gat_t_ones")
    if t_ones is None or t_ones.device != A.values.device or t_ones.dtype != A.values.dtype:
        t_ones = torch.ones(int(A.transpose[2].numel()), dtype=A.values.dtype, device=A.values.device)
        A.__dict__["_gat_t_ones"] = t_ones
    return MatrixArgs.transpose_of(A, t_ones)


def _gat_forward(A, Z, el, er, slope: float, stats: bool):
    """``ops.gat`` (or ``gat(stats=True)``: O, mx, s) on A."""
    H, F = int(Z.shape[1]), int(Z.shape[2])
    return run(_op("gat", slope, stats), MatrixArgs.of(A), {"el": el.contiguous(), "er": er.contiguous(),
                                                         "Z": Z.contiguous()}, heads=H, feat=F)


class _GATAggregate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, Z, el, er, A, slope):
        O, mx, s = _gat_forward(A, Z, el, er, slope, stats=True)
        ctx.A, ctx.slope = A, slope
        # the softmax's log-sum-exp per row and head: alpha = exp(e - lse); a row without
        # entries (lse = -inf) is never read, its s being 0
        ctx.save_for_backward(Z, el, er, O, mx + torch.log(s))
        return O

    @staticmethod
    def backward(ctx, dO):
        Z, el, er, O, lse = ctx.saved_tensors
        A, slope = ctx.A, ctx.slope
        H, F = int(Z.shape[1]), int(Z.shape[2])
        inputs = {"el": el, "er": er, "lse": lse, "Z": Z, "O": O, "dO": dO.contiguous()}
        dZ = d_el = d_er = None
        if ctx.needs_input_grad[1]:  # d_el: A's rows
            d_el, = run(_op("gat_grad_rows", slope), MatrixArgs.of(A), inputs, heads=H, feat=F)
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[2]:  # dZ, d_er: the rows of A's transpose
            dZ, d_er = run(_op("gat_grad_cols", slope), _transpose_args(A), inputs, heads=H, feat=F)
        return (dZ if ctx.needs_input_grad[0] else None), d_el, (d_er if ctx.needs_input_grad[2] else None), \
            None, None


def gat_aggregate(A, Z: torch.Tensor, el: torch.Tensor, er: torch.Tensor,
                  negative_slope: float = ops.GAT_SLOPE) -> torch.Tensor:
    """GAT's aggregation ``O[i, h, f] = sum_j softmax_j(leaky_relu(el[i, h] + er[j, h])) Z[j, h, f]``
    (``ops.gat``, one operator): Z ``(cols, heads, feat)``, el ``(rows, heads)`` (targets), er
    ``(cols, heads)`` (sources); O ``(rows, heads, feat)``, 0 for a row without entries.
    Differentiable in Z, el and er (the backward pass needs A built with ``grad=True``)."""
    _check_graph(A)
    H = _check_logits(A, el, er)
    if _heads_feat("Z", Z, A.shape[1])[0] != H:
        raise ValueError(f"Z has {Z.shape[1]} heads but el has {H}")
    slope = float(negative_slope)
    if (Z.requires_grad or el.requires_grad or er.requires_grad) and torch.is_grad_enabled():
        _needs_transpose(A, "the backward pass of gat_aggregate")
        return _GATAggregate.apply(Z, el, er, A, slope)
    return _gat_forward(A, Z, el, er, slope, stats=False)[0]


class GATConv(torch.nn.Module):
    """PyG's ``GATConv`` (Velickovic et al.) on sparsec's kernels, with the same parameters:
    ``lin.weight`` (heads * out, in), ``att_src`` and ``att_dst`` (1, heads, out), ``bias``
    (heads * out with ``concat``, else out), so :meth:`load_pyg` copies a PyG layer's weights
    and the outputs match. ``forward(A, x)`` takes the graph from :func:`gat_graph` (PyG adds
    self-loops in the layer; here they are part of A, ``add_self_loops=True`` by default).
    No dropout on the attention weights (PyG's default ``dropout=0``)."""

    def __init__(self, in_channels: int, out_channels: int, heads: int = 1, concat: bool = True,
                 negative_slope: float = ops.GAT_SLOPE, bias: bool = True):
        super().__init__()
        self.in_channels, self.out_channels, self.heads, self.concat = in_channels, out_channels, heads, concat
        self.negative_slope = float(negative_slope)
        self.lin = torch.nn.Linear(in_channels, heads * out_channels, bias=False)
        self.att_src = torch.nn.Parameter(torch.empty(1, heads, out_channels))
        self.att_dst = torch.nn.Parameter(torch.empty(1, heads, out_channels))
        self.bias = torch.nn.Parameter(torch.zeros(heads * out_channels if concat else out_channels)) if bias else None
        bound = math.sqrt(6.0 / (heads + out_channels))  # glorot, as PyG
        for att in (self.att_src, self.att_dst):
            torch.nn.init.uniform_(att, -bound, bound)
        torch.nn.init.xavier_uniform_(self.lin.weight)

    @torch.no_grad()
    def load_pyg(self, conv) -> "GATConv":
        """Copy the weights of a ``torch_geometric.nn.GATConv`` of the same shape."""
        self.lin.weight.copy_(conv.lin.weight)
        self.att_src.copy_(conv.att_src)
        self.att_dst.copy_(conv.att_dst)
        if self.bias is not None:
            self.bias.copy_(conv.bias)
        return self

    def forward(self, A, x: torch.Tensor) -> torch.Tensor:
        Z = self.lin(x).view(-1, self.heads, self.out_channels)
        el = (Z * self.att_dst).sum(-1)  # targets i: the rows
        er = (Z * self.att_src).sum(-1)  # sources j: the columns
        out = gat_aggregate(A, Z, el, er, self.negative_slope)
        out = out.reshape(-1, self.heads * self.out_channels) if self.concat else out.mean(dim=1)
        return out + self.bias if self.bias is not None else out

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, heads={self.heads}, concat={self.concat}"
