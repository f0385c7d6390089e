"""bsr+csr: dense blocks in BSR, every other entry in CSR (a composite of 2 parts).

The matrix is tiled into ``r x c`` blocks (edge blocks included, as in ``formats.bsr``).
A block whose fill — its non-zeros over ``r * c`` (the slots it would store, edge
blocks included) — is at least ``block_fill`` goes whole to a BSR part; every entry of
the other blocks goes to a CSR part. Both parts have the matrix's full logical shape
(the BSR part simply has no block where the CSR part has entries), and every entry is
in exactly one of them. Parts are always [bsr, csr], an empty one included
(``block_fill=0`` puts every non-empty block in BSR and leaves the CSR part empty,
anything above 1 puts everything in CSR), so a kernel compiled for one matrix runs on
any other converted with the same block shape (``block_fill`` steers the split, not the
kernel). An empty part still spans the matrix: its kernel walks its (block) rows and
finds nothing, as a CSR part does for the rows BSR took.

Specs: ``bsr+csr`` (8x8 blocks, fill 0.5), ``bsr+csr:4x4``, ``bsr+csr:4x4,0.5``, the
keyword form ``bsr+csr:block=4x4,block_fill=0.5`` (what ``CompositeFormat.spec``
prints, block as ``4/4``; a trailing ``[parts...]`` is ignored), or
``convert(m, "bsr+csr", block=(4, 4), block_fill=0.5)``.
"""
from __future__ import annotations

import math
import time

import numpy as np

from . import bsr, csr
from . import validate as V
from .composite import CompositeFormat, CompositeInstance
from .convert import canonical_csr
from .hyb import composite_summary

NAME = "bsr+csr"
DESCRIPTION = "BSR for blocks at least block_fill full, CSR for the rest; bsr+csr:RxC,FILL (default 8x8,0.5)"

DEFAULT_BLOCK = (8, 8)
DEFAULT_FILL = 0.5


def _fill(f):
    if isinstance(f, (bool, np.bool_)) or not isinstance(f, (int, float, np.integer, np.floating)) \
            or not math.isfinite(float(f)) or f < 0:
        raise ValueError(f"block_fill should be a number >= 0 (the fraction of a block's slots that are "
                         f"non-zero, e.g. 0.5), got {f!r}")
    return float(f)


def _block_text(text: str):
    t = text.strip().lower().replace("/", "x")
    try:
        return bsr.parse_spec(t)["block"]
    except ValueError:
        raise ValueError(f"bsr+csr block should be RxC with positive integers, got {text!r} "
                         f"(e.g. 'bsr+csr:4x4,0.5')") from None


def _float(text: str):
    try:
        return _fill(float(text))
    except ValueError:
        raise ValueError(f"block_fill should be a number >= 0, got {text!r} (e.g. 'bsr+csr:4x4,0.5')") from None


def parse_spec(arg: str | None) -> dict:
    if not arg:
        return {"block": DEFAULT_BLOCK, "block_fill": DEFAULT_FILL}
    arg = arg.split("[", 1)[0].strip()
    out = {"block": DEFAULT_BLOCK, "block_fill": DEFAULT_FILL}
    items = [t.strip() for t in arg.split(",")]
    if "=" in arg:
        for item in items:
            key, eq, val = item.partition("=")
            key = key.strip()
            if not eq or key not in out:
                raise ValueError(f"bsr+csr spec keywords should be block= and block_fill=, got {item!r}")
            out[key] = _block_text(val) if key == "block" else _float(val)
        return out
    if len(items) > 2:
        raise ValueError(f"bsr+csr spec should be 'bsr+csr:RxC,FILL', got 'bsr+csr:{arg}'")
    if items[0]:
        out["block"] = _block_text(items[0])
    if len(items) == 2:
        out["block_fill"] = _float(items[1])
    return out


def _params(block, block_fill):
    r, c = bsr._block(DEFAULT_BLOCK if block is None else block)
    return (("block", (r, c)), ("block_fill", _fill(DEFAULT_FILL if block_fill is None else block_fill)))


def declare(block=None, block_fill=None) -> CompositeFormat:
    """The format of every matrix converted with these parameters: [bsr, csr]."""
    params = _params(block, block_fill)
    return CompositeFormat(NAME, (bsr.declare(params[0][1]), csr.declare()), params)


def from_matrix(matrix, *, shape=None, dtype=None, block=None, block_fill=None) -> CompositeInstance:
    t0 = time.perf_counter()
    params = _params(block, block_fill)
    (r, c), fill = params[0][1], params[1][1]
    m = canonical_csr(matrix, shape=shape, dtype=dtype)
    M, N = m.shape
    NB = -(-N // c)
    rowid = V.major_ids(m.indptr)
    key = (rowid // r) * NB + m.indices.astype(np.int64) // c
    if m.nnz:
        _, which, counts = np.unique(key, return_inverse=True, return_counts=True)
        dense = (counts >= fill * r * c)[which.reshape(-1)]
    else:
        dense = np.zeros(0, dtype=bool)
    parts = []
    for keep, module, kw in ((dense, bsr, {"block": (r, c)}), (~dense, csr, {})):
        cnt = np.bincount(rowid[keep], minlength=M) if M else np.zeros(0, np.int64)
        indptr = np.zeros(M + 1, dtype=np.int64)
        np.cumsum(cnt, out=indptr[1:])
        # entries stay sorted by (row, col): the sub-matrix is already canonical
        parts.append(module.from_matrix((m.data[keep], m.indices[keep], indptr), shape=(M, N), **kw))
    cf = CompositeFormat(NAME, tuple(p.format for p in parts), params)
    inst = CompositeInstance(cf, (int(M), int(N)), parts, int(m.nnz))
    inst.conversion_s = time.perf_counter() - t0
    check(inst)
    return inst


def root_extent(inst: CompositeInstance) -> int:
    """The logical rows (each part has its own root: ``extents``)."""
    return int(inst.shape[0])


def extents(inst: CompositeInstance) -> dict:
    """Each part's root extent keyed ``<axis>_<k>`` (``io_0`` block rows, ``i_1`` rows)."""
    return {f"{p.format.axes[0].name}_{k}": p.root_extent() for k, p in enumerate(inst.parts)}


def stored_coords(inst: CompositeInstance):
    return inst.stored_coords()


def check(inst: CompositeInstance, full: bool = False) -> None:
    if not isinstance(inst, CompositeInstance) or inst.format.name != NAME:
        raise ValueError(f"a bsr+csr instance should be a CompositeInstance of format bsr+csr, got {type(inst).__name__}")
    names = [p.format.name for p in inst.parts]
    if names != ["bsr", "csr"]:
        raise ValueError(f"bsr+csr parts should be [bsr, csr] (an empty one included), got {names}")
    block = tuple(inst.format.param("block"))
    for p in inst.parts:
        if p.format.name == "bsr" and tuple(p.format.param("block")) != block:
            raise ValueError(f"the bsr part's block should be {block}, got {p.format.param('block')}")
        (bsr if p.format.name == "bsr" else csr).check(p, full=full)
    if sum(p.nnz for p in inst.parts) != inst.nnz:
        raise ValueError(f"the parts' nnz should add up to nnz = {inst.nnz}, got {sum(p.nnz for p in inst.parts)}")
    if full:
        rows, cols = inst.parts[1].stored_coords()
        r, c = block
        NB = -(-inst.shape[1] // c)
        b = inst.parts[0]
        bkeys = V.major_ids(b.arrays["indptr"]) * NB + b.arrays["indices"]
        ckeys = (rows // r) * NB + cols // c
        if np.isin(ckeys, bkeys).any():
            raise ValueError("a CSR entry should not fall in a block stored by the BSR part, got one")


def stats(inst: CompositeInstance) -> dict:
    """Totals (stored, padding ratio, bytes, conversion time) and per part its format,
    stored slots and nnz; ``bsr_fraction`` is the share of the entries in BSR."""
    s = composite_summary(inst)
    s["block"] = tuple(inst.format.param("block"))
    s["block_fill"] = float(inst.format.param("block_fill"))
    s["part_stats"] = [{"format": p.format.spec, "stored": int(p.stored), "nnz": int(p.nnz)} for p in inst.parts]
    bnnz = sum(p.nnz for p in inst.parts if p.format.name == "bsr")
    s["bsr_fraction"] = float(bnnz / inst.nnz) if inst.nnz else 0.0
    return s
