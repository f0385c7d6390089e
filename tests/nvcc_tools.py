"""nvcc for the code-generation tests: compile TVM's CUDA source to a cubin, two at a time."""
import os
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor


def _nvcc(src: str, arch: str, fmt: str):
    """(ok, compiler output, the output file's text or bytes) of ``nvcc --<fmt>``."""
    with tempfile.TemporaryDirectory(prefix="sparsec-nvcc-") as d:
        cu, out = os.path.join(d, "k.cu"), os.path.join(d, f"k.{fmt}")
        with open(cu, "w") as f:
            f.write(src)
        p = subprocess.run(["nvcc", f"--{fmt}", f"-arch={arch}", "-O3", "-diag-suppress=177", cu, "-o", out],
                           capture_output=True, text=True, timeout=300)
        ok = p.returncode == 0 and os.path.isfile(out) and os.path.getsize(out) > 0
        content = open(out, "r" if fmt == "ptx" else "rb").read() if ok else None
        return ok, p.stdout + p.stderr, content


def nvcc_compile(src: str, arch: str):
    ok, output, _ = _nvcc(src, arch, "cubin")
    return ok, output


def nvcc_many(jobs: dict) -> dict:
    """nvcc every {key: (source, arch)} two at a time; {key: (ok, output)}."""
    with ThreadPoolExecutor(2) as pool:
        futs = {k: pool.submit(nvcc_compile, src, arch) for k, (src, arch) in jobs.items()}
        return {k: f.result() for k, f in futs.items()}


def nvcc_sources(sources: dict) -> dict:
    """nvcc every {key: source} whose key ends with its architecture; skips the test when
    nvcc is not on PATH. {key: (ok, output)}."""
    import shutil

    import pytest

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    return nvcc_many({key: (src, key[-1]) for key, src in sources.items()})


def nvcc_ptx(src: str, arch: str) -> str:
    """The PTX nvcc emits for ``src`` (what the Tensor Core tests look for instructions in);
    skips the test when nvcc is not on PATH."""
    import shutil

    import pytest

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    ok, output, ptx = _nvcc(src, arch, "ptx")
    assert ok, output
    return ptx
