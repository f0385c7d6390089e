"""Load an exported sparsec module with TVM's runtime alone.

    import sparsec
    kernel = sparsec.load("spmm_csr.so")     # works with TVM_USE_RUNTIME_LIB=1, no nvcc
    C = kernel(A, B)                          # A converted by sparsec.formats.convert

Before anything is opened, the file's trailer is checked (``module_file``): the checksum,
the module format and TVM versions, and for CUDA modules whether this GPU's arch is among
the archs the module carries SASS for. Only then is the library loaded. This module
imports no part of TVM's compiler.
"""
from __future__ import annotations

import ctypes
import os
from typing import Any, Dict, Optional

from .module_file import FORMAT_VERSION, ModuleFileError, read_metadata


class IncompatibleModuleError(RuntimeError):
    """The module is intact but cannot run here (GPU arch, TVM or module-format version)."""


def arch_runs_on(arch: str, compute_capability: str) -> bool:
    """Whether SASS for ``arch`` (``sm_90a``, ``sm_80``) runs on a GPU of compute capability
    ``"9.0"``: arch-specific (``a``) code only on that exact capability, other SASS on the
    same major version at an equal or later minor one."""
    from .export import ARCH_PATTERN

    m = ARCH_PATTERN.fullmatch(arch)
    if not m:
        return False
    major, minor = (int(x) for x in compute_capability.split("."))
    if m.group(3):
        return (major, minor) == (int(m.group(1)), int(m.group(2)))
    return major == int(m.group(1)) and minor >= int(m.group(2))


def check_compatible(meta: Dict[str, Any], path: str, compute_capability: Optional[str]) -> None:
    """Raise :class:`IncompatibleModuleError` naming why the module cannot run in this process."""
    import tvm

    if meta.get("format_version") != FORMAT_VERSION:
        raise IncompatibleModuleError(f"{path}: module format {meta.get('format_version')}, this sparsec reads "
                                      f"format {FORMAT_VERSION}; re-export it with this sparsec")
    built = str(meta.get("tvm_version", ""))
    if built.split(".")[:2] != tvm.__version__.split(".")[:2]:
        raise IncompatibleModuleError(f"{path} was built with TVM {built}; this runtime is TVM {tvm.__version__}")
    if meta.get("target") == "cuda":
        archs = meta.get("archs") or []
        if compute_capability is None:
            raise IncompatibleModuleError(f"{path} holds CUDA kernels ({', '.join(archs)}) but no CUDA GPU is visible "
                                          "to this process; load it where a GPU is, or export an llvm build of the "
                                          "kernel to run on the CPU")
        if not any(arch_runs_on(a, compute_capability) for a in archs):
            raise IncompatibleModuleError(
                f"{path} carries SASS for {', '.join(archs)}, which does not run on this GPU (compute capability "
                f"{compute_capability}); re-export with archs including sm_{compute_capability.replace('.', '')}"
                + ("a" if compute_capability == "9.0" else ""))
    elif meta.get("target") != "llvm":
        raise ModuleFileError(f"{path}: unknown target {meta.get('target')!r} in the metadata")


def local_compute_capability() -> Optional[str]:
    import tvm

    try:
        dev = tvm.cuda(0)
        return dev.compute_version if dev.exist else None
    except Exception:  # noqa: BLE001 - no CUDA runtime in this TVM build / no driver
        return None


def _ensure_cuda_loader() -> None:
    """Runtime-only TVM (``TVM_USE_RUNTIME_LIB=1``) does not open its CUDA runtime library,
    so the ``cuda`` entries of a packed module would have no loader; open it once."""
    import tvm
    import tvm_ffi

    if tvm_ffi.get_global_func("ffi.Module.load_from_bytes.cuda", allow_missing=True) is not None:
        return
    lib = os.path.join(os.path.dirname(tvm.__file__), "lib", "libtvm_runtime_cuda.so")
    if not os.path.exists(lib):
        raise IncompatibleModuleError(f"this TVM has no CUDA runtime library ({lib})")
    try:
        ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        raise IncompatibleModuleError(f"cannot open TVM's CUDA runtime ({e}); "
                                      "is the NVIDIA driver installed?") from None


class LoadedExecutable:
    """A loaded library in the shape :class:`sparsec.Kernel` expects of an executable:
    ``ex[name]`` and ``ex.mod`` (``time_evaluator``)."""

    def __init__(self, mod):
        self.mod = mod

    def __getitem__(self, name):
        return self.mod[name]


def load(path, *, compute_capability: Optional[str] = None):
    """The exported kernel at ``path`` as a :class:`sparsec.Kernel` (called like a compiled
    one). ``compute_capability`` overrides the visible GPU's (for checks and tests)."""
    import tvm

    from .kernel import Kernel, ParamSpec
    from .targets import TargetSpec

    path = os.fspath(path)
    meta, _ = read_metadata(path)
    if meta.get("target") == "cuda":
        no_loader = None
        if compute_capability is None:
            try:
                _ensure_cuda_loader()  # runtime-only TVM has no CUDA device API until this is open
            except IncompatibleModuleError as e:  # no driver: refused below as "no CUDA GPU is visible"
                no_loader = e
            else:
                compute_capability = local_compute_capability()
        try:
            check_compatible(meta, path, compute_capability)
        except IncompatibleModuleError as e:
            raise e from no_loader
        _ensure_cuda_loader()
    else:
        check_compatible(meta, path, compute_capability)
    mod = tvm.runtime.load_module(path)
    # modules written before edge data had one sparse input, the matrix, and no index inputs
    params = [ParamSpec(p["name"], p["role"], p["dtype"], tuple(p["shape"]), bool(p["sparse"]),
                        bool(p.get("matrix", p["sparse"] and p["role"] == "input")),
                        tuple(tuple(u) for u in p.get("index_extents", ())))
              for p in meta["params"]]
    runs = [a for a in meta["archs"] if compute_capability and arch_runs_on(a, compute_capability)]
    arch = (runs or meta["archs"] or [None])[0]
    kernel = Kernel(meta["op"], meta["format"], TargetSpec(meta["target"], arch), meta["dtype"], params,
                    meta["knobs"], LoadedExecutable(mod))
    kernel.extra["metadata"] = meta
    kernel.extra["path"] = path
    return kernel
