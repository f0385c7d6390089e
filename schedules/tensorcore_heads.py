"""The heads of a multi-head block SpMM as a grid dimension of the BSR Tensor Core template.

``C[i, h, k] += P[i, j, h] * B[j, h, k]`` (``sparsec.ops.multihead_spmm``, or any operator of
that structure, whatever its names) is, per head h, a block SpMM of its own: P is edge data
with a trailing head axis, one weight per stored slot per head ((stored slots, heads) on BSR,
0 at a block's padding, as ``formats.edge_values`` lays it out), B is (cols, heads, feat) and
C (rows, heads, feat). The template runs one thread block per (block row, head, N tile):
the grid's y dimension is heads x N tiles (head = y // N tiles, tile = y % N tiles), and a
thread block reads its head's values of each stored block (every heads-th value of the
block's slots), its head's columns of B's rows and writes its head's columns of C's rows.

:func:`head_axis` finds the head axis of the SpMM statement by structure (axis kinds and
the accesses' axes); :class:`Operands` gives ``tensorcore.staged_spmm`` its operands' shapes
and index tuples, with one head exactly those of the single-head template.

A head's values of a block are ``heads`` elements apart, so its A gather moves 2-byte values
synchronously (``cp.async`` moves 4, 8 or 16 bytes); B's and C's rows are contiguous per
head and keep the vector copies. (Gathering a block for every head at once, with a
transpose in shared memory, would read A once: left for when it is measured to matter.)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


def head_axis(op, sparse, dense, out):
    """The head axis of a statement ``out += sparse * dense`` shaped
    ``C[i, h, k] += P[i, j, h] * B[j, h, k]`` over the operator's structure (i, j): a dense,
    non-structural axis h other than the feature axis k. None when the statement has no
    head axis (``C[i, k] += A[i, j] * B[j, k]``: the caller checks that form) or is
    anything else."""
    from sparsec.formats.axes import DenseFixed

    row, col = op.structure()
    if len(out.axes) != 3:
        return None
    h, k = out.axes[1], out.axes[2]
    if h is k or h.structural or k.structural or h.kind is not DenseFixed:
        return None
    if out.axes != (row, h, k) or sparse.axes != (row, col, h) or dense.axes != (col, h, k):
        return None
    return h


@dataclass(frozen=True)
class Operands:
    """Shapes and index tuples of the staged function's A (values), B and C: without a head
    axis (``heads`` None) A (slots,), B (cols, feat), C (rows, feat); with one of ``heads``
    heads (1 included) A (slots, heads), B (cols, heads, feat), C (rows, heads, feat); with
    ``n_tiles`` N tiles per head. ``y`` is the thread block's grid index over heads x N tiles."""

    heads: Optional[int] = None
    n_tiles: int = 1

    @property
    def grid_y(self) -> int:
        return (self.heads or 1) * self.n_tiles

    @property
    def contiguous_values(self) -> bool:
        """Whether a block's values for one head are contiguous (vector and async copies)."""
        return (self.heads or 1) == 1

    def tile(self, y):
        """The N tile of grid index ``y``."""
        return y if self.heads is None else y % self.n_tiles

    def head(self, y):
        return y // self.n_tiles

    def a_shape(self, slots):
        return (slots,) if self.heads is None else (slots, self.heads)

    def a_at(self, slot, y):
        return (slot,) if self.heads is None else (slot, self.head(y))

    def dense_shape(self, rows, feat):
        """B's (rows = cols of the matrix) or C's (rows = rows) shape."""
        return (rows, feat) if self.heads is None else (rows, self.heads, feat)

    def dense_at(self, row, y, col):
        """The index of column ``col`` of row ``row`` of B or C for grid index ``y``'s head."""
        return (row, col) if self.heads is None else (row, self.head(y), col)

    def whole(self, buf):
        """The region of all of ``buf``."""
        import tvm
        from tvm import tirx

        return tirx.BufferRegion(buf, [tvm.ir.Range.from_min_extent(0, d) for d in buf.shape])

    def c_tile(self, C, rows, y, first, last):
        """The region of C a thread block writes: its head's columns first..last of every row."""
        import tvm
        from tvm import tirx

        cols = tvm.ir.Range.from_min_extent(first, last - first)
        head = [] if self.heads is None else [tvm.ir.Range.from_min_extent(self.head(y), 1)]
        return tirx.BufferRegion(C, [tvm.ir.Range.from_min_extent(0, rows), *head, cols])
