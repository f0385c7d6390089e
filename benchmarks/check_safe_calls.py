#!/usr/bin/env python3
"""Safe kernel calls on a target (issue 21): what a kernel is handed is checked before launch.

On ``--target cuda`` (the GPU host) and ``--target llvm`` (anywhere), for csr, hyb and
bsr:4x4 SpMM:

* a hand-built and a mutated (after ``convert``) instance with an out-of-range index
  (column 1e8, a negative column, a non-monotone indptr) raise a ValueError naming it,
  before launch, and the process goes on (no crash, no wrong answer);
* non-contiguous inputs (numpy and torch) give the scipy float64 result; a non-contiguous,
  read-only or host ``out=`` is refused naming ``out``; read-only inputs work;
* torch tensors on the target's device work; meta tensors and tensors requiring grad are
  refused naming the argument;
* an exported module (``sparsec.load``) checks the same (csr);
* attention on integer SR-BCRS is refused before compiling.

With ``--target cuda`` where no GPU is visible, it checks the one thing that can be checked
there: the call raises the clear "no CUDA GPU is visible" RuntimeError first.

    python3 benchmarks/check_safe_calls.py [--target cuda|llvm] [--out DIR]

Prints a table last; writes ``safe_calls.json`` to ``--out``; exits 1 on any failure.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback

import numpy as np
import scipy.sparse as sp

import _preamble  # noqa: F401,E402  (the one preamble: checkout root and benchmarks/data on sys.path)

import sparsec  # noqa: E402
from sparsec.formats import CompositeInstance, FormatInstance, convert  # noqa: E402
from sparsec.kernel import _gpu_visible  # noqa: E402

FORMATS = ("csr", "hyb", "bsr:4x4")
FEAT = 32
TOL = 1e-5


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="cuda", help="cuda (default; the arch of the visible GPU) or llvm")
    p.add_argument("--out", default=None, help="folder for safe_calls.json")
    return p.parse_args(argv)


def test_matrix(seed=0, rows=1003, cols=517):
    rng = np.random.default_rng(seed)
    m = sp.random(rows, cols, density=0.02, format="lil", random_state=seed, dtype=np.float32)
    m[rows // 2, :] = rng.standard_normal(cols)  # one long row
    m[:7, :] = 0  # empty rows
    return m.tocsr()


def by_hand(inst):
    """``inst`` rebuilt from copies of its arrays (not sealed: what a user builds by hand)."""
    if isinstance(inst, CompositeInstance):
        return CompositeInstance(inst.format, inst.shape, [by_hand(p) for p in inst.parts], inst.nnz)
    return FormatInstance(inst.format, inst.shape, {n: np.array(a) for n, a in inst.arrays.items()},
                          inst.data.copy(), inst.nnz)


def index_part(inst):
    """The (part, column-index array name) where a corruption is planted: the last part."""
    part = inst.parts[-1] if isinstance(inst, CompositeInstance) else inst
    return part, [n for n in part.format.index_array_names() if n in ("indices", "col_ids")][0]


def corrupt(inst, how, mutate):
    """A copy (``mutate=False``: built by hand) or the instance itself after ``convert``
    (``mutate=True``: an index array replaced by a changed copy) with one bad index."""
    bad = inst if mutate else by_hand(inst)
    part, name = index_part(bad)
    arr = np.array(part.arrays[name])
    if how == "indptr":
        if "indptr" not in part.arrays:
            return None
        ptr = np.array(part.arrays["indptr"])
        k = int(np.flatnonzero(np.diff(ptr) > 0)[1]) + 1
        ptr[k] = ptr[k + 1] + 1  # rises above the next entry: non-monotone
        part.arrays["indptr"] = ptr
        return bad
    live = np.flatnonzero(arr >= 0)
    arr[int(live[len(live) // 2])] = 10**8 if how == "col 1e8" else -7
    part.arrays[name] = arr
    return bad


class Checks:
    def __init__(self):
        self.rows = []

    def run(self, what, fn):
        try:
            detail = fn() or ""
            ok = True
        except Exception as e:  # noqa: BLE001 - a failed check is reported, the others still run
            ok, detail = False, f"{type(e).__name__}: {e}"[:300]
            traceback.print_exc()
        self.rows.append({"check": what, "ok": ok, "detail": str(detail)[:300]})
        print(f"{'ok  ' if ok else 'FAIL'} {what}: {detail}", flush=True)


def expect(exc, fn, *words):
    try:
        fn()
    except exc as e:
        msg = str(e)
        missing = [w for w in words if w not in msg]
        if missing or "Traceback" in msg or "TVMScript" in msg:
            raise AssertionError(f"message lacks {missing}: {msg[:300]}") from None
        return msg[:160]
    raise AssertionError(f"no {exc.__name__} raised")


def close(out, ref):
    out = np.asarray(out.cpu().numpy() if hasattr(out, "cpu") else out, dtype=np.float64)
    err = float(np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-30))
    if not err < TOL:
        raise AssertionError(f"max relative error {err:.3g}")
    return f"rel err {err:.1e}"


def no_gpu_checks(checks, target):
    A = convert(test_matrix(), "csr")
    k = sparsec.compile("spmm", "csr", target=target, feat=FEAT)
    B = np.ones((A.shape[1], FEAT), np.float32)
    checks.run("no GPU: a CUDA kernel call is refused first", lambda: expect(
        RuntimeError, lambda: k(A, B), "no CUDA GPU is visible", "llvm"))
    checks.run("no GPU: before the index check", lambda: expect(
        RuntimeError, lambda: k(corrupt(A, "col 1e8", False), B), "no CUDA GPU is visible"))


def target_checks(checks, target, kind):
    torch = None
    try:
        import torch
    except ImportError:
        pass
    tdev = "cuda" if kind == "cuda" else "cpu"
    m = test_matrix()
    rng = np.random.default_rng(1)
    B64 = rng.standard_normal((m.shape[1], FEAT))
    ref = m.astype(np.float64) @ B64
    B = B64.astype(np.float32)
    for spec in FORMATS:
        A = convert(m, spec)
        k = sparsec.compile("spmm", A, target=target, feat=FEAT)
        checks.run(f"{spec}: converted instance", lambda: close(k(A, B), ref))
        for mutate in (False, True):
            for how in ("col 1e8", "col -7", "indptr"):
                label = f"{spec}: {'mutated after convert' if mutate else 'hand-built'}, {how}"
                bad = corrupt(convert(m, spec) if mutate else A, how, mutate)
                if bad is None:
                    continue
                words = {"col 1e8": ["100000000", "out of range"], "col -7": ["-7", "out of range"],
                         "indptr": ["indptr", "non-decreasing"]}[how]
                checks.run(label, lambda bad=bad, words=words: expect(ValueError, lambda: k(bad, B), *words))
        checks.run(f"{spec}: still runs after the refusals", lambda: close(k(A, B), ref))
        checks.run(f"{spec}: valid hand-built instance", lambda: close(k(by_hand(A), B), ref))
        wide = np.repeat(B, 2, axis=1)
        checks.run(f"{spec}: strided numpy input", lambda: close(k(A, wide[:, ::2]), ref))
        ro = B.copy()
        ro.flags.writeable = False
        checks.run(f"{spec}: read-only numpy input", lambda: close(k(A, ro), ref))
        if kind == "llvm":
            out = np.zeros((m.shape[0], 2 * FEAT), np.float32)[:, ::2]
            checks.run(f"{spec}: strided numpy out= refused", lambda: expect(
                ValueError, lambda: k(A, B, out=out), "out C", "C-contiguous"))
            ro_out = np.zeros((m.shape[0], FEAT), np.float32)
            ro_out.flags.writeable = False
            checks.run(f"{spec}: read-only out= refused", lambda: expect(
                ValueError, lambda: k(A, B, out=ro_out), "out C", "read-only"))
        else:
            checks.run(f"{spec}: numpy out= on a CUDA kernel refused", lambda: expect(
                ValueError, lambda: k(A, B, out=np.zeros((m.shape[0], FEAT), np.float32)), "out C", "numpy"))
        if torch is None:
            continue
        Bt = torch.from_numpy(B).to(tdev)
        checks.run(f"{spec}: torch {tdev} tensor", lambda: close(k(A, Bt), ref))
        Bnc = torch.from_numpy(np.ascontiguousarray(B.T)).to(tdev).t()
        checks.run(f"{spec}: non-contiguous torch input", lambda: close(k(A, Bnc), ref))
        out_nc = torch.zeros((FEAT, m.shape[0]), device=tdev).t()
        checks.run(f"{spec}: non-contiguous torch out= refused", lambda: expect(
            ValueError, lambda: k(A, Bt, out=out_nc), "out C", "C-contiguous"))
        out_ok = torch.zeros((m.shape[0], FEAT), device=tdev)
        checks.run(f"{spec}: torch out= written", lambda: close(k(A, Bt, out=out_ok), ref))
        checks.run(f"{spec}: torch meta tensor refused", lambda: expect(
            ValueError, lambda: k(A, torch.empty((m.shape[1], FEAT), device="meta")), "B", "meta"))
        checks.run(f"{spec}: tensor requiring grad refused", lambda: expect(
            ValueError, lambda: k(A, Bt.clone().requires_grad_()), "B", "requires grad"))
        if kind == "cuda":
            checks.run(f"{spec}: CPU tensor on a CUDA kernel refused", lambda: expect(
                ValueError, lambda: k(A, torch.from_numpy(B)), "B", "cpu"))

    A = convert(m, "csr")
    with tempfile.TemporaryDirectory(prefix="sparsec-safe-") as tmp:
        path = os.path.join(tmp, "spmm.so")
        k = sparsec.compile("spmm", "csr", target=target, feat=FEAT)
        try:
            k.export(path)
            loaded = sparsec.load(path)
        except Exception as e:  # noqa: BLE001 - no exporter here (nvcc) is reported, not fatal
            checks.run("exported module: export and load", lambda e=e: (_ for _ in ()).throw(e))
            loaded = None
        if loaded is not None:
            checks.run("exported module: runs", lambda: close(loaded(A, B), ref))
            checks.run("exported module: hand-built col 1e8 refused", lambda: expect(
                ValueError, lambda: loaded(corrupt(A, "col 1e8", False), B), "100000000"))
            checks.run("exported module: strided input", lambda: close(loaded(A, np.repeat(B, 2, 1)[:, ::2]), ref))

    for dt, fmt in (("int8", "srbcrs:v8,int8"), ("int4", "srbcrs:v4,int4")):
        checks.run(f"attention x {fmt} refused before compiling", lambda dt=dt, fmt=fmt: expect(
            ValueError, lambda: sparsec.compile("attention", fmt, target=target, dtype=dt, feat=16),
            "is not supported", "exp"))


def main(argv=None):
    args = parse_args(argv)
    kind = "cuda" if args.target.startswith("cuda") else "llvm"
    target = args.target
    checks = Checks()
    if kind == "cuda" and not _gpu_visible():
        if target == "cuda":
            target = "cuda:sm_90a"
        print("no CUDA GPU is visible: checking the no-GPU refusal only", flush=True)
        no_gpu_checks(checks, target)
    else:
        if target == "cuda":
            import tvm

            target = "cuda:sm_" + tvm.cuda(0).compute_version.replace(".", "") + (
                "a" if tvm.cuda(0).compute_version == "9.0" else "")
        target_checks(checks, target, kind)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "safe_calls.json"), "w") as f:
            json.dump({"target": target, "checks": checks.rows}, f, indent=1)
    failed = [r for r in checks.rows if not r["ok"]]
    print(f"\n{'check':<62} result")
    for r in checks.rows:
        print(f"{r['check'][:62]:<62} {'ok' if r['ok'] else 'FAIL'}")
    print(f"\n{len(checks.rows) - len(failed)}/{len(checks.rows)} ok on {target}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
