#!/usr/bin/env python3
"""Load and run modules exported ahead of time, with TVM's runtime alone (issue 7).

Export on the CPU machine (nvcc compiles the SASS there), then run this on the GPU host
with only the runtime bundle staged and nvcc off PATH:

    python benchmarks/check_aot.py --export build/aot              # CPU machine
    TVM_USE_RUNTIME_LIB=1 PATH=/usr/bin:/bin python3 benchmarks/check_aot.py build/aot   # GPU host

Each module is checked against the scipy float64 product on fresh random matrices (empty
rows, one row holding most of the entries, sizes that are no multiple of any tile),
with numpy inputs and with torch CUDA tensors, outputs poisoned first. It also confirms
the refusals: a module without this GPU's arch, and a copy with one corrupted byte.
Prints a table last.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import scipy.sparse as sp

import _preamble  # noqa: F401,E402  (the one preamble: checkout root and benchmarks/data on sys.path)

# (file stem, operator, format spec, dtype, feat, archs, knobs)
MODULES = [
    ("spmm_csr_f32", "spmm", "csr", "float32", 64, ["sm_80", "sm_90a"], None),
    ("sddmm_csr_f32", "sddmm", "csr", "float32", 32, ["sm_80", "sm_90a"], None),
    ("spmm_ell8_f32", "spmm", "ell:8", "float32", 32, ["sm_90a"], None),
    ("spmm_bsr16_f16", "spmm", "bsr:16x16", "float16", 128, ["sm_90a"], None),
    # bsr_ring with TMA tensor copies: its host code encodes the tensor maps through the
    # runtime's runtime.cuTensorMapEncodeTiled at every call
    ("spmm_bsr32_ring_tma_f16", "spmm", "bsr:32x32", "float16", 64, ["sm_90a"], {"tma": 1}),
    # csr_split: two launches and a workspace of carries the host code allocates every call
    ("spmm_csr_split_f32", "spmm", "csr", "float32", 64, ["sm_90a"], {"entries_per_warp": 64}),
    ("spmm_csr_f32_sm80_only", "spmm", "csr", "float32", 64, ["sm_80"], None),
]


def export_all(out: Path) -> None:
    import sparsec

    out.mkdir(parents=True, exist_ok=True)
    for stem, op, fmt, dtype, feat, archs, knobs in MODULES:
        k = sparsec.compile(op, fmt, target="cuda:sm_90a", dtype=dtype, feat=feat, knobs=knobs)
        meta = k.export(str(out / f"{stem}.so"), archs=archs)
        print(f"{stem}: {op} {fmt} {dtype} feat={feat} archs={meta['archs']} {meta['library_bytes']} bytes")


def matrices(rng, fmt: str, dtype: str):
    """Fresh test matrices: odd sizes, empty rows, one very long row."""
    out = []
    for rows, cols, density in ((1000, 777, 0.01), (37, 53, 0.2), (4099, 3001, 0.002)):
        m = sp.random(rows, cols, density=density, format="lil", random_state=rng, dtype=np.float64)
        m[rows // 2, :] = rng.standard_normal(cols)  # a single huge row
        m[: rows // 10, :] = 0  # empty rows
        m = m.tocsr()
        if fmt.startswith("ell"):  # ell:8 holds at most 8 per row: keep each row's first 8
            m = sp.csr_matrix((m.data, m.indices, m.indptr), shape=m.shape)
            for i in range(rows):
                s, e = m.indptr[i], m.indptr[i + 1]
                m.data[s + 8:e] = 0
            m.eliminate_zeros()
        if fmt.startswith("bsr"):  # whole 16 x 16 blocks
            m = sp.random(rows // 16 * 16 + 16, cols // 16 * 16 + 16, density=density, format="csr", random_state=rng)
            m = sp.bsr_matrix(m, blocksize=(16, 16)).tocsr()
        out.append(m.astype(np.float32))  # convert() casts to the kernel dtype
    return out


def check(path: Path, rng, torch=None):
    import sparsec
    from sparsec.reference import REFERENCES, TOLERANCE, max_rel_err

    k = sparsec.load(str(path))
    meta = k.extra["metadata"]
    feat = next(d for p in meta["params"] if p["role"] == "input" and not p["sparse"]
                for d in p["shape"] if isinstance(d, int))
    errs = []
    for m in matrices(rng, meta["format"], meta["dtype"]):
        A = sparsec.formats.convert(m, meta["format"], dtype=meta["dtype"])
        widths = [m.shape[1]] if meta["op"] == "spmm" else [m.shape[0], m.shape[1]]
        dense = [rng.standard_normal((w, feat)).astype(meta["dtype"]) for w in widths]
        ref = REFERENCES[meta["op"]](A, *dense)
        outs = [k(A, *dense, poison=True)]  # numpy in, numpy out
        if torch is not None:  # torch CUDA tensors in and out, no copies
            outs.append(k(A, *[torch.from_numpy(d).cuda() for d in dense], poison=True).cpu().numpy())
        errs += [max_rel_err(o, ref) for o in outs]
    return meta, max(errs), max(errs) <= TOLERANCE[meta["dtype"]]


def stream_check(path: Path, rng):
    """The loaded kernel launches on torch's current stream: captured into a CUDA graph on
    a side stream and replayed, it must give the right answer (a launch on another stream
    would fail the capture or read stale inputs)."""
    import torch

    import sparsec
    from sparsec.reference import REFERENCES, max_rel_err

    k = sparsec.load(str(path))
    m = matrices(rng, "csr", "float32")[0]
    A = sparsec.formats.convert(m, "csr")
    B = torch.zeros((m.shape[1], 64), device="cuda")
    out = torch.full((m.shape[0], 64), float("nan"), device="cuda")
    k(A, B, out=out)  # first call: uploads A's arrays (not capturable)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        k(A, B, out=out)
    host = rng.standard_normal(B.shape).astype(np.float32)
    B.copy_(torch.from_numpy(host))
    out.fill_(float("nan"))
    graph.replay()
    err = max_rel_err(out.cpu().numpy(), REFERENCES["spmm"](A, host))
    return {"module": "spmm_csr_f32 (CUDA graph replay)", "archs": k.extra["metadata"]["archs"],
            "max_rel_err": err, "correct": err <= 1e-5}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", help="the directory of exported modules")
    ap.add_argument("--export", action="store_true", help="export the modules into DIR (CPU machine, needs nvcc)")
    ap.add_argument("--out", help="write the results as JSON")
    args = ap.parse_args()
    if args.export:
        export_all(Path(args.dir))
        return 0
    import tvm

    import sparsec
    from sparsec.module_file import ModuleFileError
    from sparsec.runtime import IncompatibleModuleError

    import tvm_ffi

    env = {"runtime_only": bool(tvm.base._RUNTIME_ONLY), "nvcc_on_path": shutil.which("nvcc"),
           "tvm": tvm.__version__,
           # the hook TVM would JIT CUDA source through (NVRTC/nvcc) if a module held source
           "cuda_compile_callback":
               tvm_ffi.get_global_func("tvm_callback_cuda_compile", allow_missing=True) is not None}
    compiles = []

    @tvm_ffi.register_global_func("tvm_callback_cuda_compile", override=True)
    def refuse_to_compile(*_args):  # any JIT at load would land here and fail the run
        compiles.append(1)
        raise RuntimeError("aot_check: a CUDA compile was attempted while loading an exported module")

    rng = np.random.default_rng(7)
    rows = []
    # first with numpy arrays, then with torch CUDA tensors
    for use_torch in (False, True):
        torch = None
        if use_torch:
            import torch
        for stem, *_ in MODULES:
            path = Path(args.dir) / f"{stem}.so"
            name = stem + (" (torch)" if use_torch else " (numpy)")
            try:
                meta, err, ok = check(path, rng, torch)
                rows.append({"module": name, "archs": meta["archs"], "max_rel_err": err, "correct": ok})
            except IncompatibleModuleError as e:
                rows.append({"module": name, "refused": str(e)})
        if not use_torch:
            maps = Path("/proc/self/maps").read_text()
            env["after_numpy_runs"] = {"tvm_compiler_library_loaded": "libtvm_compiler" in maps,
                                       "gpu": tvm.cuda(0).device_name}
    rows.append(stream_check(Path(args.dir) / "spmm_csr_f32.so", rng))
    bad = Path(args.dir) / "corrupted.so"
    data = bytearray((Path(args.dir) / "spmm_csr_f32.so").read_bytes())
    data[len(data) // 3] ^= 0xFF
    bad.write_bytes(bytes(data))
    try:
        sparsec.load(str(bad))
        rows.append({"module": "corrupted copy", "refused": None})
    except ModuleFileError as e:
        rows.append({"module": "corrupted copy", "refused": str(e)})
    env["tvm_compiler_library_loaded_at_end"] = "libtvm_compiler" in Path("/proc/self/maps").read_text()
    env["cuda_compiles_attempted"] = len(compiles)
    if args.out:
        Path(args.out).write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    print(json.dumps(env))
    print("| module | archs | max rel err | result |")
    print("|---|---|---:|---|")
    for r in rows:
        res = "correct" if r.get("correct") else ("refused: " + str(r["refused"])[:150] if "refused" in r else "WRONG")
        print(f"| {r['module']} | {','.join(r.get('archs', []))} | {r.get('max_rel_err', float('nan')):.2e} | {res} |")
    return 0 if all(r.get("correct") or r.get("refused") for r in rows) and not compiles else 1


if __name__ == "__main__":
    sys.exit(main())
