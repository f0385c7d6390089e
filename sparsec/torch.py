"""PyTorch integration: sparsec's SpMM and SDDMM as ``torch.library`` custom ops.

    import sparsec.torch as st
    A = st.SparseTensor(scipy_csr, device="cuda")          # converted once, index arrays on the GPU
    Y = st.spmm(A, X)                                        # A @ X, differentiable in A's values and X
    layer = st.SparseLinear.from_dense(pruned_weight)        # y = x @ W^T + b with W sparse
    conv = st.GCNConv(64, 16); h = conv(A_hat, x)            # A_hat @ (x @ W) + b

The ops (``sparsec::spmm``, ``sparsec::sddmm``) carry fake (meta) implementations, so
``torch.compile`` traces through them without graph breaks, and the CSR SpMM has autograd:
the gradient w.r.t. the dense operand is an SpMM with A transposed (its structure built
once, with the permutation that carries A's values into it), the gradient w.r.t. A's
values an SDDMM on A's pattern. Kernels are compiled on first use for the tensors' device
(``llvm`` on the CPU, ``cuda`` on a GPU) and width, then cached; tensors go to them through
DLPack, on the current CUDA stream, without copies.
"""
from __future__ import annotations

import contextlib
import functools
import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import scipy.sparse as sp
import torch

from .dtypes import dtype_spec
from .formats import FormatInstance, convert, make_format
from .kernel import scalar_values

__all__ = ["SparseTensor", "spmm", "sddmm", "SparseLinear", "GCNConv", "gcn_norm", "kernel_for"]


# ---- kernels ------------------------------------------------------------------------------
@functools.lru_cache(maxsize=256)
def kernel_for(op: str, fmt: str, dtype: str, feat: int, device_type: str):
    """The compiled sparsec kernel for an op on a format, dtype, dense width and device."""
    from .build import compile as sparsec_compile

    target = "llvm" if device_type == "cpu" else "cuda"
    return sparsec_compile(op, fmt, target=target, dtype=dtype, feat=feat)


@functools.lru_cache(maxsize=256)
def _index_names(fmt: str) -> Tuple[str, ...]:
    return tuple(make_format(fmt).index_array_names())


def _launch(op: str, fmt: str, index: Sequence[torch.Tensor], values: torch.Tensor, sizes: Dict[str, int],
            dense: Sequence[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
    """Run the kernel on tensors already in place: argument order from its parameter list."""
    feat = int(dense[0].shape[1])
    kernel = kernel_for(op, fmt, str(values.dtype).replace("torch.", ""), feat, values.device.type)
    by_index = dict(zip(_index_names(fmt), index))
    inputs = iter(dense)
    args = []
    for p in kernel.params:
        if p.role == "index":
            args.append(by_index[p.name])
        elif p.role == "input" and p.sparse:
            args.append(values)
        elif p.role == "input":
            args.append(next(inputs).contiguous())
        elif p.role == "output":
            args.append(out)
        elif p.role == "temp":
            args.append(torch.zeros([sizes[d] if isinstance(d, str) else (values.numel() if d is None else d)
                                     for d in p.shape], dtype=getattr(torch, p.dtype), device=values.device))
        else:
            args.append(int(sizes[p.name]))
    with _on_torch_stream(values.device):
        kernel.executable[kernel.op_name](*args)
    return out


def _on_torch_stream(device: torch.device):
    """TVM launches on its own current stream (the legacy default unless set): point it at
    torch's current stream, so the kernel orders with torch's work and CUDA-graph capture."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    import tvm_ffi

    return tvm_ffi.use_torch_stream()


def _out_dtype(values: torch.Tensor) -> torch.dtype:
    """The kernels' output dtype for these sparse values (fp16 accumulates and returns fp32)."""
    return getattr(torch, dtype_spec(str(values.dtype).replace("torch.", "")).out)


def _sizes(names: str, values: Sequence[int]) -> Dict[str, int]:
    return dict(zip(names.split(","), values))


def _check_dense(name: str, x: torch.Tensor, rows: int, values: torch.Tensor):
    if x.dim() != 2 or x.shape[0] != rows:
        raise ValueError(f"{name} should be 2-D with {rows} rows, got shape {tuple(x.shape)}")
    if x.dtype != values.dtype:
        raise TypeError(f"{name} should be {values.dtype} like the sparse values, got {x.dtype}")
    if x.device != values.device:
        raise ValueError(f"{name} is on {x.device} but the sparse matrix is on {values.device}")


# ---- the custom ops ---------------------------------------------------------------------------
@torch.library.custom_op("sparsec::spmm", mutates_args=())
def _spmm_op(fmt: str, index: List[torch.Tensor], values: torch.Tensor, sizes: List[int], size_names: str,
             b: torch.Tensor) -> torch.Tensor:
    s = _sizes(size_names, sizes)
    _check_dense("B", b, s["cols"], values)
    out = torch.empty((s["rows"], b.shape[1]), dtype=_out_dtype(values), device=b.device)
    return _launch("spmm", fmt, index, values, s, [b], out)


@_spmm_op.register_fake
def _(fmt, index, values, sizes, size_names, b):
    return b.new_empty((_sizes(size_names, sizes)["rows"], b.shape[1]), dtype=_out_dtype(values))


@torch.library.custom_op("sparsec::sddmm", mutates_args=())
def _sddmm_op(fmt: str, index: List[torch.Tensor], values: torch.Tensor, sizes: List[int], size_names: str,
              x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    s = _sizes(size_names, sizes)
    _check_dense("X", x, s["rows"], values)
    _check_dense("Y", y, s["cols"], values)
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"X and Y should have the same width, got {x.shape[1]} and {y.shape[1]}")
    out = torch.empty(values.shape, dtype=_out_dtype(values), device=values.device)
    return _launch("sddmm", fmt, index, values, s, [x, y], out)


@_sddmm_op.register_fake
def _(fmt, index, values, sizes, size_names, x, y):
    return values.new_empty(values.shape, dtype=_out_dtype(values))


@torch.library.custom_op("sparsec::csr_spmm", mutates_args=())
def _csr_spmm_op(indptr: torch.Tensor, indices: torch.Tensor, values: torch.Tensor, t_indptr: torch.Tensor,
                 t_indices: torch.Tensor, t_perm: torch.Tensor, rows: int, cols: int,
                 b: torch.Tensor) -> torch.Tensor:
    """CSR SpMM with the transpose's structure along, for the backward pass."""
    return _spmm_op(*_csr_args(indptr, indices, values, rows, cols), b)


@_csr_spmm_op.register_fake
def _(indptr, indices, values, t_indptr, t_indices, t_perm, rows, cols, b):
    return b.new_empty((rows, b.shape[1]), dtype=_out_dtype(values))


def _csr_args(indptr, indices, values, rows, cols):
    return "csr", [indptr, indices], values, [rows, rows, cols], "n_i,rows,cols"


def _csr_spmm_setup(ctx, inputs, output):
    indptr, indices, values, t_indptr, t_indices, t_perm, rows, cols, b = inputs
    ctx.save_for_backward(indptr, indices, values, t_indptr, t_indices, t_perm, b)
    ctx.rows, ctx.cols = rows, cols


def _csr_spmm_backward(ctx, grad):
    indptr, indices, values, t_indptr, t_indices, t_perm, b = ctx.saved_tensors
    grad = grad.contiguous().to(values.dtype)
    grad_values = grad_b = None
    if ctx.needs_input_grad[8]:  # dB = A^T dC: SpMM on the transpose, values carried by t_perm
        grad_b = _spmm_op(*_csr_args(t_indptr, t_indices, values[t_perm], ctx.cols, ctx.rows), grad)
    if ctx.needs_input_grad[2]:  # dA[i, j] = dC[i, :] . B[j, :] at A's stored slots
        grad_values = _sddmm_op(*_csr_args(indptr, indices, torch.ones_like(values), ctx.rows, ctx.cols), grad,
                                b.contiguous())
    return None, None, grad_values, None, None, None, None, None, grad_b


torch.library.register_autograd("sparsec::csr_spmm", _csr_spmm_backward, setup_context=_csr_spmm_setup)


# ---- user-facing wrappers ------------------------------------------------------------------------
class SparseTensor:
    """A matrix converted to a sparsec format, its index arrays on ``device`` (moved once)
    and its values a tensor (``values``) that may require grad. CSR matrices also keep
    their transpose's structure, for SpMM's backward pass."""

    def __init__(self, matrix, fmt: str = "csr", *, device="cpu", dtype=None, requires_grad: bool = False):
        inst = matrix if isinstance(matrix, FormatInstance) else convert(matrix, fmt, dtype=dtype)
        self.instance = inst
        self.format = inst.format.spec
        self.shape = tuple(inst.shape)
        device = torch.device(device)
        self.index = [torch.from_numpy(np.ascontiguousarray(inst.arrays[n])).to(device)
                      for n in _index_names(self.format)]
        self.values = torch.from_numpy(np.ascontiguousarray(inst.data)).to(device).requires_grad_(requires_grad)
        sizes = scalar_values(inst)
        self.size_names = ",".join(sizes)
        self.sizes = [int(v) for v in sizes.values()]
        self.transpose = None
        if self.format == "csr":
            n = inst.data.size
            t = sp.csr_matrix((np.arange(n, dtype=np.float64), inst.arrays["indices"], inst.arrays["indptr"]),
                              shape=self.shape).T.tocsr()  # data: which slot of A each slot of A^T holds
            t.sort_indices()
            self.transpose = [torch.from_numpy(a.astype(np.int32)).to(device)
                              for a in (t.indptr, t.indices)] + \
                             [torch.from_numpy(t.data.astype(np.int64)).to(device)]

    @property
    def device(self):
        return self.values.device

    def to_dense(self) -> torch.Tensor:
        return torch.from_numpy(self.instance.to_scipy(self.values.detach().cpu().numpy()).toarray())


def spmm(A: SparseTensor, B: torch.Tensor) -> torch.Tensor:
    """``A @ B`` (B: cols x feat). Differentiable in B and, for CSR, in ``A.values``."""
    if not isinstance(A, SparseTensor):
        raise TypeError(f"A should be a sparsec.torch.SparseTensor, got {type(A).__name__}")
    if A.transpose is not None:
        indptr, indices = A.index
        return _csr_spmm_op(indptr, indices, A.values, *A.transpose, A.shape[0], A.shape[1], B)
    return _spmm_op(A.format, A.index, A.values, A.sizes, A.size_names, B)


def sddmm(A: SparseTensor, X: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    """``A[i, j] * (X[i, :] . Y[j, :])`` at each stored slot of A (not differentiable)."""
    return _sddmm_op(A.format, A.index, A.values, A.sizes, A.size_names, X, Y)


class SparseLinear(torch.nn.Module):
    """``y = x @ W^T + b`` with a pruned weight W (out x in) held sparse. CSR weights train
    (the values are a Parameter); other formats (``bsr:RxC``, ``nm:N:M``, ``srbcrs:vV,int8``
    ...) are inference-only."""

    def __init__(self, weight: SparseTensor, bias: Optional[torch.Tensor] = None):
        super().__init__()
        self.weight = weight
        self.values = torch.nn.Parameter(weight.values.detach(), requires_grad=weight.transpose is not None)
        weight.values = self.values
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach().clone())
        self.out_features, self.in_features = weight.shape

    @classmethod
    def from_dense(cls, weight, bias=None, fmt: str = "csr", device=None, dtype=None):
        w = weight.detach().cpu().numpy() if isinstance(weight, torch.Tensor) else np.asarray(weight)
        device = device or (weight.device if isinstance(weight, torch.Tensor) else "cpu")
        st = SparseTensor(sp.csr_matrix(w) if fmt == "csr" else w, fmt, device=device, dtype=dtype)
        return cls(st, None if bias is None else torch.as_tensor(bias, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        xt = x.reshape(-1, self.in_features).t().contiguous()  # in x tokens
        y = spmm(self.weight, xt).t()
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features)


def gcn_norm(adj: sp.spmatrix) -> sp.csr_matrix:
    """``D^-1/2 (A + I) D^-1/2``, Kipf and Welling's propagation matrix, as float32 CSR."""
    a = sp.csr_matrix(adj, dtype=np.float64)
    a = a + sp.identity(a.shape[0], format="csr")
    d = np.asarray(a.sum(axis=1)).ravel()
    inv = sp.diags(np.where(d > 0, 1.0 / np.sqrt(d), 0.0))
    return (inv @ a @ inv).tocsr().astype(np.float32)


class GCNConv(torch.nn.Module):
    """One graph convolution, ``A_hat @ (x @ W) + b`` (A_hat from :func:`gcn_norm`)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(in_features, out_features))
        self.bias = torch.nn.Parameter(torch.zeros(out_features)) if bias else None
        torch.nn.init.uniform_(self.weight, -1 / math.sqrt(in_features), 1 / math.sqrt(in_features))

    def forward(self, a_hat: SparseTensor, x: torch.Tensor) -> torch.Tensor:
        h = spmm(a_hat, x @ self.weight)
        return h + self.bias if self.bias is not None else h
