"""RGCN for PyTorch on sparsec's ``rgcn`` operator: one launch per layer for every relation.

    graph = RelationalGraph(adj, edge_type, num_relations, device="cuda")   # converted once
    conv = RGCNConv(64, 16, num_relations)                                  # PyG's parameters
    y = conv(graph, x)

``RelationalGraph`` stacks the relations' patterns along the rows (``formats.stack_rows``),
with PyG's mean normalisation (1 / deg_r(i)) as the values and the identity as one more
relation, so that the root term ``x_i W_root`` is the same launch: ``Y = sum_r A_r X W_r``
with ``W = [W_0 .. W_{R-1}, W_root]``. The backward pass is the same operator on the
transposed relations (dX = sum_r A_r^T dY W_r^T) and, for the weights, the segment sums
Z = A_r X (an SpMM over the non-empty stacked rows) times dY, one small GEMM per relation.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import scipy.sparse as sp
import torch

from .formats import convert, stack_rows

__all__ = ["RelationalGraph", "RGCNConv", "rgcn"]


def _mean_stacked(adj: sp.csr_matrix, types: np.ndarray, relations: int, self_loops: bool) -> sp.csr_matrix:
    """Stacked relations with values 1 / deg_r(i) (PyG's mean), the identity as relation R."""
    stacked = stack_rows(sp.csr_matrix((np.ones(adj.nnz, np.float32), adj.indices, adj.indptr), shape=adj.shape),
                         types, relations)
    deg = np.diff(stacked.indptr).astype(np.float32)
    stacked.data = np.repeat(1.0 / np.maximum(deg, 1.0), np.diff(stacked.indptr)).astype(np.float32)
    if self_loops:
        n = adj.shape[0]
        if adj.shape[0] != adj.shape[1]:
            raise ValueError(f"a root term needs a square graph (nodes x nodes), got {adj.shape}")
        stacked = sp.vstack([stacked, sp.identity(n, dtype=np.float32, format="csr")], format="csr")
    return sp.csr_matrix(stacked, dtype=np.float32)


class RelationalGraph:
    """A graph with one relation per edge, converted once for ``rgcn``: the stacked matrix in
    ``fmt`` (any sparsec format family; csr by default), its transpose for the backward
    pass, and the non-empty stacked rows (segments) for the weight gradient.

    ``adj``: n x n, row i listing the neighbours i aggregates (PyG: edge_index = [j, i]);
    ``edge_type``: one relation in [0, num_relations) per stored entry, CSR order."""

    def __init__(self, adj, edge_type, num_relations: int, *, device="cpu", fmt: str = "csr",
                 root: bool = True):
        adj = sp.csr_matrix(adj)
        types = np.asarray(edge_type)
        if isinstance(edge_type, torch.Tensor):
            types = edge_type.detach().cpu().numpy()
        self.n, self.relations, self.root = adj.shape[0], int(num_relations), bool(root)
        self.device = torch.device(device)
        stacked = _mean_stacked(adj, types, self.relations, self.root)
        self.rel = self.relations + int(self.root)
        self.matrix = convert(stacked, fmt)
        n = self.n
        t_blocks = [stacked[r * n:(r + 1) * n].T.tocsr() for r in range(self.rel)]
        self.transposed = convert(stack_rows(t_blocks).astype(np.float32), fmt)
        # segments: the non-empty stacked rows, for dW_r = Z_r^T dY (Z = the segments' sums)
        lengths = np.diff(stacked.indptr)
        seg = np.flatnonzero(lengths)
        self.segments = convert(sp.csr_matrix(stacked[seg]), "csr")
        self.segment_node = torch.from_numpy(seg % n).to(self.device)
        seg_rel = seg // n
        self.segment_bounds = np.searchsorted(seg_rel, np.arange(self.rel + 1)).tolist()
        self._kernels = {}  # (op, instance, widths) -> compiled kernel

    def kernel(self, transposed: bool, fin: int, fout: int, bias: bool = False):
        """The compiled ``rgcn`` (``rgcn_bias`` with ``bias``: the bias is the value the sum
        starts from, no pass of its own) for the stacked matrix (or its transpose)."""
        inst = self.transposed if transposed else self.matrix
        return self._compiled("rgcn_bias" if bias else "rgcn", inst, rel=self.rel, fin=fin, fout=fout)

    def segment_spmm(self, feat: int):
        """The compiled SpMM over the non-empty stacked rows (the weight gradient's Z)."""
        return self._compiled("spmm", self.segments, feat=feat)

    def _compiled(self, op: str, inst, **params):
        from . import api

        key = (op, id(inst), tuple(sorted(params.items())))
        if key not in self._kernels:
            target = "llvm" if self.device.type == "cpu" else "cuda"
            self._kernels[key] = api.compile(op, inst, target=target, **params)
        return self._kernels[key]


class _RGCNFunction(torch.autograd.Function):
    """``sum_r A_r x W_r (+ bias)`` with W the packed (rel, fin, fout) weights; ``parts`` are
    the parameters W was packed from (all relations, or the relations and the root), which
    get its gradient split back."""

    @staticmethod
    def forward(ctx, x, packed, bias, graph, *parts):
        ctx.graph, ctx.sizes = graph, [p.shape[0] if p.dim() == 3 else 1 for p in parts]
        ctx.shapes = [p.shape for p in parts]
        ctx.save_for_backward(x, packed)
        k = graph.kernel(False, packed.shape[1], packed.shape[2], bias=bias is not None)
        args = (x.detach().contiguous(), packed.detach().contiguous())
        return k(graph.matrix, *args, bias.detach().contiguous()) if bias is not None else k(graph.matrix, *args)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        graph = ctx.graph
        dy = dy.detach().contiguous()
        dx = dbias = None
        if ctx.needs_input_grad[0]:
            k = graph.kernel(True, weight.shape[2], weight.shape[1])
            dx = k(graph.transposed, dy, weight.detach().transpose(1, 2).contiguous())
        if ctx.needs_input_grad[2]:
            dbias = dy.sum(0)
        dparts = [None] * len(ctx.sizes)
        if any(ctx.needs_input_grad[4:]):
            z = graph.segment_spmm(x.shape[1])(graph.segments, x.detach().contiguous())
            dyg = dy.index_select(0, graph.segment_node)
            dw = torch.zeros_like(weight)
            b = graph.segment_bounds
            for r in range(graph.rel):
                if b[r + 1] > b[r]:
                    dw[r] = z[b[r]:b[r + 1]].T @ dyg[b[r]:b[r + 1]]
            dparts = [d.reshape(shape) for d, shape in zip(torch.split(dw, ctx.sizes), ctx.shapes)]
        return (dx, None, dbias, None, *dparts)


def rgcn(graph: RelationalGraph, x: torch.Tensor, weight: torch.Tensor,
         bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``sum_r A_r x W[r] (+ bias)`` (W: rel x fin x fout, its last relation the root weight
    when the graph has one), differentiable in x, W and bias; one launch of the contraction."""
    _check_inputs(graph, x, weight.shape, bias)
    return _RGCNFunction.apply(x, weight, bias, graph, weight)


def _check_inputs(graph: RelationalGraph, x, wshape, bias) -> None:
    if len(wshape) != 3 or wshape[0] != graph.rel:
        raise ValueError(f"weight should be ({graph.rel}, fin, fout) (relations{' + root' if graph.root else ''}), "
                         f"got {tuple(wshape)}")
    if x.dim() != 2 or x.shape[0] != graph.n or x.shape[1] != wshape[1]:
        raise ValueError(f"x should be ({graph.n}, {wshape[1]}), got {tuple(x.shape)}")
    if bias is not None and tuple(bias.shape) != (wshape[2],):
        raise ValueError(f"bias should be ({wshape[2]},), got {tuple(bias.shape)}")


class RGCNConv(torch.nn.Module):
    """PyG's ``RGCNConv`` (mean aggregation, root weight, bias) on sparsec: parameters
    ``weight`` (R x in x out), ``root`` (in x out) and ``bias`` (out), copyable from PyG's."""

    def __init__(self, in_channels: int, out_channels: int, num_relations: int, bias: bool = True):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(num_relations, in_channels, out_channels))
        self.root = torch.nn.Parameter(torch.empty(in_channels, out_channels))
        self.bias = torch.nn.Parameter(torch.zeros(out_channels)) if bias else None
        torch.nn.init.xavier_uniform_(self.weight)
        torch.nn.init.xavier_uniform_(self.root)

        self._packed = (None, None)  # (parameter versions, [W; W_root]) -- see packed_weight

    def packed_weight(self) -> torch.Tensor:
        """``[W_0 .. W_{R-1}, W_root]`` as the kernel reads it, repacked only when a parameter
        changed (its version counter moved: an optimizer step, ``load_state_dict``), so
        inference pays no copy per call."""
        key = tuple((p.data_ptr(), p._version, p.device, p.dtype) for p in (self.weight, self.root))
        if self._packed[0] != key:
            with torch.no_grad():
                self._packed = (key, torch.cat([self.weight, self.root[None]]).contiguous())
        return self._packed[1]

    def forward(self, graph: RelationalGraph, x: torch.Tensor) -> torch.Tensor:
        if not graph.root:
            raise ValueError("RGCNConv has a root weight: build the graph with root=True")
        packed = self.packed_weight()
        _check_inputs(graph, x, packed.shape, self.bias)
        return _RGCNFunction.apply(x, packed, self.bias, graph, self.weight, self.root)
