"""How close a time is to what the hardware allows.

Compulsory traffic is what any kernel must move at least once: the sparse operand in its
own layout (CSR: values, int32 column indices and row pointers; BSR: the stored blocks,
int32 block-column indices and block-row pointers), each dense input read once and the
output written once. Useful flops count the operator's multiply-adds on stored entries.
The ceilings are measured in the same run: a large device-to-device copy for bandwidth
(bytes read + written per second) and a large dense matmul per dtype for compute (float32
with TF32 off, as the fp32 kernels compute). A case's bound is

    time_bound = max(bytes / bandwidth, flops / peak)      roofline fraction = time_bound / time
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

INDEX_BYTES = 4  # int32 indices and pointers, in sparsec's formats and in the peers' inputs
VALUE_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}


def _value_bytes(dtype: str) -> int:
    if dtype not in VALUE_BYTES:
        raise ValueError(f"dtype should be one of {tuple(VALUE_BYTES)}, got {dtype!r}")
    return VALUE_BYTES[dtype]


def sparse_operand_bytes(rows: int, nnz: int, dtype: str, block: Optional[Tuple[int, int]] = None,
                         stored_blocks: Optional[int] = None) -> int:
    """Bytes of the sparse operand: CSR (``block`` None) or BSR with ``stored_blocks`` blocks."""
    v = _value_bytes(dtype)
    if block is None:
        return nnz * (v + INDEX_BYTES) + (rows + 1) * INDEX_BYTES
    if stored_blocks is None:
        raise ValueError("BSR bytes need stored_blocks (the number of stored blocks)")
    r, c = block
    block_rows = -(-rows // r)
    return stored_blocks * (r * c * v + INDEX_BYTES) + (block_rows + 1) * INDEX_BYTES


def compulsory(op: str, rows: int, cols: int, nnz: int, feat: int, dtype: str,
               block: Optional[Tuple[int, int]] = None, stored_blocks: Optional[int] = None) -> Tuple[int, int]:
    """(bytes, flops) that ``op`` must move and compute at least.

    spmm  C[rows, feat] = A @ B[cols, feat]:  A + B + C;  2 * entries * feat flops
    sddmm C = A .* (X[rows, feat] @ Y[feat, cols]) at A's entries:  A + X + Y + C (one value
          per entry);  (2 * feat + 1) * entries flops (the dot product, then the scale)
    where entries is nnz for CSR and stored_blocks * r * c for BSR (the block is the unit
    of work there: its explicit zeros are computed)."""
    v = _value_bytes(dtype)
    a_bytes = sparse_operand_bytes(rows, nnz, dtype, block, stored_blocks)
    entries = nnz if block is None else stored_blocks * block[0] * block[1]
    if op == "spmm":
        return a_bytes + cols * feat * v + rows * feat * v, 2 * entries * feat
    if op == "sddmm":
        return a_bytes + rows * feat * v + feat * cols * v + entries * v, (2 * feat + 1) * entries
    raise ValueError(f"op should be spmm or sddmm, got {op!r}")


def time_bound_s(nbytes: float, flops: float, bandwidth: float, peak_flops: float) -> float:
    """The least time the work can take: the slower of moving its bytes and doing its flops."""
    return max(nbytes / bandwidth, flops / peak_flops)


def roofline_fraction(time_s: float, nbytes: float, flops: float, bandwidth: float, peak_flops: float) -> float:
    """time_bound / time: 1.0 is the roofline, 0.25 is a quarter of it."""
    if time_s <= 0:
        raise ValueError(f"time should be positive, got {time_s}")
    return time_bound_s(nbytes, flops, bandwidth, peak_flops) / time_s


def achieved(time_s: float, nbytes: float, flops: float) -> Dict[str, float]:
    return {"GBps": nbytes / time_s / 1e9, "TFLOPs": flops / time_s / 1e12}


# ---- ceilings measured in the run ------------------------------------------------------------
def measure_copy_bandwidth(timer, device: str, nbytes: int) -> float:
    """Bytes per second of a device-to-device copy of ``nbytes``, counting the read and the write.
    The copy is an elementwise kernel (y = -x): a plain ``copy_`` becomes a DMA memcpy node
    inside a CUDA graph, which runs at about two thirds of what the SMs' loads and stores reach."""
    import torch

    x = torch.randn(nbytes // 4, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    ms = timer.measure([lambda: torch.neg(x, out=y)]).median_ms
    return 2 * x.numel() * 4 / (ms * 1e-3)


def measure_matmul_peak(timer, device: str, dtype: str, n: int) -> float:
    """Flops per second of an n x n x n dense matmul (float32 with TF32 off)."""
    import torch

    tdtype = getattr(torch, dtype)
    a = torch.randn(n, n, device=device).to(tdtype)
    b = torch.randn(n, n, device=device).to(tdtype)
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        ms = timer.measure([lambda: torch.matmul(a, b)]).median_ms
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    return 2 * n ** 3 / (ms * 1e-3)


# full-size probes on a GPU; small ones for CPU dry runs
PROBE_SIZES = {"cuda": {"copy_bytes": 2**30, "matmul_n": 8192}, "cpu": {"copy_bytes": 2**24, "matmul_n": 256}}


def measure_ceilings(timer, device: str, dtypes) -> Dict[str, object]:
    """{"copy_GBps": ..., "matmul_TFLOPs": {dtype: ...}} for every dtype in ``dtypes``."""
    sizes = PROBE_SIZES[device]
    bw = measure_copy_bandwidth(timer, device, sizes["copy_bytes"])
    peaks = {d: measure_matmul_peak(timer, device, d, sizes["matmul_n"]) for d in sorted(set(dtypes))}
    return {"copy_GBps": bw / 1e9, "matmul_TFLOPs": {d: p / 1e12 for d, p in peaks.items()},
            "copy_bytes": sizes["copy_bytes"], "matmul_n": sizes["matmul_n"]}
