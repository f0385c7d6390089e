#!/usr/bin/env python3
"""The rgcn segment-contraction kernel on real relational graphs for several SPLITS x CHUNK
(GPU host): the data behind ``schedules.segment_contract``'s choice of splits per matrix.

    python3 benchmarks/time_rgcn_splits.py --graph mdual rmat-s18 --relations 16

Per graph: the stacked matrix's segment statistics (longest segment, heaviest and mean group
of 256 root positions), then the kernel's median time (CUDA events) per setting, for layer
shapes 64x64 and 64x16. Writes $OUT/time_rgcn_splits.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import _preamble  # noqa: F401,E402
sys.path.insert(0, str(_preamble.ROOT / "examples"))

import numpy as np  # noqa: E402

import gnn_peers as gp  # noqa: E402
from check_segment_split import partition, segment_stats, time_ms  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", nargs="*", default=["mdual", "rmat-s18"])
    ap.add_argument("--relations", type=int, default=16)
    ap.add_argument("--splits", type=int, nargs="*", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--chunk", type=int, nargs="*", default=[16, 32])
    args = ap.parse_args(argv)
    import sparsec
    from sparsec import ops
    from sparsec.formats import convert
    from sparsec.torch_rgcn import _mean_stacked

    rng = np.random.default_rng(0)
    out = []
    for gname in args.graph:
        adj = gp.load_graph(gname)
        stacked = _mean_stacked(adj, gp.draw_relations(adj, args.relations), args.relations, True)
        stats = segment_stats(stacked)
        inst = convert(stacked, "csr")
        rel = args.relations + 1
        print(f"# {gname}: {stats}", flush=True)
        for fin, fout in ((64, 64), (64, 16)):
            X = rng.standard_normal((adj.shape[1], fin)).astype(np.float32)
            W = rng.standard_normal((rel, fin, fout)).astype(np.float32)
            for chunk in args.chunk:
                for splits in args.splits:
                    with partition(splits, chunk):
                        k = sparsec.compile(ops.rgcn(), inst, target="cuda", rel=rel, fin=fin, fout=fout)
                        row = {"graph": gname, "fin": fin, "fout": fout, "splits": splits, "chunk": chunk,
                               "ms": time_ms(k, inst, X, W), **stats}
                    out.append(row)
                    print(json.dumps(row), flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), "time_rgcn_splits.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(f"\n{'graph':9} {'shape':6} {'chunk':>5} " + " ".join(f"{'S=' + str(s):>7}" for s in args.splits))
    for gname in args.graph:
        for fin, fout in ((64, 64), (64, 16)):
            for chunk in args.chunk:
                ms = [r["ms"] for r in out if (r["graph"], r["fin"], r["fout"], r["chunk"]) == (gname, fin, fout, chunk)]
                print(f"{gname:9} {fin}x{fout:<3} {chunk:>5} " + " ".join(f"{m:7.3f}" for m in ms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
