"""The peers sparsec is timed against, each on the same matrix and dense inputs.

A peer has a name, a label saying what it runs, ``applies`` (None, or why it does not
apply to this case) and ``setup``, which converts the inputs into the peer's own layout
once, outside timing, and returns the call to time. A peer whose library is missing or
that rejects the case (a dtype it lacks) is skipped with the reason, by run.py.

    torch_csr    torch.sparse.mm on a sparse_csr tensor: cuSPARSE SpMM on CUDA
    torch_sddmm  torch.sparse.sampled_addmm: cuSPARSE SDDMM (it computes X @ Y at A's
                 entries; A's values scale it in the check, outside timing)
    torch_bsr    a sparse_bsr tensor @ dense: torch's Triton kernel for fp16/bf16 on CUDA
    torch_dense  torch.matmul on the densified operand (cuBLAS, TF32 off for fp32): what
                 ignoring sparsity costs; only where the dense matrix fits the budget
    cupy_csr     cupyx.scipy.sparse.csr_matrix @ cupy array: CuPy's cuSPARSE SpMM
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

from ..measure import Prepared

DENSE_PEER_MAX_BYTES = 8 * 2**30


@dataclass
class Operands:
    """One case's inputs on the device, shared by every peer (torch tensors).

    ``csr`` is the matrix sparsec multiplies (int32 indices, the case's dtype), ``entry_rows``
    and ``entry_cols`` its entries' coordinates in CSR order (int64, for gathers), ``dense``
    the dense inputs in the operator's order, ``bsr`` sparsec's BSR arrays (block-row pointers,
    block columns, values shaped (blocks, r, c)) when the format is BSR."""

    op: str
    dtype: str
    device: str
    rows: int
    cols: int
    feat: int
    csr: object
    entry_rows: object
    entry_cols: object
    dense: Tuple[object, ...]
    bsr: Optional[Tuple[object, object, object]] = None
    block: Optional[Tuple[int, int]] = None
    dense_budget_bytes: int = DENSE_PEER_MAX_BYTES


@dataclass(frozen=True)
class Peer:
    name: str
    label: str
    applies: Callable[[Operands], Optional[str]]
    setup: Callable[[Operands], Prepared]


def _only(op):
    return lambda o: None if o.op == op else f"{op} only"


# ---- torch CSR (cuSPARSE SpMM) ---------------------------------------------------------------
def _torch_csr_setup(o: Operands) -> Prepared:
    import torch

    return Prepared(torch.sparse.mm, (o.csr, o.dense[0]))


# ---- torch sampled_addmm (cuSPARSE SDDMM) ----------------------------------------------------
def _torch_sddmm_setup(o: Operands) -> Prepared:
    import torch

    values = o.csr.values()

    def sddmm(a, x, y):
        return torch.sparse.sampled_addmm(a, x, y, beta=0.0)

    return Prepared(sddmm, (o.csr, o.dense[0], o.dense[1]), finish=lambda r: r.values() * values)


# ---- torch BSR @ dense (Triton) --------------------------------------------------------------
def _torch_bsr_applies(o: Operands) -> Optional[str]:
    if o.op != "spmm":
        return "spmm only"
    if o.bsr is None:
        return "BSR formats only"
    r, c = o.block
    if o.rows % r or o.cols % c:
        return f"torch BSR needs the shape ({o.rows}, {o.cols}) to be a multiple of the block {r}x{c}"
    return None


def _torch_bsr_setup(o: Operands) -> Prepared:
    import torch

    crow, col, values = o.bsr
    a = torch.sparse_bsr_tensor(crow, col, values, size=(o.rows, o.cols))
    return Prepared(torch.matmul, (a, o.dense[0]))


# ---- dense torch.matmul (cuBLAS) -------------------------------------------------------------
def _dense_bytes(o: Operands) -> int:
    import torch

    return o.rows * o.cols * torch.empty((), dtype=o.csr.dtype).element_size()


def _torch_dense_applies(o: Operands) -> Optional[str]:
    need = _dense_bytes(o)
    if need > o.dense_budget_bytes:
        what = "densified matrix" if o.op == "spmm" else "dense product"
        return f"the {what} takes {need / 2**30:.1f} GiB, over the {o.dense_budget_bytes / 2**30:.1f} GiB budget"
    return None


def _torch_dense_setup(o: Operands) -> Prepared:
    import torch

    if o.op == "spmm":
        return Prepared(torch.matmul, (o.csr.to_dense(), o.dense[0]))
    rows, cols, values = o.entry_rows, o.entry_cols, o.csr.values()
    return Prepared(torch.matmul, (o.dense[0], o.dense[1]), finish=lambda full: full[rows, cols] * values)


# ---- CuPy cuSPARSE ---------------------------------------------------------------------------
def _cupy_applies(o: Operands) -> Optional[str]:
    if o.op != "spmm":
        return "spmm only"
    if o.device != "cuda":
        return "CUDA only"
    if importlib.util.find_spec("cupy") is None:
        return "cupy is not installed"
    return None


def _cupy_setup(o: Operands) -> Prepared:
    import cupy
    import cupyx.scipy.sparse as cusp
    import torch

    a = cusp.csr_matrix((cupy.from_dlpack(o.csr.values()), cupy.from_dlpack(o.csr.col_indices()),
                         cupy.from_dlpack(o.csr.crow_indices())), shape=(o.rows, o.cols))
    # CuPy's SpMM takes the dense operand in column-major order; give it that, so the
    # timed call does not include a transposing copy
    b = cupy.asfortranarray(cupy.from_dlpack(o.dense[0]))
    # not graph-capturable: CuPy's cuSPARSE path allocates and synchronises inside the call
    return Prepared(_matmul, (a, b), finish=lambda r: torch.from_dlpack(r), graph_safe=False)


def _matmul(a, b):
    return a @ b


PEERS = (
    Peer("torch_csr", "torch.sparse.mm on CSR (cuSPARSE SpMM)", _only("spmm"), _torch_csr_setup),
    Peer("torch_sddmm", "torch.sparse.sampled_addmm (cuSPARSE SDDMM)", _only("sddmm"), _torch_sddmm_setup),
    Peer("torch_bsr", "torch BSR @ dense (Triton for fp16/bf16)", _torch_bsr_applies, _torch_bsr_setup),
    Peer("torch_dense", "dense torch.matmul (cuBLAS, TF32 off)", _torch_dense_applies, _torch_dense_setup),
    Peer("cupy_csr", "cupyx csr_matrix @ dense (CuPy cuSPARSE)", _cupy_applies, _cupy_setup),
)
PEER_LABELS = {p.name: p.label for p in PEERS}


def main_peer(op: str, format_spec: str) -> str:
    """The peer a case's speedup is quoted against: the vendor kernel for the same layout."""
    if op == "sddmm":
        return "torch_sddmm"
    return "torch_bsr" if format_spec.startswith("bsr:") else "torch_csr"
