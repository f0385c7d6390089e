#!/usr/bin/env python3
"""The SASS instructions where a kernel's warps stall most, from an Nsight Compute report with
the SourceCounters section (GPU host, where ``ncu`` is):

    ncu -i prof.ncu-rep --page source --csv --print-source sass > src.csv
    python3 benchmarks/ncu_hotspots.py src.csv [--top 25]

Prints, for each kernel in the file, its total stall samples and the ``--top`` instructions
with their share and the columns of stall reasons that dominate them.
"""
from __future__ import annotations

import argparse
import csv
import io
import sys


def _tables(text: str):
    """The per-kernel CSV tables of ``ncu --page source --csv`` (each starts at a header row)."""
    blocks, cur = [], []
    for line in text.splitlines():
        if line.startswith('"Address"') or line.startswith('"#"') or line.startswith('"Source"'):
            if cur:
                blocks.append(cur)
            cur = [line]
        elif cur:
            cur.append(line)
        elif line.strip():
            blocks.append([line])  # a kernel heading before its table
    if cur:
        blocks.append(cur)
    return blocks


def _num(x: str) -> float:
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    text = open(args.csv).read()
    for block in _tables(text):
        if len(block) == 1:
            print(block[0][:160])
            continue
        rows = list(csv.DictReader(io.StringIO("\n".join(block))))
        if not rows:
            continue
        samp = next((k for k in rows[0] if k.startswith("Warp Stall Sampling (All")), None)
        if samp is None:
            continue
        reasons = [k for k in rows[0] if k.startswith("stall_") or k.endswith("(All Samples)") and k != samp]
        total = sum(_num(r[samp]) for r in rows) or 1.0
        print(f"--- {len(rows)} instructions, {total:.0f} stall samples")
        for r in sorted(rows, key=lambda r: -_num(r[samp]))[:args.top]:
            top = sorted(((k, _num(r[k])) for k in reasons), key=lambda kv: -kv[1])[:3]
            why = " ".join(f"{k.replace(' (All Samples)', '')}:{v:.0f}" for k, v in top if v)
            print(f"{100 * _num(r[samp]) / total:5.1f}% {r.get('Address', '')[-5:]:>5} {r.get('Source', '')[:70]:<70} {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
