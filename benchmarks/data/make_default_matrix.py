#!/usr/bin/env python3
"""Regenerate ``sparsec/data/power_grid.npz``, the matrix embedded in the package.

    python benchmarks/data/make_default_matrix.py [--debs DIR] [--check]

It is the US western power-grid network (Watts & Strogatz 1998) from graph-tool's
collection, ``power.gt.gz`` in the Debian package ``python3-graph-tool``: 4,941
vertices and 6,594 undirected edges, stored as the symmetric 4,941 x 4,941 adjacency
matrix (13,188 non-zeros, float32 values 1.0, canonical CSR) written with
``scipy.sparse.save_npz`` (compressed), with fixed zip timestamps so the bytes are
reproducible. ``--check`` compares with the existing file instead of writing it.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
from pathlib import Path

from _preamble import ROOT
from fetch import GRAPH_TOOL_PKG, download_deb, extract_members, save_npz_reproducible
from sources import read_gt

TARGET = ROOT / "sparsec" / "data" / "power_grid.npz"
MEMBER = "usr/lib/python3/dist-packages/graph_tool/collection/power.gt.gz"
N_VERTICES, N_EDGES = 4941, 6594


def build(deb_dir: Path | None, out: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="sparsec-power-") as tmp:
        tmp = Path(tmp)
        deb = download_deb(GRAPH_TOOL_PKG, tmp / "debs", deb_dir)
        if deb is None:
            raise SystemExit(f"cannot fetch {GRAPH_TOOL_PKG}")
        files = extract_members(deb, MEMBER, tmp / "x")
        if not files:
            raise SystemExit(f"{MEMBER} not found in {deb.name}")
        a = read_gt(files[0])
    assert a.shape == (N_VERTICES, N_VERTICES), a.shape
    assert a.nnz == 2 * N_EDGES, a.nnz
    assert (a != a.T).nnz == 0 and a.diagonal().sum() == 0
    save_npz_reproducible(out, a)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--debs", type=Path, default=None, help="use .deb files already in this folder")
    ap.add_argument("--check", action="store_true", help="compare with the existing file, write nothing")
    args = ap.parse_args(argv)
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            fresh = Path(tmp) / TARGET.name
            build(args.debs, fresh)
            same = TARGET.exists() and fresh.read_bytes() == TARGET.read_bytes()
        print(f"{TARGET}: {'identical' if same else 'DIFFERS'}")
        return 0 if same else 1
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    build(args.debs, TARGET)
    data = TARGET.read_bytes()
    print(f"wrote {TARGET} ({len(data):,} bytes, sha256 {hashlib.sha256(data).hexdigest()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
