"""Sum accumulators of a 16-bit float output widened to float32, rounded once where stored.

A DSL output may be declared float16 or bfloat16 while the kernel accumulates in float32
(``sparsec.dtypes.DtypeSpec.out``). The lowering casts each contribution to the output's
dtype, so the register accumulator a schedule makes for it (``cache_write``) is a 16-bit
array and every addition rounds: a row of 8000 entries came out 22 % wrong. The Tensor Core
templates accumulate in float32 and cast at the store; this rewrite gives the generic
templates the same semantics on their scheduled IR:

    C_local: half[...]                           C_local: float32[...]
    C_local[i] = half(0)                  ->     C_local[i] = 0f
    C_local[i] = C_local[i] + half(v)            C_local[i] = C_local[i] + v     (v: float32)
    C[j] = C_local[i]                            C[j] = half(C_local[i])

Every other read of the accumulator reads its value rounded to the declared dtype, so an
epilogue folded into the write-back computes on the same value as before. Why after
scheduling, not in the lowering: the accumulator only exists once a schedule made it (a
register array per thread, a row's array on the CPU), and the programs the structure-matching
templates take (``spmm_structure``, ``tensorcore``) stay exactly as they were.

``widen_accumulators`` changes only buffers a block allocates, never a kernel argument.
Where a nest adds into an output other nests also write (hyb's split rows, a composite's
parts), on CUDA each thread's contribution is summed in float32 and rounded once where it
is added (``atomicAdd``), while the running total in the output stays 16-bit: widening it
would take another global buffer and launches. On the CPU, ``widen_outputs`` sums such an
output in a float32 copy. A node kind the rewrite does not know leaves the function as it was.
"""
from __future__ import annotations

from .tvm_modules import ie, pe, s_tir, tirx, tvm_ffi, tvm_ir
from .tir_rewrite import stores

NARROW = ("float16", "bfloat16")
WIDE = "float32"


class Unsupported(Exception):
    """A node kind the rewrite does not rebuild (the function is then left unchanged)."""


def widen_accumulators(func: tirx.PrimFunc, wide: str = WIDE) -> tirx.PrimFunc:
    """``func`` with every block-allocated 16-bit float buffer that a sum updates
    (``X[i] = X[i] + v``) made ``wide``, as in the module docstring."""
    allocated, updated = [], []

    def visit(block):
        allocated.extend(b for b in block.alloc_buffers if str(b.dtype) in NARROW)
        for part in (block.init, block.body):
            if part is not None:
                updated.extend(st.buffer for st in stores(part, attrs=True) if _accumulated(st) is not None)

    _walk_blocks(func.body, visit)
    found = [b for b in allocated if any(b.same_as(u) for u in updated)]
    if not found:
        return func
    mapping = [(b, b.with_dtype(wide)) for b in found]
    try:
        return func.with_body(_Widen(mapping).stmt(func.body))
    except Unsupported:
        return func


def widen_outputs(func: tirx.PrimFunc, names, wide: str = WIDE) -> tirx.PrimFunc:
    """``func`` with the 16-bit float arguments ``names`` accumulated in a ``wide`` copy of
    the whole buffer: copied in first, every nest reads and writes the copy (as the module
    docstring's accumulators), copied out rounded once at the end.

    Why (CPU): a nest that adds into rows other nests also write (hyb's split rows after its
    fill, a composite's parts) has no register accumulator that holds a row's total, so its
    running total would stay 16-bit (hyb's 64-wide split rows: 4e-3 relative on a row of
    8000). The copy-in keeps any element no nest writes as it was. Not for CUDA: the copy
    would be another global buffer and two more launches."""
    params = [p for p in func.params if getattr(p, "name", None) in names and str(p.dtype) in NARROW]
    if not params:
        return func
    mapping = [(p, tirx.decl_buffer(p.shape, wide, name=f"{p.name}_{wide}")) for p in params]
    try:
        body = _Widen(mapping).stmt(func.body)
    except Unsupported:
        return func
    if not isinstance(body, s_tir.SBlockRealize):
        return func
    root = body.block
    ins = [_copy(n, p, lambda x: pe.Cast(wide, x), f"{p.name}_in") for p, n in mapping]
    outs = [_copy(p, n, lambda x: pe.Cast(str(p.dtype), x), f"{p.name}_out") for p, n in mapping]
    root = s_tir.SBlock(iter_vars=root.iter_vars, reads=root.reads, writes=root.writes, name_hint=root.name_hint,
                        body=tirx.SeqStmt(ins + [root.body] + outs), init=root.init,
                        alloc_buffers=list(root.alloc_buffers) + [n for _, n in mapping],
                        match_buffers=root.match_buffers, annotations=root.annotations)
    return func.with_body(s_tir.SBlockRealize(body.iter_values, body.predicate, root))


def _copy(dst, src, convert, name: str):
    """``dst[...] = convert(src[...])`` over the whole shape, the outer loop parallel."""
    loop_vars = [tirx.Var(f"{name}_{d}", "int32") for d in range(len(dst.shape))]
    stmt = tirx.BufferStore(dst, convert(tirx.BufferLoad(src, loop_vars)), loop_vars)
    for d in reversed(range(len(loop_vars))):
        kind = tirx.ForKind.PARALLEL if d == 0 else tirx.ForKind.SERIAL
        stmt = tirx.For(loop_vars[d], 0, dst.shape[d], kind, stmt)
    return stmt


def _walk_blocks(stmt, fn) -> None:
    if isinstance(stmt, s_tir.SBlockRealize):
        fn(stmt.block)
        if stmt.block.init is not None:
            _walk_blocks(stmt.block.init, fn)
        _walk_blocks(stmt.block.body, fn)
    elif isinstance(stmt, tirx.SeqStmt):
        for s in stmt.seq:
            _walk_blocks(s, fn)
    elif isinstance(stmt, (tirx.For, tirx.AttrStmt)):
        _walk_blocks(stmt.body, fn)
    elif isinstance(stmt, tirx.IfThenElse):
        _walk_blocks(stmt.then_case, fn)
        if stmt.else_case is not None:
            _walk_blocks(stmt.else_case, fn)


def _accumulated(store):
    """The added term when ``store`` is ``X[i] = X[i] + v`` (either order), else None."""
    v = store.value
    if isinstance(v, pe.Add):
        for acc, term in ((v.a, v.b), (v.b, v.a)):
            if (isinstance(acc, ie.TensorLoad) and acc.source.same_as(store.buffer)
                    and len(acc.indices) == len(store.indices)
                    and all(tvm_ffi.structural_equal(a, b) for a, b in zip(acc.indices, store.indices))):
                return term
    return None


class _Widen:
    """Rebuilds statements and expressions with each ``old`` buffer replaced by its ``new``
    (wide) one: stores into it keep their value unrounded, other loads round it back."""

    def __init__(self, mapping):
        self.mapping = mapping

    def new(self, buf):
        return next((n for o, n in self.mapping if o.same_as(buf)), None)

    def own(self, buf):
        """The buffer ``buf`` is after the rewrite."""
        new = self.new(buf)
        return buf if new is None else new

    # ---- statements
    def stmt(self, s):
        if isinstance(s, s_tir.SBlockRealize):
            return s_tir.SBlockRealize([self.expr(v) for v in s.iter_values], self.expr(s.predicate),
                                       self.block(s.block))
        if isinstance(s, tirx.SeqStmt):
            return tirx.SeqStmt([self.stmt(x) for x in s.seq])
        if isinstance(s, tirx.For):
            return tirx.For(s.loop_var, self.expr(s.min), self.expr(s.extent), s.kind, self.stmt(s.body),
                            s.thread_binding, s.annotations, s.step)
        if isinstance(s, tirx.IfThenElse):
            return tirx.IfThenElse(self.expr(s.condition), self.stmt(s.then_case),
                                   self.stmt(s.else_case) if s.else_case is not None else None)
        if isinstance(s, tirx.AttrStmt):
            return tirx.AttrStmt(s.node, s.attr_key, self.expr(s.value), self.stmt(s.body))
        if isinstance(s, tirx.Evaluate):
            return tirx.Evaluate(self.expr(s.value))
        if isinstance(s, tirx.BufferStore):
            return self.store(s)
        raise Unsupported(type(s).__name__)

    def block(self, b):
        if any(self.new(m.source.source) is not None for m in b.match_buffers):
            raise Unsupported("match_buffer of a widened buffer")
        return s_tir.SBlock(iter_vars=b.iter_vars, reads=[self.region(r) for r in b.reads],
                            writes=[self.region(r) for r in b.writes], name_hint=b.name_hint,
                            body=self.stmt(b.body), init=self.stmt(b.init) if b.init is not None else None,
                            alloc_buffers=[self.own(a) for a in b.alloc_buffers],
                            match_buffers=b.match_buffers, annotations=b.annotations)

    def region(self, r):
        ranges = [tvm_ir.Range.from_min_extent(self.expr(x.min), self.expr(x.extent)) for x in r.region]
        return tirx.BufferRegion(self.own(r.source), ranges)

    def store(self, st):
        idx = [self.expr(i) for i in st.indices]
        new = self.new(st.buffer)
        if new is None:
            return tirx.BufferStore(st.buffer, self.expr(st.value), idx)
        term = _accumulated(st)
        if term is not None:
            value = pe.Add(tirx.BufferLoad(new, idx), self.wide(term, new.dtype))
        else:
            value = self.wide(st.value, new.dtype)
        return tirx.BufferStore(new, value, idx)

    def wide(self, e, dtype):
        """``e`` (a 16-bit value about to be stored) computed in ``dtype``: a cast down from
        ``dtype`` is dropped, a constant retyped, anything else cast up."""
        if isinstance(e, pe.Cast) and str(e.value.ty) == str(dtype):
            return self.expr(e.value)
        if isinstance(e, pe.FloatImm):
            return pe.FloatImm(str(dtype), e.value)
        return pe.Cast(str(dtype), self.expr(e))

    # ---- expressions
    def expr(self, e):
        if isinstance(e, ie.TensorLoad):
            idx = [self.expr(i) for i in e.indices]
            new = self.new(e.source)
            if new is None:
                return tirx.BufferLoad(e.source, idx)
            return pe.Cast(str(e.source.dtype), tirx.BufferLoad(new, idx))
        if isinstance(e, (pe.Var, pe.IntImm, pe.FloatImm, ie.StringImm)) or isinstance(e, (bool, int, float)):
            return e
        if isinstance(e, pe.Cast):
            return pe.Cast(e.ty, self.expr(e.value))
        if isinstance(e, pe.Not):
            return pe.Not(self.expr(e.a))
        if isinstance(e, (pe.BinaryOpExpr, pe.CmpExpr, pe.And, pe.Or)):
            return type(e)(self.expr(e.a), self.expr(e.b))
        if isinstance(e, pe.Select):
            return pe.Select(self.expr(e.condition), self.expr(e.true_value), self.expr(e.false_value))
        if isinstance(e, pe.Let):
            return pe.Let(e.var, self.expr(e.value), self.expr(e.body))
        if isinstance(e, pe.Ramp):
            return pe.Ramp(self.expr(e.base), self.expr(e.stride), e.lanes)
        if isinstance(e, pe.Broadcast):
            return pe.Broadcast(self.expr(e.value), e.lanes)
        if isinstance(e, ie.Call):
            return ie.Call(e.op, [self.expr(a) for a in e.args], e.attrs, e.ty_args, ret_ty=e.ty)
        raise Unsupported(type(e).__name__)
