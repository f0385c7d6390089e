"""One timer for sparsec and every peer.

Each sample is ``batch`` back-to-back calls between two CUDA events recorded on the current
stream (the stream sparsec's kernels are launched on too: run.py enters
``tvm_ffi.use_torch_stream``), divided by ``batch``. Launches queue up as they do inside a
model, so the host-side cost of a call (Python, the FFI, the launch) overlaps the GPU work
instead of showing as idle GPU time between the events; sparsec and the peers are timed
the same way.
Samples follow a warm-up and are taken over R copies of the input set, called in turn,
where R copies together hold several times the L2 cache: a call then reads its operands
from memory, as it would inside a model, instead of from the cache its previous call
filled. The reported time is the median sample. On the CPU (dry runs) a sample is a
``perf_counter`` interval.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Sequence

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

    def as_dict(self) -> dict:
        return {"median_ms": self.median_ms, "min_ms": self.min_ms, "max_ms": self.max_ms, "reps": self.reps,
                "copies": self.copies}


class Timer:
    """Median of per-call timings (each sample a batch of calls) after a warm-up. The number of timed calls adapts to the
    call's length: as many as fit in ``budget_ms`` of work, between ``min_reps`` and
    ``max_reps``; the warm-up runs every copy at least once and ``warmup_ms`` at least."""

    def __init__(self, device: str = "cuda", *, warmup_ms: float = 25.0, budget_ms: float = 150.0,
                 min_reps: int = 5, max_reps: int = 50, batch: int = 10):
        if device not in ("cuda", "cpu"):
            raise ValueError(f"device should be 'cuda' or 'cpu', got {device!r}")
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
        samples = self._samples(calls, reps)
        return Timing(float(np.median(samples)), float(np.min(samples)), float(np.max(samples)), reps, len(calls))

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
        for i in range(n):
            starts[i].record()
            for _ in range(batch):
                calls[k % len(calls)]()
                k += 1
            ends[i].record()
        torch.cuda.synchronize()
        return np.array([s.elapsed_time(e) / batch for s, e in zip(starts, ends)])


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
