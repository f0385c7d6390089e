"""2:4 operands in the order one warp's ``mma.sp.m16n8k32`` (f16/bf16) reads them.

``formats.nm`` stores a 2:4 matrix in CUTLASS's global layout (``mma_values``,
``mma_meta``), which CUTLASS's and PyTorch's kernels read. sparsec's own Tensor Core
kernel (``schedules.tc_pipeline``, mode sp24) copies tiles of these arrays into shared
memory as they are: ``ldmatrix.x4`` hands each lane its A registers, and the metadata is
packed here, once, into the word each lane passes to the instruction:

* ``values``: (Mp, Kp/2) float16, row-major, rows padded to 16 and columns to 32 with
  zeros. Group q (columns 4q..4q+3) of row r keeps two values, in increasing column
  order, at ``values[r, 2q]`` and ``values[r, 2q + 1]``. In a K tile of 32 columns the
  lane (g = lane / 4, t = lane % 4) holds a0 = row g, compressed columns 2t, 2t+1;
  a1 = row g+8, same columns; a2 = row g, columns 2t+8, 2t+9; a3 = row g+8, those.
* ``meta``: (Mp/16, Kp/32, 16) uint32, entry ``2 * g + h`` of a tile being the word of
  lane 4g + h (sparsity selector 0: lanes 4g and 4g+1 supply metadata). Word (g, h)
  holds the groups 4h..4h+3 of the tile: row g in bits 0..15 and row g+8 in bits 16..31,
  one nibble per group, lowest group first; a nibble is (first kept index) | (second
  kept index) << 2, in increasing order (what ``mma.sp::ordered_metadata`` requires).

The lane layout follows the PTX ISA's figures for the sparse m16n8k32 fragments.
``emulate`` computes one warp's result from these arrays lane by lane, the way the
instruction is specified, so the packing and the kernel's index arithmetic are checked
against the dense product on the CPU; the GPU check confirms the hardware agrees.
"""
from __future__ import annotations

import numpy as np

TILE_M, TILE_N, TILE_K = 16, 8, 32


def padded_shape(rows: int, cols: int) -> tuple:
    return (-(-rows // TILE_M) * TILE_M, -(-cols // TILE_K) * TILE_K)


def pack(dense) -> tuple:
    """A 2:4 matrix (any shape; float16, or anything that converts to it exactly) ->
    ``(values, meta)`` in the lane layout. ValueError names a group holding more than two
    non-zeros."""
    a = np.asarray(dense)
    if a.ndim != 2:
        raise ValueError(f"dense should be 2-D, got shape {a.shape}")
    rows, cols = a.shape
    mp, kp = padded_shape(rows, cols)
    full = np.zeros((mp, kp), np.float16)
    full[:rows, :cols] = a
    groups = full.reshape(mp, kp // 4, 4)
    nz = (groups.view(np.uint16) & 0x7FFF) != 0
    counts = nz.sum(-1)
    if np.any(counts > 2):
        r, q = np.argwhere(counts > 2)[0]
        raise ValueError(f"row {r}, columns {4 * q}..{4 * q + 3} hold {counts[r, q]} non-zeros, "
                         "more than 2 of every 4: prune to 2:4 first (formats.nm.prune)")
    first, second = _kept_slots(nz)
    values = np.stack([np.take_along_axis(groups, first[..., None], -1)[..., 0],
                       np.take_along_axis(groups, second[..., None], -1)[..., 0]], -1).reshape(mp, kp // 2)
    nibble = (first | (second << 2)).astype(np.uint32)  # (mp, kp/4)
    # (tile_m, g, half_rows, tile_k, h, group-in-word) -> words
    nib = nibble.reshape(mp // 16, 2, 8, kp // 32, 2, 4).transpose(0, 3, 2, 4, 1, 5)
    halfwords = (nib << (4 * np.arange(4, dtype=np.uint32))).sum(-1)  # (tm, tk, g, h, half)
    words = halfwords[..., 0] | (halfwords[..., 1] << 16)
    return np.ascontiguousarray(values), np.ascontiguousarray(words.reshape(mp // 16, kp // 32, 16),
                                                              dtype=np.uint32)


def _kept_slots(nz):
    """The two slots (0..3, increasing) each group keeps: its non-zeros, padded with the
    lowest zero slots (their values are zero, so any choice is exact)."""
    order = np.argsort(~nz, axis=-1, kind="stable")  # non-zero slots first, each part in slot order
    two = np.sort(order[..., :2], axis=-1)
    return two[..., 0].astype(np.int64), two[..., 1].astype(np.int64)


def unpack(values, meta, shape) -> np.ndarray:
    """The dense (rows, cols) matrix of ``pack``'s arrays."""
    rows, cols = (int(s) for s in shape)
    mp, kp = padded_shape(rows, cols)
    words = np.asarray(meta, np.uint32).reshape(mp // 16, kp // 32, 8, 2)  # (tm, tk, g, h)
    half = np.stack([words & 0xFFFF, words >> 16], -1)  # (tm, tk, g, h, half)
    nib = (half[..., None] >> (4 * np.arange(4, dtype=np.uint32))) & 0xF  # (tm, tk, g, h, half, j)
    nib = nib.transpose(0, 4, 2, 1, 3, 5).reshape(mp, kp // 4)
    idx = np.stack([nib & 3, nib >> 2], -1).astype(np.int64)
    out = np.zeros((mp, kp // 4, 4), np.float16)
    np.put_along_axis(out, idx, np.asarray(values, np.float16).reshape(mp, kp // 4, 2), -1)
    return out.reshape(mp, kp)[:rows, :cols]


def lane_registers(values, meta, tm: int, tk: int, lane: int):
    """What lane ``lane`` loads for tile (tm, tk): the A registers as (row, compressed
    column) pairs with their values, and its metadata word (0 for lanes 4g+2, 4g+3). The
    kernel uses the same index arithmetic (kept in one place here, mirrored there)."""
    g, t = lane // 4, lane % 4
    regs = []
    for r, (dr, dc) in enumerate(((0, 0), (8, 0), (0, 8), (8, 8))):
        row, col = tm * 16 + g + dr, tk * 16 + 2 * t + dc
        regs.append(((row, col), values[row, col:col + 2]))
    word = int(meta[tm, tk, 2 * g + t]) if t < 2 else 0
    return regs, word


def emulate(values, meta, B) -> np.ndarray:
    """``A @ B`` in float64 as a warp of ``mma.sp.m16n8k32`` computes it from the lane
    registers: each row's compressed values come from the lanes that hold them, each
    value's column from the nibble that the supplying lane's word gives it."""
    values = np.asarray(values, np.float16)
    mp, khalf = values.shape
    kp = 2 * khalf
    B = np.asarray(B, np.float64)
    if B.shape[0] > kp:
        raise ValueError(f"B has {B.shape[0]} rows, more than the packed K of {kp}")
    Bp = np.zeros((kp, B.shape[1]))
    Bp[:B.shape[0]] = B
    out = np.zeros((mp, B.shape[1]))
    for tm in range(mp // 16):
        for tk in range(kp // 32):
            a = np.zeros((16, 16))  # compressed tile, as the 32 lanes hand it over
            words = {}
            for lane in range(32):
                regs, word = lane_registers(values, meta, tm, tk, lane)
                for (row, col), pair in regs:
                    a[row - tm * 16, col - tk * 16: col - tk * 16 + 2] = pair
                if lane % 4 < 2:
                    words[(lane // 4, lane % 4)] = word
            for r in range(16):
                g, half = r % 8, r // 8
                for q in range(8):  # group q of the tile: compressed columns 2q, 2q+1
                    word = words[(g, q // 4)] >> (16 * half)
                    nib = (word >> (4 * (q % 4))) & 0xF
                    for s, slot in enumerate((nib & 3, nib >> 2)):
                        out[tm * 16 + r] += a[r, 2 * q + s] * Bp[tk * 32 + 4 * q + slot]
    return out
