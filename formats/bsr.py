"""BSR: block rows over a variable list of (r x c) dense blocks.

Blocks turn scattered non-zeros into small dense tiles that map onto vector/tensor
units. r and c are independent, and the logical shape need not be a multiple of them:
edge blocks are padded, and slots past the logical edge hold 0 (their stored
coordinates are -1). Block columns are sorted within each block row.

A block's slots that hold no entry of the matrix are padding, not zeros of the matrix:
``arrays["valid"]`` (the format's ``slot_mask``, uint8, laid out like ``data``) is 1 at the
slots the input stored — explicit zeros included — and 0 elsewhere, so that an operator
that is not linear in A (a softmax, a row max, a division by a row sum) sees only the
matrix's coordinates (``formats.base``).
"""
from __future__ import annotations

import time

import numpy as np

from . import validate as V
from .axes import DenseFixed, SparseVariable
from .base import Format, FormatInstance, check_slot_mask, masked_coords
from .convert import canonical_csr
from .stats import summarize

NAME = "bsr"
MASK = "valid"  # the slot mask's array name (formats.base)
DESCRIPTION = "block sparse rows: r x c dense blocks (any r, c; edges padded), sorted block columns"


def _block(block):
    if isinstance(block, (int, np.integer)) and not isinstance(block, (bool, np.bool_)):
        block = (block, block)
    try:
        r, c = block
    except (TypeError, ValueError):
        raise ValueError(f"block should be an (r, c) pair of positive integers, got {block!r}") from None
    for v in (r, c):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"block should be an (r, c) pair of positive integers, got {block!r}")
    return int(r), int(c)


def parse_spec(arg: str | None) -> dict:
    if not arg:
        return {"block": None}  # make_format("bsr", block=...) supplies it
    text = arg
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"block should be RxC with positive integers, got {text!r} (e.g. 'bsr:4x4')")
    return {"block": (int(parts[0]), int(parts[1]))}


def declare(block) -> Format:
    r, c = _block(block)
    return Format(NAME, (
        DenseFixed("io", dim=0, scale=r),
        SparseVariable("jo", dim=1, scale=c, indptr="indptr", indices="indices"),
        DenseFixed("ii", dim=0, extent=r),
        DenseFixed("ji", dim=1, extent=c),
    ), (("block", (r, c)),), slot_mask=MASK)


def from_matrix(matrix, *, shape=None, dtype=None, block=None) -> FormatInstance:
    t0 = time.perf_counter()
    if block is None:
        raise ValueError("block should be given for bsr (spec 'bsr:4x4', CLI --block 4x4, or block=(4, 4)), got None")
    r, c = _block(block)
    m = canonical_csr(matrix, shape=shape, dtype=dtype)
    M, N = m.shape
    MB, NB = -(-M // r), -(-N // c)
    rows = V.major_ids(m.indptr)
    cols = m.indices.astype(np.int64)
    key = (rows // r) * NB + cols // c  # sorted by (block row, block col) after unique
    keys, which = np.unique(key, return_inverse=True)
    blocks = np.zeros((keys.size, r, c), dtype=m.data.dtype)
    blocks[which.reshape(-1), rows % r, cols % c] = m.data
    valid = np.zeros((keys.size, r, c), dtype=np.uint8)
    valid[which.reshape(-1), rows % r, cols % c] = 1
    counts = np.bincount(keys // NB, minlength=MB) if keys.size else np.zeros(MB, np.int64)
    indptr = np.zeros(MB + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    arrays = {"indptr": V.check_index(indptr, "indptr", nnz=m.nnz, shape=(M, N)),
              "indices": V.check_index(keys % NB if NB else keys, "indices", nnz=m.nnz, shape=(M, N)),
              MASK: valid.reshape(-1)}
    inst = FormatInstance(declare((r, c)), (int(M), int(N)), arrays, blocks.reshape(-1), int(m.nnz))
    inst.conversion_s = time.perf_counter() - t0
    check(inst)
    return inst


def tensor_core_layout(fmt: Format, dtype: str):
    """float16 blocks run on the streaming Tensor Core kernel at few columns of B
    (``schedules.bsr_stream``: the instance's indptr, sorted block columns and values as
    they are); its match decides the block shapes and widths it takes, and the block-row
    template (``schedules.tensorcore``) takes the rest."""
    return "bsr_blocks" if dtype == "float16" else None


def root_extent(inst: FormatInstance) -> int:
    return int(inst.arrays["indptr"].size - 1)


def stored_coords(inst: FormatInstance):
    r, c = inst.format.param("block")
    M, N = inst.shape
    indptr = inst.arrays["indptr"]
    brow = V.major_ids(indptr)
    bcol = inst.arrays["indices"].astype(np.int64)
    nb = bcol.size
    rows = np.broadcast_to((brow * r)[:, None, None] + np.arange(r)[None, :, None], (nb, r, c)).reshape(-1)
    cols = np.broadcast_to((bcol * c)[:, None, None] + np.arange(c)[None, None, :], (nb, r, c)).reshape(-1)
    outside = (rows >= M) | (cols >= N)
    rows, cols = rows.copy(), cols.copy()
    rows[outside] = -1
    cols[outside] = -1
    return masked_coords(inst, rows, cols)


def check(inst: FormatInstance, full: bool = False) -> None:
    V.check_instance_arrays(inst, ("indptr", "indices"))
    r, c = inst.format.param("block")
    M, N = inst.shape
    MB, NB = -(-M // r), -(-N // c)
    indptr, indices = inst.arrays["indptr"], inst.arrays["indices"]
    if indptr.size != MB + 1:
        raise ValueError(f"indptr has {indptr.size} entries, should be block rows + 1 = {MB + 1}")
    if indptr[-1] != indices.size:
        raise ValueError(f"indptr should end at the number of blocks = len(indices) = {indices.size}, "
                         f"got {int(indptr[-1])}")
    if inst.data.size != indices.size * r * c:
        raise ValueError(f"data should have blocks * r * c = {indices.size} * {r} * {c} = "
                         f"{indices.size * r * c} values, got {inst.data.size}")
    check_slot_mask(inst)
    if full:
        V.check_indptr(indptr, MB, indices.size, major="block row")
        V.check_range(indices, NB, V.major_ids(indptr), minor="block column", major="block row", name="indices")
        V.check_sorted_rows(indptr, indices, what="block column indices")
        # only blocks in the last block row or column reach past the edge: look at those alone
        blocks = inst.data.reshape(-1, r, c)
        last_row = blocks[int(indptr[MB - 1]):] if M % r and MB else blocks[:0]
        last_col = blocks[indices == NB - 1] if N % c and NB else blocks[:0]
        if np.any(last_row[:, M % r:, :] != 0) or np.any(last_col[:, :, N % c:] != 0):
            raise ValueError("slots past the logical edge should hold 0, got a non-zero value")


def stats(inst: FormatInstance) -> dict:
    """Row lengths count in-bounds slots holding a non-zero value (block fill is what
    ``padding_ratio`` measures)."""
    rows, _ = inst.stored_coords()
    live = (rows >= 0) & (inst.data != 0)
    s = summarize(inst, np.bincount(rows[live], minlength=inst.shape[0])[: inst.shape[0]])
    s["block"] = inst.format.param("block")
    s["blocks"] = int(inst.arrays["indices"].size)
    return s
