"""Pruned linear layers on the Tensor Cores, for inference (fp16 / bf16 on a CUDA GPU).

    lin = TensorCoreLinear.from_dense(w, bias, pattern="nm_tc:1,10", activation="gelu")
    ffn = SparseFFN(TensorCoreLinear.from_dense(w1, b1, "nm_tc:1,10", activation="gelu"),
                    TensorCoreLinear.from_dense(w2, b2, "nm_tc:1,10"))
    y = ffn(x)                                   # x: (..., 768) fp16 -> (..., 768)

Two weight patterns, each converted once to its ``sparsec.formats`` family (which checks
the pattern and packs the Tensor Core operand) and multiplied by the kernel
``sparsec.compile`` builds for the layer's operator (:func:`linear_operator`, a DSL SpMM):

* ``"nm_tc:N,M"`` — vector-wise N:M (format ``nm_tc:N:M:v128``): rows in vectors of ``vec``
  (128) share their kept columns, N in every M, so a block gathers N/M of the activations'
  rows and runs dense ``mma`` on them. ``nm_tc:1,10`` is 90 % sparse.
* ``"mma_sp:2,4"`` — 2:4 (format ``mma_sp``) through the sparse ``mma.sp`` instruction.

The operator computes ``W @ x^T`` with the activations feature-major (in x tokens): that is
the layout whose rows a gather reads whole. Its epilogue statement adds the bias per output
feature and applies the activation (``sparsec.dsl.ACTIVATIONS``), its output is declared in
the layer's precision, and it writes ``C[token, feature]`` (token-major) or, for the first
layer of :class:`SparseFFN`, ``C[feature, token]``, which is what the second layer reads, so
an FFN costs one transpose of its input and two kernels. ``sparsec.compile`` recognises the
structure and runs it on the packed Tensor Core pipeline (``schedules.tensorcore_packed``,
whose defaults pick the tiles per token count), like any user's operator of that shape.
Kernels are compiled per token count on first use and shared by layers of the same pattern;
each launches on torch's current stream and reads the tensors in place through DLPack.
"""
from __future__ import annotations

import functools
from typing import Optional, Tuple

import numpy as np
import torch

from .kernel import on_torch_stream
from .schedules.tensorcore_packed import GATHER_FEAT_ALIGN

__all__ = ["TensorCoreLinear", "SparseFFN", "PATTERNS", "parse_pattern", "feature_major", "prune"]

PATTERNS = ("nm_tc", "mma_sp")
VEC = 128  # rows per vector of a vector-wise N:M weight (a multiple of every block height)
ACTIVATIONS = ("none", "gelu", "gelu_tanh", "relu")  # "none" and the names of sparsec.dsl.ACTIVATIONS


def parse_pattern(pattern: str) -> Tuple[str, int, int]:
    """``"nm_tc:1,10"`` -> ("nm_tc", 1, 10); ValueError naming what is wrong."""
    kind, _, rest = str(pattern).partition(":")
    try:
        n, m = (int(v) for v in rest.split(","))
    except ValueError:
        raise ValueError(f"pattern should be 'nm_tc:N,M' or 'mma_sp:2,4', got {pattern!r}") from None
    if kind not in PATTERNS:
        raise ValueError(f"pattern should be 'nm_tc:N,M' or 'mma_sp:2,4', got {pattern!r}")
    if kind == "mma_sp" and (n, m) != (2, 4):
        raise ValueError(f"mma_sp takes 2:4 weights only (the instruction's pattern), got {n}:{m}")
    if not 0 < n <= m:
        raise ValueError(f"pattern {pattern!r}: need 0 < N <= M")
    return kind, n, m


def knobs_for(mode: str, tokens: int, kc: int, shape=None) -> dict:
    """The kernel's knobs for a token count, gathered row length and (where given) the
    weight's (out, in) shape: the packed Tensor Core transformation's defaults
    (``schedules.tensorcore_packed.default_pipeline_knobs``, the rule every compiled kernel of
    this structure follows; the layer's kernel is compiled for its weight, so its shape counts)."""
    from .schedules.tensorcore_packed import default_pipeline_knobs

    return default_pipeline_knobs(mode, VEC, tokens, kc if mode == "gather" else None, shape)


def format_spec(kind: str, n: int, m: int) -> str:
    """The ``sparsec.formats`` spec of a pattern: ``nm_tc:N:M:v128`` or ``mma_sp``."""
    return f"nm_tc:{n}:{m}:v{VEC}" if kind == "nm_tc" else "mma_sp"


@functools.lru_cache(maxsize=64)
def linear_operator(bias: bool, activation: str, token_major_out: bool, dtype: str):
    """The layer as a DSL operator: ``C = act(W @ X + bias)`` with W (out x in) sparse, X
    (in x tokens) dense, the bias (float32, one per output feature) and the output in
    ``dtype``, written ``C[token, feature]`` with ``token_major_out`` else
    ``C[feature, token]``. Its name says its definition (kernels are cached by name)."""
    from . import dsl

    name = f"tc_linear_{'bias_' if bias else ''}{activation}_{'tm' if token_major_out else 'fm'}_{dtype}"
    op = dsl.Operator(name, "C = act(W @ X + bias) of a pruned linear layer, activations feature-major")
    i = op.dense_fixed("i")  # output feature
    j = op.sparse_variable("j", parent=i)  # input feature
    t = op.dense_fixed("t", extent="tokens")
    W, X = op.sparse_input("W", (i, j)), op.dense_input("X", (j, t))
    B = op.dense_input("bias", (i,), dtype="float32") if bias else None
    C = op.dense_output("C", (t, i) if token_major_out else (i, t), dtype=dtype)

    def out(ii, tt):
        return (tt, ii) if token_major_out else (ii, tt)

    with op.iterate([i, j, t], "SRS") as (ii, jj, tt):
        C[out(ii, tt)] += W[ii, jj] * X[jj, tt]
    if bias or activation != "none":
        act = dsl.ACTIVATIONS.get(activation, lambda x: x)
        with op.iterate([i, t], "SS") as (ii, tt):
            C[out(ii, tt)] = act(C[out(ii, tt)] + B[ii] if bias else C[out(ii, tt)])
    return op


_KERNELS: dict = {}  # (spec, dtype, tokens, row stages, bias, activation, token-major, arch) -> Kernel


def _kernel(layer: "TensorCoreLinear", tokens: int, token_major_out: bool, arch: str):
    """The compiled kernel for a layer's pattern and a token count (shared by equal layers:
    it runs on any matrix of the format; the gathered row length only picks the tiles)."""
    from .api import compile as sparsec_compile

    dtype = str(layer.values.dtype)[6:]
    kc = int(layer.values.shape[1]) if layer.kind == "nm_tc" else 0
    key = (layer.format_spec, dtype, tokens, kc, layer.bias is not None, layer.activation, token_major_out, arch)
    if key not in _KERNELS:
        op = linear_operator(layer.bias is not None, layer.activation, token_major_out, dtype)
        k = sparsec_compile(op, layer.instance, target=f"cuda:{arch}", dtype=dtype, tokens=tokens)
        if not k.knobs or "warps_m" not in k.knobs:
            raise RuntimeError(f"{op.name} x {layer.format_spec} did not compile to the Tensor Core pipeline")
        _KERNELS[key] = k
    return _KERNELS[key]


def feature_major(x2: torch.Tensor) -> torch.Tensor:
    """``x2.t().contiguous()`` for a (tokens, features) CUDA tensor, through sparsec's tiled
    transpose kernel where both sizes are multiples of 8 (torch's strided copy otherwise)."""
    rows, cols = x2.shape
    if x2.device.type != "cuda" or rows % 8 or cols % 8 or str(x2.dtype)[6:] not in ("float16", "bfloat16"):
        return x2.t().contiguous()
    x2 = x2 if x2.is_contiguous() else x2.contiguous()
    out = torch.empty((cols, rows), dtype=x2.dtype, device=x2.device)
    with on_torch_stream(True):
        _transposer(int(rows), int(cols), str(x2.dtype)[6:], _arch(x2.device))(x2, out)
    return out


@functools.lru_cache(maxsize=64)
def _transposer(rows: int, cols: int, dtype: str, arch: str):
    """The tiled transpose kernel of a (rows, cols) ``dtype`` matrix, built once per shape."""
    from .schedules import transpose

    return transpose.build(rows, cols, dtype, arch)["transpose"]


def _arch(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


class TensorCoreLinear(torch.nn.Module):
    """``y = act(x @ W^T + b)`` with W pruned to a Tensor Core pattern (see the module doc).
    Inference only: the packed weight is a buffer, not a Parameter."""

    def __init__(self, values: torch.Tensor, index: torch.Tensor, shape: Tuple[int, int], pattern: str,
                 bias: Optional[torch.Tensor] = None, activation: str = "none", instance=None):
        """``values``/``index``: the packed operand (``formats.nm_tc.pack``'s values and
        columns, or ``formats.mma_sp.pack``'s values and metadata as uint32); ``instance``:
        the converted weight (``from_dense`` keeps it) the kernels are compiled for, so its
        gathered row length picks their tiles; without it, the format spec."""
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation should be one of {list(ACTIVATIONS)}, got {activation!r}")
        self.kind, self.n, self.m = parse_pattern(pattern)
        self.pattern, self.activation = pattern, activation
        self.out_features, self.in_features = shape
        self.format_spec = format_spec(self.kind, self.n, self.m)
        self.instance = instance
        self.register_buffer("values", values)
        self.register_buffer("index", index)
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())

    @classmethod
    def from_dense(cls, weight, bias=None, pattern: str = "nm_tc:1,10", activation: str = "none",
                   device="cuda", dtype=torch.float16):
        """Convert an already-pruned weight (out x in) to the pattern's format
        (``sparsec.formats.convert``: it packs the Tensor Core operand); ValueError naming
        the rows and window (or 4-column group) that break the pattern. ``prune`` makes one
        that fits."""
        from .formats import convert, nm_tc

        kind, n, m = parse_pattern(pattern)
        w = weight.detach().cpu().float().numpy() if isinstance(weight, torch.Tensor) else np.asarray(weight)
        if w.ndim != 2:
            raise ValueError(f"the weight should be 2-D (out x in), got shape {w.shape}")
        if dtype not in (torch.float16, torch.bfloat16):
            raise TypeError(f"Tensor Core layers take float16 or bfloat16, got {dtype}")
        if kind == "mma_sp" and dtype != torch.float16:
            raise TypeError("mma_sp:2,4 layers hold float16 values (formats.mma_sp packs float16)")
        fp16 = dtype == torch.float16  # the formats pack float16; bfloat16 is packed from float32 here
        inst = convert(w.astype(np.float32), format_spec(kind, n, m), dtype=np.float16 if fp16 else np.float32)
        if kind == "nm_tc":
            if fp16:
                values, cols = inst.arrays["gather_values"], inst.arrays["gather_cols"]
            else:
                values, cols = nm_tc.pack(inst.to_dense(), n=n, m=m, vec=VEC, dtype="float32")
            # the format's own packing, as the kernel is compiled for it: a wider row than the
            # matrix's would miss the kernel's sized body for the any-size one (1.4x slower)
            index = torch.from_numpy(np.ascontiguousarray(cols))
        else:
            values = inst.arrays["sp24_values"]
            index = torch.from_numpy(inst.arrays["sp24_meta"].view(np.int32)).view(torch.uint32)
        vals = torch.from_numpy(np.ascontiguousarray(values)).to(dtype)
        b = None if bias is None else torch.as_tensor(bias).detach().float()
        layer = cls(vals, index, w.shape, pattern, b, activation, instance=inst)
        return layer.to(device)

    def kernel(self, tokens: int, token_major_out: bool = True, arch: str = "sm_90a"):
        """The compiled ``sparsec.Kernel`` this layer runs for ``tokens`` columns (for
        :meth:`kernel_tokens` of them; its CUDA source with ``.source()``; compiling needs no GPU)."""
        return _kernel(self, self.kernel_tokens(tokens), bool(token_major_out), arch)

    # ---- running --------------------------------------------------------------------------
    @property
    def mode(self) -> str:
        return "gather" if self.kind == "nm_tc" else "sp24"

    def _check_input(self, xt: torch.Tensor):
        if xt.device.type != "cuda":
            raise ValueError(f"TensorCoreLinear runs on a CUDA GPU; the input is on {xt.device}")
        if xt.device != self.values.device:
            raise ValueError(f"the input is on {xt.device} but the weight is on {self.values.device}")
        if xt.dtype != self.values.dtype:
            raise TypeError(f"the input should be {self.values.dtype} like the weight, got {xt.dtype}")
        if xt.dim() != 2 or xt.shape[0] != self.in_features:
            raise ValueError(f"feature-major input should be ({self.in_features}, tokens), got {tuple(xt.shape)}")

    def forward_feature_major(self, xt: torch.Tensor, token_major_out: bool = True) -> torch.Tensor:
        """The layer on activations held feature-major ``(in, tokens)``; returns
        ``(tokens, out)`` or, with ``token_major_out=False``, ``(out, tokens)``."""
        self._check_input(xt)
        tokens = int(xt.shape[1])
        run = self.kernel_tokens(tokens)
        if run != tokens:  # zero columns up to what the kernel takes; their outputs are dropped
            xt = torch.nn.functional.pad(xt, (0, run - tokens))
        xt = xt if xt.is_contiguous() else xt.contiguous()
        k = _kernel(self, run, token_major_out, _arch(xt.device))
        shape = (run, self.out_features) if token_major_out else (self.out_features, run)
        out = torch.empty(shape, dtype=xt.dtype, device=xt.device)
        bias = None if self.bias is None else self.bias.float()  # float32 even after module.half()
        packed = iter((self.values, self.index))
        by_role = {"input": {"X": xt, "bias": bias}, "output": {"C": out}}
        args = [next(packed) if p.role == "index" else by_role[p.role][p.name] for p in k.params]
        with on_torch_stream(True):
            k.executable[k.op_name](*args)
        if run == tokens:
            return out
        return out[:tokens] if token_major_out else out[:, :tokens]

    def kernel_tokens(self, tokens: int) -> int:
        """The token count the layer's kernel runs for ``tokens`` (vector-wise N:M takes a
        multiple of 16 columns; at least 16, so an empty batch runs a tile of zeros)."""
        if isinstance(tokens, bool) or not isinstance(tokens, (int, np.integer)) or tokens < 0:
            raise ValueError(f"tokens should be a non-negative int (the input's columns), got {tokens!r}")
        if self.mode != "gather":
            return max(int(tokens), 1)
        return max(-(-int(tokens) // GATHER_FEAT_ALIGN), 1) * GATHER_FEAT_ALIGN

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"the input's last dimension should be {self.in_features}, got {tuple(x.shape)}")
        lead = x.shape[:-1]
        y = self.forward_feature_major(feature_major(x.reshape(-1, self.in_features)))
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, pattern={self.pattern}, "
                f"activation={self.activation}, bias={self.bias is not None}")


class SparseFFN(torch.nn.Module):
    """A transformer FFN, ``up`` (with its activation fused) then ``down``, keeping the
    hidden activations feature-major between the two kernels: one transpose in all."""

    def __init__(self, up: TensorCoreLinear, down: TensorCoreLinear):
        super().__init__()
        if up.out_features != down.in_features:
            raise ValueError(f"up gives {up.out_features} features but down takes {down.in_features}")
        self.up, self.down = up, down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.up.in_features:
            raise ValueError(f"the input's last dimension should be {self.up.in_features}, got {tuple(x.shape)}")
        lead = x.shape[:-1]
        h = self.up.forward_feature_major(feature_major(x.reshape(-1, self.up.in_features)),
                                          token_major_out=False)
        return self.down.forward_feature_major(h).reshape(*lead, self.down.out_features)


def prune(weight: np.ndarray, pattern: str) -> np.ndarray:
    """``weight`` pruned by magnitude to ``pattern`` (vector-wise N:M by the vectors' L1
    norms; 2:4 per row), zeros elsewhere, same dtype."""
    from .formats import nm, nm_tc

    kind, n, m = parse_pattern(pattern)
    w = np.asarray(weight)
    if kind == "nm_tc":
        return nm_tc.prune(w, n=n, m=m, vec=VEC)
    return np.where(nm.prune(w.astype(np.float32), n=2, m=4)[1], w, 0).astype(w.dtype)
