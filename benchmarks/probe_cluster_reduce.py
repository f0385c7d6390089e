#!/usr/bin/env python3
"""Does TVM 0.27 launch a thread-block cluster and reduce across it through distributed
shared memory? (GPU host, needs the TVM compiler: stage1.) The groundwork of a split-K
across the CTAs of a cluster for BSR SpMM with few feature columns (issues 23/24): each CTA
of a cluster would walk part of a block row and the first would sum the others' partial
tiles from their shared memory -- one launch, no atomics, no workspace to zero.

    python3 benchmarks/probe_cluster_reduce.py [--clusters 264] [--size 4]

The kernel: CTA ``rank`` of cluster ``g`` writes ``(rank + 1) * (g + 1)`` to its 128
shared floats; after ``barrier.cluster`` rank 0 reads every rank's array through ``mapa``
and stores the sum, ``size (size + 1) / 2 * (g + 1)``; a second barrier keeps the others'
shared memory alive until it has. ``--source`` prints the CUDA (works without a GPU).
Prints what it found and writes ``$OUT/cluster_probe.json``.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

import _preamble  # noqa: F401,E402

WIDTH = 128


def probe_kernel(clusters: int, size: int):
    from tvm.ir import PointerType, PrimType
    from tvm.script import tirx as T
    from tvm.tirx import Var

    @T.prim_func
    def probe(out_h: T.handle, rank_h: T.handle):
        T.func_attr({"global_symbol": "probe", "tirx.noalias": True})
        OUT = T.match_buffer(out_h, (clusters * WIDTH,), "float32")
        RANK = T.match_buffer(rank_h, (clusters * size,), "int32")
        bx = T.launch_thread("blockIdx.x", clusters * size)
        cx = T.launch_thread("clusterCtaIdx.x", size)
        tx = T.launch_thread("threadIdx.x", WIDTH)
        part = T.alloc_buffer((WIDTH,), "float32", scope="shared")
        g = bx // size
        part[tx] = T.Cast("float32", (cx + 1) * (g + 1))
        if tx == 0:
            RANK[bx] = cx
        T.ptx.barrier.cluster.arrive()
        T.ptx.barrier.cluster.wait()
        if cx == 0:
            acc = T.alloc_local([1], "float32")
            acc[0] = part[tx]
            mapped = T.alloc_local([1], "uint64")
            for r in range(1, size):
                T.evaluate(T.ptx.mapa.u64(mapped[0], part.access_ptr("r"), T.uint32(r)))
                remote_ptr = Var("remote_part", PointerType(PrimType("float32"), "shared"))
                T.Bind(T.reinterpret(PointerType(PrimType("float32"), "shared"), mapped[0]), var=remote_ptr)
                remote = T.decl_buffer((WIDTH,), "float32", data=remote_ptr, scope="shared")
                acc[0] = acc[0] + remote[tx]
            OUT[g * WIDTH + tx] = acc[0]
        T.ptx.barrier.cluster.arrive()
        T.ptx.barrier.cluster.wait()

    return probe


def build(clusters: int, size: int):
    import tvm

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    return tvm.compile(tvm.IRModule({"probe": probe_kernel(clusters, size)}), target=target)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clusters", type=int, default=264)
    ap.add_argument("--size", type=int, default=4)
    ap.add_argument("--source", action="store_true", help="print the CUDA source and stop")
    args = ap.parse_args()
    ex = build(args.clusters, args.size)
    src = ex.mod.imports[0].inspect_source()
    if args.source:
        print(src)
        return
    import torch
    import tvm

    out = torch.full((args.clusters * WIDTH,), float("nan"), device="cuda")
    rank = torch.full((args.clusters * args.size,), -1, dtype=torch.int32, device="cuda")
    ex["probe"](tvm.runtime.from_dlpack(out), tvm.runtime.from_dlpack(rank))
    torch.cuda.synchronize()
    g = np.arange(args.clusters, dtype=np.float64)
    want = np.repeat(args.size * (args.size + 1) / 2 * (g + 1), WIDTH)
    got = out.cpu().numpy().astype(np.float64)
    ranks = rank.cpu().numpy()
    result = {"device": torch.cuda.get_device_name(), "clusters": args.clusters, "size": args.size,
              "sum_correct": bool(np.array_equal(got, want)), "ranks_are_block_mod_size":
              bool(np.array_equal(ranks, np.arange(args.clusters * args.size) % args.size)),
              "first_sums": got[::WIDTH][:6].tolist(), "first_ranks": ranks[:8].tolist(),
              "cluster_in_source": "cluster" in src}
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "cluster_probe.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
