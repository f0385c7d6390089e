#!/usr/bin/env python3
"""RGCN's layer kernel with its output's fill in the same launch against the fill as a
launch of its own (GPU host): correctness of both on real relational graphs, then their
times side by side.

    python3 benchmarks/time_rgcn_fill.py --graph mdual rmat-s18 --relations 16

Per graph and layer shape (64x64, 64x16): ``rgcn_bias`` (R relations + the root term, the
bias folded into the fill) compiled with the fill claimed per group of rows inside the
contraction's launch (``lower.fuse_fill``, sparsec's default) and with the fill as a kernel
of its own first. Each is called 4 times on a NaN-poisoned
output (the call counts in the workspace advance) and checked against float64 scipy; then
timed with CUDA events, median of 50 launches, in 3 alternated rounds (the minimum round is
reported). Writes $OUT/time_rgcn_fill.json and prints a table last.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys

import _preamble  # noqa: F401,E402
sys.path.insert(0, str(_preamble.ROOT / "examples"))

import numpy as np  # noqa: E402

import gnn_peers as gp  # noqa: E402
from check_axis_trees import rgcn_reference  # noqa: E402
from check_segment_split import time_ms  # noqa: E402


@contextlib.contextmanager
def variant(name: str):
    """Kernels compiled inside: "separate" keeps the output's fill as a launch of its own;
    "fused" runs it in the contraction's launch (``sparsec.lower.fuse_fill.ENABLED``);
    "fused_bN" also bounds it to N resident blocks per SM (``FUSED_MIN_BLOCKS``). A suffix
    after "@" sets segment_contract's constants: hH the head pass's entries (``HEAD``; h0:
    none), gG its group (``HEAD_GROUP``), pP segments per thread (``PER_THREAD``), cC threads
    over g (``COL_THREADS``), e.g.
    "separate@h2g4" or "fused@h0p8c16"."""
    from sparsec.lower import fuse_fill
    from sparsec.schedules import segment_contract

    build, _, head = name.partition("@")
    bound = build[len("fused_b"):] if build.startswith("fused_b") else None
    if build not in ("separate", "fused") and not (bound or "").isdigit():
        raise ValueError(f"variant should be separate, fused or fused_bN (N blocks per SM), got {name!r}")
    knobs = {"h": "HEAD", "g": "HEAD_GROUP", "p": "PER_THREAD", "c": "COL_THREADS"}
    given = re.findall(r"([hgpc])(\d+)", head)
    if "".join(k + v for k, v in given) != head:
        raise ValueError(f"variant suffix should be letters h, g, p, c each with a number (e.g. @h2g4p8c16), got {name!r}")
    saved = {n: getattr(segment_contract, n) for n in ("FUSED_MIN_BLOCKS", *knobs.values())}
    saved_enabled = fuse_fill.ENABLED
    fuse_fill.ENABLED = build != "separate"
    if bound:
        segment_contract.FUSED_MIN_BLOCKS = int(bound)
    for k, v in given:
        setattr(segment_contract, knobs[k], int(v))
    try:
        yield
    finally:
        fuse_fill.ENABLED = saved_enabled
        for n, v in saved.items():
            setattr(segment_contract, n, v)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", nargs="*", default=["mdual", "rmat-s18"])
    ap.add_argument("--relations", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", nargs="*", default=["separate", "fused", "fused_b8"],
                    help="separate (the fill as a launch of its own, the default build), fused (one launch), "
                         "fused_bN (one launch, N resident blocks per SM); each may end in @hHgG "
                         "(the segment sums' head pass: H entries, G sums together; @h0 none)")
    args = ap.parse_args(argv)
    args.variants = ["separate"] + [v for v in args.variants if v != "separate"]  # the ratios' base
    for name in args.variants:
        with variant(name):  # a misspelt variant fails here, before any graph is loaded
            pass
    import torch

    import sparsec
    from sparsec.formats import convert
    from sparsec.reference import max_rel_err
    from sparsec.torch_rgcn import _mean_stacked

    rng = np.random.default_rng(0)
    out = []
    for gname in args.graph:
        adj = gp.load_graph(gname)
        rel = args.relations + 1
        stacked = _mean_stacked(adj, gp.draw_relations(adj, args.relations), args.relations, True)
        inst = convert(stacked, "csr")
        for fin, fout in ((64, 64), (64, 16)):
            X = rng.standard_normal((adj.shape[1], fin)).astype(np.float32)
            W = rng.standard_normal((rel, fin, fout)).astype(np.float32)
            b = rng.standard_normal(fout).astype(np.float32)
            ref = rgcn_reference(stacked, rel, X, W) + b
            kernels = {}
            for name in args.variants:
                with variant(name):
                    kernels[name] = sparsec.compile("rgcn_bias", inst, target="cuda", rel=rel, fin=fin, fout=fout)
            row = {"graph": gname, "rel": rel, "fin": fin, "fout": fout, "n": int(adj.shape[0]),
                   "entries": int(stacked.nnz)}
            for name, k in kernels.items():
                row[f"{name}_launches"] = k.source().count("__global__") // 2
                errs = [max_rel_err(k(inst, X, W, b, poison=True), ref) for _ in range(4)]
                row[f"{name}_max_rel_err"] = float(max(errs))
            rounds = {name: [] for name in kernels}
            for _ in range(args.rounds):
                for name, k in kernels.items():
                    rounds[name].append(time_ms(k, inst, X, W, b))
            for name in kernels:
                row[f"{name}_ms"] = min(rounds[name])
                row[f"{name}_rounds_ms"] = rounds[name]
            for name in kernels:
                row[f"{name}_over_separate"] = row[f"{name}_ms"] / row["separate_ms"]
            out.append(row)
            print(json.dumps(row), flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), "time_rgcn_fill.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": out}, f, indent=1)
    names = args.variants
    print(f"\n{'graph':9} {'shape':6} " + " ".join(f"{n + ' ms':>14}" for n in names) + f" {'launches':>9} {'max err':>8}")
    for r in out:
        err = max(r[f"{n}_max_rel_err"] for n in names)
        launches = "/".join(str(r[f"{n}_launches"]) for n in names)
        print(f"{r['graph']:9} {r['fin']}x{r['fout']:<3} " + " ".join(
            f"{r[n + '_ms']:7.3f} ({r[n + '_over_separate']:4.2f})" for n in names) + f" {launches:>9} {err:8.1e}")
    ok = all(max(r[f"{n}_max_rel_err"] for n in names) < 1e-4 for r in out)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
