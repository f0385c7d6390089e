"""The autotuner's builder/runner: measure candidates in separate processes.

A candidate is a plain dict::

    {"op": "spmm" | "sddmm", "format": "hyb", "format_knobs": {"col_parts": 2},
     "schedule_knobs": {}, "feat": 64, "dtype": "float32"}

``measure(candidates, matrix)`` returns one result dict per candidate, in order::

    {"status": "ok" | "compile_error" | "runtime_error" | "crash" | "timeout" | "wrong",
     "time_ms": median ms or None, "error": short message or None,
     "max_rel_err": float or None, "compile_s": float or None}

``Runner.submit(candidates, matrix)`` queues candidates and returns tickets at once, and
``Runner.collect(at_least)`` hands back (ticket, result) pairs as they finish: a tuner keeps
the builders busy while a slow build runs on (``measure`` is submit + collect all).

Why processes: generated code that reads out of bounds kills the process that runs it,
and a bad schedule can loop forever. So building (convert + compile + export to a shared
library) runs in a pool of spawned CPU workers, and measuring runs in other spawned
workers, one candidate at a time each, under a per-candidate deadline. A worker that dies
is recorded as ``crash`` for its candidate only; one past its deadline is SIGKILLed and
recorded as ``timeout``; either way it is replaced and the run goes on. Workers are
long-lived (importing TVM costs seconds) and the measuring pool keeps a started spare per
slot, so a replacement is ready at once and a hang costs no more than its timeout.

Processes are started with the "spawn" method: TVM is not fork-safe. As with any spawned
multiprocessing, a script that calls ``measure`` needs an ``if __name__ == "__main__":`` guard.

Before timing, each candidate is run once on fresh random inputs with its outputs
poisoned (NaN) and compared with the float64 reference; a result outside the dtype's
tolerance is ``wrong`` and is not timed.

On CUDA targets, ``devices=[0, 1, ...]`` gives one measuring slot per GPU (each worker sees
only its GPU through CUDA_VISIBLE_DEVICES), so candidates are measured in parallel. On the
CPU (``llvm``, the default) there is one measuring slot so timings do not disturb each other.

Test hook: a candidate may carry ``"inject": "crash" | "hang" | "wrong" | "compile_error"``;
the worker then aborts during measurement, sleeps forever, perturbs the output before the
check, or raises while compiling. It exists so tests can show that such failures are
recorded and do not stop the run; tuners never set it.
"""
from __future__ import annotations

import importlib
import multiprocessing
import os
import signal
import tempfile
import time
from collections import OrderedDict, deque
from multiprocessing.connection import wait
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

OPS = ("spmm", "sddmm")
STATUSES = ("ok", "compile_error", "runtime_error", "crash", "timeout", "wrong")
INJECTIONS = ("crash", "hang", "wrong", "compile_error")
_DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "int4")
_KEYS = ("op", "format", "format_knobs", "schedule_knobs", "feat", "dtype", "inject")
_MAX_ERROR_CHARS = 300
_STARTUP_FAILURES = 3  # workers of one slot that may die before becoming ready


# ---- argument checks (in the calling process, so mistakes fail fast) -------------------------

def normalize_candidate(c, i: int = 0) -> Dict[str, Any]:
    """``c`` with defaults filled in, or ValueError naming what is wrong, so a malformed
    candidate fails before any process is started."""
    if not isinstance(c, dict):
        raise ValueError(f"candidate {i} should be a dict, got {type(c).__name__}")
    unknown = sorted(set(c) - set(_KEYS))
    if unknown:
        raise ValueError(f"candidate {i} has unknown keys {unknown}; known keys: {list(_KEYS)}")
    op = c.get("op")
    if op not in OPS:
        raise ValueError(f"candidate {i}: unknown op {op!r}; expected one of {list(OPS)}")
    fmt = c.get("format")
    if not isinstance(fmt, str) or not fmt:
        raise ValueError(f"candidate {i}: format should be a non-empty spec string such as 'csr', got {fmt!r}")
    feat = c.get("feat")
    if isinstance(feat, bool) or not isinstance(feat, int) or feat < 1:
        raise ValueError(f"candidate {i}: feat should be a positive int, got {feat!r}")
    dtype = c.get("dtype", "float32")
    if dtype not in _DTYPES:
        raise ValueError(f"candidate {i}: dtype should be one of {list(_DTYPES)}, got {dtype!r}")
    out = {"op": op, "format": fmt, "feat": feat, "dtype": dtype}
    for key in ("format_knobs", "schedule_knobs"):
        knobs = c.get(key) or {}
        if not isinstance(knobs, dict):
            raise ValueError(f"candidate {i}: {key} should be a dict, got {type(knobs).__name__}")
        out[key] = dict(knobs)
    inject = c.get("inject")
    if inject is not None and inject not in INJECTIONS:
        raise ValueError(f"candidate {i}: inject should be one of {list(INJECTIONS)} or absent, got {inject!r}")
    out["inject"] = inject
    return out


def _check_positive(name: str, value, kind=float):
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int) or not value > 0:
        raise ValueError(f"{name} should be a positive {'number' if kind is float else 'int'}, got {value!r}")


def _check_target(target: str, devices) -> List[Optional[int]]:
    """The measuring slots: one GPU id per slot on CUDA, a single CPU slot on llvm."""
    if not isinstance(target, str) or not (target == "llvm" or target.startswith("cuda")):
        raise ValueError(f"target should be 'llvm' or a cuda target ('cuda', 'cuda:sm_90a'), got {target!r}")
    if target == "llvm":
        if devices:
            raise ValueError("devices (GPU ids) apply to cuda targets only; the llvm target measures on the CPU")
        return [None]
    devices = [0] if devices is None else list(devices)
    if not devices or any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in devices):
        raise ValueError(f"devices should be a non-empty list of GPU ids (ints >= 0), got {devices!r}")
    if len(set(devices)) != len(devices):
        raise ValueError(f"devices should not repeat a GPU id, got {devices!r}")
    from .. import targets

    targets.parse_target(target)  # a malformed arch fails here, not in every build
    if targets.local_cuda_arch() is None:
        raise ValueError(f"target {target} is measured on a GPU, and no GPU is visible here; "
                         "tune on a GPU host, or use --target llvm")
    return devices


# ---- the public entry point ----------------------------------------------------------------------

RESULT_KEYS = ("status", "time_ms", "error", "max_rel_err", "compile_s", "method", "load_s")


def measure(candidates: Sequence[Dict[str, Any]], matrix, target: str = "llvm", *,
            timeout_s: float = 10.0, build_timeout_s: float = 120.0, workers: Optional[int] = None,
            number: int = 10, repeat: int = 5, devices: Optional[Sequence[int]] = None,
            seed: int = 0) -> List[Dict[str, Any]]:
    """Build and measure every candidate for ``matrix`` (anything ``formats.convert``
    accepts); one result dict per candidate, in order (see the module docstring). A
    one-shot :class:`Runner`; a tuner that measures in rounds keeps one Runner open instead,
    so its workers (and their caches) live across rounds."""
    with Runner(target, timeout_s=timeout_s, build_timeout_s=build_timeout_s, workers=workers, number=number,
                repeat=repeat, devices=devices) as runner:
        return runner.measure(candidates, matrix, seed=seed)


class Closing:
    """``with X(...) as x:`` closes x on the way out, errors or not (the runners hold
    worker processes and temporary directories)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Runner(Closing):
    """Long-lived build and measure workers for one target.

    ``timeout_s`` bounds each candidate's measurement (check plus timing) and
    ``build_timeout_s`` its build; ``workers`` build processes (default: the CPU count),
    with ``build_env`` added to their environment (e.g. ``SPARSEC_CUDA_UNROLL``);
    on the CPU ``number`` x ``repeat`` timed runs, of which the median of the repeats is
    reported. On a GPU with torch, candidates are timed like every benchmark contestant
    (``sparsec.measure.Timer``: CUDA-graph replay over rotated copies of the inputs,
    so each call reads from memory rather than a warm L2). Pools start at the first
    ``measure`` and stop at ``close`` (or the end of a ``with`` block)."""

    def __init__(self, target: str = "llvm", *, timeout_s: float = 10.0, build_timeout_s: float = 120.0,
                 workers: Optional[int] = None, number: int = 10, repeat: int = 5,
                 devices: Optional[Sequence[int]] = None, build_env: Optional[Dict[str, str]] = None):
        _check_positive("timeout_s", timeout_s)
        _check_positive("build_timeout_s", build_timeout_s)
        _check_positive("number", number, int)
        _check_positive("repeat", repeat, int)
        if workers is not None:
            _check_positive("workers", workers, int)
        self.slots = _check_target(target, devices)
        self.target, self.timeout_s, self.build_timeout_s = target, timeout_s, build_timeout_s
        self.workers, self.number, self.repeat = workers, number, repeat
        self.build_env = {**_BUILD_ENV, **(build_env or {})}
        self._tmp = tempfile.TemporaryDirectory(prefix="sparsec-tune-")
        self._builders: Optional[_Pool] = None
        self._measurers: Optional[_Pool] = None
        self._matrices: Dict[int, tuple] = {}  # id(matrix) -> (matrix, path): one file per matrix
        self._libs = 0
        self._build: Optional[_Run] = None
        self._measure: Optional[_Run] = None
        self._tasks: Dict[int, Dict[str, Any]] = {}  # ticket -> candidate, matrix, seed (in flight)
        self._ready: List[tuple] = []  # (ticket, result) finished, not yet collected
        self._next_ticket = 0

    def close(self):
        for pool in (self._builders, self._measurers):
            if pool is not None:
                pool.close()
        self._builders = self._measurers = None
        self._build = self._measure = None
        self._tasks.clear()
        self._ready.clear()
        self._tmp.cleanup()

    def measure(self, candidates: Sequence[Dict[str, Any]], matrix, seed: int = 0) -> List[Dict[str, Any]]:
        """One result dict per candidate, in order. ``seed`` draws the dense inputs (the same
        for every candidate of the call, so the float64 reference is computed once)."""
        if self._tasks:
            raise RuntimeError("measure() waits for every submitted candidate; collect() the ones in flight first")
        tickets = self.submit(candidates, matrix, seed)
        done = dict(self.collect())
        return [done[t] for t in tickets]

    def submit(self, candidates: Sequence[Dict[str, Any]], matrix, seed: int = 0) -> List[int]:
        """Queue candidates for building and measuring and return at once, one ticket each;
        ``collect`` hands the results back as they finish. Measuring starts as soon as a
        build is done, so a tuner can keep the builders busy while slow builds run on."""
        cands = [normalize_candidate(c, i) for i, c in enumerate(_as_list(candidates))]
        if not cands:
            return []
        matrix_path = self._matrix_path(matrix)
        self._start()
        tickets = []
        for c, lib in zip(cands, self._lib_paths(len(cands))):
            t, self._next_ticket = self._next_ticket, self._next_ticket + 1
            self._tasks[t] = {"candidate": c, "matrix": matrix_path, "seed": seed}
            self._build.add(t, {"candidate": c, "matrix": matrix_path, "target": self.target, "lib": lib})
            tickets.append(t)
        return tickets

    @property
    def in_flight(self) -> int:
        """Submitted candidates whose results have not been collected."""
        return len(self._tasks)

    def collect(self, at_least: Optional[int] = None) -> List[tuple]:
        """(ticket, result) of finished candidates, in the order they finished: waits until
        ``at_least`` are ready (default: every one in flight) and returns all that are."""
        want = len(self._tasks) if at_least is None else max(0, min(int(at_least), len(self._tasks)))
        while len(self._ready) < want:
            self._step()
        out, self._ready = self._ready, []
        for t, _ in out:
            self._tasks.pop(t)
        return out

    def _start(self):
        """Start the pools at the first submit: builders, and measuring workers, which
        import while the first builds run."""
        if self._builders is None:
            n = self.workers or os.cpu_count() or 1
            self._builders = _Pool([self.build_env] * n, standby=False)
            self._build = _Run(self._builders, "build", self.build_timeout_s)
        if self._measurers is None:
            envs = [{} if d is None else {"CUDA_VISIBLE_DEVICES": str(d)} for d in self.slots]
            self._measurers = _Pool(envs, standby=True)
            self._measure = _Run(self._measurers, "measure", self.timeout_s)

    def _step(self):
        """One turn of the event loop: hand out queued tasks, wait for any worker, route
        finished builds to measuring (or to the results, when the build failed)."""
        self._build.dispatch()
        self._measure.dispatch()
        _wait_any(self._build, self._measure)
        for t, o in self._build.collect():
            task = self._tasks[t]
            if o["status"] == "built":
                task["compile_s"] = o["compile_s"]
                self._measure.add(t, {"candidate": task["candidate"], "matrix": task["matrix"], "lib": o["lib"],
                                      "meta": o["meta"], "number": self.number, "repeat": self.repeat,
                                      "seed": task["seed"]})
            else:
                self._ready.append((t, _failed(o["status"], o.get("error"), o.get("compile_s"))))
        for t, o in self._measure.collect():
            o = {**o, "compile_s": self._tasks[t].get("compile_s")}
            self._ready.append((t, {k: o.get(k) for k in RESULT_KEYS}))

    def _matrix_path(self, matrix) -> str:
        """The matrix as canonical CSR in one .npz that every worker loads (once per worker),
        rather than pickling it into every task."""
        import scipy.sparse as sp

        from .. import formats

        known = self._matrices.get(id(matrix))
        if known is not None and known[0] is matrix:
            return known[1]
        path = os.path.join(self._tmp.name, f"matrix{len(self._matrices)}.npz")
        sp.save_npz(path, formats.as_csr(matrix), compressed=False)
        self._matrices[id(matrix)] = (matrix, path)
        return path

    def _lib_paths(self, n: int) -> List[str]:
        start, self._libs = self._libs, self._libs + n
        return [os.path.join(self._tmp.name, f"cand{i}.so") for i in range(start, start + n)]


def _as_list(candidates) -> list:
    if isinstance(candidates, (str, bytes, dict)) or not hasattr(candidates, "__iter__"):
        raise ValueError(f"candidates should be a list of candidate dicts, got {type(candidates).__name__}")
    return list(candidates)


def _failed(status: str, error, compile_s=None) -> Dict[str, Any]:
    return {"status": status, "time_ms": None, "error": _short(error), "max_rel_err": None, "compile_s": compile_s,
            "method": None, "load_s": None}


def _short(msg) -> Optional[str]:
    """The first line of an error, bounded: TVM errors carry long tracebacks."""
    if msg is None:
        return None
    text = str(msg).strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    first = lines[-1] if lines and lines[0].startswith("Traceback") else (lines[0] if lines else text)
    return first if len(first) <= _MAX_ERROR_CHARS else first[:_MAX_ERROR_CHARS - 3] + "..."


# ---- worker processes ----------------------------------------------------------------------------

class _Worker:
    """One spawned worker process and the parent's end of its pipe."""

    def __init__(self, ctx, env: Dict[str, str]):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, env), daemon=True)
        self.proc.start()
        child.close()
        self.ready = False

    def stop(self, kill: bool = False):
        """End the process: politely when idle, SIGKILL when it is stuck or ``kill``."""
        if self.proc.is_alive() and not kill:
            try:
                self.conn.send(None)
            except (OSError, ValueError):
                pass
            self.proc.join(2.0)
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join()
        self.conn.close()


class _Slot:
    """A place where one task runs at a time: its worker, a ready spare (measuring
    pools), the environment both get, and how many of its workers died while starting."""

    def __init__(self, ctx, env, standby: bool):
        self.ctx, self.env, self.standby = ctx, env, standby
        self.worker = _Worker(ctx, env)
        self.spare = _Worker(ctx, env) if standby else None
        self.startup_failures = 0

    def workers(self) -> List[_Worker]:
        return [w for w in (self.worker, self.spare) if w is not None]

    def replace(self, w: _Worker, kill: bool):
        """Drop ``w`` (dead or stuck) and put a fresh process in its place; the spare, when
        there is one, takes over at once so the next task waits for no import."""
        if not w.ready:
            self.startup_failures += 1
            if self.startup_failures >= _STARTUP_FAILURES:
                raise RuntimeError(f"tuning workers die while starting (exit code {w.proc.exitcode}); "
                                   "see their stderr (a script calling measure needs an if __name__ == '__main__': guard)")
        w.stop(kill=kill)
        if w is self.worker and self.spare is not None:
            self.worker, self.spare = self.spare, _Worker(self.ctx, self.env)
        elif w is self.worker:
            self.worker = _Worker(self.ctx, self.env)
        else:
            self.spare = _Worker(self.ctx, self.env)

    def close(self):
        for w in self.workers():
            w.stop()


class _Pool:
    """Long-lived spawned workers, one slot per worker (and its spare); the tasks and their
    deadlines are tracked by a :class:`_Run`."""

    def __init__(self, envs: Sequence[Dict[str, str]], standby: bool):
        ctx = multiprocessing.get_context("spawn")
        self.slots: List[_Slot] = []
        try:
            for env in envs:
                self.slots.append(_Slot(ctx, env, standby))
        except BaseException:
            self.close()
            raise

    def close(self):
        for s in self.slots:
            s.close()


class _Run:
    """Tasks of one kind going through one pool: queued, running (slot -> task index and
    deadline), and finished results not yet handed out. Several runs can be driven from
    one loop (``_wait_any``), which is how builds and measurements overlap."""

    def __init__(self, pool: _Pool, kind: str, timeout_s: float):
        self.pool, self.kind, self.timeout_s = pool, kind, timeout_s
        self.pending: deque = deque()  # (task index, payload)
        self.busy: Dict[_Slot, tuple] = {}
        self.done: List[tuple] = []

    @property
    def finished(self) -> bool:
        return not (self.pending or self.busy or self.done)

    def add(self, idx: int, payload: Dict[str, Any]):
        self.pending.append((idx, payload))

    def dispatch(self):
        for s in self.pool.slots:
            if self.pending and s not in self.busy and s.worker.ready:
                idx, payload = self.pending.popleft()
                s.worker.conn.send((self.kind, payload))
                self.busy[s] = (idx, time.monotonic() + self.timeout_s)

    def waitables(self) -> list:
        return [o for s in self.pool.slots for w in s.workers() for o in (w.conn, w.proc.sentinel)]

    def next_deadline(self) -> Optional[float]:
        return min((d for _, d in self.busy.values()), default=None)

    def collect(self) -> List[tuple]:
        """(task index, result) of every task that ended since the last call: a message, a
        death (crash) or a deadline passed (timeout; the worker is killed and replaced)."""
        for s in self.pool.slots:
            for w in s.workers():
                msg = _poll(w)
                if msg == "dead":
                    if w is s.worker and s in self.busy:
                        idx, _ = self.busy.pop(s)
                        self.done.append((idx, {"status": "crash", "error": _death(w.proc)}))
                    s.replace(w, kill=True)
                elif msg is not None and msg[0] == "ready":
                    w.ready = True
                elif msg is not None and msg[0] == "done" and s in self.busy:
                    idx, _ = self.busy.pop(s)
                    self.done.append((idx, msg[1]))
        now = time.monotonic()
        for s, (idx, deadline) in list(self.busy.items()):
            if now >= deadline:
                self.busy.pop(s)
                self.done.append((idx, {"status": "timeout",
                                        "error": f"no result within {self.timeout_s:g} s; worker killed"}))
                s.replace(s.worker, kill=True)
        done, self.done = self.done, []
        return done


def _wait_any(*runs: _Run):
    """Block until a message or a death in any run's pool, or the nearest deadline."""
    objs = [o for r in runs for o in r.waitables()]
    deadlines = [d for r in runs for d in [r.next_deadline()] if d is not None]
    timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
    wait(objs, timeout=timeout)


def _poll(w: _Worker):
    """The worker's next message, "dead" when its process has ended, or None."""
    try:
        if w.conn.poll():
            return w.conn.recv()
    except (EOFError, OSError):
        w.proc.join(1.0)
        return "dead"
    if not w.proc.is_alive():
        return "dead"
    return None


def _death(proc) -> str:
    """How the worker ended, e.g. 'worker died: signal SIGSEGV'."""
    proc.join(1.0)
    code = proc.exitcode
    if code is not None and code < 0:
        try:
            return f"worker died: signal {signal.Signals(-code).name}"
        except ValueError:
            return f"worker died: signal {-code}"
    return f"worker died: exit code {code}"


def _worker_main(conn, env: Dict[str, str]):
    """Worker loop: import the compiler once (seconds), announce readiness, then run tasks
    until told to stop. Each task handler turns its own exceptions into a status."""
    os.environ.update(env)  # before anything touches CUDA: the GPU this worker measures on
    importlib.import_module("sparsec.build")  # TVM imported before "ready": deadlines exclude it

    conn.send(("ready", None))
    handlers = {"build": _build_task, "measure": _measure_task}
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        kind, payload = msg
        conn.send(("done", handlers[kind](payload)))


# ---- the tasks (run inside workers) --------------------------------------------------------------

_BUILD_ENV: Dict[str, str] = {}
_MATRICES: Dict[str, Any] = {}
_INSTANCES: "OrderedDict[tuple, Any]" = OrderedDict()  # converted matrices, most recent last
_CASES: Dict[tuple, Any] = {}  # dense inputs and SpMM references of the current case
_KEEP_INSTANCES = 6


def _load_matrix(path: str):
    """The run's matrix, read once per worker."""
    if path not in _MATRICES:
        import scipy.sparse as sp

        _MATRICES.clear()
        _INSTANCES.clear()
        _CASES.clear()
        _MATRICES[path] = sp.load_npz(path).tocsr()
    return _MATRICES[path]


def _convert(cand, matrix_path: str):
    """The candidate's format instance (format_knobs as the format's keyword parameters),
    kept for the next few candidates: a tuner measures several schedules of one format."""
    import json

    from .. import workload

    key = (matrix_path, cand["format"], json.dumps(cand["format_knobs"], sort_keys=True), cand["dtype"])
    if key in _INSTANCES:
        _INSTANCES.move_to_end(key)
        return _INSTANCES[key]
    inst, _ = workload.convert(_load_matrix(matrix_path), cand["format"], cand["format_knobs"], cand["dtype"])
    _INSTANCES[key] = inst
    while len(_INSTANCES) > _KEEP_INSTANCES:
        _INSTANCES.popitem(last=False)
    return inst


def _build_task(p) -> Dict[str, Any]:
    """Convert, compile and export to a shared library, returning what the measuring
    worker needs to rebuild the Kernel around the loaded library. CUDA modules are
    exported ahead of time (``Kernel.export``: nvcc compiles SASS here, in parallel, off
    the measuring GPU's critical path), so loading them compiles nothing."""
    from ..build import compile as sparsec_compile

    cand = p["candidate"]
    t0 = time.perf_counter()
    try:
        if cand["inject"] == "compile_error":
            raise RuntimeError("injected compile error (test hook)")
        inst = _convert(cand, p["matrix"])
        k = sparsec_compile(cand["op"], inst, feat=cand["feat"], target=p["target"],
                            knobs=cand["schedule_knobs"] or None)
        k.export(p["lib"])
    except Exception as e:  # noqa: BLE001 - any failure to build is this candidate's compile error
        return {"status": "compile_error", "error": _short(f"{type(e).__name__}: {e}"),
                "compile_s": time.perf_counter() - t0}
    meta = {"op_name": k.op_name, "format_spec": k.format_spec, "target": k.target, "dtype": k.dtype,
            "params": k.params, "knobs": k.knobs}
    return {"status": "built", "lib": p["lib"], "meta": meta, "compile_s": time.perf_counter() - t0}



def _cuda_timer():
    """The benchmark's timer (``sparsec.measure``) when torch sees a GPU (graph replay over rotated copies), else None."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    from ..measure import Timer

    return Timer("cuda", warmup_ms=10.0, budget_ms=60.0, min_reps=5, max_reps=30)


def _case_inputs(kernel, inst, cand, p, on_gpu: bool):
    """Dense inputs (numpy, and torch on the GPU) and, for SpMM, the float64 reference, made
    once per (matrix, op, width, dtype, seed): every candidate of a tuning round shares them.
    SDDMM's reference is per format (its output follows the format's stored slots), and so
    is SpMM's for a format that prunes or quantizes the matrix (its own matrix is the one computed)."""
    from .. import workload
    from ..reference import REFERENCES

    shapes = tuple((q.name, q.dtype, q.shape) for q in kernel.inputs)
    family = cand["format"].split(":")[0]
    changed = (cand["format"], tuple(sorted(cand["format_knobs"].items()))) \
        if family in (*workload.NM_FAMILIES, "srbcrs") else None
    key = (p["matrix"], cand["op"], cand["feat"], cand["dtype"], p["seed"], shapes, on_gpu, changed)
    if key not in _CASES:
        _CASES.clear()
        dense = workload.dense_inputs(kernel, inst, p["seed"])
        ref = REFERENCES["spmm"](inst, *dense) if cand["op"] == "spmm" else None
        entry = {"dense": dense, "ref": ref, "dense_dev": None, "ref_dev": None}
        if on_gpu:
            import torch

            entry["dense_dev"] = [torch.from_numpy(np.ascontiguousarray(x)).cuda() for x in dense]
            if ref is not None:
                entry["ref_dev"] = torch.from_numpy(ref).cuda()
        _CASES[key] = entry
    return _CASES[key]


def _measure_task(p) -> Dict[str, Any]:
    """Check on poisoned outputs against the float64 reference, then time. Failures to
    set up or run are runtime errors; a result outside tolerance is wrong, untimed."""
    import tvm

    from ..kernel import Kernel
    from ..reference import REFERENCES, TOLERANCE, max_rel_err
    from ..runtime import LoadedExecutable

    cand = p["candidate"]
    timer = None
    try:
        inst = _convert(cand, p["matrix"])
        if p["meta"]["target"].kind == "cuda":
            timer = _cuda_timer()
        t_load = time.perf_counter()
        kernel = Kernel(executable=LoadedExecutable(tvm.runtime.load_module(p["lib"])), **p["meta"])
        kernel.executable[kernel.op_name]  # resolve the function (CUDA: load the SASS onto the GPU)
        load_s = time.perf_counter() - t_load
        case = _case_inputs(kernel, inst, cand, p, timer is not None)
        _inject_fault(cand["inject"])
        if timer is not None:
            out = kernel(inst, *case["dense_dev"], poison=True)
            if cand["inject"] == "wrong" and out.numel():
                out.view(-1)[out.numel() // 2] += 1.0 + float(out.abs().max())
            ref = case["ref_dev"]
            if ref is None:
                import torch

                ref = torch.from_numpy(REFERENCES[cand["op"]](inst, *case["dense"])).cuda()
            err = max_rel_err(out, ref)
        else:
            out = np.array(kernel(inst, *case["dense"], poison=True), dtype=np.float64)
            if cand["inject"] == "wrong" and out.size:
                out.flat[out.size // 2] += 1.0 + abs(out).max()
            ref = case["ref"] if case["ref"] is not None else REFERENCES[cand["op"]](inst, *case["dense"])
            err = max_rel_err(out, ref)
    except Exception as e:
        return {"status": "runtime_error", "error": _short(f"{type(e).__name__}: {e}")}
    tol = TOLERANCE[cand["dtype"]]
    if not err <= tol:
        return {"status": "wrong", "error": f"max relative error {err:.3g} exceeds {tol:g}", "max_rel_err": err}
    try:
        if timer is not None:
            ms, method = _time_on_gpu(timer, kernel, inst, case["dense_dev"])
        else:
            ms, method = kernel.time(inst, *case["dense"], number=p["number"], repeat=p["repeat"])["median_ms"], \
                "evaluator"
    except Exception as e:
        return {"status": "runtime_error", "error": _short(f"{type(e).__name__}: {e}"), "max_rel_err": err}
    return {"status": "ok", "time_ms": ms, "max_rel_err": err, "method": method, "load_s": load_s}


def _time_on_gpu(timer, kernel, inst, dense_dev):
    """The median device time of one call, timed as the benchmark times it."""
    from ..measure import device_l2_bytes, free_device_bytes, prepare_sparsec, rotation_count

    prepared = prepare_sparsec(kernel, inst, dense_dev, poison=False, layout="kernel")
    copies = rotation_count(prepared.nbytes, device_l2_bytes(), free_device_bytes("cuda"))
    calls = [prepared] + [prepared.clone() for _ in range(copies - 1)]
    t = timer.measure(calls)
    del calls
    return t.median_ms, t.method


def _inject_fault(inject: Optional[str]):
    """Test hook: die or hang the way a bad kernel would, mid-measurement."""
    if inject == "crash":
        os.abort()
    if inject == "hang":
        while True:
            time.sleep(3600)
