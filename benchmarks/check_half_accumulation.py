#!/usr/bin/env python3
"""GPU check of float16-declared outputs (``schedules.widen``): SpMM and SDDMM user operators
whose output is float16, on CUDA for csr, ell, hyb and bsr, against the float64 product, on
NaN-poisoned outputs. The matrices hold one long row of positive values (its sums reach the
thousands, where float16's spacing is 1-2), empty rows and odd sizes; B and X, Y are float16.
A sum kept in float16 was ~20 % off on such a row; rounded once it is within ~5e-4.

    python3 benchmarks/check_half_accumulation.py [--out FILE]

Writes every case to FILE (default $OUT/check_half_accumulation.json) and prints a table
last; exits 1 if any case is off by more than TOL.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

import _preamble  # noqa: F401,E402  (the one preamble: checkout root and benchmarks/data on sys.path)

TOL = 2e-3  # relative to the output's largest entry: a few float16 roundings, not a 16-bit running sum
FORMATS = ("csr", "ell", "hyb", "bsr:16x16")


def cases():
    """(name, float32 CSR): a long positive row among short ones, with empty rows, odd sizes."""
    import scipy.sparse as sp

    g = np.random.default_rng(5)
    out = []
    for rows, cols, long_row in ((41, 6007, 3), (1000, 8000, 999), (257, 3001, 0)):
        m = sp.random(rows, cols, density=0.004, format="lil", dtype=np.float32, random_state=int(rows))
        m[long_row, :] = g.random(cols).astype(np.float32)
        m[rows // 2, :] = 0  # an empty row
        out.append((f"{rows}x{cols}-long-row-{long_row}", m.tocsr()))
    return out


def main(argv=None) -> int:
    import torch

    import sparsec
    from sparsec import formats
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from test_half_accumulation import sddmm_half, spmm_half

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "check_half_accumulation.json"))
    ap.add_argument("--target", default="cuda", help="cuda (the GPU host) or llvm (this script's own check, on a CPU)")
    args = ap.parse_args(argv)
    dev = "cuda" if args.target.startswith("cuda") else "cpu"
    rows = []
    g = np.random.default_rng(6)
    for name, m in cases():
        dense = m.toarray().astype(np.float16).astype(np.float64)
        for spec in FORMATS:
            inst = formats.convert(m, spec, dtype="float16")
            for op_name, feat in (("spmm", 32), ("spmm", 128), ("sddmm", 64)):
                rec = {"matrix": name, "format": spec, "op": op_name, "feat": feat}
                try:
                    if op_name == "spmm":
                        k = sparsec.compile(spmm_half(), inst, target=args.target, dtype="float16", feat=feat)
                        B = torch.from_numpy(g.random((m.shape[1], feat)).astype(np.float16)).to(dev)
                        got = k(inst, B, poison=True).double().cpu().numpy()
                        ref = dense @ B.double().cpu().numpy()
                    else:
                        k = sparsec.compile(sddmm_half(), inst, target=args.target, dtype="float16", feat=feat)
                        X = torch.from_numpy(g.random((m.shape[0], feat)).astype(np.float16)).to(dev)
                        Y = torch.from_numpy(g.random((m.shape[1], feat)).astype(np.float16)).to(dev)
                        out = k(inst, X, Y, poison=True)
                        got = inst.coordinate_values(out.double().cpu().numpy())
                        c = inst.to_scipy().tocoo()  # canonical CSR order, as coordinate_values gives
                        ref = dense[c.row, c.col] * np.einsum("ij,ij->i", X.double().cpu().numpy()[c.row],
                                                             Y.double().cpu().numpy()[c.col])
                        got = np.asarray(got, dtype=np.float64)
                    rec["knobs"] = k.knobs
                    rec["max_rel_err"] = float(np.abs(got - ref).max() / np.abs(ref).max())
                    rec["ok"] = bool(np.isfinite(got).all() and rec["max_rel_err"] <= TOL)
                except Exception as e:  # noqa: BLE001 - a case that cannot run is a result, said why
                    rec["ok"], rec["error"] = False, f"{type(e).__name__}: {str(e)[:300]}"
                rows.append(rec)
                print(f"{'ok ' if rec['ok'] else 'BAD'} {name:<28} {spec:<10} {op_name:<6} F={feat:<4} "
                      + (f"err {rec['max_rel_err']:.1e}" if "max_rel_err" in rec else rec.get("error", "")), flush=True)
    doc = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu (llvm)", "tol": TOL, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    bad = [r for r in rows if not r["ok"]]
    print(f"\n{doc['device']}: {len(rows)} cases, {len(bad)} off by more than {TOL} (or failed)")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
