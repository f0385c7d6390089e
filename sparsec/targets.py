"""Target names accepted by sparsec, as TVM 0.27 target dicts.

``llvm`` (this CPU), ``cuda`` (the local GPU's arch, else sm_90a), ``cuda:sm_80``,
``cuda:sm_90a``. TVM 0.27 no longer parses CLI-style target strings, and a bare
"cuda" silently means sm_50, so every CUDA target here names its arch.
"""
from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass

from .lazy_module import lazy

tvm = lazy("tvm")  # naming a target does not import TVM; building one or asking for a device does

DEFAULT_CUDA_ARCH = "sm_90a"


@dataclass(frozen=True)
class TargetSpec:
    kind: str  # "llvm" or "cuda"
    arch: str | None = None

    @property
    def name(self) -> str:
        return self.kind if self.arch is None else f"{self.kind}:{self.arch}"

    @property
    def has_clusters(self) -> bool:
        """A CUDA arch with thread-block clusters and ``mbarrier.try_wait`` (sm_90 on): what
        the few-column BSR and tiled kernels launch with."""
        digits = re.match(r"sm_(\d+)", self.arch or "")
        return self.kind == "cuda" and digits is not None and int(digits.group(1)) >= 90

    def tvm_target(self) -> tvm.target.Target:
        if self.kind == "llvm":
            return tvm.target.Target({"kind": "llvm", "num-cores": _cores()})
        return tvm.target.Target({"kind": "cuda", "arch": self.arch})

    def device(self):
        return tvm.cpu(0) if self.kind == "llvm" else tvm.cuda(0)

    def can_run(self) -> bool:
        """True when this process can execute kernels for the target (a GPU is present)."""
        if self.kind == "llvm":
            return True
        try:
            return bool(tvm.cuda(0).exist)
        except Exception:
            return False


def _cores() -> int:
    import os

    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def local_cuda_arch() -> str | None:
    try:
        dev = tvm.cuda(0)
        if not dev.exist:
            return None
        major, minor = dev.compute_version.split(".")
        return f"sm_{major}{minor}" + ("a" if major == "9" else "")
    except Exception:
        return None


def parse_target(text) -> TargetSpec:
    if isinstance(text, TargetSpec):
        return text
    if not isinstance(text, str):
        raise TypeError(f"target should be a string like 'llvm' or 'cuda:sm_90a', got {type(text).__name__}")
    t = text.strip().lower()
    if t in ("llvm", "cpu"):
        return TargetSpec("llvm")
    if t == "cuda":
        return TargetSpec("cuda", local_cuda_arch() or DEFAULT_CUDA_ARCH)
    m = re.fullmatch(r"cuda:(sm_\d{2,3}a?)", t)
    if m:
        return TargetSpec("cuda", m.group(1))
    raise ValueError(f"target should be llvm, cuda, cuda:sm_80 or cuda:sm_90a, got {text!r}")


def choose_cuda_compiler() -> str:
    """The CUDA compile mode TVM will use (``TVM_CUDA_COMPILE_MODE``). TVM's default, NVRTC,
    needs the cuda-bindings package; where it is missing, nvcc is chosen instead, so kernels
    still load. A mode set by the user is left alone."""
    if "TVM_CUDA_COMPILE_MODE" not in os.environ:
        try:
            has_bindings = importlib.util.find_spec("cuda.bindings") is not None
        except ImportError:
            has_bindings = False
        if not has_bindings:
            os.environ["TVM_CUDA_COMPILE_MODE"] = "nvcc"
    return os.environ.get("TVM_CUDA_COMPILE_MODE", "nvrtc")


choose_cuda_compiler()  # at import: every compile parses its target here, before TVM compiles CUDA
