"""Annotations that the lowering writes on TIR blocks and the schedules read: a leaf, so that
schedules (below lower in the import layers) never import the emitter for a name."""

ATOMIC_ATTR = "sparsec_atomic"  # block annotation: stores into global memory must be atomic adds
