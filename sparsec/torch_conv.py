"""The one-node forms of ``sparsec.torch``'s graph convolutions: ``GCNConv`` (Kipf and
Welling) and ``SAGEConv`` (GraphSAGE, mean aggregation) call :func:`gcn` and :func:`sage`,
each layer one autograd node, where :func:`fused` allows.

Why one node: on graphs of 10^4-10^5 nodes a layer's kernels take microseconds and the host's
cost per op decides an eager training step (issue 27). Written as Linear + SpMM + bias, a
layer records five autograd nodes and launches an op per term; here the forward is a matmul
and one SpMM whose epilogue adds the bias or the root term (``ops.spmm_bias``,
``ops.spmm_add``: one kernel for CSR; GraphSAGE projecting first runs one SpMM of
``sparsec.torch.root_augmented(A)`` on one matmul's output instead), the backward the SpMM
on A's transpose and the weight products, in one Python node. The matrix is fixed (its
values need no gradient) and must have its transpose (built by ``SparseTensor`` for csr,
ell, hyb and bsr); otherwise, and under ``torch.compile`` or a dispatch mode, the layers
compose the registered ops instead (same function, more nodes). This module sits below ``sparsec.torch``: it takes the matrix
by its attributes and launches through ``sparsec.torch_launch``.
"""
from __future__ import annotations

import torch

from .torch_launch import eager, launch_matrix_op, out_dtype

__all__ = ["fused", "gcn", "sage", "project_first"]


_PLAIN = (torch.Tensor, torch.nn.Parameter)  # tensor subclasses (and their modes) take the composed path


def fused(A, x: torch.Tensor, *params) -> bool:
    """Whether the one-node path applies to ``sparsec.torch.SparseTensor`` A: a fixed matrix
    with its transpose, values whose kernels return their own dtype (fp32, fp64), eager
    plain tensors of the values' dtype on their device (a mismatch takes the composed ops,
    where torch names it or promotes as usual, rather than reaching a kernel), no
    ``torch.func`` transform (whose wrapped tensors pass for plain ones)."""
    values = A.values
    return (A.transpose is not None and not values.requires_grad and out_dtype(values) == values.dtype
            and not torch.compiler.is_compiling() and not torch._C._are_functorch_transforms_active()
            and eager(values) and
            all(p is None or (type(p) in _PLAIN and p.dtype == values.dtype and p.device == values.device)
                for p in (x,) + params))


def _matrix_op(op: str, A, dense, rows: int, transposed: bool = False) -> torch.Tensor:
    """Run ``op`` (spmm, spmm_bias, spmm_add) on A (or A's transpose) and ``dense``."""
    out = torch.empty((rows, dense[0].shape[1]), dtype=A.values.dtype, device=dense[0].device)
    if transposed:
        return launch_matrix_op(op, A.transpose[0], A.t_ffi_index, A.transposed_values(A.values), A.t_size_dict,
                                dense, out)
    return launch_matrix_op(op, A.key, A.ffi_index, A.values, A.size_dict, dense, out)


def _direct(fn):
    """``Function.apply`` without its Python wrapper (default-argument binding, functorch's
    dead-wrapper unwrapping): a few microseconds of host time per call. The callers run it
    only where :func:`fused` holds, so no functorch transform is active."""
    return super(torch.autograd.Function, fn).apply


def project_first(x: torch.Tensor, in_features: int, out_features: int) -> bool:
    """Whether a layer multiplies by its weight before aggregating (``A (x W)``) rather than
    after (``(A x) W``; equal by linearity). Projecting first narrows the SpMM when out < in;
    aggregating first spares the backward pass its SpMM on A's transpose when x needs no
    gradient (a first layer): two launches fewer, and the same device work (one SpMM at the
    input width instead of two at the output width)."""
    return x.requires_grad and out_features < in_features


class _GCNFunction(torch.autograd.Function):
    """``A @ (x @ W) + b``. Projecting first (:func:`project_first`): the SpMM's epilogue adds
    b; backward dXW = A^T dY (an SpMM on A's transpose), dW = x^T dXW, dx = dXW W^T.
    Aggregating first: ``addmm(b, A x, W)``; backward dW = (A x)^T dY, dx = A^T (dY W^T).
    Both: db = column sums of dY."""

    @staticmethod
    def forward(ctx, x, weight, bias, A, project):
        ctx.A, ctx.project = A, project
        if project:
            ctx.save_for_backward(x, weight)
            xw, rows = torch.mm(x, weight), A.shape[0]
            return _matrix_op("spmm", A, [xw], rows) if bias is None else _matrix_op("spmm_bias", A, [xw, bias], rows)
        agg = _matrix_op("spmm", A, [x], A.shape[0])
        ctx.save_for_backward(agg, weight)
        return torch.mm(agg, weight) if bias is None else torch.addmm(bias, agg, weight)

    @staticmethod
    def backward(ctx, dy):
        A, need = ctx.A, ctx.needs_input_grad
        dy = dy.contiguous()
        if ctx.project:
            x, weight = ctx.saved_tensors
            dxw = _matrix_op("spmm", A, [dy], A.shape[1], transposed=True)
            dx = torch.mm(dxw, weight.t()) if need[0] else None
            dw = torch.mm(x.t(), dxw) if need[1] else None
        else:
            agg, weight = ctx.saved_tensors
            dx = _matrix_op("spmm", A, [torch.mm(dy, weight.t())], A.shape[1], transposed=True) if need[0] else None
            dw = torch.mm(agg.t(), dy) if need[1] else None
        db = dy.sum(0) if need[2] else None
        return dx, dw, db, None, None


gcn = _direct(_GCNFunction)  # gcn(x, weight, bias, A, project)


class _SAGEFunction(torch.autograd.Function):
    """``A @ x @ Wl^T + x @ Wr^T + b`` (A the mean aggregator), with ``weight`` the two
    matrices stacked, ``[Wl; Wr]`` (2 out x in: one parameter, so one gradient and one
    ``AccumulateGrad`` node). ``mode``:

    * ``"root"``: projecting first with A given as ``sparsec.torch.root_augmented(A)``:
      ``Y = x W^T`` is one product, and one SpMM of the augmented matrix (its epilogue adding
      b) sums the neighbours' rows 2j and the node's own row 2i + 1 of ``Y.view(2n, out)``;
      backward, the SpMM of its transpose gives ``G = [A^T dY | dY]`` directly;
    * ``"project"``: projecting first on A itself (formats the augmentation would spoil,
      bsr): two products and ``ops.spmm_add``; backward G is concatenated;
    * ``"aggregate"``: ``(A x) Wl^T + x Wr^T + b`` (:func:`project_first`; PyG's order).

    Projecting first, ``dW = G^T x`` and ``dx = G W`` are one product each."""

    @staticmethod
    def forward(ctx, x, weight, bias, A, mode):
        fout = weight.shape[0] // 2
        ctx.A, ctx.mode = A, mode
        if mode == "root":
            y = torch.mm(x, weight.t()).view(-1, fout)  # rows 2j: x_j Wl^T, rows 2j + 1: x_j Wr^T
            out = (_matrix_op("spmm", A, [y], A.shape[0]) if bias is None else
                   _matrix_op("spmm_bias", A, [y, bias], A.shape[0]))
            ctx.save_for_backward(x, weight)
            return out
        weight_l, weight_r = weight[:fout], weight[fout:]
        root = torch.mm(x, weight_r.t()) if bias is None else torch.addmm(bias, x, weight_r.t())
        if mode == "project":
            out = _matrix_op("spmm_add", A, [torch.mm(x, weight_l.t()), root], A.shape[0])
            ctx.save_for_backward(x, weight)
        else:
            agg = _matrix_op("spmm", A, [x], A.shape[0])
            out = root.addmm_(agg, weight_l.t())
            ctx.save_for_backward(x, weight, agg)
        return out

    @staticmethod
    def backward(ctx, dy):
        A, need = ctx.A, ctx.needs_input_grad
        dy = dy.contiguous()
        dx = dw = None
        if ctx.mode != "aggregate":
            x, weight = ctx.saved_tensors
            if need[0] or need[1]:
                if ctx.mode == "root":  # [A^T dY | dY], 2n x out read as n x 2 out
                    g = _matrix_op("spmm", A, [dy], A.shape[1], transposed=True).view(dy.shape[0], -1)
                else:
                    g = torch.cat([_matrix_op("spmm", A, [dy], A.shape[1], transposed=True), dy], 1)
                dx = torch.mm(g, weight) if need[0] else None
                dw = torch.mm(g.t(), x) if need[1] else None
        else:
            x, weight, agg = ctx.saved_tensors
            fout = weight.shape[0] // 2
            if need[1]:
                dw = weight.new_empty(weight.shape)
                torch.mm(dy.t(), agg, out=dw[:fout])
                torch.mm(dy.t(), x, out=dw[fout:])
            if need[0]:
                dx = _matrix_op("spmm", A, [torch.mm(dy, weight[:fout])], A.shape[1], transposed=True)
                dx.addmm_(dy, weight[fout:])
        db = dy.sum(0) if need[2] else None
        return dx, dw, db, None, None


sage = _direct(_SAGEFunction)  # sage(x, weight, bias, A, mode), weight = [Wl; Wr]
