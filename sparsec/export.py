"""Ahead-of-time export: a compiled kernel as one file that loads with TVM's runtime alone.

Built where TVM has no CUDA runtime (a CPU machine), TVM 0.27 keeps a CUDA kernel in its
module as CUDA *source* and compiles it when the module is loaded
(``tvm_callback_cuda_compile``), so an exported library needs a CUDA compiler, and TVM's
compiler library, wherever it is opened; built on a GPU machine it holds a cubin for that
GPU alone. Here the source is compiled at export time by nvcc into a fatbin holding SASS
for each requested arch, and the library's packed device module
(``__tvm_ffi__library_bin``) is rewritten to carry the fatbin (format ``fatbin``) instead.
TVM's CUDA loader hands such a payload straight to ``cuModuleLoadData``: no NVRTC, no
nvcc, no compiler library at load time. The metadata trailer (``module_file``) records what the module is and which archs it has.
"""
from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import tempfile
from typing import Dict, Iterable, List, Optional, Sequence

from ._version import __version__
from .jsonable import jsonable
from .module_file import append_metadata

ARCH_PATTERN = re.compile(r"sm_(\d{1,2})(\d)(a?)")  # major, minor, arch-specific: sm_80, sm_90a, sm_100a
_BLOB_SYMBOL = "__tvm_ffi__library_bin"


def check_archs(archs: Iterable[str]) -> List[str]:
    """Validated, de-duplicated arch names (``sm_80``, ``sm_90a``, ...)."""
    out = []
    for a in archs:
        if not isinstance(a, str) or not ARCH_PATTERN.fullmatch(a):
            raise ValueError(f"arch should look like sm_80 or sm_90a, got {a!r}")
        if a not in out:
            out.append(a)
    if not out:
        raise ValueError("archs should name at least one GPU architecture, e.g. ['sm_90a']")
    return out


def nvcc_fatbin(source: str, archs: Sequence[str], nvcc: Optional[str] = None) -> bytes:
    """Compile CUDA source to a fatbin with SASS for each arch (no PTX: a GPU outside the
    list is refused at load time rather than JIT-compiled)."""
    nvcc = nvcc or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not os.path.exists(nvcc) and not shutil.which(nvcc):
        raise RuntimeError("exporting a CUDA kernel needs nvcc (the CUDA toolkit) on PATH; "
                           "loading the exported module does not")
    with tempfile.TemporaryDirectory(prefix="sparsec-aot-") as tmp:
        src, out = os.path.join(tmp, "kernels.cu"), os.path.join(tmp, "kernels.fatbin")
        with open(src, "w") as f:
            f.write(source)
        # --split-compile: a hyb with dozens of parts is one source with dozens of kernels,
        # optimised in parallel threads
        cmd = [nvcc, "--fatbin", "-O3", "-std=c++17", "-w", "--split-compile=0", src, "-o", out]
        for a in check_archs(archs):
            cmd.append(f"-gencode=arch=compute_{a[3:]},code={a}")
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"nvcc failed for archs {list(archs)}:\n{res.stderr.strip()[-4000:]}")
        with open(out, "rb") as f:
            return f.read()


def _u64(data: bytes, pos: int):
    if pos + 8 > len(data):
        raise ValueError("packed device module ends early")
    return struct.unpack_from("<Q", data, pos)[0], pos + 8


def _string(data: bytes, pos: int):
    n, pos = _u64(data, pos)
    if pos + n > len(data):
        raise ValueError("packed device module ends early")
    return data[pos:pos + n], pos + n


def _skip_function_table(data: bytes, pos: int) -> int:
    """Past a CUDA module's function table: per kernel its name, argument dtypes (4 bytes
    each), launch-parameter tags (strings) and per-argument extra tags (4 bytes each)."""
    n, pos = _u64(data, pos)
    for _ in range(n):
        for _ in range(2):  # the map key, then FunctionInfo.name
            _, pos = _string(data, pos)
        n_args, pos = _u64(data, pos)
        pos += 4 * n_args
        n_tags, pos = _u64(data, pos)
        for _ in range(n_tags):
            _, pos = _string(data, pos)
        n_extra, pos = _u64(data, pos)
        pos += 4 * n_extra
    return pos


def swap_cuda_payload(blob: bytes, source: str, binary: bytes, fmt: str = "fatbin") -> bytes:
    """The packed import blob of a host module with its CUDA module's code replaced by
    ``binary`` in format ``fmt``. The CUDA module's saved bytes are ``[format][function
    table][code]``: the code is the CUDA source where TVM had no CUDA runtime at build time
    (a CPU machine), or a cubin/PTX it compiled at build time (a GPU machine). The blob layout
    (TVM 0.27, tvm-ffi 0.1.14) is: total size; import-tree row pointers and child indices;
    then per module its kind and, except for the host library ``_lib``, its saved bytes.
    Anything unexpected raises instead of writing a module that would not load."""
    size, pos = _u64(blob, 0)
    if size != len(blob) - 8:
        raise ValueError(f"packed device module says {size} bytes, has {len(blob) - 8}")
    n_ptr, pos = _u64(blob, pos)
    pos += 8 * n_ptr
    n_child, pos = _u64(blob, pos)
    pos += 8 * n_child
    out, swapped = bytearray(blob[8:pos]), 0
    for _ in range(max(n_ptr - 1, 0)):
        kind, pos = _string(blob, pos)
        out += struct.pack("<Q", len(kind)) + kind
        if kind == b"_lib":
            continue
        payload, pos = _string(blob, pos)
        if kind == b"cuda":
            fmt_old, p = _string(payload, 0)
            table_end = _skip_function_table(payload, p)
            code, end = _string(payload, table_end)
            if end != len(payload) or fmt_old not in (b"cuda", b"cubin", b"ptx", b"fatbin") or \
                    (fmt_old == b"cuda" and code != source.encode()):
                raise ValueError("the CUDA module's saved bytes are not laid out as TVM 0.27 writes them "
                                 f"(format {fmt_old!r}); is this TVM 0.27?")
            payload = (struct.pack("<Q", len(fmt)) + fmt.encode() + payload[p:table_end]
                       + struct.pack("<Q", len(binary)) + binary)
            swapped += 1
        out += struct.pack("<Q", len(payload)) + payload
    if pos != len(blob) or swapped != 1:
        raise ValueError(f"unexpected packed device module ({swapped} CUDA modules, {len(blob) - pos} bytes left)")
    return struct.pack("<Q", len(out)) + bytes(out)


def _blob_c_source(blob: bytes) -> str:
    body = ",\n".join(",".join(str(b) for b in blob[i:i + 40]) for i in range(0, len(blob), 40))
    return ("#ifdef __cplusplus\nextern \"C\" {\n#endif\n"
            f"__attribute__((visibility(\"default\"))) extern const unsigned char {_BLOB_SYMBOL}[];\n"
            f"const unsigned char {_BLOB_SYMBOL}[{len(blob)}] = {{\n{body}\n}};\n"
            "#ifdef __cplusplus\n}\n#endif\n")


def reuse_metadata(format_spec: str) -> Dict:
    """Which matrices the module takes: ``convert_spec``, the spec to convert them with (a
    composite's resolved parameters, e.g. ``hyb:col_parts=1,buckets=1/2/4``), and
    ``matrix_requirements``, what it asks beyond that (empty: any matrix converted with
    ``convert_spec``; a hyb kernel compiled for a matrix without split rows lists them)."""
    from .formats.registry import convert_spec, matrix_requirements

    return {"convert_spec": convert_spec(format_spec), "matrix_requirements": matrix_requirements(format_spec)}


def export_kernel(kernel, path: str, archs: Optional[Sequence[str]] = None) -> Dict:
    """Write ``kernel`` to ``path`` as a library TVM's runtime loads, with the metadata
    trailer; CUDA kernels carry SASS for ``archs`` (default: the arch compiled for).
    Returns the metadata."""
    import tvm
    from tvm.runtime import _ffi_api

    path = os.fspath(path)
    mod = kernel.executable.mod
    meta = {"op": kernel.op_name, "format": kernel.format_spec, "dtype": kernel.dtype,
            "target": kernel.target.kind, "knobs": jsonable(kernel.knobs),
            "params": [{"name": p.name, "role": p.role, "dtype": p.dtype, "shape": list(p.shape),
                        "sparse": p.sparse, "matrix": p.matrix,
                        "index_extents": [list(u) for u in p.index_extents]} for p in kernel.params],
            "sparsec_version": __version__, "tvm_version": tvm.__version__, "archs": []}
    meta.update(reuse_metadata(kernel.format_spec))
    if kernel.extra.get("shape_multiple"):  # the loaded kernel checks it per call, as the compiled one did
        meta["shape_multiple"] = int(kernel.extra["shape_multiple"])
    if kernel.target.kind == "cuda":
        meta["archs"] = check_archs(archs or [kernel.target.arch])
        source = kernel.source()
        blob = bytes(_ffi_api.ModulePackImportsToTensor(mod).numpy().tobytes())
        blob = swap_cuda_payload(blob, source, nvcc_fatbin(source, meta["archs"]))

        def pack(_mod, is_system_lib, prefix, workspace_dir):
            if is_system_lib or prefix:
                raise ValueError("system-library modules cannot be exported ahead of time")
            out = os.path.join(workspace_dir, "devc.c")
            with open(out, "w") as f:
                f.write(_blob_c_source(blob))
            return out

        mod.export_library(path, fpack_imports=pack)
    elif archs:
        raise ValueError(f"archs apply to CUDA kernels; this kernel targets {kernel.target.name}")
    else:
        mod.export_library(path)
    return append_metadata(path, meta)

