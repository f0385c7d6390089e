#!/usr/bin/env python3
"""Nsight Compute's view of RGCN's layer kernel with its fill fused and with the fill as a
launch of its own (GPU host), to say where the fused kernel's extra time goes.

    ncu --profile-from-start off --section SpeedOfLight --section Occupancy \
        --section WarpStateStats --section LaunchStats python3 benchmarks/profile_rgcn_fill.py

Compiles ``rgcn_bias`` for one graph and layer shape both ways, warms both up, then profiles
two calls of each between cudaProfilerStart / Stop.
"""
from __future__ import annotations

import argparse
import sys

import _preamble  # noqa: F401,E402
sys.path.insert(0, str(_preamble.ROOT / "examples"))

import numpy as np  # noqa: E402

import gnn_peers as gp  # noqa: E402
from _helpers import profile_calls  # noqa: E402
from time_rgcn_fill import variant  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", default="rmat-s18")
    ap.add_argument("--relations", type=int, default=16)
    ap.add_argument("--shape", nargs=2, type=int, default=[64, 16], metavar=("FIN", "FOUT"))
    ap.add_argument("--variants", nargs="*", default=["fused", "separate"],
                    help="builds to profile, as benchmarks/time_rgcn_fill.py names them")
    args = ap.parse_args(argv)
    import torch

    import sparsec
    from sparsec.formats import convert
    from sparsec.torch_rgcn import _mean_stacked

    adj = gp.load_graph(args.graph)
    rel = args.relations + 1
    stacked = _mean_stacked(adj, gp.draw_relations(adj, args.relations), args.relations, True)
    inst = convert(stacked, "csr")
    fin, fout = args.shape
    rng = np.random.default_rng(0)
    X = torch.from_numpy(rng.standard_normal((adj.shape[1], fin)).astype(np.float32)).cuda()
    W = torch.from_numpy(rng.standard_normal((rel, fin, fout)).astype(np.float32)).cuda()
    b = torch.from_numpy(rng.standard_normal(fout).astype(np.float32)).cuda()
    calls = []
    for name in args.variants:
        with variant(name):
            k = sparsec.compile("rgcn_bias", inst, target="cuda", rel=rel, fin=fin, fout=fout)
        a, _, _ = k.prepare(inst, X, W, b)
        calls.append((name, k.executable[k.op_name], a))
    profile_calls(calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
