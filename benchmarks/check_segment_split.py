"""The segment contraction's split of long segments (``schedules.segment_split``) on the GPU:
``rgcn`` on graphs with hub rows against a float64 per-relation reference, on NaN-poisoned
outputs, and the kernel's time on the hub graph.

    python3 benchmarks/check_segment_split.py [--out DIR] [--splits 1 8 16] [--chunk 16]

Graphs: (i) "hub": 30000 nodes with a few random entries per row and one 20000-entry row
whose entries all carry relation 0 (a single 20000-entry segment) plus a second hub row of
8000 entries over all relations; (ii) "rmat": an R-MAT graph (a=0.57, b=c=0.19, scale 15,
16 edges per node), whose high-degree rows sit together in the first root positions of each
relation. R in {4, 16}, (fin, fout) in {(64, 64), (64, 16), (8, 40)}, formats csr and hyb.
Timing: the whole rgcn call (output fill and contraction), median of CUDA events over
50 launches, csr, for every SPLITS x CHUNK given (the first pair is the one checked; the
module constants are set for the compile and restored). Prints a table, writes
DIR/check_segment_split.json, exits 1 on any mismatch.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

import numpy as np
import scipy.sparse as sp

import _preamble  # noqa: F401
import sparsec  # noqa: E402
from check_axis_trees import TOL, rgcn_reference  # noqa: E402
from sparsec import ops  # noqa: E402
from sparsec.formats import convert, stack_rows  # noqa: E402
from sparsec.kernel import on_torch_stream  # noqa: E402
from sparsec.reference import max_rel_err  # noqa: E402
from sparsec.schedules import segment_contract  # noqa: E402

FORMATS = ("csr", "hyb")
SHAPES = ((64, 64), (64, 16), (8, 40), (8, 1), (16, 3))  # G < 4: one chunk of more than 256 segments
RELATIONS = (4, 16)


def hub_graph(n=30000, hub=20000, seed=0):
    """(matrix, the hub row): up to 7 random entries per row, row 777 with ``hub`` entries and
    row 12345 with 8000."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(0, 8, n)
    lens[777], lens[12345] = 0, 0
    rows = np.concatenate([np.repeat(np.arange(n), lens), np.full(hub, 777), np.full(8000, 12345)])
    cols = np.concatenate([rng.integers(0, n, lens.sum()), rng.choice(n, hub, replace=False),
                           rng.choice(n, 8000, replace=False)])
    a = sp.csr_matrix((np.ones(rows.size, np.float32), (rows, cols)), shape=(n, n))
    a.sum_duplicates()  # a repeated random column becomes one entry
    a.data = rng.standard_normal(a.nnz).astype(np.float32)
    return a, 777


def rmat_graph(scale=15, per_node=16, seed=1):
    rng = np.random.default_rng(seed)
    n, m = 1 << scale, per_node << scale
    r, c = np.zeros(m, np.int64), np.zeros(m, np.int64)
    for _ in range(scale):  # one quadrant per level: a, b, c, d = 0.57, 0.19, 0.19, 0.05
        u = rng.random(m)
        r = 2 * r + (u >= 0.76)
        c = 2 * c + ((u >= 0.57) & (u < 0.76) | (u >= 0.95))
    a = sp.csr_matrix((np.ones(m, np.float32), (r, c)), shape=(n, n))
    a.sum_duplicates()
    a.data = rng.standard_normal(a.nnz).astype(np.float32)
    return a


def relations(adj, rel, rng, hub_row=None):
    types = rng.integers(0, rel, adj.nnz)
    if hub_row is not None:
        types[adj.indptr[hub_row]:adj.indptr[hub_row + 1]] = 0  # one segment of all its entries
    return types


@contextlib.contextmanager
def partition(splits, chunk):
    """Kernels compiled inside take ``splits`` splits (whatever their matrix would choose,
    ``segment_contract.splits_for``) of ``chunk``-entry chunks."""
    saved = (segment_contract.SPLITS, segment_contract.DEFAULT_SPLITS, segment_contract.CHUNK,
             segment_contract.splits_for)
    segment_contract.SPLITS = segment_contract.DEFAULT_SPLITS = splits
    segment_contract.CHUNK = chunk
    segment_contract.splits_for = lambda lengths: splits
    try:
        yield
    finally:
        (segment_contract.SPLITS, segment_contract.DEFAULT_SPLITS, segment_contract.CHUNK,
         segment_contract.splits_for) = saved


def segment_stats(stacked) -> dict:
    counts = np.diff(stacked.indptr)
    groups = np.add.reduceat(counts, np.arange(0, counts.size, segment_contract.THREADS))
    return {"positions": int(counts.size), "longest": int(counts.max()), "heaviest_block": int(groups.max()),
            "mean_block": float(groups.mean())}


def time_ms(k, inst, *dense, reps=50) -> float:
    """Median of ``reps`` launches of ``k`` (CUDA events) on ``inst`` and the numpy ``dense``
    inputs, after 5 warm-up launches."""
    import torch

    args, _, _ = k.prepare(inst, *(torch.from_numpy(a).cuda() for a in dense))
    fn = k.executable[k.op_name]
    with on_torch_stream(True):
        for _ in range(5):
            fn(*args)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for start, end in events:
            start.record()
            fn(*args)
            end.record()
    torch.cuda.synchronize()
    return float(np.median([s.elapsed_time(e) for s, e in events]))


def _shape(r) -> str:
    return f"{r['rel']}x{r['fin']}x{r['fout']}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--target", default="cuda", help="llvm: a dry run of the checks on the CPU, no timing")
    ap.add_argument("--splits", type=int, nargs="*", default=[segment_contract.SPLITS])
    ap.add_argument("--chunk", type=int, nargs="*", default=[segment_contract.CHUNK])
    args = ap.parse_args(argv)
    rng = np.random.default_rng(5)
    hub, hub_row = hub_graph()
    graphs = (("hub", hub, hub_row), ("rmat", rmat_graph(), None))
    rows, timings = [], []
    with partition(args.splits[0], args.chunk[0]):
        for gname, adj, hrow in graphs:
            for rel in RELATIONS:
                stacked = stack_rows(adj, relations(adj, rel, rng, hrow), rel).astype(np.float32)
                stats = segment_stats(stacked)
                for fin, fout in SHAPES:
                    X = rng.standard_normal((adj.shape[1], fin)).astype(np.float32)
                    W = rng.standard_normal((rel, fin, fout)).astype(np.float32)
                    ref = rgcn_reference(stacked, rel, X, W)
                    for fmt in FORMATS:
                        row = {"graph": gname, "rel": rel, "fin": fin, "fout": fout, "fmt": fmt, **stats}
                        try:
                            inst = convert(stacked, fmt)
                            k = sparsec.compile(ops.rgcn(), inst, target=args.target, rel=rel, fin=fin, fout=fout)
                            row["segment_contract"] = "l__Zs" in k.source()
                            row["err"] = max_rel_err(k(inst, X, W, poison=True), ref)
                        except Exception as e:  # noqa: BLE001 - reported per case
                            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                        row["ok"] = row.get("err", np.inf) <= TOL
                        rows.append(row)
                        print(json.dumps(row), flush=True)
    for splits in args.splits if args.target == "cuda" else ():
        for chunk in args.chunk:
            with partition(splits, chunk):
                for gname, adj, hrow in graphs:
                    for rel in RELATIONS:
                        stacked = stack_rows(adj, relations(adj, rel, np.random.default_rng(9), hrow), rel)
                        inst = convert(stacked.astype(np.float32), "csr")
                        for fin, fout in SHAPES[:2]:
                            X = rng.standard_normal((adj.shape[1], fin)).astype(np.float32)
                            W = rng.standard_normal((rel, fin, fout)).astype(np.float32)
                            k = sparsec.compile(ops.rgcn(), inst, target="cuda", rel=rel, fin=fin, fout=fout)
                            t = {"graph": gname, "rel": rel, "fin": fin, "fout": fout, "splits": splits,
                                 "chunk": chunk, "ms": time_ms(k, inst, X, W)}
                            timings.append(t)
                            print(json.dumps(t), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "check_segment_split.json"), "w") as f:
        json.dump({"rows": rows, "timings": timings}, f, indent=1)
    print(f"\n{'graph':6} {'shape':10} {'fmt':5} {'longest':>8} {'heaviest':>9} {'result'}")
    for r in rows:
        res = f"{r['err']:.1e}" if "err" in r else r["error"][:60]
        print(f"{r['graph']:6} {_shape(r):10} {r['fmt']:5} {r['longest']:>8} "
              f"{r['heaviest_block']:>9} {res} {'ok' if r['ok'] else 'WRONG'}")
    print(f"\n{'graph':6} {'shape':10} {'splits':>6} {'chunk':>5} {'ms':>8}")
    for t in timings:
        print(f"{t['graph']:6} {_shape(t):10} {t['splits']:>6} {t['chunk']:>5} {t['ms']:>8.3f}")
    bad = sum(not r["ok"] for r in rows)
    print(f"{len(rows) - bad}/{len(rows)} ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
