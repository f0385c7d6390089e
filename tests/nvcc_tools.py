"""nvcc for the code-generation tests: compile TVM's CUDA source to a cubin, two at a time."""
import os
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor


def nvcc_compile(src: str, arch: str):
    with tempfile.TemporaryDirectory(prefix="sparsec-nvcc-") as d:
        cu, cubin = os.path.join(d, "k.cu"), os.path.join(d, "k.cubin")
        with open(cu, "w") as f:
            f.write(src)
        p = subprocess.run(["nvcc", "--cubin", f"-arch={arch}", "-O3", "-diag-suppress=177", cu, "-o", cubin],
                           capture_output=True, text=True, timeout=300)
        ok = p.returncode == 0 and os.path.isfile(cubin) and os.path.getsize(cubin) > 0
        return ok, p.stdout + p.stderr


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
    with tempfile.TemporaryDirectory(prefix="sparsec-ptx-") as d:
        cu, ptx = os.path.join(d, "k.cu"), os.path.join(d, "k.ptx")
        with open(cu, "w") as f:
            f.write(src)
        p = subprocess.run(["nvcc", "-ptx", f"-arch={arch}", "-O3", "-diag-suppress=177", cu, "-o", ptx],
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stdout + p.stderr
        with open(ptx) as f:
            return f.read()
