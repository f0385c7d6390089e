"""Measure tuning candidates on remote machines through TVM's RPC tracker.

    python -m tvm.exec.rpc_tracker --host 0.0.0.0 --port 9190                      # anywhere
    CUDA_VISIBLE_DEVICES=0 python -m tvm.exec.rpc_server --tracker HOST:9190 --key h200 --no-fork
    CUDA_VISIBLE_DEVICES=1 python -m tvm.exec.rpc_server --tracker HOST:9190 --key h200 --no-fork

    from sparsec.tune.rpc import RPCRunner
    with RPCRunner("HOST:9190", "h200", target="cuda:sm_90a") as runner:
        results = runner.measure(candidates, matrix)      # same results as runner.Runner

Candidates are built here, in a pool of spawned processes (the tuner's own build task:
convert, compile, export ahead of time, so a server needs TVM's runtime only and compiles
nothing). Each built module then goes to whichever server the tracker hands out: one
thread per server under the key, each thread asking the tracker for a session per
candidate, so measurements spread over every registered GPU and a candidate that kills
its session (an illegal address, a hang past ``timeout_s``) costs only itself. On the
server, the candidate runs once on poisoned outputs, which come back and are checked
against the float64 reference here, then is timed by TVM's time evaluator (median of
``repeat`` runs of ``number`` calls).
"""
from __future__ import annotations

import multiprocessing
import os
import queue
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import runner as RN


class LocalCluster(RN.Closing):
    """A tracker and ``servers`` RPC servers on this machine, for tests and for one GPU host
    (``env_per_server``: e.g. ``[{"CUDA_VISIBLE_DEVICES": "0"}, {...: "1"}]``). Each server
    is a process of TVM's own ``tvm.exec.rpc_server``."""

    def __init__(self, key: str, servers: int = 2, env_per_server: Optional[Sequence[Dict[str, str]]] = None,
                 port: int = 9190, wait_s: float = 60.0):
        import subprocess
        import sys

        from tvm.rpc.tracker import Tracker

        self.key = key
        self.tracker = Tracker(port=port, port_end=port + 100, silent=True)
        self.address = f"127.0.0.1:{self.tracker.port}"
        envs = list(env_per_server or [{}] * servers)
        # --no-fork: sessions start as fresh processes; a session forked from a server whose
        # process has touched CUDA gets cudaErrorInitializationError (measured on the H200 host)
        self.procs = [subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_server", "--tracker", self.address,
                                        "--key", key, "--port", str(port + 200 + 20 * i), "--port-end",
                                        str(port + 219 + 20 * i), "--no-fork"],
                                       env={**os.environ, **e}, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, start_new_session=True)
                      for i, e in enumerate(envs)]
        deadline = time.time() + wait_s
        while self.registered() < len(envs):
            if time.time() > deadline or any(p.poll() is not None for p in self.procs):
                self.close()
                raise RuntimeError(f"{len(envs)} RPC servers did not register with the tracker in {wait_s:.0f} s")
            time.sleep(0.2)

    def registered(self) -> int:
        from tvm import rpc

        info = rpc.connect_tracker(*parse_tracker(self.address)).summary().get("server_info", [])
        return sum(1 for s in info if s.get("key", "").split(":")[-1] == self.key)

    def close(self):
        import signal

        for p in self.procs:  # each server runs its sessions in child processes: stop the group
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in self.procs:
            try:
                p.wait(10)
            except Exception:  # noqa: BLE001 - still there: kill it
                os.killpg(p.pid, signal.SIGKILL)
        self.tracker.terminate()


def parse_tracker(address: str) -> Tuple[str, int]:
    """``"host:port"`` -> (host, port), with a clear error for anything else."""
    host, sep, port = str(address).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"tracker should be HOST:PORT, got {address!r}")
    return host, int(port)


class RPCRunner(RN.Closing):
    """Build here, measure on the servers registered with the tracker under ``key``.

    ``parallel`` sessions run at once (default: the servers under ``key`` when a round
    starts); ``timeout_s`` bounds a candidate's session (upload, check and timing);
    ``workers`` build processes (default: the CPU count). A build past ``build_timeout_s``
    is recorded as a compile error and abandoned; its process goes with the pool."""

    def __init__(self, tracker: str, key: str, target: str = "llvm", *, timeout_s: float = 60.0,
                 build_timeout_s: float = 300.0, workers: Optional[int] = None, number: int = 10,
                 repeat: int = 5, parallel: Optional[int] = None):
        self.tracker = parse_tracker(tracker)
        if not key or not isinstance(key, str):
            raise ValueError(f"key should name the servers' device key, got {key!r}")
        from ..targets import parse_target

        parse_target(target)
        for name, value in (("timeout_s", timeout_s), ("build_timeout_s", build_timeout_s), ("number", number),
                            ("repeat", repeat), ("workers", workers), ("parallel", parallel)):
            if value is not None and not value > 0:
                raise ValueError(f"{name} should be positive, got {value!r}")
        self.key, self.target = key, target
        self.timeout_s, self.build_timeout_s = timeout_s, build_timeout_s
        self.number, self.repeat, self.parallel = number, repeat, parallel
        self._tmp = tempfile.TemporaryDirectory(prefix="sparsec-rpc-")
        self._pool = ProcessPoolExecutor(workers or os.cpu_count() or 1,
                                         mp_context=multiprocessing.get_context("spawn"))  # TVM is not fork-safe
        self._libs = 0

    def close(self):
        self._pool.shutdown(wait=False, cancel_futures=True)  # an abandoned build must not hold this up
        self._tmp.cleanup()

    def servers(self) -> int:
        """Servers registered under the key and free or busy (the tracker's summary)."""
        from tvm import rpc

        summary = rpc.connect_tracker(*self.tracker).summary()
        return sum(1 for s in summary.get("server_info", []) if s.get("key", "").split(":")[-1] == self.key)

    def measure(self, candidates: Sequence[Dict[str, Any]], matrix, seed: int = 0) -> List[Dict[str, Any]]:
        """One result dict per candidate, in order, as ``runner.Runner.measure`` gives, plus
        ``session`` (which of the parallel sessions measured it) and ``wall_s``."""
        import scipy.sparse as sp

        from .. import formats

        cands = [RN.normalize_candidate(c, i) for i, c in enumerate(RN._as_list(candidates))]
        if not cands:
            return []
        n_sessions = self.parallel or self.servers()
        if n_sessions < 1:
            raise RuntimeError(f"no RPC server is registered under key {self.key!r} at "
                               f"{self.tracker[0]}:{self.tracker[1]}")
        mpath = os.path.join(self._tmp.name, f"matrix{self._libs}.npz")
        sp.save_npz(mpath, formats.as_csr(matrix), compressed=False)
        results: List[Optional[Dict[str, Any]]] = [None] * len(cands)
        todo: "queue.Queue[Optional[tuple]]" = queue.Queue()
        futures = []
        for i, c in enumerate(cands):
            lib = os.path.join(self._tmp.name, f"cand{self._libs}.so")
            self._libs += 1
            futures.append((i, self._pool.submit(RN._build_task, {"candidate": c, "matrix": mpath,
                                                                   "target": self.target, "lib": lib})))
        threads = [threading.Thread(target=self._session_loop, args=(s, todo, results, mpath, seed), daemon=True)
                   for s in range(n_sessions)]
        for t in threads:
            t.start()
        for i, fut in futures:  # hand each build to the measuring threads as it finishes, in order
            try:
                built = fut.result(timeout=self.build_timeout_s)
            except Exception as e:  # noqa: BLE001 - a build process that died or ran out of time
                built = {"status": "compile_error", "error": RN._short(f"{type(e).__name__}: {e}")}
            if built["status"] != "built":
                results[i] = RN._failed(built["status"], built.get("error"), built.get("compile_s"))
            else:
                todo.put((i, cands[i], built))
        for _ in threads:
            todo.put(None)
        for t in threads:
            t.join()
        return results

    def _session_loop(self, session: int, todo, results, mpath: str, seed: int):
        while True:
            item = todo.get()
            if item is None:
                return
            i, cand, built = item
            t0 = time.perf_counter()
            try:
                res = self._measure_remote(cand, built, mpath, seed)
            except Exception as e:  # noqa: BLE001 - this candidate only
                msg = f"{type(e).__name__}: {e}"
                if "timeout" in msg.lower() or "expired" in msg.lower():
                    status = "timeout"
                elif "RPC" in type(e).__name__ or isinstance(e, OSError):
                    status = "crash"  # the session died (the server reports the kernel's error)
                else:
                    status = "runtime_error"  # setting the candidate up here failed
                res = RN._failed(status, msg, built.get("compile_s"))
            res = {**{k: res.get(k) for k in RN.RESULT_KEYS}, "compile_s": built.get("compile_s"),
                   "session": session, "wall_s": time.perf_counter() - t0}
            results[i] = res

    def _measure_remote(self, cand, built, mpath: str, seed: int) -> Dict[str, Any]:
        import tvm
        from tvm import rpc

        from .. import workload
        from ..kernel import Kernel
        from ..reference import REFERENCES, TOLERANCE, max_rel_err
        from ..targets import TargetSpec

        meta = built["meta"]
        inst = RN._convert(cand, mpath)
        kernel = Kernel(executable=None, **meta)
        dense = workload.dense_inputs(kernel, inst, seed)
        host = Kernel(executable=None, **{**meta, "target": TargetSpec("llvm")})  # numpy arguments, in order
        args, outs, _ = host.prepare(inst, *dense, poison=True)
        out_pos = [next(j for j, a in enumerate(args) if a is o) for o in outs]
        remote = rpc.connect_tracker(*self.tracker).request(self.key, priority=1,
                                                            session_timeout=self.timeout_s)
        t_load = time.perf_counter()
        remote.upload(built["lib"])
        mod = remote.load_module(os.path.basename(built["lib"]))
        dev = remote.cuda(0) if meta["target"].kind == "cuda" else remote.cpu(0)
        func = mod[kernel.op_name]
        load_s = time.perf_counter() - t_load
        dev_args = [tvm.runtime.tensor(np.ascontiguousarray(a), dev) if isinstance(a, np.ndarray) else a
                    for a in args]
        func(*dev_args)
        got = dev_args[out_pos[0]].numpy()
        err = max_rel_err(got, REFERENCES[cand["op"]](inst, *dense))
        tol = TOLERANCE[cand["dtype"]]
        if not err <= tol:
            return {"status": "wrong", "error": f"max relative error {err:.3g} exceeds {tol:g}", "max_rel_err": err}
        timer = mod.time_evaluator(kernel.op_name, dev, number=self.number, repeat=self.repeat)
        ms = float(np.median([float(r) for r in timer(*dev_args).results])) * 1e3
        return {"status": "ok", "time_ms": ms, "max_rel_err": err, "method": "rpc-evaluator", "load_s": load_s}
