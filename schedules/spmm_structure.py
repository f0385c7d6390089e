"""Whether a DSL operator is an SpMM ``C[i, k] = sum_j A[i, j] * B[j, k]``, with at most a
bias and an activation after the sum, read off its statements and axes (never its name): the
kernels that take any operator of that structure (the packed Tensor Core SpMMs,
``csr_split``) ask it for B's and C's names, the epilogue and the feature count."""
from __future__ import annotations

from typing import Optional, Tuple


def spmm_structure(program, token_major: bool = False):
    """(B, C, bias or None, activation, feature count, transposed C, bias axis, declared
    dtypes by buffer name) when the operator is an SpMM with at most a bias / activation
    epilogue and no other operand, else None. ``token_major``: match instead the linear
    layer's form with both dense operands transposed, ``C[k, i] = sum_j A[i, j] * B[k, j]``
    (B and C token-major, as ``torch.nn.Linear`` holds them)."""
    from sparsec.dsl import Access
    from sparsec.expr import BinOp

    op = program.bound.op
    if op.outer_axes():
        return None
    statements = [it.statement for it in op.iterations if it.statement is not None]
    if not 1 <= len(statements) <= 2:
        return None
    first = statements[0]
    v = first.value
    if first.reduce != "sum" or not (isinstance(v, BinOp) and v.op == "*" and isinstance(v.a, Access)
                                     and isinstance(v.b, Access)):
        return None
    sparse, dense = (v.a, v.b) if v.a.buffer.sparse else (v.b, v.a)
    out = first.target
    row, col = op.structure()
    k = out.axes[-1]
    transpose_c = len(out.axes) == 2 and out.axes[0] is not row
    k = out.axes[0] if transpose_c else out.axes[-1]
    if (not sparse.buffer.matrix or dense.buffer.sparse or out.buffer.sparse or k.structural or len(out.axes) != 2
            or out.axes != ((k, row) if transpose_c else (row, k)) or sparse.axes != (row, col)
            or dense.axes != ((k, col) if token_major else (col, k)) or (token_major and not transpose_c)):
        return None
    bias, activation, bias_axis = None, "none", "row"
    if len(statements) == 2:
        found = _epilogue(statements[1], out, row, k)
        if found is None:
            return None
        bias, activation, bias_axis = found
    declared = {b.name: b.dtype for b in op.buffers if b.dtype is not None}
    if set(declared) - {out.buffer.name, bias}:
        return None  # A or B in a precision of their own: the generic template casts them
    inputs = [b.name for b in op.buffers if b.role == "input"]
    if inputs != [sparse.buffer.name, dense.buffer.name] + ([bias] if bias else []):
        return None  # another operand, or inputs declared in another order than the kernel takes them
    if [b.name for b in op.buffers if b.role not in ("input",)] != [out.buffer.name]:
        return None
    feat = program.bound.extent(k)
    if not isinstance(feat, int) or feat < 1:
        return None
    return dense.buffer.name, out.buffer.name, bias, activation, feat, transpose_c, bias_axis, declared


def _epilogue(st, out, row, k) -> Optional[Tuple[Optional[str], str, str]]:
    """(bias name or None, activation, bias axis) of ``C = act(C [+ bias[i] or bias[k]])``,
    ``act`` one of ``sparsec.dsl.ACTIVATIONS`` written as its builder writes it (``relu``
    also as ``maximum(0, x)``), or none with a bias."""
    from sparsec.dsl import ACTIVATIONS, Access, maximum
    from sparsec.expr import BinOp, walk

    if st.reduce is not None or st.target.buffer is not out.buffer or st.target.axes != out.axes:
        return None

    def is_out(x):
        return isinstance(x, Access) and x.buffer is out.buffer and x.axes == out.axes

    def inner(x):
        """(bias, axis) when ``x`` is C, C + bias[i] or C + bias[k]; else None."""
        if is_out(x):
            return None, "row"
        if not (isinstance(x, BinOp) and x.op == "+"):
            return None
        other = x.b if is_out(x.a) else x.a if is_out(x.b) else None
        if not (isinstance(other, Access) and not other.buffer.sparse and other.buffer.role == "input"
                and len(other.axes) == 1 and other.axes == other.buffer.axes and other.axes[0] in (row, k)):
            return None
        return other.buffer.name, "row" if other.axes[0] is row else "col"

    builders = [(name, fn) for name, fn in ACTIVATIONS.items()] + [("relu", lambda x: maximum(0.0, x))]
    for x in walk(st.value):
        found = inner(x)
        if found is None:
            continue
        if x is st.value:
            return (found[0], "none", found[1]) if found[0] is not None else None
        for name, fn in builders:
            if same_expr(fn(x), st.value):
                return found[0], name, found[1]
    return None


def same_expr(a, b) -> bool:
    """Structural equality of two DSL expressions (the nodes compare by identity)."""
    from sparsec.dsl import Access
    from sparsec.expr import BinOp, Call, Const

    if type(a) is not type(b):
        return False
    if isinstance(a, Const):
        return a.value == b.value
    if isinstance(a, Access):
        return a.buffer is b.buffer and len(a.axes) == len(b.axes) and all(x is y for x, y in zip(a.axes, b.axes))
    if isinstance(a, BinOp):
        return a.op == b.op and same_expr(a.a, b.a) and same_expr(a.b, b.b)
    if isinstance(a, Call):
        return a.fn == b.fn and len(a.args) == len(b.args) and all(same_expr(x, y) for x, y in zip(a.args, b.args))
    return False
