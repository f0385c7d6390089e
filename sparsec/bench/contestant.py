"""A contestant is one call with every argument prepared beforehand.

sparsec and each peer are timed the same way: ``fn(*args)`` in a loop, with nothing
converted per call. ``clone()`` gives an independent copy of every buffer (sparse
operand, dense inputs, output), so the timer can cycle through several copies and no
call finds its operands still in L2 from the call before.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional, Tuple

import numpy as np


def _identity(x):
    return x


@dataclass
class Prepared:
    """``fn(*args)`` ready to run. ``output_arg`` names the argument the call writes its
    result into (sparsec's compiled functions return nothing); without it the call returns
    the result. ``finish`` turns the raw result into the torch tensor the check compares
    with the reference (a gather, a scale, a DLPack view); it runs outside timing."""

    fn: Callable
    args: Tuple[Any, ...]
    output_arg: Optional[int] = None
    finish: Callable[[Any], Any] = field(default=_identity)
    graph_safe: bool = True  # False: the call cannot be captured in a CUDA graph (the timer runs it eagerly)

    def __call__(self):
        return self.fn(*self.args)

    def output(self, returned):
        raw = returned if self.output_arg is None else self.args[self.output_arg]
        return self.finish(raw)

    @property
    def nbytes(self) -> int:
        """Bytes held by the arguments: what one more copy of the input set costs."""
        return sum(nbytes_of(a) for a in self.args)

    def clone(self) -> "Prepared":
        return replace(self, args=tuple(clone_of(a) for a in self.args))


def _kind(x) -> str:
    mod = type(x).__module__
    if mod.startswith("torch"):
        return "torch"
    if mod.startswith("cupyx"):
        return "cupy_sparse"
    if mod.startswith("cupy"):
        return "cupy"
    if isinstance(x, np.ndarray):
        return "numpy"
    if hasattr(x, "__dlpack__") and hasattr(x, "shape") and hasattr(x, "dtype"):
        return "tvm"
    return "scalar"


def nbytes_of(x) -> int:
    kind = _kind(x)
    if kind == "torch":
        if repr(x.layout) == "torch.strided":
            return x.numel() * x.element_size()
        return sum(p.numel() * p.element_size() for p in _torch_sparse_parts(x))
    if kind in ("cupy", "numpy"):
        return int(x.nbytes)
    if kind == "cupy_sparse":
        return int(x.data.nbytes + x.indices.nbytes + x.indptr.nbytes)
    if kind == "tvm":
        return int(np.prod(x.shape, dtype=np.int64)) * np.dtype(str(x.dtype)).itemsize
    return 0


def _torch_sparse_parts(x):
    layout = repr(x.layout)
    if layout in ("torch.sparse_csr", "torch.sparse_bsr"):
        return (x.crow_indices(), x.col_indices(), x.values())
    if layout in ("torch.sparse_csc", "torch.sparse_bsc"):
        return (x.ccol_indices(), x.row_indices(), x.values())
    if layout == "torch.sparse_coo":
        return (x._indices(), x._values())
    raise TypeError(f"cannot count the bytes of a torch tensor with layout {layout}")


def clone_of(x):
    kind = _kind(x)
    if kind == "torch":
        return x.clone()
    if kind in ("cupy", "cupy_sparse", "numpy"):
        return x.copy()
    if kind == "tvm":
        import torch
        import tvm

        return tvm.runtime.from_dlpack(torch.from_dlpack(x).clone())
    return x


# ---- sparsec ---------------------------------------------------------------------------------
# the dense operands as the benchmark makes them (and the peers take them): B is cols x feat;
# SDDMM's X is rows x feat and Y feat x cols, C = A .* (X @ Y)
STANDARD_LAYOUTS = {"spmm": (("cols", "feat"),), "sddmm": (("rows", "feat"), ("feat", "cols"))}


def in_kernel_layout(kernel, dense):
    """``dense`` (standard layouts) as the kernel declares its inputs: an input declared
    transposed (sparsec's SDDMM may take Y as cols x feat) gets a contiguous transposed copy,
    made here, outside timing."""
    standard = STANDARD_LAYOUTS.get(kernel.op_name)
    if standard is None or len(standard) != len(dense):
        return tuple(dense)
    out = []
    for p, x, std in zip(kernel.inputs, dense, standard):
        declared = tuple(d if isinstance(d, str) else "feat" for d in p.shape)
        if declared == std:
            out.append(x)
        elif declared == std[::-1]:
            out.append(x.t().contiguous())
        else:
            raise ValueError(f"{kernel.op_name}: input {p.name} is declared {declared}; the benchmark makes {std}")
    return tuple(out)


def prepare_sparsec(kernel, A, dense, poison: bool = True, layout: str = "standard") -> Prepared:
    """The compiled function and its argument list, built once by ``Kernel.prepare`` (which
    checks format, dtypes, shapes and devices) and turned into TVM tensors, so the timed loop
    calls the function directly with no per-call checks or DLPack conversions. ``dense``
    comes in the benchmark's standard layouts, or (``layout="kernel"``) already as the
    kernel declares its inputs."""
    import tvm

    if layout not in ("standard", "kernel"):
        raise ValueError(f"layout should be 'standard' or 'kernel', got {layout!r}")
    if layout == "standard":
        dense = in_kernel_layout(kernel, dense)
    args, outs, _ = kernel.prepare(A, *dense, poison=poison)
    if len(outs) != 1:
        raise ValueError(f"the benchmark times operators with one output; {kernel.op_name} has {len(outs)}")
    out_index = next(i for i, p in enumerate(kernel.params) if p.role == "output")
    # torch tensors become TVM tensors once (zero-copy); numpy arrays (CPU dry runs only) are
    # left to the call, as Kernel.__call__ does: TVM's from_dlpack wants 64-byte alignment
    converted = tuple(tvm.runtime.from_dlpack(a) if _kind(a) == "torch" else a for a in args)
    return Prepared(kernel.executable[kernel.op_name], converted, output_arg=out_index, finish=_to_torch)


def _to_torch(x):
    import torch

    if _kind(x) == "torch":
        return x
    return torch.from_numpy(x) if isinstance(x, np.ndarray) else torch.from_dlpack(x)
