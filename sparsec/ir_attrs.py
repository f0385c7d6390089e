"""Annotations that the lowering writes on TIR blocks and the schedules read: a leaf, so that
schedules (below lower in the import layers) never import the emitter for a name."""

ATOMIC_ATTR = "sparsec_atomic"  # block annotation: stores into global memory must be atomic adds

# A kernel parameter of zeroed int32 counters that a kernel leaves zeroed when it ends (its
# last thread block resets them): thread blocks order themselves through it within one launch
# (``schedules.segment_contract``'s fill). The runtime hands every call the same array per
# matrix instance and device (``sparsec.tc_operands``), so it is allocated once.
TICKETS = "sparsec_tickets"
TICKETS_LEN = 2048  # counters on lines of their own (schedules.segment_contract)
