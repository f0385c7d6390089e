"""GPU correctness check: every operator x format on CUDA against torch in float64.

Run on the GPU host (DEVELOPERS.md / ../shared/gpu/README.md say how to stage TVM):

    bash .gpu/stage2/install.sh && source .gpu/stage2/env.sh && python3 benchmarks/check_gpu.py

For each matrix (odd shapes with empty rows and one huge row, the embedded power grid,
uniform and power-law matrices of 100,000 rows) and each format, the kernel runs on
torch CUDA tensors with poisoned (NaN) outputs, and is compared with torch's result in
float64 on the GPU: the dense product ``A.to_dense() @ B`` where A fits densely, else
``torch.sparse.mm`` on the CSR matrix; SDDMM from the dense product ``X @ Y.T`` gathered
at the stored entries. Writes every row to $OUT/gpu_check.json and prints a table last.
"""
from __future__ import annotations

import faulthandler
import json
import os
import sys
import time

import numpy as np
import scipy.sparse as sp
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
import _preamble  # noqa: F401,E402  (the one preamble: checkout root and benchmarks/data on sys.path)
import sparsec  # noqa: E402
from sparsec.formats import convert, nm, srbcrs  # noqa: E402
from sparsec.reference import max_rel_err  # noqa: E402
from tests.dsl_ops import TEST_OPS  # noqa: E402

DENSE_LIMIT = 20_000  # rows x cols up to this squared: compare with torch's dense matmul
TOL = {"float32": 1e-5, "float16": 1e-2, "int8": 0.0, "int4": 0.0}


def _int_matrix(m, bits):
    q, _ = srbcrs.quantize(m, bits)
    return q


def _fp16_values(m):
    out = m.copy()
    out.data = out.data.astype(np.float16).astype(np.float32)
    return out


FORMATS = {
    "csr": lambda m: convert(m, "csr"),
    "bsr:2x2": lambda m: convert(m, "bsr:2x2"),
    "bsr:4x4": lambda m: convert(m, "bsr:4x4"),
    "bsr:16x16": lambda m: convert(m, "bsr:16x16"),
    "bsr:3x5": lambda m: convert(m, "bsr:3x5"),
    "ell": lambda m: convert(m, "ell"),
    "hyb(auto)": lambda m: convert(m, "hyb"),
    "hyb(4;1..32)": lambda m: convert(m, "hyb", col_parts=4, buckets=(1, 2, 4, 8, 16, 32)),
    "bsr+csr(4x4,.3)": lambda m: convert(m, "bsr+csr", block=(4, 4), block_fill=0.3),
    "nm 2:4": lambda m: convert(nm.prune_stored(m, n=2, m=4), "nm", n=2, m=4),
    "nm 1:8": lambda m: convert(nm.prune_stored(m, n=1, m=8), "nm", n=1, m=8),
    "nm 2:4 v4": lambda m: convert(nm.prune_stored(m, n=2, m=4, vec=4), "nm", n=2, m=4, vec=4),
    "tiled:64x64": lambda m: convert(m, "tiled"),
    "tiled:16x32": lambda m: convert(m, "tiled:16x32"),
    **{f"srbcrs v{v} {dt}": (lambda m, v=v, dt=dt: convert(
        _int_matrix(m, 8 if dt == "int8" else 4) if dt.startswith("int") else _fp16_values(m),
        "srbcrs", vec=v, dtype=dt)) for v in (2, 4, 8) for dt in ("int8", "int4", "float16")},
}


def odd_matrix(seed=0):
    """4097 x 3001 (no tile divides it), 30 % empty rows, one row holding 2,500 entries."""
    rng = np.random.default_rng(seed)
    m = sp.random(4097, 3001, density=0.002, format="lil", dtype=np.float32, random_state=seed)
    for r in rng.choice(4097, 1200, replace=False):
        m.rows[r], m.data[r] = [], []
    cols = np.sort(rng.choice(3001, 2500, replace=False))
    m.rows[17], m.data[17] = list(cols), list(rng.standard_normal(2500).astype(np.float32))
    return m.tocsr()


def uniform_matrix(n, nnz, seed=1):
    """n x n with about nnz entries at uniformly random positions (duplicates merged)."""
    rng = np.random.default_rng(seed)
    rows, cols = rng.integers(0, n, nnz), rng.integers(0, n, nnz)
    m = sp.csr_matrix((rng.standard_normal(nnz).astype(np.float32), (rows, cols)), shape=(n, n))
    m.sum_duplicates()
    return m


def powerlaw_matrix(n, mean_len, seed=0, max_len=2000):
    rng = np.random.default_rng(seed)
    lens = np.minimum((rng.pareto(1.5, n) + 1) * mean_len / 3, max_len).astype(np.int64)
    rows = np.repeat(np.arange(n), lens)
    cols = rng.integers(0, n, rows.size)
    m = sp.csr_matrix((rng.standard_normal(rows.size).astype(np.float32), (rows, cols)), shape=(n, n))
    m.sum_duplicates()
    return m


def matrices(small=False):
    pg = sp.load_npz(os.path.join(HERE, "..", "sparsec", "data", "power_grid.npz")).astype(np.float32)
    pg.data = np.random.default_rng(5).standard_normal(pg.nnz).astype(np.float32)
    out = {"odd_4097x3001": odd_matrix(), "power_grid": pg}
    if not small:
        out.update({"uniform_100k": uniform_matrix(100_000, 500_000), "powerlaw_100k": powerlaw_matrix(100_000, 8)})
    return out


def torch_csr64(inst, dev):
    m = inst.to_scipy().astype(np.float64)
    return torch.sparse_csr_tensor(torch.from_numpy(m.indptr.astype(np.int64)), torch.from_numpy(m.indices.astype(np.int64)),
                                   torch.from_numpy(m.data), size=m.shape, device=dev)


def torch_spmm_ref(inst, B):
    A = torch_csr64(inst, B.device)
    if inst.shape[0] <= DENSE_LIMIT and inst.shape[1] <= DENSE_LIMIT:
        return A.to_dense() @ B.double(), "dense matmul"
    return torch.sparse.mm(A, B.double()), "torch.sparse.mm"


def torch_sddmm_ref(inst, X, Y):
    rows, cols = inst.stored_coords()
    ok = torch.from_numpy(rows >= 0).to(X.device)
    r = torch.from_numpy(np.maximum(rows, 0)).to(X.device)
    c = torch.from_numpy(np.maximum(cols, 0)).to(X.device)
    vals = torch.from_numpy(inst.slot_values().astype(np.float64)).to(X.device)
    X64, Yt64 = X.double(), Y.double()  # Y is cols x feat
    out = torch.empty(inst.stored, dtype=torch.float64, device=X.device)
    step = 1 << 21
    for s in range(0, inst.stored, step):
        out[s:s + step] = (X64[r[s:s + step]] * Yt64[c[s:s + step]]).sum(1)
    return torch.where(ok, out * vals, torch.zeros_like(out)), "gathered X @ Y.T"


def errs(out, ref, kind):
    if kind.startswith("int"):  # integer kernels must be exact
        if out.dtype.is_floating_point and torch.isnan(out).any():
            return {"err": float("inf"), "max_elem_err": float("inf")}
        d = (out.double() - ref.double()).abs().max().item() if ref.numel() else 0.0
        return {"err": d, "max_elem_err": d}
    # ||out - ref|| / ||ref|| (the pass criterion) and max|out - ref| / max|ref| (stricter)
    return {"err": max_rel_err(out, ref, norm="fro"), "max_elem_err": max_rel_err(out, ref)}


def dtype_kind(inst) -> str:
    return inst.value_dtype if inst.value_dtype in ("int8", "int4", "float16") else "float32"


def dense_input(kernel, i, shape, rng, dev):
    """A random dense operand in the kernel's dtype: small integers for integer kernels."""
    dtype = kernel.inputs[i].dtype
    if dtype.startswith("int"):
        return torch.randint(-8, 8, shape, device=dev, generator=rng, dtype=getattr(torch, dtype))
    return torch.randn(shape, device=dev, generator=rng).to(getattr(torch, dtype))


def main():
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="cuda", help="cuda (default) or llvm: a CPU dry run of this script")
    ap.add_argument("--small", action="store_true", help="only the two small matrices")
    args = ap.parse_args()
    on_gpu = args.target != "llvm"
    dev = torch.device("cuda" if on_gpu else "cpu")
    gpu = torch.cuda.get_device_name(0) if on_gpu else "cpu"
    out_dir = os.environ.get("OUT", ".")
    rng = torch.Generator(device=dev).manual_seed(0)
    rows, kernels, unsupported = [], {}, []

    def kernel(opname, op, inst, feat):
        key = (opname, inst.format.spec, feat)
        if key not in kernels:
            t0 = time.perf_counter()
            kernels[key] = sparsec.compile(op, inst, target=args.target, **({"feat": feat} if feat else {}))
            kernels[key].extra["wall_compile_s"] = time.perf_counter() - t0
        return kernels[key]

    faulthandler.dump_traceback_later(120, repeat=True)  # a hung kernel shows where it hangs
    for mname, m in matrices(args.small).items():
        for label, make_inst in FORMATS.items():
            if label.startswith("nm") and m.shape[0] * -(-m.shape[1] // 4) * 2 > 5e7:
                continue  # N:M stores N slots per window of every row: meant for moderate sparsity
            t0 = time.perf_counter()
            inst = make_inst(m)
            conv = time.perf_counter() - t0
            kind = dtype_kind(inst)
            for feat in (64, 17):
                k = kernel("spmm", "spmm", inst, feat)
                B = dense_input(k, 0, (m.shape[1], feat), rng, dev)
                got = k(inst, B, poison=True)
                ref, how = torch_spmm_ref(inst, B)
                rows.append(dict(op="spmm", matrix=mname, format=label, spec=inst.format.spec, kind=kind, feat=feat,
                                 rows=m.shape[0], nnz=int(m.nnz), stored=inst.stored, **errs(got, ref, kind),
                                 reference=how, conversion_s=conv, knobs=k.knobs))
                k = kernel("sddmm", "sddmm", inst, feat)
                X = dense_input(k, 0, (m.shape[0], feat), rng, dev)
                Y = dense_input(k, 1, (m.shape[1], feat), rng, dev)
                got = k(inst, X, Y, poison=True)
                ref, how = torch_sddmm_ref(inst, X, Y)
                rows.append(dict(op="sddmm", matrix=mname, format=label, spec=inst.format.spec, kind=kind, feat=feat,
                                 rows=m.shape[0], nnz=int(m.nnz), stored=inst.stored, **errs(got, ref, kind),
                                 reference=how, knobs=k.knobs))
            if kind == "float32":  # the test-only row-wise operators, in float32
                for name, (make, ref_fn) in TEST_OPS.items():
                    try:
                        k = kernel(name, make(), inst, None)
                    except ValueError as e:  # a max over rows that repeat (hyb's split rows): no atomic max
                        if "atomic" not in str(e):
                            raise
                        unsupported.append(f"{name} on {label} ({mname}): {e}")
                        continue
                    got = k(inst, poison=True)
                    ref = torch.from_numpy(ref_fn(inst)).to(dev)
                    rows.append(dict(op=name, matrix=mname, format=label, spec=inst.format.spec, kind=kind, feat=0,
                                     rows=m.shape[0], nnz=int(m.nnz), stored=inst.stored,
                                     **errs(torch.as_tensor(got).to(dev), ref, kind), reference="scipy float64",
                                     knobs=k.knobs))
            if on_gpu:
                torch.cuda.synchronize()
            print(f"{mname:14s} {label:16s} done ({inst.stored} slots, worst err "
                  f"{max(r['err'] for r in rows if r['matrix'] == mname and r['format'] == label):.1e})", flush=True)
            del inst
        with open(os.path.join(out_dir, "gpu_check.json"), "w") as f:
            json.dump({"device": gpu, "partial": True, "rows": rows}, f)
    faulthandler.cancel_dump_traceback_later()

    compile_s = [k.extra["wall_compile_s"] for k in kernels.values()]
    with open(os.path.join(out_dir, "gpu_check.json"), "w") as f:
        json.dump({"device": gpu, "torch": torch.__version__, "rows": rows,
                   "compile_s_median": float(np.median(compile_s))}, f, indent=1)
    bad = [r for r in rows if not r["err"] <= TOL[r["kind"]]]
    print(f"\nGPU: {gpu}; {len(kernels)} kernels compiled (median {np.median(compile_s):.2f} s each)")
    print("rel_err = ||out - ref|| / ||ref||;  max_elem = max|out - ref| / max|ref|; worst format per op x matrix")
    print("integer kernels: max |out - ref| (must be 0); worst per op x format over all matrices and feature widths")
    print(f"{'op':12s} {'format':16s} {'kind':8s} {'checks':>6s} {'rel_err':>9s} {'max_elem':>9s}  worst on")
    worst, count = {}, {}
    for r in rows:
        key = (r["op"], r["format"])
        count[key] = count.get(key, 0) + 1
        if key not in worst or r["err"] > worst[key]["err"]:
            worst[key] = r
    for key, r in worst.items():
        print(f"{r['op']:12s} {r['format']:16s} {r['kind']:8s} {count[key]:6d} {r['err']:9.2e} {r['max_elem_err']:9.2e}"
              f"  {r['matrix']} feat {r['feat']}")
    print(f"\n{len(rows)} checks, {len(bad)} above tolerance {TOL}")
    for u in unsupported:
        print("  not compiled (by design):", u[:160])
    for r in bad:
        print("  FAIL", r)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
