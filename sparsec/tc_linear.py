"""Pruned linear layers on the Tensor Cores, for inference (fp16 / bf16 on a CUDA GPU).

    lin = TensorCoreLinear.from_dense(w, bias, pattern="nm_tc:1,10", activation="gelu")
    ffn = SparseFFN(TensorCoreLinear.from_dense(w1, b1, "nm_tc:1,10", activation="gelu"),
                    TensorCoreLinear.from_dense(w2, b2, "nm_tc:1,10"))
    y = ffn(x)                                   # x: (..., 768) fp16 -> (..., 768)

Two weight patterns, each packed once and multiplied by ``schedules.tc_pipeline``:

* ``"nm_tc:N,M"`` — vector-wise N:M (``formats.nm_tc``): rows in vectors of ``vec`` (128)
  share their kept columns, N in every M, so a block gathers N/M of the activations' rows
  and runs dense ``mma`` on them. ``nm_tc:1,10`` is 90 % sparse.
* ``"mma_sp:2,4"`` — 2:4 (``formats.mma_sp``) through the sparse ``mma.sp`` instruction.

The kernel computes ``W @ x^T`` with the activations feature-major (in x tokens): that is
the layout whose rows a gather reads whole. Bias and activation run in the kernel's
epilogue, and the output comes back token-major (``transpose_c``) or, for the first layer
of :class:`SparseFFN`, feature-major, which is what the second layer reads, so an FFN
costs one transpose of its input and two kernels. Kernels are compiled per token count on
first use and shared by layers of the same shape; each launches on torch's current stream
and reads the tensors in place through DLPack.
"""
from __future__ import annotations

import functools
from typing import Optional, Tuple

import numpy as np
import torch

from .kernel import on_torch_stream

__all__ = ["TensorCoreLinear", "SparseFFN", "PATTERNS", "parse_pattern", "feature_major", "prune"]

PATTERNS = ("nm_tc", "mma_sp")
VEC = 128  # rows per vector of a vector-wise N:M weight (a multiple of every block height)
KC_ALIGN = 32  # gathered row length padded to whole 2-k-step stages (no bounds checks)


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


def knobs_for(mode: str, tokens: int, kc: int) -> dict:
    """The kernel's knobs for a token count and gathered row length (measured on an H200,
    benchmarks/results/ffn_tc_H200.json): narrow column tiles and deep stages below 512
    tokens; 128 x 64 blocks above, with 4 k-steps a stage where the row is long enough."""
    long_k = mode == "sp24" or (kc % 64 == 0 and kc > 128)
    if tokens < 512:
        return dict(warps_m=4, warps_n=1, warp_m_tiles=1, warp_n_tiles=2, k_steps=4 if long_k else 2, stages=4)
    base = dict(warps_m=2, warps_n=2, warp_m_tiles=4, warp_n_tiles=4, group_m=8)
    return {**base, "k_steps": 4, "stages": 3} if long_k else {**base, "k_steps": 2, "stages": 4}


@functools.lru_cache(maxsize=128)
def _kernel(mode: str, out_f: int, in_f: int, tokens: int, dtype: str, kc: int, bias: bool, activation: str,
            transpose_c: bool, arch: str):
    """The compiled kernel for one layer shape and token count (shared by equal layers)."""
    from .schedules import tc_pipeline

    extra = {"vec": VEC, "kc": kc} if mode == "gather" else {}
    ex = tc_pipeline.build(mode, out_f, in_f, tokens, arch=arch, dtype=dtype, out_dtype=dtype, bias=bias,
                           activation=activation, transpose_c=transpose_c, **extra,
                           **knobs_for(mode, tokens, kc))
    return ex["tc_spmm"]


@functools.lru_cache(maxsize=64)
def _transposer(rows: int, cols: int, dtype: str, arch: str):
    from .schedules import transpose

    return transpose.build(rows, cols, dtype, arch)["transpose"]


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


def _arch(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


class TensorCoreLinear(torch.nn.Module):
    """``y = act(x @ W^T + b)`` with W pruned to a Tensor Core pattern (see the module doc).
    Inference only: the packed weight is a buffer, not a Parameter."""

    def __init__(self, values: torch.Tensor, index: torch.Tensor, shape: Tuple[int, int], pattern: str,
                 bias: Optional[torch.Tensor] = None, activation: str = "none"):
        super().__init__()
        from .schedules.tc_pipeline import ACTIVATIONS

        if activation not in ACTIVATIONS:
            raise ValueError(f"activation should be one of {list(ACTIVATIONS)}, got {activation!r}")
        self.kind, self.n, self.m = parse_pattern(pattern)
        self.pattern, self.activation = pattern, activation
        self.out_features, self.in_features = shape
        self.register_buffer("values", values)
        self.register_buffer("index", index)
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())

    @classmethod
    def from_dense(cls, weight, bias=None, pattern: str = "nm_tc:1,10", activation: str = "none",
                   device="cuda", dtype=torch.float16):
        """Pack an already-pruned weight (out x in); ValueError naming the row vector and
        window (or 4-column group) that breaks the pattern. ``prune`` makes one that fits."""
        from .formats import mma_sp, nm_tc

        kind, n, m = parse_pattern(pattern)
        w = weight.detach().cpu().float().numpy() if isinstance(weight, torch.Tensor) else np.asarray(weight)
        if w.ndim != 2:
            raise ValueError(f"the weight should be 2-D (out x in), got shape {w.shape}")
        if dtype not in (torch.float16, torch.bfloat16):
            raise TypeError(f"Tensor Core layers take float16 or bfloat16, got {dtype}")
        np_dtype = "float16" if dtype == torch.float16 else "float32"
        if kind == "nm_tc":
            values, cols = nm_tc.pack(w, n=n, m=m, vec=VEC, dtype=np_dtype)
            pad = -values.shape[1] % KC_ALIGN  # zero values at column 0: same product, whole stages
            values = np.pad(values, ((0, 0), (0, pad)))
            index = torch.from_numpy(np.pad(cols, ((0, 0), (0, pad))))
        else:
            if dtype != torch.float16:
                raise TypeError("mma_sp:2,4 layers hold float16 values (formats.mma_sp packs float16)")
            values, meta = mma_sp.pack(w.astype(np.float16))  # ValueError names a group over 2 of 4
            index = torch.from_numpy(meta.view(np.int32)).view(torch.uint32)
        vals = torch.from_numpy(np.ascontiguousarray(values)).to(dtype)
        b = None if bias is None else torch.as_tensor(bias).detach().float()
        layer = cls(vals, index, w.shape, pattern, b, activation)
        return layer.to(device)

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
        xt = xt if xt.is_contiguous() else xt.contiguous()
        tokens = int(xt.shape[1])
        dtype = str(self.values.dtype)[6:]
        kc = int(self.values.shape[1]) if self.kind == "nm_tc" else 0
        f = _kernel(self.mode, self.out_features, self.in_features, tokens, dtype, kc, self.bias is not None,
                    self.activation, token_major_out, _arch(xt.device))
        shape = (tokens, self.out_features) if token_major_out else (self.out_features, tokens)
        out = torch.empty(shape, dtype=xt.dtype, device=xt.device)
        bias = () if self.bias is None else (self.bias.float(),)  # float32 even after module.half()
        args = (self.values, self.index, xt) + bias + (out,)
        with on_torch_stream(True):
            f(*args)
        return out

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
