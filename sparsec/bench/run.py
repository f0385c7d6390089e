"""The benchmark loop: for each case compile (cached), check, time, record.

Every contestant's result is compared with a float64 reference before it is timed (sparsec
with poisoned outputs, so an element it never writes fails the check). The reference is
computed with torch in float64 on the run's device from exactly the values the kernels
see (fp16-rounded for fp16 cases): scipy on the host would take tens of seconds on the
30M-entry R-MAT graph at width 512. A case whose sparsec result or any peer's result is
wrong is recorded as failed with the error, and the run goes on; ``failed()`` lists them.

Kernels are cached by (op, format spec, dtype, feat, knobs): a CSR or BSR kernel does not
depend on the matrix, so one compile serves every matrix of a suite.
"""
from __future__ import annotations

import contextlib
import platform
import sys
import time
import warnings
import zlib
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from .. import formats, workload
from .._version import __version__
from ..build import compile as sparsec_compile
from ..measure import Prepared, Timer, device_l2_bytes, free_device_bytes, prepare_sparsec, rotation_count
from ..reference import TOLERANCE, max_rel_err
from ..targets import parse_target
from . import roofline
from .cases import MatrixCases
from .peers import DENSE_PEER_MAX_BYTES, PEER_LABELS, PEERS, Operands, Peer, main_peer

DENSE_PEER_MEMORY_SHARE = 0.3  # of the free device memory a densified operand may take
REF_CHUNK_BYTES = 2**28  # the float64 SDDMM reference gathers this much per step


def tolerance(dtype: str) -> float:
    """The accepted max |out - ref| / max |ref|: the one ``sparsec run --check`` uses."""
    return TOLERANCE[dtype]


def require_device(target: str):
    """The target's spec, or a ValueError that says why this machine cannot run the benchmark."""
    spec = parse_target(target)
    try:
        import torch
    except ImportError:
        raise ValueError("sparsec bench needs torch (the peers and the timer use it): "
                         "pip install 'sparsec[torch]' on a CPU machine, a CUDA build of torch on the GPU host") from None
    if spec.kind == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("sparsec bench times kernels on a CUDA GPU, and torch sees none here "
                             "(torch.cuda.is_available() is False): run it on the GPU host")
        if not spec.can_run():
            raise ValueError("sparsec bench: torch sees a GPU but TVM cannot open it (tvm.cuda(0).exist is False): "
                             "is TVM's CUDA runtime staged? (../shared/gpu/README.md)")
    return spec


class Bench:
    """One benchmark session: the device, the timer, the ceilings, the kernel cache and the
    records. ``target="llvm"`` runs the whole pipeline on the CPU with torch's CPU peers
    (a dry run for tests; its times mean nothing)."""

    def __init__(self, target: str = "cuda", *, max_reps: int = 50, timer: Optional[Timer] = None,
                 peers: Sequence[Peer] = PEERS, log: Callable[[str], None] = None):
        self.target = require_device(target)
        self.device = "cuda" if self.target.kind == "cuda" else "cpu"
        self.timer = timer or Timer(self.device, max_reps=max_reps)
        self.peers = tuple(peers)
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.kernels: Dict[tuple, object] = {}  # key -> Kernel, or the exception its compile raised
        self.records: List[dict] = []
        self.ceilings: Dict[str, object] = {"copy_GBps": None, "matmul_TFLOPs": {}}
        self.l2_bytes = device_l2_bytes() if self.device == "cuda" else 2**20
        self._versions = versions()

    # ---- the session ---------------------------------------------------------------------------
    def run(self, groups: Sequence[MatrixCases]) -> List[dict]:
        """Run every case of ``groups``; returns (and keeps) their records."""
        total = sum(len(g.cases) for g in groups)
        done = 0
        with self._context():
            self._ensure_ceilings({c.dtype for g in groups for c in g.cases})
            out = []
            for g in groups:
                operands: Dict[tuple, dict] = {}
                for case in g.cases:
                    done += 1
                    t0 = time.perf_counter()
                    rec = self.run_case(g, case, operands)
                    out.append(rec)
                    self.log(f"[{done}/{total}] {progress_line(rec)} ({time.perf_counter() - t0:.1f} s)")
                operands.clear()
                self._free()
        self.records.extend(out)
        return out

    def failed(self) -> List[dict]:
        return [r for r in self.records if r["status"] != "ok"]

    def result(self) -> dict:
        """Everything a report needs: device, versions, ceilings and the records."""
        return {"device": self.device_name(), "target": self.target.name, "versions": self._versions,
                "ceilings": self.ceilings, "peers": dict(PEER_LABELS), "records": list(self.records)}

    def device_name(self) -> str:
        if self.device == "cuda":
            import torch

            return torch.cuda.get_device_name(0)
        return f"cpu ({platform.processor() or platform.machine()})"

    @contextlib.contextmanager
    def _context(self):
        """TF32 off (fp32 peers compute in fp32, as sparsec does); on CUDA, TVM launches on
        torch's current stream, the one the timer's events are recorded on."""
        import torch

        prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(warnings.catch_warnings())
                warnings.filterwarnings("ignore", message="Sparse (CSR|BSR|invariant).*")
                if self.device == "cuda":
                    import tvm_ffi

                    stack.enter_context(tvm_ffi.use_torch_stream())
                yield
        finally:
            torch.backends.cuda.matmul.allow_tf32 = prev

    def _ensure_ceilings(self, dtypes):
        missing = sorted(set(dtypes) - set(self.ceilings["matmul_TFLOPs"]))
        if not missing:
            return
        t0 = time.perf_counter()
        measured = roofline.measure_ceilings(self.timer, self.device, missing)
        self.ceilings.update({k: v for k, v in measured.items() if k != "matmul_TFLOPs"})
        self.ceilings["matmul_TFLOPs"].update(measured["matmul_TFLOPs"])
        peaks = ", ".join(f"{d} {t:.3g} TFLOP/s" for d, t in self.ceilings["matmul_TFLOPs"].items())
        self.log(f"ceilings: device copy {self.ceilings['copy_GBps']:.0f} GB/s; dense matmul {peaks} "
                 f"({time.perf_counter() - t0:.1f} s)")

    def _free(self):
        if self.device == "cuda":
            import torch

            torch.cuda.empty_cache()

    # ---- one case ------------------------------------------------------------------------------
    def run_case(self, group: MatrixCases, case, operand_cache: Dict[tuple, dict]) -> dict:
        rec = {"op": case.op, "format": case.spec, "dtype": case.dtype, "matrix": case.matrix, "suite": case.suite,
               "block": case.block, "sparsity": case.sparsity, "rows": int(group.matrix.shape[0]),
               "cols": int(group.matrix.shape[1]), "nnz": int(group.matrix.nnz), "feat": case.feat,
               "status": "ok", "error": None, "sparsec_ms": None, "peers": {}, "ratios": {},
               "main_peer": main_peer(case.op, case.spec), "speedup": None, "knobs": dict(case.knobs),
               "device": None, "target": self.target.name}
        try:
            mat = self._matrix_operands(group, case, operand_cache)
            rec.update(nnz=mat["nnz"], stored=mat["inst"].stored)
            kernel = self._kernel(case, mat["inst"])
            rec.update(knobs=dict(kernel.knobs), compile_s=kernel.compile_s)
            operands = self._case_operands(case, mat)
            refs = self._references(case, mat, operands)
            prepared = prepare_sparsec(kernel, mat["inst"], operands.dense, poison=True)
            err = self._check(prepared, refs["sparsec"])
            rec["sparsec_max_rel_err"] = err
            if not err <= tolerance(case.dtype):
                raise CheckFailed(f"sparsec result wrong: max_rel_err {err:.3g} > {tolerance(case.dtype):g}")
            timing = self._time(prepared)
            del prepared
            rec.update(sparsec_ms=timing.median_ms, sparsec_timing=timing.as_dict())
            rec.update(self._roofline(case, mat, timing.median_ms))
            for peer in self.peers:
                res = self._run_peer(peer, operands, refs["peers"], case, mat)
                if res is not None:
                    rec["peers"][peer.name] = res
            rec["ratios"] = {n: p["ms"] / timing.median_ms for n, p in rec["peers"].items() if p.get("ms")}
            rec["speedup"] = rec["ratios"].get(rec["main_peer"])
            wrong = [f"{n}: {p['reason']}" for n, p in rec["peers"].items() if p["status"] == "failed"]
            if wrong:
                raise CheckFailed("peer result wrong: " + "; ".join(wrong))
        except CheckFailed as e:
            rec.update(status="failed", error=str(e))
        except Exception as e:  # a compile error, a conversion error, a CUDA error: record it, go on
            rec.update(status="failed", error=f"{type(e).__name__}: {e}"[:2000])
        rec.update(device=self.device_name(), versions=self._versions)
        return rec

    def _kernel(self, case, inst):
        """The compiled kernel for the case, compiled once per key; a compile error is cached
        too, so the cases that share the key fail at once with the same message."""
        key = (case.op, inst.format.spec, case.dtype, case.feat, case.knobs)
        if key not in self.kernels:
            try:
                self.kernels[key] = sparsec_compile(case.op, inst, target=self.target.name, dtype=case.dtype,
                                                    feat=case.feat, knobs=dict(case.knobs) or None)
            except Exception as e:
                self.kernels[key] = e
        k = self.kernels[key]
        if isinstance(k, Exception):
            raise CheckFailed(f"compile failed: {type(k).__name__}: {k}"[:2000])
        return k

    def _matrix_operands(self, group: MatrixCases, case, cache) -> dict:
        """The sparsec instance and the matrix on the device, once per (format, dtype) of a matrix."""
        key = (case.spec, case.dtype)
        if key in cache:
            return cache[key]
        import torch

        params = formats.parse_spec(case.spec)[1]
        inst, info = workload.convert(group.matrix, case.spec, params, case.dtype)
        family = formats.parse_spec(case.spec)[0].NAME
        if family == "csr":  # the peers multiply exactly the arrays sparsec does
            arrays = inst.kernel_arrays()  # writeable (torch.from_numpy warns on the read-only views)
            indptr, indices, values = arrays["indptr"], arrays["indices"], inst.data
        else:  # the stored entries as CSR; explicit zeros inside blocks are not work for a CSR peer
            m = inst.to_scipy()
            m.eliminate_zeros()
            indptr, indices, values = m.indptr, m.indices, m.data.astype(case.dtype)
        dev = self.device
        tdtype = getattr(torch, case.dtype)
        crow = torch.from_numpy(np.ascontiguousarray(indptr, dtype=np.int32)).to(dev)
        col = torch.from_numpy(np.ascontiguousarray(indices, dtype=np.int32)).to(dev)
        vals = torch.from_numpy(np.ascontiguousarray(values)).to(dev, tdtype)
        rows, cols = inst.shape
        entry_rows = torch.repeat_interleave(torch.arange(rows, device=dev), (crow[1:] - crow[:-1]).long())
        mat = {"inst": inst, "info": info, "family": family, "nnz": int(vals.numel()),
               "csr": torch.sparse_csr_tensor(crow, col, vals, size=(rows, cols)),
               "csr64": torch.sparse_csr_tensor(crow, col, vals.double(), size=(rows, cols)),
               "entry_rows": entry_rows, "entry_cols": col.long(), "bsr": None, "block": None}
        if family == "bsr":
            r, c = params["block"]
            mat["block"] = (r, c)
            arrays = inst.kernel_arrays()
            mat["bsr"] = (torch.from_numpy(arrays["indptr"]).to(dev), torch.from_numpy(arrays["indices"]).to(dev),
                          torch.from_numpy(inst.data).to(dev).reshape(-1, r, c))
        if case.op == "sddmm" and family != "csr":  # sparsec's output is one value per stored slot
            srows, scols = inst.stored_coords()
            mat["slots"] = (torch.from_numpy(srows.astype(np.int64)).to(dev), torch.from_numpy(scols.astype(np.int64)).to(dev),
                            torch.from_numpy(inst.slot_values().astype(np.float64)).to(dev))
        cache[key] = mat
        return mat

    def _case_operands(self, case, mat) -> Operands:
        import torch

        rows, cols = mat["inst"].shape
        gen = torch.Generator(device=self.device).manual_seed(zlib.crc32(f"{case.matrix}/{case.feat}".encode()))
        tdtype = getattr(torch, case.dtype)

        def randn(*shape):
            return torch.randn(*shape, generator=gen, device=self.device).to(tdtype)

        dense = (randn(cols, case.feat),) if case.op == "spmm" else (randn(rows, case.feat), randn(case.feat, cols))
        budget = DENSE_PEER_MAX_BYTES
        if self.device == "cuda":
            budget = min(budget, int(DENSE_PEER_MEMORY_SHARE * free_device_bytes("cuda")))
        return Operands(case.op, case.dtype, self.device, rows, cols, case.feat, mat["csr"], mat["entry_rows"],
                        mat["entry_cols"], dense, mat["bsr"], mat["block"], budget)

    def _references(self, case, mat, o: Operands) -> dict:
        import torch

        if case.op == "spmm":
            ref = torch.sparse.mm(mat["csr64"], o.dense[0].double())
            return {"sparsec": ref, "peers": ref}
        x, y = o.dense[0].double(), o.dense[1].double()
        peers = gathered_dot(x, y, o.entry_rows, o.entry_cols) * mat["csr64"].values()
        if "slots" not in mat:
            return {"sparsec": peers, "peers": peers}
        srows, scols, svals = mat["slots"]
        ok = srows >= 0
        slots = gathered_dot(x, y, srows.clamp(min=0), scols.clamp(min=0)) * svals
        return {"sparsec": torch.where(ok, slots, torch.zeros_like(slots)), "peers": peers}

    def _check(self, prepared: Prepared, ref) -> float:
        out = prepared.output(prepared())
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()
        return max_rel_err(out, ref)

    def _time(self, prepared: Prepared):
        copies = rotation_count(prepared.nbytes, self.l2_bytes, free_device_bytes(self.device))
        calls = [prepared] + [prepared.clone() for _ in range(copies - 1)]
        return self.timer.measure(calls)

    def _roofline(self, case, mat, ms: float) -> dict:
        rows, cols = mat["inst"].shape
        block = mat["block"]
        stored_blocks = mat["inst"].stored // (block[0] * block[1]) if block else None
        nbytes, flops = roofline.compulsory(case.op, rows, cols, mat["nnz"], case.feat, case.dtype, block, stored_blocks)
        bw = self.ceilings["copy_GBps"] * 1e9
        peak = self.ceilings["matmul_TFLOPs"][case.dtype] * 1e12
        t = ms * 1e-3
        return {"bytes": nbytes, "flops": flops, **roofline.achieved(t, nbytes, flops),
                "copy_GBps": bw / 1e9, "peak_TFLOPs": peak / 1e12,
                "time_bound_ms": roofline.time_bound_s(nbytes, flops, bw, peak) * 1e3,
                "roofline_fraction": roofline.roofline_fraction(t, nbytes, flops, bw, peak)}

    def _run_peer(self, peer: Peer, o: Operands, ref, case, mat) -> Optional[dict]:
        """None where the peer does not apply; else its status (ok, skipped with the reason it
        could not run, failed with its error), time and roofline fraction."""
        reason = peer.applies(o)
        if reason is not None:
            return None
        res = {"label": peer.label}
        try:
            prepared = peer.setup(o)
            err = self._check(prepared, ref)
        except Exception as e:  # library missing, dtype or layout unsupported by the peer
            msg = f"{type(e).__name__}: {e}".strip().splitlines()[0][:300]
            return {**res, "status": "skipped", "reason": msg, "ms": None}
        res["max_rel_err"] = err
        if not err <= tolerance(case.dtype):
            return {**res, "status": "failed", "ms": None,
                    "reason": f"max_rel_err {err:.3g} > {tolerance(case.dtype):g}"}
        timing = self._time(prepared)
        frac = self._roofline(case, mat, timing.median_ms)["roofline_fraction"]
        return {**res, "status": "ok", "ms": timing.median_ms, "timing": timing.as_dict(), "roofline_fraction": frac}


class CheckFailed(Exception):
    """A case that cannot be timed: a wrong result, or a kernel that does not compile."""


def gathered_dot(x, y, rows, cols):
    """(x @ y)[rows[k], cols[k]] for every k, in chunks of about REF_CHUNK_BYTES."""
    import torch

    yt = y.t().contiguous()
    out = torch.empty(rows.numel(), dtype=x.dtype, device=x.device)
    step = max(1, REF_CHUNK_BYTES // max(1, x.shape[1] * x.element_size()))
    for s in range(0, rows.numel(), step):
        out[s:s + step] = (x[rows[s:s + step]] * yt[cols[s:s + step]]).sum(1)
    return out


def progress_line(rec: dict) -> str:
    head = f"{rec['op']} {rec['format']} {rec['dtype']} {rec['matrix']} F={rec['feat']}"
    if rec["sparsec_ms"] is None:
        return f"{head}: FAILED: {rec['error']}"
    parts = [f"sparsec {rec['sparsec_ms']:.4f} ms"]
    for name, p in rec["peers"].items():
        if p["status"] == "ok":
            parts.append(f"{name} {p['ms']:.4f} ms ({rec['ratios'][name]:.2f}x)")
        else:
            parts.append(f"{name} {p['status']}")
    parts.append(f"roofline {rec['roofline_fraction']:.0%}")
    tail = "" if rec["status"] == "ok" else f" FAILED: {rec['error']}"
    return f"{head}: " + ", ".join(parts) + tail


def versions() -> dict:
    """Versions of everything that decides the numbers."""
    import torch
    import tvm
    import tvm_ffi

    out = {"sparsec": __version__, "python": platform.python_version(), "torch": torch.__version__,
           "torch_cuda": torch.version.cuda, "tvm": tvm.__version__, "tvm_ffi": tvm_ffi.__version__,
           "numpy": np.__version__}
    for name in ("cupy", "triton"):
        try:
            out[name] = __import__(name).__version__
        except Exception:
            out[name] = None
    return out
