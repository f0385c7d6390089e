"""Which statements a format's padding cannot change, and so need no guard.

An operator's value is defined on the matrix's coordinates, whatever the format stores
(``formats.base``: padding). A padded slot holds 0 and has an in-range coordinate, so a
kernel that visits it computes as if the matrix had an entry 0 there. That is harmless
exactly when an entry 0 adds nothing; stage II guards every other statement with the slot
mask, on the formats that have one (``Format.slot_mask``: BSR, N:M and SR-BCRS vectors).

A statement is *padding-neutral* (no guard: the linear fast path of SpMM and SDDMM stays
byte-identical) when

  1. it is a sum reduction, or an assignment to a sparse buffer, whose value is a product
     with the matrix (the first sparse input) as one of its factors: a padded slot gives 0 * (finite) = 0,
     which adds nothing to a sum and writes the 0 a padded slot of a sparse output holds
     (``C[i, k] += A[i, j] * B[j, k]``, ``y[i] += A[i, j]``, ``C[i, j] = A[i, j] * C[i, j]``);
  2. it writes a sparse buffer from dense operands only (a sum or an assignment, reading no
     sparse buffer), and a later statement rewrites that buffer by rule 1 as an assignment:
     the value it leaves in a padded slot is finite and overwritten by 0 before the operator
     ends (SDDMM's dot product before its scale by A). Statements in between that read it
     are guarded by the rule below, or are neutral by rule 1 (0 times it).

Further sparse inputs (edge data) do not count as that factor: their padding slots hold 0
too (``EdgeValues``), but a statement that reads one outside a product with the matrix is
guarded all the same, so its result never rests on what a padding slot of edge data holds.
An edge-type index read at a padding slot (``W[E[i, j], f]``) reads 0, within every extent.

Every other statement is guarded: max/min reductions, divisions, exp, any other read of the
sparse input or a sparse temporary, a sum whose value does not have A as a factor (a padded
slot would add ``B[j, k]``), an assignment to a dense buffer. A guarded reduction skips a
padded slot (its identity); a guarded write of a sparse buffer stores 0 there.
"""
from __future__ import annotations

from typing import List, Set

from ..dsl import Access, Operator, Statement, accesses
from ..expr import BinOp, Expr


def _factors(e: Expr) -> List[Expr]:
    """The factors of a product tree (``a * b * c`` -> [a, b, c]; anything else -> [e])."""
    if isinstance(e, BinOp) and e.op == "*":
        return _factors(e.a) + _factors(e.b)
    return [e]


def linear_in_sparse_input(value: Expr) -> bool:
    """``value`` is a product with a read of the matrix (the first sparse input) as one of its factors."""
    return any(isinstance(f, Access) and f.buffer.matrix for f in _factors(value))


def _reads_sparse(value: Expr) -> bool:
    return any(n.buffer.sparse for n in accesses(value))


def _rule1(st: Statement) -> bool:
    if st.reduce == "sum" or (st.reduce is None and st.target.buffer.sparse):
        return linear_in_sparse_input(st.value)
    return False


def neutral_iterations(op: Operator) -> Set[str]:
    """Names of the operator's iterations whose statement is padding-neutral (see the
    module docstring); every other iteration is guarded on formats with a slot mask."""
    out = set()
    its = op.iterations
    for n, it in enumerate(its):
        st = it.statement
        if _rule1(st):
            out.add(it.name)
            continue
        tgt = st.target.buffer
        if tgt.sparse and st.reduce in (None, "sum") and not _reads_sparse(st.value):
            if any(later.statement.target.buffer is tgt and later.statement.reduce is None and _rule1(later.statement)
                   for later in its[n + 1:]):
                out.add(it.name)
    return out
