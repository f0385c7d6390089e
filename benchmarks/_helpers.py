"""What the GPU scripts share: loading a cached graph
with fresh values, sparsec.bench's timer, the wrong-result report and a probe's result file.
Imported by scripts after ``_preamble``."""
from __future__ import annotations

import os

import numpy as np
import scipy.sparse as sp

from sparsec.bench.suites import default_cache_dir

CACHE = str(default_cache_dir())  # $SPARSEC_DATA_DIR: benchmarks/data/cache unless set


def load_graph(name: str, small: bool = False):
    """``<name>.npz`` from the cache as float32 CSR with seeded normal values (None when it is
    not there); ``small`` keeps a 2000 x 3000 corner for CPU dry runs."""
    path = os.path.join(CACHE, f"{name}.npz")
    if not os.path.exists(path):
        return None
    m = sp.load_npz(path).tocsr().astype(np.float32)
    if small:
        m = m[:2000, :3000].tocsr()
    m.sum_duplicates()
    m.data = np.random.default_rng(4).standard_normal(m.nnz).astype(np.float32)
    return m


def make_timed(device: str):
    """``timed(fn, inputs)``: median ms per call of fn(x), x cycling over ``inputs``, with
    sparsec.bench's timer (CUDA-graph replays on the GPU, perf_counter on the CPU)."""
    from sparsec.bench.timing import Timer

    timer = Timer(device, warmup_ms=10.0, budget_ms=60.0, max_reps=150)

    def timed(fn, inputs) -> float:
        return timer.measure([lambda x=x: fn(x) for x in inputs]).median_ms

    return timed


def write_probe_rows(path: str, rows, more_wrong: int = 0) -> int:
    """A probe's result file, ``{"device": the GPU's name, "rows": rows, "wrong": n}``; returns
    n, its rows' variants that failed their check plus ``more_wrong``."""
    import json

    import torch

    wrong = sum(not x["ok"] for r in rows for x in r.get("variants", ())) + more_wrong
    with open(path, "w") as fh:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows, "wrong": wrong}, fh, indent=1)
    return wrong


def report_wrong(rows) -> int:
    """Print every setting whose result failed its check; 1 when there is one (the exit code)."""
    bad = [(r["matrix"], r["feat"], x["format"], x["knobs"], x["err"]) for r in rows for x in r["results"]
           if not x["ok"]]
    if bad:
        print("WRONG RESULTS:", bad)
        return 1
    return 0


def fmt(x, unit: str = "") -> str:
    """A table cell: 4 significant digits and ``unit``, or '-' for a missing value."""
    return f"{x:.4g}{unit}" if x else "-"



def profile_calls(calls, warmup: int = 3, profiled: int = 2) -> None:
    """Call each ``(name, fn, args)`` ``warmup`` times, then ``profiled`` times between
    cudaProfilerStart / Stop (what ``ncu --profile-from-start off`` and nsys capture), and
    say which were profiled."""
    import torch

    for _, fn, a in calls:
        for _ in range(warmup):
            fn(*a)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for _, fn, a in calls:
        for _ in range(profiled):
            fn(*a)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print("profiled", [n for n, _, _ in calls])
