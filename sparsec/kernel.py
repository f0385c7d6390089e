"""A compiled operator: call it on a format instance plus numpy arrays or torch tensors.

Arguments are checked against the kernel's metadata before anything runs, so a mismatch is
a Python exception that names the argument rather than a crash inside generated code or a
raw TVM/DLPack message. In order: a CUDA kernel with no GPU visible (RuntimeError); the
matrix (type, format, value dtype, then its index arrays: ``formats.validate.
check_before_launch``, free for an instance sealed by ``convert``, a full check otherwise);
each further input (count; dense ones: shape, dtype, device; edge data -- sparse inputs after
the matrix -- its layout and pattern: ``edge_args``); the values of index inputs against the
extents they index (``W[E[i, j], f]``: never an out-of-bounds read); each ``out=`` array (shape, dtype, device,
C-contiguous, writeable, native byte order: it is written in place, so it is never copied).
Inputs that are merely awkward are made to fit: strided views, read-only and non-native
byte-order numpy arrays are copied, non-contiguous torch tensors made contiguous.
torch tensors (CPU or CUDA) and numpy arrays on the CPU pass through DLPack without copies;
numpy inputs to a CUDA kernel are copied to the GPU (once per format instance for its
index arrays and values).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tvm

from .dtypes import DtypeSpec, dtype_spec
from .edge_args import check_indices, edge_layout
from .formats import EdgeValues, FormatInstance
from .formats.base import check_slot_mask
from .formats.composite import CompositeInstance
from .formats.registry import reuse_refusal
from .formats.validate import check_before_launch
from .targets import TargetSpec
from .tc_operands import packed_operands

SparseMatrix = (FormatInstance, CompositeInstance)


@dataclass(frozen=True)
class ParamSpec:
    """One kernel argument: an index array, a value buffer, or a scalar size."""

    name: str
    role: str  # index | input | output | temp | scalar
    dtype: str
    shape: Tuple[Any, ...] = ()  # ints, "rows", "cols", or None (one per stored slot of the matrix)
    sparse: bool = False
    matrix: bool = False  # the first sparse input: the instance's own values
    # an index input (W[E[i, j], f]): (extent, what it indexes) per use; extent an int, "rows" or "cols"
    index_extents: Tuple[Tuple[Any, str], ...] = ()


@dataclass
class Kernel:
    op_name: str
    format_spec: str
    target: TargetSpec
    dtype: str
    params: List[ParamSpec]
    knobs: Dict[str, Any]
    executable: Any
    compile_s: float = 0.0
    script: str = ""
    extra: Dict[str, Any] = field(default_factory=dict)

    # ---- introspection ---------------------------------------------------------------------
    @property
    def inputs(self) -> List[ParamSpec]:
        """The inputs a call takes after the matrix, in declaration order: dense inputs and edge
        data (sparse inputs after the first, ``sparse=True``)."""
        return [p for p in self.params if p.role == "input" and not p.matrix]

    @property
    def outputs(self) -> List[ParamSpec]:
        return [p for p in self.params if p.role == "output"]

    def source(self) -> str:
        """Generated device code: CUDA C++ for cuda targets, LLVM IR for llvm."""
        if "metadata" in self.extra:
            raise ValueError(f"{self.extra['path']} is an exported module: it carries machine code, not source")
        mod = self.executable.mod
        if self.target.kind == "cuda":
            return mod.imports[0].inspect_source("cuda")
        return mod.inspect_source("ll")

    def export(self, path: str, archs: Optional[Sequence[str]] = None) -> Dict[str, Any]:
        """Write the kernel as one file that ``sparsec.load`` (or ``tvm.runtime.load_module``)
        opens with TVM's runtime alone: CUDA kernels are compiled now, by nvcc, to SASS for
        ``archs`` (default: the arch compiled for). Returns the metadata stored with it."""
        if "metadata" in self.extra:
            raise ValueError(f"{self.extra['path']} is already an exported module; copy the file instead")
        from .export import export_kernel

        return export_kernel(self, path, archs)

    # ---- calling -----------------------------------------------------------------------------
    def __call__(self, A, *dense, out=None, poison: bool = False):
        """Run on ``A`` and the further inputs (``inputs``: dense ones, and edge data as
        ``A.edge_values(x)`` or a per-entry array (nnz, *trailing) in canonical CSR order, laid out
        per call: a gather over the stored slots, O(stored x trailing), on the GPU for CUDA
        tensors, through a slot map built once per sealed instance, O(stored log stored); index
        inputs are range-checked, O(1) for EdgeValues, one vectorised pass otherwise). Returns the output
        (a tuple when there are several), in the library of the inputs (torch or numpy).
        ``poison=True`` fills freshly allocated outputs with NaN first, so that an element
        the kernel fails to write shows up in a check."""
        args, outs, like_torch = self.prepare(A, *dense, out=out, poison=poison)
        with on_torch_stream(like_torch and self.target.kind == "cuda"):
            self.executable[self.op_name](*args)
        return self._finish(outs, like_torch)

    def prepare(self, A, *dense, out=None, poison: bool = False):
        """Checked argument list for the compiled function, the outputs, and whether the
        caller passed torch tensors. The no-GPU refusal comes first: nothing about the
        arguments can make the call run, and it spares a full index check."""
        if self.target.kind == "cuda" and not _gpu_visible():
            raise RuntimeError(f"this {self.op_name} kernel targets CUDA ({self.target.name}) but no CUDA GPU is "
                               f"visible to this process; compile for target='llvm' to run on the CPU")
        self._check_instance(A)
        inputs = self.inputs
        if len(dense) != len(inputs):
            names = ", ".join(p.name for p in inputs)
            kind = "dense" if not any(p.sparse for p in inputs) else "further (dense and edge data)"
            raise TypeError(f"{self.op_name} takes the sparse matrix and {len(inputs)} {kind} inputs ({names}), "
                            f"got {len(dense)}")
        sizes = scalar_values(A)
        stacked = next((p for p in self.params if p.name == "lrows"), None)
        if stacked is not None:
            sizes["lrows"] = logical_rows(self.op_name, A, stacked.shape[0])
        like_torch = any(_is_torch(x) for x in dense)
        dev = self.target.device()
        by_name = {p.name: x for p, x in zip(inputs, dense)}
        outs = self._outputs(A, sizes, out, like_torch, dense, poison)
        index_arrays = self._instance_arrays(A, dev)
        args: List[Any] = []
        for p in self.params:
            if p.role == "index":
                args.append(index_arrays[p.name])
            elif p.role == "input" and p.matrix:
                args.append(index_arrays["__data__"])
            elif p.role == "input" and p.sparse:  # edge data: per entry -> the stored-slot layout
                x = by_name[p.name]
                layout = edge_layout(self.op_name, p, x, A)
                check_indices(self.op_name, p, x, A, sizes)
                args.append(self._edge_arg(p, x, layout, dev))
            elif p.role == "input":
                args.append(self._dense_arg(p, by_name[p.name], sizes, dev))
                if p.index_extents:
                    check_indices(self.op_name, p, by_name[p.name], A, sizes)
            elif p.role in ("output", "temp"):
                args.append(outs[p.name])
            elif p.role == "scalar":
                args.append(int(sizes[p.name]))
        args = [_compact(a) for a in args]
        return args, [outs[p.name] for p in self.outputs], like_torch

    @property
    def dtypes(self) -> DtypeSpec:
        return dtype_spec(self.dtype)

    def _check_instance(self, A):
        if not isinstance(A, SparseMatrix):
            raise TypeError(f"the sparse operand should be a converted matrix (sparsec.formats.convert), "
                            f"got {type(A).__name__}")
        _check_format(self.format_spec, A.format)
        matrix = next((p for p in self.params if p.matrix), None)
        want = self.dtypes.sparse
        if matrix is not None and matrix.dtype != self.dtypes.sparse_storage:  # declared with dtype=
            want = matrix.dtype
        if A.value_dtype != want:
            raise TypeError(f"matrix values should be {want} for this kernel, got {A.value_dtype} "
                            f"(convert with dtype={want!r} or compile for {A.value_dtype})")
        check_before_launch(A)  # free for an instance sealed by convert
        multiple = self.extra.get("shape_multiple") or (self.extra.get("metadata") or {}).get("shape_multiple")
        if multiple and any(int(s) % multiple for s in A.shape):
            raise ValueError(f"{self.op_name}: this kernel takes matrices whose rows and columns are multiples of "
                             f"{multiple} (it copies and writes whole 16-byte rows), got a {A.shape[0]} x "
                             f"{A.shape[1]} matrix; pad it, or compile for this matrix (another kernel takes it)")

    def _expected_shape(self, p: ParamSpec, sizes) -> Tuple[int, ...]:
        return tuple(sizes[d] if isinstance(d, str) else d for d in p.shape)

    def _dense_arg(self, p: ParamSpec, x, sizes, dev):
        shape = tuple(int(s) for s in getattr(x, "shape", ()))
        want = self._expected_shape(p, sizes)
        if shape != want:
            raise ValueError(f"{self.op_name}: {p.name} should have shape {want} (rows, cols from the sparse "
                             f"matrix), got {shape}")
        dtype = _dtype_name(x)
        if dtype != p.dtype:
            raise TypeError(f"{self.op_name}: {p.name} should be {p.dtype}, got {dtype}")
        if _is_torch(x):
            self._check_torch(p.name, x)
            return aligned_tensor(x.contiguous() if not x.is_contiguous() else x)
        if not isinstance(x, np.ndarray):
            raise TypeError(f"{self.op_name}: {p.name} should be a numpy array or torch tensor, got {type(x).__name__}")
        x = _exportable(x)  # the kernel only reads an input: a copy in C order is as good
        return x if self.target.kind == "llvm" else tvm.runtime.tensor(_compact(x), dev)

    def _edge_arg(self, p: ParamSpec, given, x, dev):
        """Edge data ``x`` (``given`` laid out) on the kernel's device: a numpy array for a CUDA
        kernel is copied there on each call, unless it came as EdgeValues (cached in them)."""
        if _is_torch(x):
            self._check_torch(p.name, x)
            return aligned_tensor(x.contiguous() if not x.is_contiguous() else x)
        if self.target.kind == "llvm":
            return _exportable(x)
        if isinstance(given, EdgeValues):
            hit = given.device_cache.get(str(dev))
            if hit is None:
                hit = given.device_cache[str(dev)] = tvm.runtime.tensor(_compact(_exportable(x)), dev)
            return hit
        return tvm.runtime.tensor(_compact(_exportable(x)), dev)

    def _check_torch(self, name: str, x) -> None:
        """Device and autograd of a torch argument (DLPack would refuse both with its own words)."""
        want = "cuda" if self.target.kind == "cuda" else "cpu"
        kind = x.device.type
        if kind == "meta":
            raise ValueError(f"{self.op_name}: {name} is a torch meta tensor, which has a shape but no data for a "
                             f"kernel to read; give a {want} tensor (sparsec.torch ops trace meta tensors)")
        if kind != want:
            raise ValueError(f"{self.op_name}: {name} is on {x.device} but the kernel runs on {self.target.name}; "
                             f"give a {want} tensor")
        if kind == "cuda" and (x.device.index or 0) != self.target.device().index:
            raise ValueError(f"{self.op_name}: {name} is on {x.device} but the kernel runs on cuda:"
                             f"{self.target.device().index}")
        if x.requires_grad:
            raise ValueError(f"{self.op_name}: {name} requires grad, and a kernel call records no gradient; pass "
                             f"it .detach()-ed, or use sparsec.torch.spmm, which has a backward pass")

    def _check_out(self, p: ParamSpec, x, shape) -> None:
        """``out=`` is written in place, so it cannot be copied to make it fit: refuse by name."""
        if not (_is_torch(x) or isinstance(x, np.ndarray)):
            raise TypeError(f"{self.op_name}: out {p.name} should be a numpy array or torch tensor, "
                            f"got {type(x).__name__}")
        if tuple(x.shape) != shape or _dtype_name(x) != p.dtype:
            raise ValueError(f"out {p.name} should be {p.dtype} with shape {shape}, "
                             f"got {_dtype_name(x)} {tuple(x.shape)}")
        if _is_torch(x):
            self._check_torch(f"out {p.name}", x)
            contiguous = x.is_contiguous()
        else:
            if self.target.kind == "cuda":
                raise ValueError(f"{self.op_name}: out {p.name} is a numpy array (host memory) but the kernel runs "
                                 f"on {self.target.name}; give a CUDA torch tensor, or no out=")
            if not x.flags.writeable:
                raise ValueError(f"{self.op_name}: out {p.name} is a read-only numpy array, and the kernel writes "
                                 "it in place; pass a writeable array")
            if not x.dtype.isnative:
                raise ValueError(f"{self.op_name}: out {p.name} has non-native byte order ({x.dtype.str}), which "
                                 f"a kernel cannot write; pass a {p.dtype} array in native order")
            contiguous = x.flags.c_contiguous
        if not contiguous:
            raise ValueError(f"{self.op_name}: out {p.name} should be C-contiguous, as the kernel writes it in "
                             f"place, got a strided view; pass a contiguous array and copy it into the view")

    def _outputs(self, A, sizes, out, like_torch, dense, poison):
        outs = {}
        given = () if out is None else (out if isinstance(out, (tuple, list)) else (out,))
        specs = [p for p in self.params if p.role in ("output", "temp")]
        n_out = len(self.outputs)
        if given and len(given) != n_out:
            raise TypeError(f"out should hold {n_out} arrays, got {len(given)}")
        for i, p in enumerate(specs):
            shape = (A.stored,) + tuple(p.shape[1:]) if p.sparse else self._expected_shape(p, sizes)
            if p.role == "output" and given:
                x = given[i]
                self._check_out(p, x, shape)
                outs[p.name] = x
                continue
            outs[p.name] = _alloc(shape, p.dtype, self.target, like_torch, dense, poison or p.role == "temp")
        return outs

    def _instance_arrays(self, A, dev) -> Dict[str, Any]:
        """The instance's index arrays and values on the kernel's device (cached per instance)."""
        host = index_arrays(A)
        packed = [p.name for p in self.params if p.role == "index" and p.name not in host]
        if packed:  # a Tensor Core kernel's packed operands (sparsec.tc_operands)
            host.update(packed_operands(A, packed))
        host["__data__"] = A.data
        if self.target.kind == "llvm":
            host["__data__"] = _exportable(A.data)
            return host
        # per array, keyed by the host array itself, so that a replaced array is copied again
        # and kernels that read different arrays of one instance (a Tensor Core kernel's
        # packed operands beside another's index arrays) do not evict each other's
        cache = A.__dict__.setdefault("_device_arrays", {}).setdefault(str(dev), {})
        out = {}
        for n, a in host.items():
            hit = cache.get(n)
            if hit is None or hit[0] is not a:
                hit = cache[n] = (a, tvm.runtime.tensor(_compact(_exportable(a)), dev))
            out[n] = hit[1]
        return out

    def _finish(self, outs, like_torch):
        res = []
        for o in outs:
            if like_torch or isinstance(o, np.ndarray):
                res.append(o)
            else:
                res.append(o.numpy())
        return res[0] if len(res) == 1 else tuple(res)

    # ---- timing ------------------------------------------------------------------------------
    def time(self, A, *dense, number: int = 10, repeat: int = 5) -> Dict[str, float]:
        """Median and spread of ``repeat`` timings of ``number`` runs each, after a warm-up, in ms."""
        args, _, _ = self.prepare(A, *dense)
        args = [tvm.runtime.from_dlpack(a) if _is_torch(a) else
                (tvm.runtime.tensor(a, self.target.device()) if isinstance(a, np.ndarray) else a) for a in args]
        ev = self.executable.mod.time_evaluator(self.op_name, self.target.device(), number=number, repeat=repeat)
        res = ev(*args)
        ms = np.array([float(r) for r in res.results]) * 1e3
        return {"median_ms": float(np.median(ms)), "min_ms": float(ms.min()), "max_ms": float(ms.max())}


def _check_format(compiled_spec: str, fmt) -> None:
    """The matrix's format is the one compiled for, or a composite with the same parts
    (``formats.registry.reuse_refusal``: hyb and bsr+csr kernels run on any matrix converted
    with their spec); else a ValueError naming the difference."""
    if fmt.spec != compiled_spec:
        refusal = reuse_refusal(compiled_spec, fmt)
        if refusal is not None:
            raise ValueError(refusal)


def on_torch_stream(active: bool):
    """TVM launches on its own current stream (the legacy default unless set); with torch CUDA
    tensors, point it at torch's current stream, so the kernel orders with torch's work and
    is captured by ``torch.cuda.graph``."""
    if not active:
        return contextlib.nullcontext()
    import tvm_ffi

    return tvm_ffi.use_torch_stream()


def index_arrays(A) -> Dict[str, np.ndarray]:
    """The matrix's index arrays by kernel parameter name (a composite's parts prefixed p<k>_),
    and its slot mask where the format has one (a kernel that guards on padding takes it).
    Index arrays come from ``kernel_arrays`` (writeable, the same objects every call)."""
    parts = A.parts if isinstance(A, CompositeInstance) else [A]
    out = {}
    for k, part in enumerate(parts):
        prefix = f"p{k}_" if isinstance(A, CompositeInstance) else ""
        out.update({prefix + n: a for n, a in part.kernel_arrays().items()})
        if part.format.slot_mask:
            check_slot_mask(part)  # O(1); the seal does not cover the mask (it is not an index array)
            out[prefix + part.format.slot_mask] = part.slot_mask()
    return out


def scalar_values(A) -> Dict[str, int]:
    """Every scalar a kernel may take: run-time extents n_<axis>, part offsets, rows, cols."""
    out = {"rows": int(A.shape[0]), "cols": int(A.shape[1])}
    if isinstance(A, CompositeInstance):
        for k, (part, off) in enumerate(zip(A.parts, A.offsets)):
            out.update({f"n_p{k}_{a}": int(n) for a, n in part.extents().items()})
            out[f"off_p{k}"] = off
    else:
        out.update({f"n_{a}": int(n) for a, n in A.extents().items()})
    return out


def logical_rows(op_name: str, A, outer: int) -> int:
    """Rows per outer coordinate of a stacked structure (r, i, j): A holds ``outer`` blocks of
    rows, one per r (``formats.stack_rows``)."""
    rows = int(A.shape[0])
    if rows % outer:
        raise ValueError(f"{op_name}: the matrix has {rows} rows, which should be {outer} equal blocks of rows, one "
                         f"per coordinate of the structure's outer axis (its extent); build it with "
                         f"sparsec.formats.stack_rows(matrices) or stack_rows(adj, types, {outer})")
    lrows = rows // outer
    parts = A.format.parts if isinstance(A, CompositeInstance) else (A.format,)
    block = max(a.scale for p in parts for a in p.axes if a.dim == 0)
    if lrows % block:  # the lowering reads r and i from a block's first row (lower.positions.stacked_coordinate)
        raise ValueError(f"{op_name}: {A.format.spec} stores rows in blocks of {block}, and the matrix's {outer} "
                         f"blocks of rows (one per coordinate of the structure's outer axis) have lrows = {lrows} "
                         f"rows each, not a multiple of {block}: a block of {block} rows would straddle two of them; "
                         f"pad each pattern to a multiple of {block} rows before stack_rows, or use csr, ell or hyb")
    return lrows


_GPU_VISIBLE: Optional[bool] = None


def _gpu_visible() -> bool:
    """Whether a CUDA GPU is visible (asked once per process: the answer does not change)."""
    global _GPU_VISIBLE
    if _GPU_VISIBLE is None:
        try:
            _GPU_VISIBLE = bool(tvm.cuda(0).exist)
        except Exception:  # noqa: BLE001 - a TVM built without CUDA, or no driver
            _GPU_VISIBLE = False
    return _GPU_VISIBLE


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def _exportable(x: np.ndarray) -> np.ndarray:
    """``x`` as an array DLPack exports and a kernel reads flat: 1-D or as given, C-contiguous,
    writeable (DLPack refuses read-only arrays), native byte order; copied only if needed."""
    if not x.dtype.isnative:
        x = x.astype(x.dtype.newbyteorder("="))
    x = np.ascontiguousarray(x)
    return x if x.flags.writeable else x.copy()


def _dtype_name(x) -> str:
    if _is_torch(x):
        return str(x.dtype).replace("torch.", "")
    return np.dtype(getattr(x, "dtype", type(x))).name


def _alloc(shape, dtype, target: TargetSpec, like_torch: bool, dense: Sequence, poison: bool):
    # poison: NaN, or for integer outputs the most negative value (no kernel result is that)
    fill = (np.nan if dtype.startswith("float") else np.iinfo(dtype).min) if poison else 0
    if like_torch:
        import torch

        dev = next(x.device for x in dense if _is_torch(x))
        return torch.full(shape, fill, dtype=getattr(torch, dtype), device=dev)
    host = _compact(np.full(shape, fill, dtype=dtype))
    return host if target.kind == "llvm" else tvm.runtime.tensor(host, target.device())


TORCH_ALIGN = 16  # bytes: Tensor Core kernels move their operands in 16-byte cp.async chunks


def aligned_tensor(x):
    """A torch tensor whose data starts on a 16-byte boundary: ``x`` itself (torch allocates
    at 256 or more), or a copy of a view that starts inside an allocation (``big[1:]``), which
    a 16-byte copy would otherwise fault on."""
    return x if x.data_ptr() % TORCH_ALIGN == 0 else x.clone()


def _compact(a):
    """numpy gives empty arrays zero strides, which TVM rejects as non-compact; restate them
    with C strides (no memory is touched: the array has no elements)."""
    if isinstance(a, np.ndarray) and a.size == 0:
        strides, step = [], a.itemsize
        for n in reversed(a.shape):
            strides.append(step)
            step *= max(n, 1)
        return np.lib.stride_tricks.as_strided(a, a.shape, tuple(reversed(strides)))
    return a

