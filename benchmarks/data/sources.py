"""Readers for the real sparse matrices that ship inside Debian packages.

Only numpy and scipy are needed (no graph-tool, no METIS):

* :func:`read_gt` reads graph-tool's binary ``.gt`` / ``.gt.gz`` format (the networks
  of ``graph_tool.collection`` in the Debian package ``python3-graph-tool``).
* :func:`read_metis` reads a METIS ``.graph`` file (``mdual.graph`` and friends in the
  Debian package ``libmetis-doc``).

Both return the adjacency matrix as a canonical ``scipy.sparse.csr_matrix``: float32
values 1.0, int32 indices, no duplicate entries, column indices sorted in each row.

The gt layout (graph-tool manual, "The gt file format", and
``src/graph/graph_io_binary.hh``)::

    magic      6 bytes   "\\xe2\\x9b\\xbe gt"  (U+26FE, a space, "gt", UTF-8)
    version    uint8     1
    endianness uint8     0 = little-endian, 1 = big-endian (applies to every integer below)
    comment    uint64 length + bytes
    directed   uint8
    N          uint64    vertex count
    N times:   uint64 out-degree k, then k neighbour ids of d bytes, where d is 1 if
               N <= 2**8 - 1, 2 if N <= 2**16 - 1, 4 if N <= 2**32 - 1, else 8
    property maps (ignored here)

An undirected graph stores every edge once, in the list of one of its end points.
"""

from __future__ import annotations

import gzip
import re
import struct
from pathlib import Path

import numpy as np
import scipy.sparse as sp

__all__ = ["GT_MAGIC", "gt_id_width", "read_gt", "read_gt_edges", "read_metis", "to_adjacency"]

GT_MAGIC = "\u26fe gt".encode("utf-8")  # b"\xe2\x9b\xbe gt", 6 bytes


def gt_id_width(n: int) -> int:
    """Bytes per vertex id in a gt adjacency list for a graph of ``n`` vertices."""
    if n <= 0xFF:
        return 1
    if n <= 0xFFFF:
        return 2
    if n <= 0xFFFFFFFF:
        return 4
    return 8


def _read_bytes(path) -> bytes:
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":  # gzip, whatever the file name says
        raw = gzip.decompress(raw)
    return raw


def _gather(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenate ``buf[s:s+l]`` for every (s, l) without a Python loop."""
    total = int(lengths.sum())
    if total == 0:
        return np.empty(0, dtype=buf.dtype)
    # Offset of each run in the output, then shift every output position to its source.
    out_start = np.cumsum(lengths) - lengths
    shift = np.repeat(starts - out_start, lengths)
    return buf[shift + np.arange(total, dtype=np.int64)]


def read_gt_edges(path):
    """Parse a gt file into ``(n, directed, src, dst)``; ``src``/``dst`` are int64 arrays
    in file order (one entry per stored edge, parallel edges and self-loops kept)."""
    raw = _read_bytes(path)
    if raw[:6] != GT_MAGIC:
        raise ValueError(f"{path}: not a graph-tool binary file (magic {raw[:6]!r})")
    version, big_endian = raw[6], raw[7]
    if version != 1:
        raise ValueError(f"{path}: unsupported gt version {version}")
    e = ">" if big_endian else "<"
    u64 = struct.Struct(e + "Q")
    try:
        (comment_len,) = u64.unpack_from(raw, 8)
        pos = 16 + comment_len
        directed = bool(raw[pos])
        (n,) = u64.unpack_from(raw, pos + 1)
    except (struct.error, IndexError):
        raise ValueError(f"{path}: truncated gt header") from None
    pos += 9
    if n * 8 > len(raw) - pos:  # every vertex needs at least its 8-byte degree
        raise ValueError(f"{path}: truncated adjacency ({n} vertices in {len(raw)} bytes)")
    width = gt_id_width(n)

    # The out-degrees are interleaved with the neighbour lists, so finding where each list
    # starts is inherently sequential: walk the degrees only (one unpack per vertex, tens
    # of thousands of vertices take milliseconds), then gather all neighbour ids at once.
    deg = np.empty(n, dtype=np.int64)
    starts = np.empty(n, dtype=np.int64)
    unpack = u64.unpack_from
    try:
        for v in range(n):
            (k,) = unpack(raw, pos)
            deg[v] = k
            pos += 8
            starts[v] = pos
            pos += k * width
    except struct.error:
        pos = len(raw) + 1
    if pos > len(raw):
        raise ValueError(f"{path}: truncated adjacency ({pos} > {len(raw)} bytes)")

    buf = np.frombuffer(raw, dtype=np.uint8, count=pos)
    nbr_bytes = _gather(buf, starts, deg * width)
    dst = nbr_bytes.view(np.dtype(f"{e}u{width}")).astype(np.int64)
    src = np.repeat(np.arange(n, dtype=np.int64), deg)
    if dst.size and int(dst.max()) >= n:
        raise ValueError(f"{path}: vertex id out of range")
    return n, directed, src, dst


def to_adjacency(n: int, src, dst, symmetric: bool) -> sp.csr_matrix:
    """Canonical n x n CSR with a 1.0 (float32) at every (src, dst); mirrored if
    ``symmetric``. Duplicates collapse to one entry; self-loops are kept."""
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    if symmetric:
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    idx_dtype = np.int32 if n < 2**31 else np.int64
    # Sort by (row, col), drop repeats, then build CSR directly.
    key = np.sort(src * n + dst)
    if key.size:
        key = key[np.concatenate(([True], key[1:] != key[:-1]))]
    rows, cols = np.divmod(key, max(n, 1))
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
    a = sp.csr_matrix(
        (np.ones(key.size, dtype=np.float32), cols.astype(idx_dtype), indptr.astype(idx_dtype)),
        shape=(n, n),
    )
    a.has_sorted_indices = True
    a.has_canonical_format = True
    return a


def read_gt(path, symmetrize: bool | None = None) -> sp.csr_matrix:
    """Adjacency matrix of a graph-tool ``.gt`` / ``.gt.gz`` file.

    Row ``v`` holds the out-neighbours of ``v``. ``symmetrize=None`` (default) mirrors
    the edges exactly when the file says the graph is undirected.
    """
    n, directed, src, dst = read_gt_edges(path)
    if symmetrize is None:
        symmetrize = not directed
    return to_adjacency(n, src, dst, symmetric=symmetrize)


_COMMENT_LINE = re.compile(r"^%.*(?:\n|$)", re.MULTILINE)


def read_metis(path, symmetrize: bool = True) -> sp.csr_matrix:
    """Adjacency matrix of a METIS ``.graph`` file.

    Header ``n m [fmt [ncon]]``; then one line per vertex (an empty line is a vertex
    without neighbours) with, per ``fmt`` = ``abc``: a vertex size if ``a``, ``ncon``
    vertex weights if ``b``, then 1-based neighbour ids each followed by an edge weight
    if ``c``. ``%`` lines are comments. Weights are ignored (values are 1.0). METIS
    lists every edge from both ends already; ``symmetrize`` only guards against files
    that do not.
    """
    text = _read_bytes(path).decode("ascii")
    text = _COMMENT_LINE.sub("", text.replace("\r\n", "\n"))
    header, _, body = text.partition("\n")
    head = header.split()
    if len(head) < 2:
        raise ValueError(f"{path}: bad METIS header {header!r}")
    n = int(head[0])
    fmt = f"{int(head[2]):03d}" if len(head) > 2 else "000"
    has_size, has_vwgt, has_ewgt = (c == "1" for c in fmt)
    ncon = int(head[3]) if len(head) > 3 else (1 if has_vwgt else 0)
    lead = int(has_size) + (ncon if has_vwgt else 0)  # tokens before the neighbour list
    stride = 2 if has_ewgt else 1

    lines = body.split("\n")
    if len(lines) < n:
        lines += [""] * (n - len(lines))
    body = "\n".join(lines[:n])

    # Tokenise with numpy: token starts are non-blank bytes preceded by a blank; the line
    # of a token is the number of newlines before it.
    b = np.frombuffer(body.encode("ascii"), dtype=np.uint8)
    blank = (b == 32) | (b == 9) | (b == 10) | (b == 13)
    is_start = ~blank
    is_start[1:] &= blank[:-1]
    tok_line = np.cumsum(b == 10, dtype=np.int32)[is_start]
    counts = np.bincount(tok_line, minlength=n)
    values = np.fromstring(body, dtype=np.int64, sep=" ")  # C parser; text mode is not deprecated
    if values.size != tok_line.size:
        raise ValueError(f"{path}: tokenisation mismatch")
    first = np.cumsum(counts) - counts
    rank = np.arange(values.size, dtype=np.int64) - first[tok_line]
    is_nbr = (rank >= lead) & ((rank - lead) % stride == 0)
    src = tok_line[is_nbr].astype(np.int64)
    dst = values[is_nbr] - 1
    if dst.size and (dst.min() < 0 or dst.max() >= n):
        raise ValueError(f"{path}: neighbour id out of range 1..{n}")
    return to_adjacency(n, src, dst, symmetric=symmetrize)
