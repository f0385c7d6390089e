"""Annotations that the lowering writes on TIR blocks and the schedules read: a leaf, so that
schedules (below lower in the import layers) never import the emitter for a name."""

ATOMIC_ATTR = "sparsec_atomic"  # block annotation: stores into global memory must be atomic adds

# A kernel parameter of int32 counters, zeros when made, that a segment contraction with its
# output's fill in the same launch keeps between calls (``schedules.segment_contract``): per
# group of 256 output rows a claim and a filled-in call count, per thread block its own call
# count. The runtime hands every call the same array per matrix instance, device and split
# count (``sparsec.tc_operands``); the suffix is the kernel's split count, so kernels whose
# thread blocks differ never share one.
SYNC_PREFIX = "sparsec_sync_s"
SYNC_ROWS = 256  # output rows per group: one thread block's root positions (segment_contract.THREADS)


def sync_words(positions: int, splits: int) -> int:
    """Counters a workspace needs for a matrix of at most ``positions`` root positions and
    output rows, ``splits`` thread blocks per group of positions: a claim and a fill count
    per group of rows, a call count per thread block."""
    groups = -(-max(int(positions), 1) // SYNC_ROWS)
    return (2 + int(splits)) * groups


# A kernel parameter listing the output rows a composite's fill must set (``lower.fill_rows``):
# the rows that none of the parts named in its suffix stores (``fill_rows_p0_1_2``: parts 0, 1
# and 2 own their rows). The runtime makes it from the matrix instance (``sparsec.tc_operands``).
FILL_ROWS_PREFIX = "fill_rows_p"


def fill_rows_name(parts) -> str:
    """The row list's parameter name for a kernel whose parts ``parts`` store their rows."""
    return FILL_ROWS_PREFIX + "_".join(str(int(k)) for k in parts)


def fill_rows_parts(name: str):
    """The parts a ``fill_rows_name`` lists, or None for any other name."""
    if not name.startswith(FILL_ROWS_PREFIX):
        return None
    tail = name[len(FILL_ROWS_PREFIX):].split("_")
    return tuple(int(k) for k in tail) if tail and all(k.isdigit() for k in tail) else None
