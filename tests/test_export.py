"""Exported modules (issue 7): ahead-of-time CUDA, the metadata trailer, and loading with
TVM's runtime alone. CPU kernels run end to end here, also in a runtime-only subprocess;
CUDA modules are built with nvcc and checked up to the point where a GPU is needed (the
GPU run is benchmarks/check_aot.py)."""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

import sparsec
from sparsec import cli
from sparsec.export import check_archs, swap_cuda_payload
from sparsec.module_file import MAGIC, ModuleFileError, read_metadata, trailer
from sparsec.reference import REFERENCES, max_rel_err
from sparsec.runtime import IncompatibleModuleError, arch_runs_on

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")


def matrix(seed=0, rows=301, cols=207):
    m = sp.random(rows, cols, density=0.05, format="lil", random_state=seed, dtype=np.float32)
    m[:5, :] = 0  # empty rows
    m[7, :] = np.arange(cols, dtype=np.float32) / cols  # one full row
    return m.tocsr()


@pytest.fixture(scope="module")
def cpu_module(tmp_path_factory):
    path = tmp_path_factory.mktemp("aot") / "spmm_csr.so"
    kernel = sparsec.compile("spmm", "csr", target="llvm", feat=16)
    return str(path), kernel.export(str(path))


@pytest.fixture(scope="module")
def cuda_module(tmp_path_factory):
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc")
    path = tmp_path_factory.mktemp("aot") / "sddmm_csr_cuda.so"
    kernel = sparsec.compile("sddmm", "csr", target="cuda:sm_90a", feat=32)
    return str(path), kernel.export(str(path), archs=["sm_80", "sm_90a"]), kernel


def cuda_elf_sms(data: bytes):
    """SM numbers of the CUDA ELF images (EM_CUDA = 190) inside a file."""
    sms, j = [], data.find(b"\x7fELF", 1)
    while j >= 0:
        if data[j + 4] == 2 and struct.unpack_from("<H", data, j + 18)[0] == 190:
            sms.append((struct.unpack_from("<I", data, j + 48)[0] >> 8) & 0xFF)
        j = data.find(b"\x7fELF", j + 1)
    return sms


def test_cpu_module_round_trip(cpu_module):
    path, meta = cpu_module
    assert meta["op"] == "spmm" and meta["format"] == "csr" and meta["target"] == "llvm" and meta["archs"] == []
    assert meta["tvm_version"] == __import__("tvm").__version__ and meta["sparsec_version"] == sparsec.__version__
    kernel = sparsec.load(path)
    for seed in (1, 2):
        m = matrix(seed, rows=97 + seed, cols=61)
        A = sparsec.formats.convert(m, "csr")
        B = np.random.default_rng(seed).standard_normal((61, 16)).astype(np.float32)
        assert max_rel_err(kernel(A, B, poison=True), REFERENCES["spmm"](A, B)) < 1e-5
    with pytest.raises(ValueError, match="should have shape"):
        kernel(A, np.zeros((61, 8), np.float32))
    with pytest.raises(ValueError, match="carries machine code, not source"):
        kernel.source()


def test_runtime_only_process_loads_and_runs(cpu_module, tmp_path):
    """TVM_USE_RUNTIME_LIB=1, no nvcc on PATH: sparsec imports, loads and runs the module and
    TVM's compiler library is never mapped."""
    path, _ = cpu_module
    script = f"""
import sys, shutil
import numpy as np, scipy.sparse as sp
import sparsec
from sparsec.reference import REFERENCES, max_rel_err
assert shutil.which("nvcc") is None
k = sparsec.load({path!r})
m = sp.random(150, 90, density=0.1, format="csr", random_state=3, dtype=np.float32)
A = sparsec.formats.convert(m, "csr")
B = np.random.default_rng(0).standard_normal((90, 16)).astype(np.float32)
err = max_rel_err(k(A, B, poison=True), REFERENCES["spmm"](A, B))
maps = open("/proc/self/maps").read()
print("RESULT", err, "libtvm_compiler" in maps, "sparsec.build" in sys.modules)
"""
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1", PATH=os.path.dirname(sys.executable),
               PYTHONPATH=ROOT)
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    err, compiler, build = res.stdout.split("RESULT")[1].split()
    assert float(err) < 1e-5 and compiler == "False" and build == "False"


@needs_nvcc
def test_cuda_module_carries_sass_not_source(cuda_module):
    path, meta, kernel = cuda_module
    assert meta["archs"] == ["sm_80", "sm_90a"] and meta["target"] == "cuda"
    data = open(path, "rb").read()
    assert b"__global__" not in data and kernel.source().encode()[:200] not in data
    assert data.find(bytes.fromhex("50ed55ba")) > 0  # a fatbin
    assert sorted(cuda_elf_sms(data)) == [80, 90]
    assert [p["name"] for p in meta["params"]] == [p.name for p in kernel.params]


@needs_nvcc
def test_cuda_module_refused_without_its_arch(cuda_module):
    path, _, _ = cuda_module
    with pytest.raises(IncompatibleModuleError, match=r"sm_80, sm_90a.*compute capability 7\.5.*sm_75"):
        sparsec.load(path, compute_capability="7.5")
    with pytest.raises(IncompatibleModuleError, match="compute capability 10.0"):
        sparsec.load(path, compute_capability="10.0")


def test_arch_compatibility_rules():
    assert arch_runs_on("sm_90a", "9.0") and not arch_runs_on("sm_90a", "10.0")
    assert arch_runs_on("sm_80", "8.6") and arch_runs_on("sm_80", "8.0") and not arch_runs_on("sm_86", "8.0")
    assert not arch_runs_on("sm_80", "9.0") and not arch_runs_on("compute_90", "9.0")
    assert arch_runs_on("sm_100a", "10.0") and not arch_runs_on("sm_100a", "9.0") and arch_runs_on("sm_120", "12.1")
    assert check_archs(["sm_90a", "sm_80", "sm_90a"]) == ["sm_90a", "sm_80"]
    for bad in (["sm90"], ["compute_90"], [], [90]):
        with pytest.raises(ValueError, match="arch"):
            check_archs(bad)


def test_corrupted_truncated_and_foreign_files_are_refused(cpu_module, tmp_path):
    path, _ = cpu_module
    data = open(path, "rb").read()
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x01
    cases = {"flip.so": (bytes(flipped), "checksum mismatch"),
             "cut.so": (data[:-40], "no sparsec metadata trailer"),
             "spliced.so": (data[:1000] + data[2000:], "does not describe this file's library"),
             "text.so": (b"hello world, not a library at all" * 4, "not an ELF"),
             "badjson.so": (data[:1000] + b"{not json" + struct.pack("<Q", 9) + MAGIC, "not valid JSON"),
             "meta.so": (data.replace(b'"op": "spmm"', b'"op": "spmn"'), "metadata checksum mismatch")}
    for name, (content, message) in cases.items():
        p = tmp_path / name
        p.write_bytes(content)
        with pytest.raises(ModuleFileError, match=message):
            sparsec.load(str(p))
    plain = tmp_path / "plain.so"  # what TVM's export_library alone writes
    sparsec.compile("spmm", "csr", target="llvm", feat=4).executable.export_library(str(plain))
    with pytest.raises(ModuleFileError, match="no sparsec metadata trailer"):
        sparsec.load(str(plain))
    with pytest.raises(FileNotFoundError):
        sparsec.load(str(tmp_path / "missing.so"))


def with_metadata(path, tmp_path, **changes):
    """A copy of the module whose trailer says something else, resealed (checksums valid)."""
    meta, lib_len = read_metadata(path)
    meta.update(changes)
    lib = open(path, "rb").read()[:lib_len]
    out = tmp_path / "edited.so"
    out.write_bytes(lib + trailer(lib, meta)[1])
    return str(out)


def test_incompatible_versions_are_refused(cpu_module, tmp_path):
    path, _ = cpu_module
    with pytest.raises(IncompatibleModuleError, match="built with TVM 0.19.0"):
        sparsec.load(with_metadata(path, tmp_path, tvm_version="0.19.0"))
    with pytest.raises(IncompatibleModuleError, match="module format 2"):
        sparsec.load(with_metadata(path, tmp_path, format_version=2))
    lib_len = read_metadata(path)[1]
    meta = {k: v for k, v in read_metadata(path)[0].items() if k != "params"}
    lib = open(path, "rb").read()[:lib_len]
    (tmp_path / "noparams.so").write_bytes(lib + trailer(lib, meta)[1])
    with pytest.raises(ModuleFileError, match="lacks params"):
        sparsec.load(str(tmp_path / "noparams.so"))


def test_swap_cuda_payload_checks_the_blob():
    src = "extern \"C\" __global__ void k() {}"

    def s(b):
        return struct.pack("<Q", len(b)) + b

    # one kernel "k": two arguments (handle, int32), one launch tag, no extra tags
    table = (struct.pack("<Q", 1) + s(b"k") + s(b"k") + struct.pack("<Q", 2) + bytes([3, 64, 1, 0, 0, 32, 1, 0])
             + struct.pack("<Q", 1) + s(b"blockIdx.x") + struct.pack("<Q", 2) + bytes(8))

    def blob_of(fmt, code):
        cuda = s(fmt) + table + s(code)
        body = struct.pack("<QQQQ", 3, 0, 1, 1) + struct.pack("<QQ", 1, 1) + s(b"_lib") + s(b"cuda") + s(cuda)
        return struct.pack("<Q", len(body)) + body

    for fmt, code in ((b"cuda", src.encode()), (b"cubin", b"\x7fELF-a-cubin")):  # CPU build / GPU build
        out = swap_cuda_payload(blob_of(fmt, code), src, b"\x50\xed\x55\xbaBINARY")
        assert b"fatbin" in out and out.endswith(b"BINARY") and code not in out and table in out
        assert struct.unpack_from("<Q", out, 0)[0] == len(out) - 8
    with pytest.raises(ValueError, match="not laid out as TVM 0.27 writes them"):
        swap_cuda_payload(blob_of(b"cuda", src.encode()), "other source", b"x")
    with pytest.raises(ValueError, match="not laid out"):
        swap_cuda_payload(blob_of(b"wasm", b"x"), src, b"x")
    with pytest.raises(ValueError, match="says"):
        swap_cuda_payload(blob_of(b"cuda", src.encode())[:-3], src, b"x")


def test_export_errors(tmp_path):
    k = sparsec.compile("spmm", "csr", target="llvm", feat=4)
    with pytest.raises(ValueError, match="archs apply to CUDA kernels"):
        k.export(str(tmp_path / "x.so"), archs=["sm_90a"])
    path = tmp_path / "k.so"
    k.export(str(path))
    with pytest.raises(ValueError, match="already an exported module"):
        sparsec.load(str(path)).export(str(tmp_path / "again.so"))


@needs_nvcc
def test_cli_build_arch_and_inspect(capsys, tmp_path):
    path = tmp_path / "spmm.so"
    assert cli.main(["build", "spmm", "--format", "ell:8", "--feat", "16", "--target", "cuda:sm_90a",
                     "--arch", "sm_80", "sm_90a", "-o", str(path)]) == 0
    assert "archs=sm_80,sm_90a" in capsys.readouterr().out
    assert cli.main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "ell:8" in out and "sm_80, sm_90a" in out and "sha256" in out
    assert cli.main(["inspect", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["archs"] == ["sm_80", "sm_90a"]
    data = bytearray(path.read_bytes())
    data[100] ^= 1
    path.write_bytes(bytes(data))
    assert cli.main(["inspect", str(path)]) == 2
    assert "checksum mismatch" in capsys.readouterr().err
    assert cli.main(["build", "spmm", "--format", "csr", "--feat", "16", "--arch", "sm_90a", "--emit-source"]) == 2
    assert "--arch applies to the exported module" in capsys.readouterr().err
