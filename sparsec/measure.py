"""Measuring, shared by ``sparsec.bench`` (sparsec against its peers) and ``sparsec.tune`` (one
candidate kernel): the timer, and the prepared call it times. It sits below both, beside
the kernel, so the tuner times candidates exactly as the benchmark times contestants
without importing the benchmark.

**Prepared calls.** A contestant is one call with every argument prepared beforehand.
sparsec and each peer are timed the same way: ``fn(*args)`` in a loop, with nothing
converted per call. ``clone()`` gives an independent copy of every buffer (sparse
operand, dense inputs, output), so the timer can cycle through several copies and no
call finds its operands still in L2 from the call before.

**The timer.** Each sample is ``batch`` calls between two CUDA events, divided by ``batch``. On the GPU the
``batch`` calls are captured once into a CUDA graph and the sample replays it
(``mode="graph"``, the default): what is timed is the device work of each call (every
kernel, memset and copy it launches), without the host's Python, FFI and launch costs,
which otherwise dominate calls of a few microseconds and make every contestant look the
same. A contestant that cannot be captured (it synchronises, or launches on a stream the
capture does not see) is timed eagerly instead, ``batch`` back-to-back calls on the
current stream, and its Timing says so (``method``). sparsec's kernels launch on torch's
current stream (``tvm_ffi.use_torch_stream``), CuPy's through an external-stream wrapper.
Samples follow a warm-up and are taken over R copies of the input set, called in turn,
where R copies together hold several times the L2 cache: a call then reads its operands
from memory, as it would inside a model, instead of from the cache its previous call
filled. The reported time is the median sample. On the CPU (dry runs) a sample is a
``perf_counter`` interval.
"""
from __future__ import annotations

import contextlib
import math
import sys
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional, Sequence, Tuple

import numpy as np

DEFAULT_L2_BYTES = 50 * 2**20  # H100 / H200; the device's own figure is used where torch reports it
L2_MULTIPLE = 4  # the rotated copies together hold this many L2 caches
MAX_COPIES = 64
MEMORY_SHARE = 0.25  # of the free device memory that the extra copies may take


def rotation_count(set_bytes: int, l2_bytes: int, free_bytes: int, max_copies: int = MAX_COPIES,
                   memory_share: float = MEMORY_SHARE) -> int:
    """How many copies of an input set of ``set_bytes`` to cycle through: enough to hold
    ``L2_MULTIPLE`` L2 caches, no more than ``max_copies``, and only as many extra copies as
    fit in ``memory_share`` of the free memory; at least 1 (the set itself)."""
    if set_bytes <= 0:
        return 1
    want = math.ceil(L2_MULTIPLE * l2_bytes / set_bytes)
    extra_fit = int(memory_share * max(free_bytes, 0) // set_bytes)
    return max(1, min(want, 1 + extra_fit, max_copies))


@dataclass(frozen=True)
class Timing:
    median_ms: float
    min_ms: float
    max_ms: float
    reps: int
    copies: int
    method: str = "eager"

    def as_dict(self) -> dict:
        return {"median_ms": self.median_ms, "min_ms": self.min_ms, "max_ms": self.max_ms, "reps": self.reps,
                "copies": self.copies, "method": self.method}


class Timer:
    """Median of per-call timings (each sample a batch of calls) after a warm-up. The number of timed calls adapts to the
    call's length: as many as fit in ``budget_ms`` of work, between ``min_reps`` and
    ``max_reps``; the warm-up runs every copy at least once and ``warmup_ms`` at least."""

    def __init__(self, device: str = "cuda", *, warmup_ms: float = 25.0, budget_ms: float = 150.0,
                 min_reps: int = 5, max_reps: int = 50, batch: int = 10, mode: str = "graph"):
        if device not in ("cuda", "cpu"):
            raise ValueError(f"device should be 'cuda' or 'cpu', got {device!r}")
        if mode not in ("graph", "eager"):
            raise ValueError(f"mode should be 'graph' or 'eager', got {mode!r}")
        self.mode = mode
        if min_reps < 1 or max_reps < 1:
            raise ValueError(f"min_reps and max_reps should be at least 1, got {min_reps} and {max_reps}")
        self.device = device
        self.warmup_ms, self.budget_ms = warmup_ms, budget_ms
        self.min_reps, self.max_reps = min(min_reps, max_reps), max_reps
        if batch < 1:
            raise ValueError(f"batch should be at least 1, got {batch}")
        self.batch = batch

    def measure(self, calls: Sequence[Callable[[], object]]) -> Timing:
        """Time ``calls`` (one per copy of the input set, cycled in order)."""
        if not calls:
            raise ValueError("measure needs at least one call")
        per_call_ms = self._warm_up(calls)
        reps = int(min(self.max_reps, max(self.min_reps, self.budget_ms // max(per_call_ms, 1e-6))))
        method = "cpu" if self.device == "cpu" else self.mode
        if method == "graph" and not getattr(calls[0], "graph_safe", True):
            method = "eager"  # known not to capture (CuPy's SpMM synchronises): skip the attempt
        samples = None
        if method == "graph":
            samples = self._graph_samples(calls, reps)
            if samples is None:
                method = "eager"
        if samples is None:
            samples = self._samples(calls, reps)
        return Timing(float(np.median(samples)), float(np.min(samples)), float(np.max(samples)), reps, len(calls),
                      method)

    def _sync(self):
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()

    def _warm_up(self, calls) -> float:
        """Run the calls until every copy ran once and ``warmup_ms`` passed; returns the
        wall time of one call (synchronised), which sizes the timed loop."""
        self._sync()
        t0 = time.perf_counter()
        n = 0
        while n < max(2, len(calls)) or (time.perf_counter() - t0) * 1e3 < self.warmup_ms:
            calls[n % len(calls)]()
            n += 1
            if n % len(calls) == 0:
                self._sync()
        self._sync()
        return (time.perf_counter() - t0) * 1e3 / n

    def _samples(self, calls, reps) -> np.ndarray:
        if self.device == "cpu":
            out = np.empty(reps)
            for i in range(reps):
                t0 = time.perf_counter()
                calls[i % len(calls)]()
                out[i] = (time.perf_counter() - t0) * 1e3
            return out
        import torch

        batch = self.batch
        n = max(self.min_reps, -(-reps // batch))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        k = 0
        with _on_current_stream():
            for i in range(n):
                starts[i].record()
                for _ in range(batch):
                    calls[k % len(calls)]()
                    k += 1
                ends[i].record()
        torch.cuda.synchronize()
        return np.array([s.elapsed_time(e) / batch for s, e in zip(starts, ends)])


    def _graph_samples(self, calls, reps) -> Optional[np.ndarray]:
        """Samples from CUDA-graph replays, or None when a call cannot be captured. Graph i
        holds calls i*batch ... i*batch + batch - 1 (cycling through the copies), and there
        are enough graphs for every copy to be called; the graphs share one memory pool."""
        import torch

        batch = self.batch
        n_graphs = max(1, -(-len(calls) // batch))
        graphs = []
        stream = torch.cuda.current_stream()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for gi in range(n_graphs):
                    g = torch.cuda.CUDAGraph()
                    pool = graphs[0].pool() if graphs else None
                    with _capturing(g, pool):
                        for j in range(batch):
                            calls[(gi * batch + j) % len(calls)]()
                    graphs.append(g)
            for g in graphs:  # the first replay uploads the graph
                g.replay()
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001 - any capture failure means: time this contestant eagerly
            graphs.clear()
            # torch.cuda.graph does not restore the current stream when ending the capture
            # fails; left on the side stream, later work would race with the default stream
            torch.cuda.set_stream(stream)
            torch.cuda.synchronize()
            return None
        n = max(self.min_reps, -(-reps // batch))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for i in range(n):
            starts[i].record()
            graphs[i % n_graphs].replay()
            ends[i].record()
        torch.cuda.synchronize()
        return np.array([s.elapsed_time(e) / batch for s, e in zip(starts, ends)])


def back_to_back_ms(fn: Callable[[], Any], calls: int, rounds: int = 5, sync: Callable[[], Any] = lambda: None,
                    warmup: int = 0) -> float:
    """Wall time per call of ``calls`` back-to-back calls, one ``sync`` (the device's) at the end
    of each round, best of ``rounds``: what an eager loop costs, host and device overlapping."""
    for _ in range(warmup):
        fn()
    sync()
    best = math.inf
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        best = min(best, time.perf_counter() - t)
    return best / calls * 1e3


@contextlib.contextmanager
def _capturing(graph, pool):
    """Capture into ``graph`` with sparsec (tvm_ffi) and CuPy launching on the capture stream."""
    import torch

    with torch.cuda.graph(graph, pool=pool), _on_current_stream():
        yield


@contextlib.contextmanager
def _on_current_stream():
    """sparsec (tvm_ffi) and CuPy launch on torch's current stream, where the events are."""
    import torch

    with contextlib.ExitStack() as stack:
        stream = torch.cuda.current_stream()
        try:
            import tvm_ffi

            stack.enter_context(tvm_ffi.use_raw_stream(tvm_ffi.device(f"cuda:{stream.device.index or 0}"),
                                                       stream.cuda_stream))
        except ImportError:
            pass
        if "cupy" in sys.modules:
            import cupy

            stack.enter_context(_cupy_stream(cupy, stream))
        yield


def _cupy_stream(cupy, stream):
    """CuPy's view of a torch stream (Stream.from_external in CuPy 14, ExternalStream before)."""
    try:
        return cupy.cuda.Stream.from_external(stream)
    except (AttributeError, TypeError, ValueError):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return cupy.cuda.ExternalStream(stream.cuda_stream)


def device_l2_bytes() -> int:
    """The GPU's L2 size as torch reports it, else :data:`DEFAULT_L2_BYTES`."""
    try:
        import torch

        return int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0)) or DEFAULT_L2_BYTES
    except Exception:
        return DEFAULT_L2_BYTES


def free_device_bytes(device: str) -> int:
    """Free memory for extra input copies: the GPU's free memory; on the CPU a fixed 2 GiB."""
    if device == "cuda":
        import torch

        return int(torch.cuda.mem_get_info()[0])
    return 2 * 2**30


# ---- prepared calls --------------------------------------------------------------------------
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
