"""PyTorch integration: sparsec's SpMM and SDDMM as ``torch.library`` custom ops.

    import sparsec.torch as st
    A = st.SparseTensor(scipy_csr, device="cuda")          # converted once, index arrays on the GPU
    Y = st.spmm(A, X)                                        # A @ X, differentiable in A's values and X
    layer = st.SparseLinear.from_dense(pruned_weight)        # y = x @ W^T + b with W sparse
    conv = st.GCNConv(64, 16); h = conv(A_hat, x)            # A_hat @ (x @ W) + b, one autograd node
    sage = st.SAGEConv(64, 16); h = sage(A_mean, x)          # PyG's SAGEConv(aggr="mean"), one node

The ops (``sparsec::spmm``, ``sparsec::sddmm``) carry fake (meta) implementations, so
``torch.compile`` traces through them without graph breaks, and SpMM has autograd (CSR,
ELL, hyb, BSR): the gradient w.r.t. the dense operand is an SpMM with A transposed (its
structure built once, with the map that carries A's values to its slots), the gradient
w.r.t. A's values an SDDMM on A's pattern. Kernels are compiled on first use for the
matrix, the tensors' device (``llvm`` on the CPU, ``cuda`` on a GPU) and width, then
cached; tensors go to them through DLPack, on the current CUDA stream, without copies.
An eager call on plain tensors runs the op's body directly, skipping ``torch.library``'s
dispatch (which tripled a small SpMM's host time); tracing, dispatch modes, meta tensors
and calls that record a gradient still go through the registered ops.
"""
from __future__ import annotations

import functools
import math
from typing import Dict, List, Optional, Sequence

import numpy as np
import scipy.sparse as sp
import torch

from .formats import CompositeInstance, FormatInstance, convert
from .formats.validate import check_before_launch, is_trusted
from . import torch_conv, torch_launch
from .torch_launch import check_dense as _check_dense, eager as _eager, kernel_for
from .torch_launch import launch_matrix_op as _launch, out_dtype as _out_dtype
from .kernel import index_arrays, scalar_values

__all__ = ["SparseTensor", "spmm", "sddmm", "SparseLinear", "GCNConv", "SAGEConv", "mean_adjacency", "root_augmented",
           "gcn_norm",
           "kernel_for",
           "gat_graph", "gat_adjacency", "gat_format", "multihead_spmm", "multihead_sddmm", "edge_softmax", "gat_aggregate", "GATConv"]
# graph attention and multi-head products live in sparsec.torch_gnn (imported on first use)
_GNN = ("gat_adjacency", "gat_format", "multihead_spmm", "multihead_sddmm", "edge_softmax", "gat_aggregate", "GATConv")


# ---- kernels ------------------------------------------------------------------------------
# Matrices of live SparseTensors, by key (``sparsec.torch_launch`` keeps the registry and the
# launch path, which sparsec.torch_conv shares): a kernel is compiled for the converted matrix
# itself, so that its format's automatic knobs and any tuning record for it apply.
_register = torch_launch.register


def _sizes(names: str, values: Sequence[int]) -> Dict[str, int]:
    return dict(zip(names.split(","), values))


# ---- the custom ops ---------------------------------------------------------------------------
def _spmm_body(key: str, index: List[torch.Tensor], values: torch.Tensor, s: Dict[str, int],
               b: torch.Tensor) -> torch.Tensor:
    _check_dense("B", b, s["cols"], values)
    out = torch.empty((s["rows"], b.shape[1]), dtype=_out_dtype(values), device=b.device)  # every element written
    return _launch("spmm", key, index, values, s, [b], out)


@torch.library.custom_op("sparsec::spmm", mutates_args=())
def _spmm_op(key: str, index: List[torch.Tensor], values: torch.Tensor, sizes: List[int], size_names: str,
             b: torch.Tensor) -> torch.Tensor:
    return _spmm_body(key, index, values, _sizes(size_names, sizes), b)


def _spmm(key, index, values, sizes, size_names, b, s: Optional[Dict[str, int]] = None, fast=None) -> torch.Tensor:
    """``sparsec::spmm``, its body called directly where :func:`_eager` allows (with the index
    arrays as ``fast``, their tvm_ffi views, where given)."""
    if _eager(values, b):
        return _spmm_body(key, index if fast is None else fast, values,
                          s if s is not None else _sizes(size_names, sizes), b)
    return _spmm_op(key, index, values, sizes, size_names, b)


@_spmm_op.register_fake
def _(key, index, values, sizes, size_names, b):
    return b.new_empty((_sizes(size_names, sizes)["rows"], b.shape[1]), dtype=_out_dtype(values))


def _sddmm_body(key: str, index: List[torch.Tensor], values: torch.Tensor, s: Dict[str, int],
                x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    _check_dense("X", x, s["rows"], values)
    _check_dense("Y", y, s["cols"], values)
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"X and Y should have the same width, got {x.shape[1]} and {y.shape[1]}")
    out = torch.empty(values.shape, dtype=_out_dtype(values), device=values.device)
    return _launch("sddmm", key, index, values, s, [x, y], out)


@torch.library.custom_op("sparsec::sddmm", mutates_args=())
def _sddmm_op(key: str, index: List[torch.Tensor], values: torch.Tensor, sizes: List[int], size_names: str,
              x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return _sddmm_body(key, index, values, _sizes(size_names, sizes), x, y)


def _sddmm(key, index, values, sizes, size_names, x, y, s: Optional[Dict[str, int]] = None,
           fast=None) -> torch.Tensor:
    """``sparsec::sddmm``, its body called directly where :func:`_eager` allows."""
    if _eager(values, x, y):
        return _sddmm_body(key, index if fast is None else fast, values,
                           s if s is not None else _sizes(size_names, sizes), x, y)
    return _sddmm_op(key, index, values, sizes, size_names, x, y)


@_sddmm_op.register_fake
def _(key, index, values, sizes, size_names, x, y):
    return values.new_empty(values.shape, dtype=_out_dtype(values))


class _SpMMFunction(torch.autograd.Function):
    """SpMM with its backward pass: dB = A^T dC, an SpMM on A's transpose (converted once,
    A's values moved to its slots through ``SparseTensor.transpose``'s slot map), and
    dA = SDDMM(pattern of A; dC, B) at A's stored slots (0 on padding). A plain autograd
    Function around the custom ops: ``torch.library``'s own autograd wrapper flattens every
    argument on each call and cost ~0.4 ms of host time per SpMM in a training step."""

    @staticmethod
    def forward(ctx, values, b, A):
        ctx.A = A
        ctx.save_for_backward(values, b)
        return _spmm(A.key, A.index, values, A.sizes, A.size_names, b, A.size_dict, A.ffi_index)

    @staticmethod
    def backward(ctx, grad):
        values, b = ctx.saved_tensors
        A = ctx.A
        grad = grad.contiguous().to(values.dtype)
        grad_values = grad_b = None
        if ctx.needs_input_grad[1]:
            t_key, t_index, _, t_sizes, t_size_names = A.transpose
            grad_b = _spmm(t_key, t_index, A.transposed_values(values), t_sizes, t_size_names, grad,
                           A.t_size_dict, A.t_ffi_index)
        if ctx.needs_input_grad[0]:
            ones = torch.ones_like(values) if A.entries is None else A.entries
            grad_values = _sddmm(A.key, A.index, ones, A.sizes, A.size_names, grad, b.contiguous(), A.size_dict,
                                 A.ffi_index)
        return grad_values, grad_b, None


# ---- user-facing wrappers ------------------------------------------------------------------------
def _slot_map(inst, t_inst) -> np.ndarray:
    """For each stored slot of ``t_inst`` (A transposed, any format) the slot of ``inst``
    holding the same entry; padding slots get ``inst.stored`` (an appended zero)."""
    rows, cols = inst.stored_coords()
    t_rows, t_cols = t_inst.stored_coords()
    n_cols = inst.shape[1]
    real = np.flatnonzero(rows >= 0)
    keys = rows[real].astype(np.int64) * n_cols + cols[real]
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    out = np.full(t_rows.shape, inst.stored, dtype=np.int64)
    ok = t_rows >= 0
    want = t_cols[ok].astype(np.int64) * n_cols + t_rows[ok]
    pos = np.searchsorted(sorted_keys, want)
    pos = np.minimum(pos, max(len(sorted_keys) - 1, 0))
    if len(sorted_keys) and not np.array_equal(sorted_keys[pos], want):
        raise ValueError("the transposed matrix holds an entry the matrix does not")
    if int(ok.sum()) != len(real):
        raise ValueError(f"the transpose holds {int(ok.sum())} entries, the matrix {len(real)}")
    out[np.flatnonzero(ok)] = real[order[pos]] if len(sorted_keys) else inst.stored
    return out


def transpose_spec(spec: str) -> Optional[str]:
    """The format A's transpose takes for SpMM's backward pass, or None where converting the
    transpose could change its entries (N:M prunes, SR-BCRS quantizes)."""
    family = spec.split(":", 1)[0].split("[", 1)[0]
    if family in ("csr", "ell", "hyb"):
        return family  # ell and hyb size their widths and buckets for the transpose
    if family == "bsr":
        r, c = spec.split(":", 1)[1].split("x")
        return f"bsr:{c}x{r}"
    return None


def _auto_instance(m, feat: Optional[int], device, dtype):
    """(instance, source) for ``SparseTensor(fmt="auto")``: ``formats.convert(m, "auto")``
    for SpMM at ``feat`` on ``device`` (a CUDA device: its arch's tuning log; the CPU has
    none), so the tuning logs' pick of format and format knobs where there is one, else the
    rule-based default format ("default")."""
    target = None
    if device.type == "cuda" and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(device)
        target = f"cuda:sm_{major}{minor}" + ("a" if major == 9 else "")
    name = _dtype_name(dtype)
    inst = convert(m, "auto", op="spmm", feat=feat, target=target, dtype=name or dtype)
    return inst, inst.format_source


def _dtype_name(dtype) -> Optional[str]:
    """The value dtype's name as sparsec spells it (None: float32); a torch or numpy dtype,
    or a name. None where sparsec has no such name (the conversion then names the problem)."""
    from .dtypes import dtype_spec

    if dtype is None:
        return "float32"
    text = str(dtype).replace("torch.", "") if isinstance(dtype, torch.dtype) else dtype
    try:
        return dtype_spec(text if isinstance(text, str) else np.dtype(text).name).name
    except (TypeError, ValueError):
        return None


class SparseTensor:
    """A matrix converted to a sparsec format, its index arrays on ``device`` (moved once)
    and its values a tensor (``values``) that may require grad.

    ``fmt="auto"`` takes the tuning logs' pick for SpMM at width ``feat`` on ``device``'s
    target (the best record for this matrix, else the cost model's, with the format's knobs;
    ``sparsec.formats.convert(m, "auto")``), else sparsec's rule-based default format (CSR on
    meshes, hyb where rows are skewed: ``sparsec.formats.choose``); ``format_source`` says
    which. Where the format allows
    it (:func:`transpose_spec`; ``grad=True`` insists, ``False`` skips it) A's transpose is
    converted too, with the map that carries A's values to its slots: SpMM's backward pass
    is then one more SpMM."""

    def __init__(self, matrix, fmt: str = "csr", *, device="cpu", dtype=None, requires_grad: bool = False,
                 grad: Optional[bool] = None, feat: Optional[int] = None):
        device = torch.device(device)
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"device should be cpu or cuda (where sparsec kernels run), got {device}")
        self.format_source = None  # with fmt="auto": "record", "model" or "default" (whose pick it is)
        if isinstance(matrix, (FormatInstance, CompositeInstance)):
            inst = matrix
            own = not is_trusted(inst)  # built by hand or changed: checked now, its arrays copied
            check_before_launch(inst)
        else:
            own = False
            m = sp.csr_matrix(matrix)
            if dtype is not None:  # a torch dtype, a numpy one or a name: as sparsec names it
                dtype = _dtype_name(dtype) or dtype
            if fmt == "auto":
                inst, self.format_source = _auto_instance(m, feat, device, dtype)
            else:
                inst = convert(m, fmt, dtype=dtype)
        if inst.value_dtype == "int4":
            raise TypeError("sparsec.torch takes no int4 matrices (two values per byte have no torch dtype); "
                            "use int8 SR-BCRS, or sparsec.compile for int4")
        self.instance, self.format, self.shape = inst, inst.format.spec, tuple(inst.shape)
        self.key = _register(inst)
        # from an instance not sealed by convert, a copy: the caller's arrays may change later
        self.index = [torch.from_numpy(np.array(a, copy=True) if own else np.ascontiguousarray(a)).to(device)
                      for a in index_arrays(inst).values()]
        # the index arrays as tvm_ffi tensors too (same memory): an eager launch passes these, one
        # handle each, rather than converting every torch tensor through DLPack on each call
        self.ffi_index = torch_launch.ffi_views(self.index)
        self.values = torch.from_numpy(np.ascontiguousarray(inst.data)).to(device).requires_grad_(requires_grad)
        # 1 at the matrix's entries, 0 at padding slots the indices do not mark (a BSR block's
        # implicit zeros are no parameters): SDDMM with it is dA, 0 on padding; None: all ones
        entries = inst.valid_slots()
        self.entries = None if entries.all() else torch.from_numpy(entries).to(device=device,
                                                                                dtype=self.values.dtype)
        sizes = scalar_values(inst)
        self.size_names, self.sizes = ",".join(sizes), [int(v) for v in sizes.values()]
        self.size_dict = dict(zip(sizes, self.sizes))  # what an eager call reads (no parsing per call)
        self.transpose, self._t_values, self.t_ffi_index, self.t_size_dict = None, None, None, None
        self._with_root = None  # (values, version, SparseTensor): see root_augmented
        t_spec = transpose_spec(self.format)
        if grad and t_spec is None:
            raise ValueError(f"{self.format} matrices have no backward pass here: converting the transpose "
                             "could change its entries (use csr, ell, hyb or bsr to train)")
        if grad is not False and t_spec is not None:
            t_inst = self._t_instance = convert(inst.to_scipy().T.tocsr(), t_spec, dtype=inst.value_dtype)
            t_sizes = scalar_values(t_inst)
            self.t_size_dict = dict(zip(t_sizes, (int(v) for v in t_sizes.values())))
            t_index = [torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in index_arrays(t_inst).values()]
            self.t_ffi_index = torch_launch.ffi_views(t_index)
            self.transpose = (_register(t_inst), t_index,
                              torch.from_numpy(_slot_map(inst, t_inst)).to(device),
                              [int(v) for v in t_sizes.values()], ",".join(t_sizes))

    def transposed_values(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` (one per stored slot of A) carried to the slots of A's transpose, 0 at its
        padding. Kept while ``values`` is the same unchanged tensor that requires no grad (a
        fixed matrix: three launches fewer in every backward pass); values being trained
        change each step, also inside a replayed CUDA graph, where no version count moves."""
        if torch.compiler.is_compiling():  # traced: no Python state (the graph runs the gather each time)
            return torch.cat([values, values.new_zeros(1)])[self.transpose[2]]
        cached = self._t_values
        if cached is not None and cached[0] is values and cached[1] == values._version:
            return cached[2]
        t_values = torch.cat([values.detach(), values.new_zeros(1)])[self.transpose[2]]
        if not values.requires_grad and not (values.is_cuda and torch.cuda.is_current_stream_capturing()):
            self._t_values = (values, values._version, t_values)
        return t_values

    @property
    def device(self):
        return self.values.device

    def to_dense(self) -> torch.Tensor:
        return torch.from_numpy(self.instance.to_scipy(self.values.detach().cpu().numpy()).toarray())


def spmm(A: SparseTensor, B: torch.Tensor) -> torch.Tensor:
    """``A @ B`` (B: cols x feat), differentiable in B and ``A.values`` when A was built with
    ``grad=True``."""
    if not isinstance(A, SparseTensor):
        raise TypeError(f"A should be a sparsec.torch.SparseTensor, got {type(A).__name__}")
    if A.transpose is not None and (A.values.requires_grad or B.requires_grad) and torch.is_grad_enabled():
        return _SpMMFunction.apply(A.values, B, A)
    return _spmm(A.key, A.index, A.values, A.sizes, A.size_names, B, A.size_dict, A.ffi_index)


def sddmm(A: SparseTensor, X: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    """``A[i, j] * (X[i, :] . Y[j, :])`` at each stored slot of A (not differentiable)."""
    if not isinstance(A, SparseTensor):
        raise TypeError(f"A should be a sparsec.torch.SparseTensor, got {type(A).__name__}")
    return _sddmm(A.key, A.index, A.values, A.sizes, A.size_names, X, Y, A.size_dict, A.ffi_index)


FEW_COLUMNS = 64  # the few-column BSR kernels (schedules.bsr_gather / ring / stream) take up to this many


@functools.lru_cache(maxsize=None)
def _spmm_stored_as(dtype: str):
    """SpMM ``C = A @ B`` whose output is declared ``dtype`` (a DSL operator like any user's):
    the BSR Tensor Core template takes it by structure, sums in float32 and stores ``dtype``."""
    from . import dsl

    op = dsl.Operator(f"spmm_stored_{dtype}", f"C[i, k] = sum_j A[i, j] * B[j, k], C stored as {dtype}")
    i = op.dense_fixed("i")
    j = op.sparse_variable("j", parent=i)
    k = op.dense_fixed("k", extent="feat")
    a, b = op.sparse_input("A", (i, j)), op.dense_input("B", (j, k))
    c = op.dense_output("C", (i, k), dtype=dtype)
    with op.iterate([i, j, k], "SRS") as (vi, vj, vk):
        c[vi, vk] += a[vi, vj] * b[vj, vk]
    return op


@functools.lru_cache(maxsize=None)
def _linear_stored_as(dtype: str, bias_dtype: Optional[str]):
    """The library ``linear`` on token-major activations with Y declared ``dtype`` (and a
    ``bias_dtype`` bias): on sm_90 ``schedules.bsr_tokens`` takes it by structure for BSR
    weights, with X and Y as ``torch.nn.Linear`` holds them (no transpose before or after)
    and the bias in its epilogue."""
    from . import ops

    return ops.linear(out_dtype=dtype, bias_dtype=bias_dtype)


class SparseLinear(torch.nn.Module):
    """``y = x @ W^T + b`` with a pruned weight W (out x in) held sparse. CSR, ELL, hyb and
    BSR weights train (the values are a Parameter); N:M (``nm:2,4``) and int8 SR-BCRS
    (``srbcrs:v8,int8``) weights are inference-only. An int8 weight is quantized per tensor
    when built (``weight_scale``) and each input per tensor at run time; the int32 product
    is exact and scaled back to float."""

    def __init__(self, weight: SparseTensor, bias: Optional[torch.Tensor] = None, weight_scale: float = 1.0):
        super().__init__()
        self.weight = weight
        self.values = torch.nn.Parameter(weight.values.detach(), requires_grad=weight.transpose is not None)
        weight.values = self.values
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach().clone())
        self.out_features, self.in_features = weight.shape
        self.weight_scale = float(weight_scale)
        self.quantized = weight.values.dtype == torch.int8

    @classmethod
    def from_dense(cls, weight, bias=None, fmt: str = "csr", device=None, dtype=None):
        """A layer of the pruned dense ``weight`` in format ``fmt``. The Tensor Core patterns
        ``nm_tc:N,M`` (vector-wise N:M) and ``mma_sp:2,4`` give an inference-only fp16
        :class:`sparsec.tc_linear.TensorCoreLinear` instead (CUDA only), whose kernels
        ``sparsec.compile`` builds from its operator like any other (the packed Tensor Core
        path); an ``nm:2,4`` float16 weight on CUDA reaches the same ``mma.sp`` kernel
        through ``spmm`` (its packed operands handed over by ``torch_launch.packed_operand``)."""
        if fmt.partition(":")[0] in ("nm_tc", "mma_sp"):
            from .tc_linear import TensorCoreLinear

            return TensorCoreLinear.from_dense(weight, bias, fmt, device=device or "cuda",
                                               dtype=dtype or torch.float16)
        if isinstance(weight, torch.Tensor) and weight.dtype in (torch.float16, torch.bfloat16):
            # a half-precision weight keeps its precision (scipy holds it as float32 meanwhile)
            dtype = dtype or str(weight.dtype).split(".")[-1]
            weight = weight.float()
        w = weight.detach().cpu().numpy() if isinstance(weight, torch.Tensor) else np.asarray(weight)
        if w.dtype == np.float16:
            dtype, w = dtype or "float16", w.astype(np.float32)
        device = device or (weight.device if isinstance(weight, torch.Tensor) else "cpu")
        m, scale = sp.csr_matrix(w), 1.0
        if fmt.startswith("srbcrs") and fmt.endswith("int8"):
            from .formats import srbcrs

            m, scale = srbcrs.quantize(m, 8)
            dtype = "int8"
        st = SparseTensor(m, fmt, device=device, dtype=dtype)
        return cls(st, None if bias is None else torch.as_tensor(bias, device=device), scale)

    def _stores_half(self, x2: torch.Tensor) -> bool:
        """Whether this call's kernel stores the layer's half precision itself: a BSR weight on
        CUDA, more tokens than the few-column kernels take (they store float32), no gradient
        to record. The block-row Tensor Core template sums in float32 and stores float16 /
        bfloat16, so no float32 output is written and read back by a cast (``weights.py``
        times the layer beside its float32 kernel)."""
        values = self.weight.values
        return (values.dtype in (torch.float16, torch.bfloat16) and x2.dtype == values.dtype and x2.is_cuda
                and x2.shape[0] > FEW_COLUMNS and self.weight.format.partition(":")[0] == "bsr"
                and not isinstance(self.weight.instance, CompositeInstance)
                and not torch.compiler.is_compiling()
                and not (torch.is_grad_enabled() and (values.requires_grad or x2.requires_grad)))

    def _token_major(self, x2: torch.Tensor) -> bool:
        """Whether this call runs ``bsr_tokens`` on x as it is (:func:`_linear_stored_as`): the
        half BSR path above on an sm_90 GPU, float16 values, blocks it takes, and rows and
        columns a multiple of 8 (its TMA rows and 16-byte stores)."""
        if not self._stores_half(x2) or x2.dtype != torch.float16 or torch.cuda.get_device_capability(x2.device)[0] < 9:
            return False
        from .schedules import bsr_tokens
        from .schedules.tensorcore_packed import TOKEN_MAJOR_MULTIPLE

        block = self.weight.instance.format.param("block")
        bias_ok = self.bias is None or self.bias.dtype in (torch.float16, torch.float32)
        return bias_ok and bsr_tokens.takes(block) and not (self.out_features % TOKEN_MAJOR_MULTIPLE
                                                             or self.in_features % TOKEN_MAJOR_MULTIPLE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if self._token_major(x2):  # y = x W^T (+ b) in one kernel on x as it is
            bias = self.bias.detach() if self.bias is not None else None
            inputs = {"X": x2} if bias is None else {"X": x2, "bias": bias}
            (y,) = torch_launch.run(_linear_stored_as("float16", None if bias is None else str(bias.dtype)[6:]),
                                    torch_launch.MatrixArgs.of(self.weight, self.values.detach()), inputs,
                                    feat=int(x2.shape[0]))
            return y.reshape(*lead, self.out_features)
        if self.quantized:  # symmetric per-tensor int8 activations; exact int32 product
            x_scale = x2.abs().amax().clamp_min(1e-12) / 127
            xq = torch.clamp(torch.round(x2 / x_scale), -127, 127).to(torch.int8).t().contiguous()
            # scaled in float32: the int32 sums pass float16's range long before the result does
            y = (spmm(self.weight, xq).float() * (x_scale.float() * self.weight_scale)).t().to(x.dtype)
        else:
            from .tc_linear import feature_major  # x2.t().contiguous(), by a tiled kernel on CUDA

            xt = feature_major(x2)
            if self._stores_half(x2):
                (yt,) = torch_launch.run(_spmm_stored_as(str(x2.dtype)[6:]),
                                         torch_launch.MatrixArgs.of(self.weight, self.values.detach()), {"B": xt},
                                         feat=int(x2.shape[0]))
                y = yt.t()
            else:
                # in x tokens -> out x tokens; float16 / bfloat16 values sum in float32, and a
                # layer hands back its input's precision as torch.nn.Linear does
                y = spmm(self.weight, xt).t().to(x.dtype)
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


def mean_adjacency(adj: sp.spmatrix) -> sp.csr_matrix:
    """``D^-1 A``, GraphSAGE's mean aggregator as a matrix (row i averages the neighbours it
    lists; rows of isolated nodes stay zero), float32 CSR."""
    a = sp.csr_matrix(adj, dtype=np.float64)
    d = np.asarray(a.sum(axis=1)).ravel()
    return (sp.diags(np.where(d > 0, 1.0 / np.maximum(d, 1), 0.0)) @ a).tocsr().astype(np.float32)


def _check_x(A, x: torch.Tensor, in_features: int):
    if not isinstance(A, SparseTensor):
        raise TypeError(f"A should be a sparsec.torch.SparseTensor, got {type(A).__name__}")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x should be a torch tensor, got {type(x).__name__}")
    _check_dense("x", x, A.shape[1], A.values)
    if x.shape[1] != in_features:
        raise ValueError(f"x should have {in_features} features (the layer's in_features), got {x.shape[1]}")


def _check_pyg_shape(name: str, weight: torch.Tensor, want) -> None:
    if tuple(weight.shape) != tuple(want):
        raise ValueError(f"{name} should be out x in = {tuple(want)} for this layer, got {tuple(weight.shape)}")


def _uniform(shape, bound: float) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.empty(shape).uniform_(-bound, bound))


def root_augmented(a: SparseTensor) -> Optional[SparseTensor]:
    """``[A | I]`` with its columns interleaved (n x 2n: A's column j moved to 2j, a 1 at
    (i, 2i + 1)), or None where A is not square or its format would lose its blocks that
    way (bsr and others).

    Why: with ``Y = x @ [W_l; W_r]^T`` (n x 2F, one product), ``Y.view(2n, F)`` holds row j's
    neighbour projection at row 2j and its root projection at row 2j + 1, so
    ``A (x W_l^T) + x W_r^T`` is one SpMM of this matrix with that view; and the SpMM of its
    transpose with dY gives ``[A^T dY | dY]`` (2n x F, read as n x 2F), the stacked gradient
    of Y, with no concatenation. GraphSAGE's layer projecting first is then one matmul and one
    SpMM forward, one SpMM and two matmuls backward. Built on first use, in A's format, and
    kept while A's values are the same unchanged tensor."""
    values = a.values
    cached = a._with_root
    if cached is not None and cached[0] is values and cached[1] == values._version:
        return cached[2]
    family = a.format.split(":", 1)[0].split("[", 1)[0]
    if family not in ("csr", "ell", "hyb") or a.shape[0] != a.shape[1]:
        return None
    m = a.instance.to_scipy(values.detach().cpu().numpy()).tocoo()
    n = m.shape[0]
    node = np.arange(n)
    aug = sp.csr_matrix((np.concatenate([m.data, np.ones(n, m.data.dtype)]),
                         (np.concatenate([m.row, node]), np.concatenate([2 * m.col, 2 * node + 1]))),
                        shape=(n, 2 * n))
    out = SparseTensor(aug, "ell" if family == "ell" else a.format, device=values.device,
                       dtype=a.instance.value_dtype)
    a._with_root = (values, values._version, out)
    return out


class GCNConv(torch.nn.Module):
    """One graph convolution, ``A_hat @ (x @ W) + b`` (A_hat from :func:`gcn_norm`; W is
    in_features x out_features; :meth:`load_pyg` copies a PyG GCNConv's): one autograd node,
    the bias added by the SpMM's epilogue, where the matrix is fixed (``sparsec.torch_conv``),
    else the ops composed."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = _uniform((in_features, out_features), 1 / math.sqrt(in_features))
        self.bias = torch.nn.Parameter(torch.zeros(out_features)) if bias else None

    def forward(self, a_hat: SparseTensor, x: torch.Tensor) -> torch.Tensor:
        _check_x(a_hat, x, self.in_features)
        if torch_conv.fused(a_hat, x, self.weight, self.bias):
            project = torch_conv.project_first(x, self.in_features, self.out_features)
            return torch_conv.gcn(x if x.is_contiguous() else x.contiguous(), self.weight, self.bias, a_hat, project)
        h = spmm(a_hat, x @ self.weight)
        return h + self.bias if self.bias is not None else h

    def load_pyg(self, conv) -> "GCNConv":
        """Take the weights of a PyG ``GCNConv`` (its ``lin.weight`` is W transposed)."""
        _check_pyg_shape("conv.lin.weight", conv.lin.weight, (self.out_features, self.in_features))
        with torch.no_grad():
            self.weight.copy_(conv.lin.weight.t())
            if self.bias is not None:
                self.bias.copy_(conv.bias)
        return self


class SAGEConv(torch.nn.Module):
    """GraphSAGE with mean aggregation, ``mean_j x_j @ W_l^T + x @ W_r^T + b``, as PyG's
    ``SAGEConv(aggr="mean")`` (its ``lin_l.weight``, ``lin_r.weight``, ``lin_l.bias``;
    :meth:`load_pyg` copies them). ``a_mean``: :func:`mean_adjacency` of the graph as a
    SparseTensor (row i lists the neighbours i aggregates). One autograd node, the root term
    added by the SpMM's epilogue, where the matrix is fixed; else the ops composed.

    ``weight`` holds W_l and W_r stacked (2 out x in; ``weight_l`` and ``weight_r`` are its
    halves, as views): one parameter instead of two spares every training step an autograd
    node and lets the backward pass form both weights' gradients in one product."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        bound = 1 / math.sqrt(in_features)
        self.weight = _uniform((2 * out_features, in_features), bound)
        self.bias = _uniform((out_features,), bound) if bias else None

    @property
    def weight_l(self) -> torch.Tensor:
        """W_l, applied to the neighbour mean (a view of ``weight``'s first half)."""
        return self.weight[:self.out_features]

    @property
    def weight_r(self) -> torch.Tensor:
        """W_r, applied to the node itself (a view of ``weight``'s second half)."""
        return self.weight[self.out_features:]

    def forward(self, a_mean: SparseTensor, x: torch.Tensor) -> torch.Tensor:
        _check_x(a_mean, x, self.in_features)
        if a_mean.shape[0] != a_mean.shape[1]:
            raise ValueError(f"a_mean should be square (nodes x nodes), got shape {a_mean.shape}")
        if torch_conv.fused(a_mean, x, self.weight, self.bias):
            x = x if x.is_contiguous() else x.contiguous()
            if torch_conv.project_first(x, self.in_features, self.out_features):
                aug = root_augmented(a_mean)
                if aug is not None and torch_conv.fused(aug, x):
                    return torch_conv.sage(x, self.weight, self.bias, aug, "root")
                return torch_conv.sage(x, self.weight, self.bias, a_mean, "project")
            return torch_conv.sage(x, self.weight, self.bias, a_mean, "aggregate")
        out = spmm(a_mean, x) @ self.weight_l.t() + x @ self.weight_r.t()
        return out + self.bias if self.bias is not None else out

    def load_pyg(self, conv) -> "SAGEConv":
        """Take the weights of a PyG ``SAGEConv(aggr="mean")``."""
        for name in ("lin_l", "lin_r"):
            _check_pyg_shape(f"conv.{name}.weight", getattr(conv, name).weight, (self.out_features, self.in_features))
        with torch.no_grad():
            self.weight_l.copy_(conv.lin_l.weight)
            self.weight_r.copy_(conv.lin_r.weight)
            if self.bias is not None:
                self.bias.copy_(conv.lin_l.bias)
        return self


def gat_graph(edges, num_nodes: Optional[int] = None, *, add_self_loops: bool = True, fmt: str = "auto",
              device="cpu") -> SparseTensor:
    """The graph GAT layers aggregate over (``sparsec.torch_gnn``): the adjacency of
    :func:`sparsec.torch_gnn.gat_adjacency` (row i lists the sources j of the edges j -> i of
    PyG's ``edge_index``, self-loops as PyG's GATConv adds them) as a SparseTensor in ``fmt``
    with its transpose in the same family (the backward pass runs on it). ``fmt``: csr, ell,
    bsr:RxC, hyb, or ``"auto"``: hyb where rows or columns are skewed (hub nodes), csr
    otherwise (:func:`sparsec.torch_gnn.gat_format`)."""
    from .torch_gnn import gat_adjacency, gat_format

    adj = gat_adjacency(edges, num_nodes, add_self_loops=add_self_loops)
    return SparseTensor(adj, gat_format(adj) if fmt == "auto" else fmt, device=device, grad=True)


def __getattr__(name: str):
    if name in _GNN:
        from . import torch_gnn

        return getattr(torch_gnn, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
