"""BSR fp16 SpMM at few feature columns (16, 64) against dense cuBLAS fp16, on the blocks
suite (MiniLM layers when cached, random 4096 x 4096 and 1024 x 4096; blocks 16/32/64 at
70/90/95 %) and the BERT-base-sized 768 x 3072 weight: the kernel ``sparsec.compile``
picks (``bsr_ring``, ``bsr_stream`` or the block-row template) with its default knobs, and
with ``--sweep`` a knob sweep over every case (``bsr_ring``'s warps, stages, blocks a stage,
clusters and column splits; the streaming kernel's warps, cluster sizes, columns a CTA and
pipeline depths at other widths). Every result is checked against
float64 on a NaN-poisoned output first. Timed with sparsec.bench's timer (CUDA-graph
replays), sparsec and ``torch.matmul`` side by side.

    python3 benchmarks/time_bsr_small_feat.py [--sweep] [--blockrow] [--ring] [--knob-sets JSON]
                                              [--cases ...] [--feats 16 64] [--out FILE]
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

import numpy as np

import _preamble  # noqa: F401,E402  (the one preamble: checkout root and benchmarks/data on sys.path)

from _helpers import make_timed  # noqa: E402


def sweep_knobs(bs: int, feat: int, cols: int = 4096):
    """The sweep's knob sets for blocks of ``bs`` and ``feat`` columns of B on a matrix of
    ``cols`` columns. On short rows (``bsr_gather``'s region): its warps, blocks a warp,
    column splits and the row length they start at. Where ``bsr_ring``
    takes them (a multiple of 8 columns up to 64): its consumer warps, stages x blocks a
    stage, cluster sizes and column splits (the grid ``probe_bsr_bulk.py`` timed). Other
    widths up to ``bsr_stream.MAX_FEAT`` columns (the streaming kernel): warps and cluster sizes around
    the default, and two pipeline depths. Wider (the block-row template): narrow N tiles
    (more thread blocks), two pipeline depths and every ``k_split`` (warp groups that share
    a block row's blocks), those the template accepts."""
    from sparsec.schedules import bsr_dispatch, bsr_gather, bsr_ring, bsr_stream
    from sparsec.schedules import tensorcore as tc

    if cols < bsr_dispatch.BSR_STREAM_MIN_COLS and bsr_gather.takes((bs, bs), feat):  # bsr_gather's region
        out = []
        for warps, per_warp, split, heavy in itertools.product((4, 8), (2, 4), (1, 2, 4), (4, 8, 16)):
            knobs = {"warps": warps, "per_warp": per_warp, "split": split, "heavy": heavy}
            try:
                bsr_gather.plan((bs, bs), feat, **knobs)
            except ValueError:
                continue
            if split > 1 or heavy == 4:  # heavy only matters where rows are split
                out.append(knobs)
        return out
    if bsr_ring.takes((bs, bs), feat):  # the producer/consumer kernel: the probe's grid
        mt = bs // 16
        out = []
        for warps, (per_stage, stages), cluster, col_split in itertools.product(
                (mt, 2 * mt, 4 * mt), ((1, 4), (1, 8), (2, 4), (4, 4)), (1, 2, 4), (1, 2)):
            knobs = {"warps": warps, "stages": stages, "cluster": cluster, "per_stage": per_stage,
                     "col_split": col_split}
            try:
                bsr_ring.plan((bs, bs), feat, **knobs)
            except ValueError:
                continue
            out.append(knobs)
        return out
    if feat <= bsr_stream.MAX_FEAT:
        nb = next(n for n in (8, 16, 32, 64) if n >= feat)
        nbs = (nb, nb // 2) if nb >= 32 else (nb,)  # half the columns a CTA: twice the CTAs
        out = [{"nb": n, "warps": w, "cluster": c} for n in nbs for w in (16, 8, 4, 2) for c in (8, 4, 2, 1)]
        return out + [{"stages": 2}, {"stages": 6}, {"warps": 4, "stages": 6}]

    n_tiles = (16, 8) if feat <= 16 else (64, 32, 16)
    out = []
    for n_tile, warp_m, stages, k_split in itertools.product(n_tiles, (16, 32), (2, 4), (1, 2, 4, 8)):
        knobs = {"n_tile": n_tile, "warp_m": min(warp_m, bs), "warp_n": min(16, n_tile), "stages": stages,
                 "k_split": k_split}
        try:
            tc.check_knobs(bs, feat, **knobs)
        except ValueError:
            continue
        if knobs not in out:
            out.append(knobs)
    return out


def suite_cases(quick: bool, only=None):
    """[(name, pruned float16 dense, block)] of the blocks suite plus the BERT FFN-out shape
    (with ``only``, the cases whose name contains one of its strings)."""
    from sparsec.bench.suites import blocks

    out = [(name, w.astype(np.float16), b) for name, w, b, s in blocks()]
    rng = np.random.default_rng(7)
    bert = (0.02 * rng.standard_normal((768, 3072))).astype(np.float32)
    from sparsec.bench.suites import prune_blocks

    for b in (16, 32, 64):
        for s in (0.7, 0.9, 0.95):
            out.append((f"bert-ffn-out-b{b}-s{int(s * 100)}", prune_blocks(bert, b, s).astype(np.float16), b))
    if quick:
        out = [c for c in out if "s90" in c[0]]
    if only:
        out = [c for c in out if any(o in c[0] for o in only)]
    return out


def side_knobs(peer: str, b: int, feat: int, dense):
    """The knobs that make ``sparsec.compile`` build ``peer`` ("blockrow": the block-row
    template; "ring": ``bsr_ring``, through ``teams``, a knob only it has, at its default, so
    compile fills the rest as it would for the case) with its defaults, or None where it
    does not take the case."""
    from sparsec.schedules import bsr_ring
    from sparsec.schedules import tensorcore as tc

    if peer == "blockrow":
        return tc.default_knobs(b, feat, dense.shape)
    return {"teams": 1} if bsr_ring.takes((b, b), feat) else None


def same_kernel(peer: str, default_knobs: dict, knobs: dict) -> bool:
    """Whether the case's default kernel already is ``peer`` with its defaults."""
    return default_knobs == knobs if peer == "blockrow" else "teams" in default_knobs


def ratio_summary(ratios, prefix: str = "") -> dict:
    """min, geomean, cases slower than dense and count of ratios to dense (keys prefixed)."""
    return {f"{prefix}min": min(ratios), f"{prefix}geomean": float(np.exp(np.mean(np.log(ratios)))),
            f"{prefix}slower": sum(r < 1 for r in ratios), f"{prefix}cases": len(ratios)}


def check_and_time(kernel, A, dense, feat, timed, torch, check=True):
    rng = np.random.default_rng(feat)
    B = torch.from_numpy(rng.standard_normal((dense.shape[1], feat)).astype(np.float16)).cuda()
    out = kernel(A, B, poison=True)
    ok, err = True, None
    if check:
        ref = dense.astype(np.float64) @ B.cpu().numpy().astype(np.float64)
        got = out.float().cpu().numpy()
        err = float(np.abs(got - ref).max() / (np.abs(ref).max() + 1e-30))
        ok = bool(np.isfinite(got).all()) and err < 2e-3
    args, _, _ = kernel.prepare(A, B, out=out)
    f = kernel.executable[kernel.op_name]
    ms = timed(lambda _: f(*args), [None])
    return ok, err, ms, B


def keep_partial(rows, sweep):
    """What the run has measured so far, in ``$OUT/bsr_small_feat_partial.json`` (when
    ``$OUT`` is set): a run cut short by the device's time limit still leaves its rows."""
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "bsr_small_feat_partial.json").write_text(json.dumps({"rows": rows, "sweep": sweep}))


def main():
    import torch

    import sparsec
    from sparsec import formats

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--feats", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--sweep", action="store_true",
                    help="a knob sweep over every case, per block size and width")
    ap.add_argument("--quick", action="store_true", help="90 %% sparsity only")
    ap.add_argument("--knobs", type=json.loads, default=None, help="knobs for every case (JSON), else defaults")
    ap.add_argument("--cases", nargs="+", help="only the cases whose name contains one of these")
    ap.add_argument("--blockrow", action="store_true",
                    help="also time the block-row template (schedules.tensorcore) with its default knobs, side by side")
    ap.add_argument("--ring", action="store_true",
                    help="also time bsr_ring with its default knobs where it takes the case, side by side")
    ap.add_argument("--knob-sets", type=json.loads, default=None,
                    help="a JSON list of knob sets, each compiled and timed beside the default and dense per case")
    ap.add_argument("--out")
    args = ap.parse_args()
    timed = make_timed("cuda")
    kernels = {}
    rows = []
    for name, dense, b in suite_cases(args.quick, args.cases):
        A = formats.convert(dense, f"bsr:{b}x{b}")
        At = torch.from_numpy(dense).cuda()
        for feat in args.feats:
            key = (name, feat)  # the default knobs follow the matrix's shape and density
            if key not in kernels:
                try:
                    kernels[key] = sparsec.compile("spmm", A, target="cuda", feat=feat, knobs=args.knobs)
                except ValueError as e:  # --knobs the template refuses for this block size: skipped, said why
                    print(f"skip {name} feat={feat}: {str(e)[:120]}", flush=True)
                    kernels[key] = None
            k = kernels[key]
            if k is None:
                continue
            try:
                ok, err, ms, B = check_and_time(k, A, dense, feat, timed, torch)
            except Exception as e:  # noqa: BLE001  (a launch failure is a result: recorded, not fatal)
                rows.append({"case": name, "block": b, "feat": feat, "knobs": k.knobs, "ok": False,
                             "error": f"{type(e).__name__}: {str(e)[:200]}"})
                print(f"ERR {name} feat={feat} {k.knobs} {type(e).__name__}", flush=True)
                continue
            dense_ms = timed(lambda _: torch.matmul(At, B), [None])
            rows.append({"case": name, "shape": list(dense.shape), "block": b, "feat": feat, "knobs": k.knobs,
                         "ok": ok, "err": err, "sparsec_ms": ms, "dense_ms": dense_ms, "speedup": dense_ms / ms})
            for peer in [p for p in ("blockrow", "ring") if getattr(args, p)]:
                knobs = side_knobs(peer, b, feat, dense)
                if knobs is None:
                    continue
                if same_kernel(peer, k.knobs, knobs):
                    okb, msb, knobs = ok, ms, k.knobs
                else:
                    kb = sparsec.compile("spmm", A, target="cuda", feat=feat, knobs=knobs)
                    okb, _, msb, _ = check_and_time(kb, A, dense, feat, timed, torch)
                    knobs = kb.knobs
                rows[-1].update({f"{peer}_ms": msb, f"{peer}_ok": okb, f"{peer}_knobs": knobs,
                                 f"{peer}_speedup": dense_ms / msb})
                rows[-1]["ok"] = rows[-1]["ok"] and okb
                print(f"    {peer} {msb:.4f} ms x{dense_ms / msb:.2f}", flush=True)
            for i, given in enumerate(args.knob_sets or []):  # each set beside the default and dense
                try:
                    ks = sparsec.compile("spmm", A, target="cuda", feat=feat, knobs=given)
                except ValueError as e:  # a set the case's kernel refuses: said why, not timed
                    print(f"    set {i} refused: {str(e)[:100]}", flush=True)
                    continue
                oks, _, mss, _ = check_and_time(ks, A, dense, feat, timed, torch)
                rows[-1].setdefault("sets", []).append({"set": i, "knobs": ks.knobs, "ok": oks, "ms": mss,
                                                        "speedup": dense_ms / mss})
                rows[-1]["ok"] = rows[-1]["ok"] and oks
                print(f"    set {i} {mss:.4f} ms x{dense_ms / mss:.2f}", flush=True)
            print(f"{'ok ' if ok else 'BAD'} {name:<34} feat={feat:<3} {ms:.4f} ms dense {dense_ms:.4f} ms "
                  f"x{dense_ms / ms:.2f} {k.knobs}", flush=True)
            keep_partial(rows, [])
    sweep = []
    if args.sweep:  # each knob set completed for each case's shape, compiled once, checked on its first case
        from sparsec.schedules import bsr_dispatch, bsr_ring, bsr_stream

        built = {}
        for (name, dense, b), feat in itertools.product(suite_cases(args.quick, args.cases), args.feats):
            A = formats.convert(dense, f"bsr:{b}x{b}")
            for knobs in sweep_knobs(b, feat, dense.shape[1]):
                if set(knobs) & bsr_dispatch.GATHER_ONLY:
                    pass  # bsr_gather's sets name all its knobs
                elif bsr_ring.takes((b, b), feat):  # complete as sparsec.compile would (all swept: none left)
                    knobs = bsr_ring.default_knobs((b, b), feat, *dense.shape, A.nnz / dense.size, fixed=knobs)
                elif feat <= bsr_stream.MAX_FEAT:  # the knobs not swept follow the case, as sparsec.compile's do
                    knobs = bsr_stream.default_knobs((b, b), feat, *dense.shape, A.nnz / dense.size, fixed=knobs)
                key = (b, feat, json.dumps(knobs, sort_keys=True))
                first = key not in built
                if first:
                    try:
                        built[key] = sparsec.compile("spmm", A, target="cuda", feat=feat, knobs=knobs)
                    except ValueError as e:
                        print("skip", b, feat, knobs, str(e)[:80])
                        built[key] = None
                if built[key] is None:
                    continue
                ok, err, ms, _ = check_and_time(built[key], A, dense, feat, timed, torch, check=first)
                sweep.append({"case": name, "block": b, "feat": feat, "knobs": knobs, "ok": ok, "ms": ms})
                if not ok:
                    print(f"BAD sweep {name} feat={feat} {knobs}", flush=True)
            print(f"sweep {name} feat={feat} done", flush=True)
            keep_partial(rows, sweep)
        best = {}
        for r in sweep:
            key = (r["case"], r["feat"])
            if r["ok"] and (key not in best or r["ms"] < best[key]["ms"]):
                best[key] = r
        for r in rows:
            if (r["case"], r["feat"]) in best and "dense_ms" in r:
                r["swept_best_ms"] = best[(r["case"], r["feat"])]["ms"]
                r["swept_best_knobs"] = best[(r["case"], r["feat"])]["knobs"]
                r["swept_speedup"] = r["dense_ms"] / r["swept_best_ms"]
    summary = {}
    for feat in args.feats:
        sp = [r["speedup"] for r in rows if r["feat"] == feat and "speedup" in r]
        if sp:
            summary[feat] = ratio_summary(sp)
            summary[feat]["slower_than_dense"] = summary[feat].pop("slower")
        for peer in ("blockrow", "ring"):
            ps = [r[f"{peer}_speedup"] for r in rows if r["feat"] == feat and f"{peer}_speedup" in r]
            if ps:
                summary[feat].update(ratio_summary(ps, f"{peer}_"))
        for i in range(len(args.knob_sets or [])):
            ps = [x["speedup"] for r in rows if r["feat"] == feat for x in r.get("sets", []) if x["set"] == i]
            if ps:
                summary[feat].update(ratio_summary(ps, f"set{i}_"))
        best = [max([r["speedup"], r.get("blockrow_speedup", 0), r.get("ring_speedup", 0)]
                    + [x["speedup"] for x in r.get("sets", [])])
                for r in rows if r["feat"] == feat and "speedup" in r]
        if best and any("ring_speedup" in r or "blockrow_speedup" in r or r.get("sets") for r in rows):
            summary[feat].update(best_of_min=min(best), best_of_slower=sum(s < 1 for s in best))
        swept = [max(r["swept_speedup"], r["speedup"]) for r in rows if r["feat"] == feat and "swept_speedup" in r]
        if swept:
            summary[feat].update(swept_min=min(swept), swept_geomean=float(np.exp(np.mean(np.log(swept)))),
                                 swept_slower=sum(s < 1 for s in swept))
    result = {"device": torch.cuda.get_device_name(), "rows": rows, "sweep": sweep, "summary": summary,
              "all_ok": all(r["ok"] for r in rows) and all(r["ok"] for r in sweep)}
    for path in filter(None, (args.out, os.environ.get("OUT") and os.path.join(os.environ["OUT"],
                                                                                "bsr_small_feat.json"))):
        Path(path).write_text(json.dumps(result, indent=1))
    print(f"{'feat':>5} {'cases':>6} {'min x':>7} {'geomean x':>10} {'slower':>7}   with the sweep's best knobs")
    for feat, s in summary.items():
        for peer in ("blockrow", "ring"):
            if f"{peer}_min" in s:
                print(f"{feat:>5} {peer} alone: min x{s[peer + '_min']:.2f} geomean x{s[peer + '_geomean']:.2f} "
                      f"slower {s[peer + '_slower']} of {s[peer + '_cases']}")
        for i in range(len(args.knob_sets or [])):
            if f"set{i}_min" in s:
                print(f"{feat:>5} set {i} {args.knob_sets[i]}: min x{s[f'set{i}_min']:.2f} "
                      f"geomean x{s[f'set{i}_geomean']:.2f} slower {s[f'set{i}_slower']} of {s[f'set{i}_cases']}")
        if "best_of_min" in s:
            print(f"{feat:>5} best of the kernels per case: min x{s['best_of_min']:.2f} slower {s['best_of_slower']}")
        print(f"{feat:>5} {s['cases']:>6} {s['min']:>7.2f} {s['geomean']:>10.2f} {s['slower_than_dense']:>7}   "
              f"{s.get('swept_min', float('nan')):.2f} / {s.get('swept_geomean', float('nan')):.2f} / "
              f"{s.get('swept_slower', '-')}")
    return 0 if result["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
