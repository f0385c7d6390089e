"""Benchmark results as files: the JSON records, a markdown summary, a speedup plot.

A ratio is the peer's time over sparsec's (above 1: sparsec is faster). Cases are grouped
by (op, dtype, format family); each group's table lists every case, and its summary gives
per peer the geometric mean, minimum and maximum ratio over the cases that peer ran.
"""
from __future__ import annotations

import json
import math
from collections import OrderedDict
from typing import Dict, Iterable, List, Optional, Sequence

from ..jsonable import jsonable


def geomean(values: Iterable[float]) -> Optional[float]:
    """Geometric mean of the positive finite values; None when there are none."""
    vals = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def group_key(rec: dict) -> str:
    return f"{rec['op']} {rec['dtype']} {rec['format'].split(':')[0]}"


def groups(records: Sequence[dict]) -> "OrderedDict[str, List[dict]]":
    out: "OrderedDict[str, List[dict]]" = OrderedDict()
    for r in records:
        out.setdefault(group_key(r), []).append(r)
    return out


def peer_names(records: Sequence[dict]) -> List[str]:
    """Peers that ran (or tried to) in any of ``records``, in first-seen order."""
    seen: "OrderedDict[str, None]" = OrderedDict()
    for r in records:
        for name in r.get("peers", {}):
            seen[name] = None
    return list(seen)


def summarize(records: Sequence[dict]) -> Dict[str, dict]:
    """Per peer: how many cases it was timed on, the geometric mean, min and max ratio, and
    in how many of them sparsec was faster."""
    out = {}
    for name in peer_names(records):
        ratios = [r["ratios"][name] for r in records if name in r.get("ratios", {})]
        if not ratios:
            continue
        worst = min((r for r in records if name in r.get("ratios", {})), key=lambda r: r["ratios"][name])
        out[name] = {"cases": len(ratios), "geomean": geomean(ratios), "min": min(ratios), "max": max(ratios),
                     "faster": sum(1 for x in ratios if x > 1.0),
                     "min_case": f"{worst['matrix']} F={worst['feat']}"}
    return out


# ---- files -----------------------------------------------------------------------------------
def write_json(result: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(jsonable(result), f, indent=1)
        f.write("\n")


def table(columns: Sequence[tuple], rows: Sequence[dict]) -> str:
    """A markdown table of ``rows``: ``columns`` are (header, cell function of a row) pairs, a
    header ending in ``:`` right-aligned (numbers). The examples and GPU checks print theirs
    with it."""
    heads = [h.rstrip(":") for h, _ in columns]
    rules = ["---:" if h.endswith(":") else "---" for h, _ in columns]
    lines = ["| " + " | ".join(heads) + " |", "|" + "|".join(rules) + "|"]
    lines += ["| " + " | ".join(str(cell(r)) for _, cell in columns) + " |" for r in rows]
    return "\n".join(lines)


def finish(rows: Sequence[dict], columns: Sequence[tuple], device: str, out: Optional[str] = None,
           note: str = "") -> str:
    """An example's or check's ending: the rows (with the device's name) to ``out`` as JSON,
    then the device line and :func:`table` printed. Returns the device's name."""
    name = "cpu"
    if device == "cuda":
        import torch

        name = torch.cuda.get_device_name()
    if out:
        write_json({"device": name, "rows": list(rows)}, out)
    print(f"device: {name}{note}")
    print(table(columns, rows))
    return name


def _ms(v) -> str:
    return "—" if v is None else f"{v:.4f}" if v < 1 else f"{v:.3f}"


def _ratio(v) -> str:
    return "—" if v is None else f"{v:.2f}×"


def markdown(result: dict) -> str:
    """The summary: setup, then one section per group with its per-peer summary and a table
    of every case; failed cases are listed last with their errors."""
    records = result["records"]
    ceil = result.get("ceilings") or {}
    v = result.get("versions") or {}
    lines = [f"# sparsec benchmark on {result.get('device', '?')}", ""]
    lines.append("Versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val) + ".")
    if ceil.get("copy_GBps"):
        peaks = ", ".join(f"{d} {t:.3g}" for d, t in ceil.get("matmul_TFLOPs", {}).items())
        lines.append(f"Ceilings measured in the run: device copy {ceil['copy_GBps']:.0f} GB/s (read + write); "
                     f"dense matmul TFLOP/s: {peaks} (float32 with TF32 off).")
    lines += ["", "Ratio = peer time / sparsec time (above 1×: sparsec is faster). Times are in ms: the median over "
              "samples, each a CUDA graph of 10 calls replayed between two CUDA events and divided by 10, so the "
              "device time of every kernel a call launches counts and the host's launch costs do not; † marks a "
              "contestant that could not be captured in a graph and was timed as 10 back-to-back eager calls "
              "(perf_counter per call in CPU dry runs). Calls rotate over input copies that together hold 4× the L2, "
              "after warm-up. Roofline = max(bytes / bandwidth, flops / peak) / time, with compulsory bytes and "
              "flops.", ""]
    labels = result.get("peers") or {}
    for key, recs in groups(records).items():
        names = peer_names(recs)
        lines += [f"## {key}", ""]
        summary = summarize(recs)
        if summary:
            lines += ["| peer | cases | geomean | min (case) | max | sparsec faster |", "|---|---:|---:|---|---:|---:|"]
            for name, s in summary.items():
                lines.append(f"| {labels.get(name, name)} | {s['cases']} | {_ratio(s['geomean'])} | {_ratio(s['min'])} "
                             f"({s['min_case']}) | {_ratio(s['max'])} | {s['faster']}/{s['cases']} |")
            lines.append("")
        head = ["matrix", "rows", "nnz", "F", "sparsec ms"] + [f"{n} ms (ratio)" for n in names] + \
            ["GB/s", "TFLOP/s", "roofline"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * 4 + "---:|" * (len(head) - 4)]
        for r in recs:
            cells = [r["matrix"], f"{r['rows']:,}", f"{r['nnz']:,}", str(r["feat"]),
                     _ms(r.get("sparsec_ms")) + _eager_mark(r.get("sparsec_timing"))]
            for n in names:
                p = r.get("peers", {}).get(n)
                if p is None:
                    cells.append("n/a")
                elif p.get("ms") is None:
                    cells.append(p["status"])
                else:
                    cells.append(f"{_ms(p['ms'])}{_eager_mark(p.get('timing'))} ({_ratio(r['ratios'].get(n))})")
            if r.get("sparsec_ms") is None:
                cells += ["—", "—", "failed"]
            else:
                cells += [f"{r['GBps']:.0f}", f"{r['TFLOPs']:.2f}", f"{r['roofline_fraction']:.0%}"]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    failed = [r for r in records if r["status"] != "ok"]
    if failed:
        lines += [f"## Failed cases ({len(failed)})", ""]
        for r in failed:
            lines.append(f"- {r['op']} {r['format']} {r['dtype']} {r['matrix']} F={r['feat']}: {r['error']}")
        lines.append("")
    skipped = sorted({(n, p["reason"]) for r in records for n, p in r.get("peers", {}).items()
                      if p["status"] == "skipped"})
    if skipped:
        lines += ["Peers skipped (could not run):", ""]
        lines += [f"- {n}: {reason}" for n, reason in skipped[:20]]
        lines.append("")
    return "\n".join(lines)


def _eager_mark(timing) -> str:
    """† after a GPU time taken from eager calls (the contestant could not be graph-captured)."""
    return "†" if timing and timing.get("method") == "eager" else ""


def write_markdown(result: dict, path: str) -> None:
    with open(path, "w") as f:
        f.write(markdown(result))


def plot_speedups(result: dict, path: str) -> bool:
    """One panel per group: each case's speedup over its main peer (log scale, a line at 1×),
    coloured by feature width. Returns False (and draws nothing) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    grouped = [(k, [r for r in recs if r.get("speedup")]) for k, recs in groups(result["records"]).items()]
    grouped = [(k, recs) for k, recs in grouped if recs]
    if not grouped:
        return False
    fig, axes = plt.subplots(len(grouped), 1, figsize=(12, 3.6 * len(grouped)), squeeze=False)
    for ax, (key, recs) in zip(axes[:, 0], grouped):
        feats = sorted({r["feat"] for r in recs})
        cmap = plt.get_cmap("viridis", max(len(feats), 2))
        for i, f in enumerate(feats):
            xs = [j for j, r in enumerate(recs) if r["feat"] == f]
            ax.scatter(xs, [recs[j]["speedup"] for j in xs], color=cmap(i), s=18, label=f"F={f}")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log")
        ticks = [j for j, r in enumerate(recs) if j == 0 or r["matrix"] != recs[j - 1]["matrix"]]
        ax.set_xticks(ticks)
        ax.set_xticklabels([recs[j]["matrix"] for j in ticks], rotation=60, ha="right", fontsize=7)
        main = recs[0]["main_peer"]
        ax.set_title(f"{key}: speedup over {(result.get('peers') or {}).get(main, main)} "
                     f"(geomean {geomean(r['speedup'] for r in recs):.2f}×)", fontsize=9)
        ax.set_ylabel("peer time / sparsec time")
        ax.legend(fontsize=7, ncol=len(feats), loc="best")
    fig.suptitle(f"sparsec on {result.get('device', '?')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
