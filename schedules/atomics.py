"""Atomic write-back for nests whose rows repeat (hyb's split rows, several column parts).

The emitter writes such a nest as an ordinary reduction marked with ``ATOMIC_ATTR``, so a
schedule can accumulate a row's partial result in registers. This pass then makes every
store of a marked block that reaches global memory an atomic of the nest's reduction, and
drops a marked block's initialisation of global memory (the fill nest has already set the
identity): one atomic per output element per (split) row instead of one per stored entry.

Sum: ``atomicAdd``. Max and min (a row max of a softmax on hyb): CUDA has atomicMax/Min for
integers only, so a float max is made of the integer ones on the value's bits
(``_atomic_float_minmax``), with no helper function or CAS loop:

    max, v's sign bit clear:  atomicMax((int *) p, bits(v))
    max, v's sign bit set:    atomicMin((unsigned int *) p, bits(v))
    min: the mirror (atomicMin on int for a clear sign bit, atomicMax on unsigned otherwise)

Why it is right: IEEE floats with a clear sign bit order like their bits as signed ints,
and any float with the sign bit set is a negative signed int, below all of them; floats
with the sign bit set order *reversed* as unsigned ints (a larger magnitude is a larger
unsigned and a smaller float), and every one of them is an unsigned >= 2^31, above any float
with a clear sign bit. So for v >= +0, a signed max leaves a non-negative current value c
at max(c, v) and replaces a negative c by v; for v <= -0, an unsigned min keeps a
non-negative c (a small unsigned) and picks the larger of two negatives. The fill nest's
initial value, the max identity (T.min_value: -FLT_MAX, 0xff7fffff; -inf, 0xff800000, alike),
is below every float as a signed int and above every other negative float as an unsigned,
so either branch replaces it (min: the mirror, from +FLT_MAX). The test is the sign *bit*, not
``v >= 0``: -0.0 >= 0 holds, yet as a signed int -0.0 is INT_MIN and would never replace
-inf. NaN is not ordered (as with T.max on a GPU, a NaN partial result is not propagated
reliably). float64 uses the 64-bit forms (long long / unsigned long long), int32 the
native atomicMax/Min.
"""
from __future__ import annotations

from sparsec.ir_attrs import ATOMIC_ATTR

from .tir_rewrite import map_blocks, map_stores, stores, with_fields
from .tvm_modules import s_tir, tirx, tvm_ffi, tvm_ir

# output dtypes with an atomic max/min here (CUDA has no 16-bit atomicMax)
ATOMIC_MINMAX_DTYPES = ("float32", "float64", "int32")
_BITS = {"float32": ("int32", "uint32"), "float64": ("int64", "uint64")}


def atomic_writeback(func: tirx.PrimFunc) -> tirx.PrimFunc:
    marked = set()
    kinds = _reduction_kinds(func)

    def visit(block: s_tir.SBlock):
        if ATOMIC_ATTR not in block.annotations:
            if any(block.name_hint == f"{m}_init" for m in marked) and _writes_global(block):
                # decompose_reduction's init of a marked block: the fill nest did it already
                return with_fields(block, body=tirx.Evaluate(0), writes=[])
            return None
        marked.add(block.name_hint)
        init = block.init
        if init is not None and _stores_global(init):
            init = None
        body = map_stores(block.body, lambda st: _atomic(st, kinds))
        return with_fields(block, body=body, init=init)

    return func.with_body(map_blocks(func.body, visit))


def mark_atomic(sch: s_tir.Schedule, block) -> None:
    """Let ``block`` (e.g. cache_write's write-back of a marked block) store atomically."""
    sch.annotate(block, ATOMIC_ATTR, 1)


def _is_global(buf) -> bool:
    return buf.scope() in ("global", "")


def _writes_global(block) -> bool:
    return any(_is_global(w.buffer) for w in block.writes)


def _stores_global(stmt) -> bool:
    return any(_is_global(st.buffer) for st in stores(stmt))


def _combine(store: tirx.BufferStore):
    """(kind, operand) when ``store`` is ``X[i] = X[i] op v`` for op in +, max, min."""
    value = store.value
    for node, kind in ((tirx.Add, "sum"), (tirx.Max, "max"), (tirx.Min, "min")):
        if isinstance(value, node):
            if _is_same_load(value.a, store):
                return kind, value.b
            if _is_same_load(value.b, store):
                return kind, value.a
    return None


def _reduction_kinds(func) -> list:
    """(buffer, kind) of every marked block's max/min update: after cache_write the marked
    compute block updates a local accumulator (``acc = T.max(acc, v)``) and a marked
    write-back block copies it to global memory, which then needs that kind of atomic."""
    found = []

    def visit(block: s_tir.SBlock):
        if ATOMIC_ATTR in block.annotations:
            for st in stores(block.body):
                c = _combine(st)
                if c is not None and c[0] != "sum":
                    found.append((st.buffer, c[0]))
        return None

    map_blocks(func.body, visit)
    return found


def _atomic(store: tirx.BufferStore, kinds):
    if not _is_global(store.buffer):
        return None
    c = _combine(store)
    if c is not None:
        kind, value = c
    else:  # a write-back of a register accumulator: the kind of the update that filled it
        value = store.value
        src = value.source if isinstance(value, tvm_ir.TensorLoad) else None
        kind = next((k for b, k in kinds if src is not None and b.same_as(src)), "sum")
    if kind == "sum":
        target = tirx.BufferLoad(store.buffer, store.indices)
        return tirx.Evaluate(tirx.call_extern(store.buffer.dtype, "atomicAdd", tirx.address_of(target), value))
    return _atomic_minmax(store, kind, value)


def _atomic_minmax(store: tirx.BufferStore, kind: str, value):
    dtype = str(store.buffer.dtype)
    fn = "atomicMax" if kind == "max" else "atomicMin"
    if dtype == "int32":
        target = tirx.BufferLoad(store.buffer, store.indices)
        return tirx.Evaluate(tirx.call_extern(dtype, fn, tirx.address_of(target), value))
    if dtype not in _BITS:
        raise ValueError(f"an atomic {kind} of {dtype} values is not supported (only {ATOMIC_MINMAX_DTYPES})")
    return _atomic_float_minmax(store, kind, value)


def _atomic_float_minmax(store: tirx.BufferStore, kind: str, value):
    """The float max/min of the module docstring, through int/uint aliases of the buffer."""
    signed, unsigned = _BITS[str(store.buffer.dtype)]
    buf = store.buffer
    as_signed = tirx.decl_buffer(buf.shape, signed, name=f"{buf.name}_bits", data=buf.data)
    as_unsigned = tirx.decl_buffer(buf.shape, unsigned, name=f"{buf.name}_ubits", data=buf.data)
    v = tirx.Var("atomic_v", buf.dtype)
    bits = tirx.reinterpret(signed, v)
    non_negative_fn, negative_fn = ("atomicMax", "atomicMin") if kind == "max" else ("atomicMin", "atomicMax")
    non_negative = tirx.Evaluate(tirx.call_extern(signed, non_negative_fn,
                                                  tirx.address_of(tirx.BufferLoad(as_signed, store.indices)), bits))
    negative = tirx.Evaluate(tirx.call_extern(unsigned, negative_fn,
                                              tirx.address_of(tirx.BufferLoad(as_unsigned, store.indices)),
                                              tirx.reinterpret(unsigned, v)))
    branch = tirx.IfThenElse(bits >= tirx.const(0, signed), non_negative, negative)
    return tirx.SeqStmt([tirx.DeclBuffer(as_signed, data=buf.data), tirx.DeclBuffer(as_unsigned, data=buf.data), tirx.Bind(v, value), branch])


def _is_same_load(e, store) -> bool:
    return (isinstance(e, tvm_ir.TensorLoad) and e.source.same_as(store.buffer)
            and len(e.indices) == len(store.indices)
            and all(tvm_ffi.structural_equal(a, b) for a, b in zip(e.indices, store.indices)))
