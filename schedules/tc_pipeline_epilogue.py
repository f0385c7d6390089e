"""The epilogue of ``tc_pipeline``: the fp32 accumulators plus the bias, through the
activation, cast and written to C (or to C transposed), so that a linear layer's bias and
activation cost no extra pass over its output.

Where C's stored rows take whole 16-byte chunks (``Plan.staged``), the block's outputs are
first staged in shared memory (reusing the pipeline's buffers) and C is written with one
16-byte store per 8 fp16 outputs; half2 stores straight from the fragments made the FFN's
short-K layers L2-request bound. Otherwise each output is stored on its own, guarded."""
from __future__ import annotations

from types import SimpleNamespace

from .tc_pipeline_plan import Plan


def activation_fn(activation: str):
    """``activation`` as a function of a float32 PrimExpr."""
    from tvm.script import tirx as T

    def erf(x):
        """erf by Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7, float32's own precision):
        one exp and one reciprocal. CUDA's erff made the FFN's first kernel twice as slow
        (H200: 27.2 vs 14.4 us at 4096 tokens; tanh GELU 17.8 us)."""
        ax = T.abs(x)
        t = T.float32(1) / (T.float32(1) + T.float32(0.3275911) * ax)
        poly = t * (T.float32(0.254829592) + t * (T.float32(-0.284496736) + t * (
            T.float32(1.421413741) + t * (T.float32(-1.453152027) + t * T.float32(1.061405429)))))
        e = T.float32(1) - poly * T.exp(-ax * ax)
        return T.if_then_else(x < T.float32(0), -e, e)

    def activate(v):
        if activation == "gelu":  # erf GELU, as BERT's FFN
            return T.float32(0.5) * v * (T.float32(1) + erf(v * T.float32(0.7071067811865476)))
        if activation == "gelu_tanh":  # PyTorch's gelu(approximate="tanh")
            return T.float32(0.5) * v * (T.float32(1) + T.tanh(
                T.float32(0.7978845608028654) * (v + T.float32(0.044715) * v * v * v)))
        if activation == "relu":
            return T.max(v, T.float32(0))
        return v

    return activate


def epilogue_macros(p: Plan) -> SimpleNamespace:
    """The macro ``write_c`` for plan ``p``."""
    from tvm.script import tirx as T

    wait = T.ptx["cp.async.wait_group"]
    activate = activation_fn(p.activation)

    def finished(Bias, v, row, col, act: bool = True):
        """The fp32 accumulator of output ``(row, col)`` with the bias (and, with ``act``, the
        activation) applied."""
        if p.bias:
            b = Bias[T.min(row, p.M - 1)] if p.bias_axis == "row" else Bias[T.min(col, p.N - 1)]
            v = v + (b if p.bias_dtype == "float32" else T.Cast("float32", b))
        return activate(v) if act else v

    def out_line(it, tid):
        return (it * p.NT + tid) // p.o_per_line

    def out_off(it, tid):
        return (it * p.NT + tid) % p.o_per_line * p.VO

    def staged_at(it, tid, e):
        return out_line(it, tid) * p.LDC + out_off(it, tid) + e

    @T.macro
    def stage_fragments(Cs, Bias, acc, bm0, bn0, wr, wc, tx):
        """Every warp's fragments, biased and cast, into the staging tile once the pipeline's
        last copies have landed (the tile reuses their buffers)."""
        wait(0)
        T.tvm_storage_sync("shared")
        for i in T.unroll(p.mt):
            for n in T.unroll(p.nt):
                for hh in T.unroll(2):
                    for h in T.unroll(2):
                        r = wr + i * 16 + tx // 4 + hh * 8
                        c = wc + n * 8 + tx % 4 * 2 + h
                        v = finished(Bias, acc[(i * p.nt + n) * 4 + hh * 2 + h], bm0 + r, bn0 + c, False)
                        if p.transpose_c:
                            Cs[c * p.LDC + r] = T.Cast(p.out_dtype, v)
                        else:
                            Cs[r * p.LDC + c] = T.Cast(p.out_dtype, v)
        T.tvm_storage_sync("shared")

    @T.macro
    def copy_out(C, Cs, ob, bm0, bn0, tid):
        """The staged block to C, 16 bytes per thread and store, guarded at C's edges (the
        indices are written out inline: a named intermediate would hide the contiguous
        16-byte access from TVM's vectorizer). The activation is applied here, to the
        output-precision values, in registers and in a loop that is not unrolled: unrolled
        over the whole fragment, the inlined erf made the kernel twice as slow. (Dense
        PyTorch also activates the layer's rounded fp16 output.)"""
        for it in T.unroll(p.o_it) if p.activation == "none" else T.serial(p.o_it):
            if p.activation != "none":
                for e in T.unroll(p.VO):
                    ob[e] = T.Cast(p.out_dtype, activate(T.Cast("float32", Cs[staged_at(it, tid, e)])))
            if p.transpose_c:
                if T.And(it * p.NT + tid < p.BN * p.o_per_line,
                         T.And(bn0 + out_line(it, tid) < p.N, bm0 + out_off(it, tid) < p.M)):
                    for e in T.vectorized(p.VO):
                        C[bn0 + out_line(it, tid), bm0 + out_off(it, tid) + e] = \
                            (Cs[staged_at(it, tid, e)] if p.activation == "none" else ob[e])
            else:
                if T.And(it * p.NT + tid < p.BM * p.o_per_line,
                         T.And(bm0 + out_line(it, tid) < p.M, bn0 + out_off(it, tid) < p.N)):
                    for e in T.vectorized(p.VO):
                        C[bm0 + out_line(it, tid), bn0 + out_off(it, tid) + e] = \
                            (Cs[staged_at(it, tid, e)] if p.activation == "none" else ob[e])

    @T.macro
    def store_fragments(C, Bias, acc, bm0, bn0, wr, wc, tx):
        """Every output straight from the fragments, guarded: for C whose stored rows do not
        take whole 16-byte chunks."""
        for i in T.unroll(p.mt):
            for n in T.unroll(p.nt):
                for hh in T.unroll(2):
                    for h in T.unroll(2):
                        row = bm0 + wr + i * 16 + tx // 4 + hh * 8
                        col = bn0 + wc + n * 8 + tx % 4 * 2 + h
                        if T.And(row < p.M, col < p.N):
                            v = finished(Bias, acc[(i * p.nt + n) * 4 + hh * 2 + h], row, col)
                            if p.transpose_c:
                                C[col, row] = T.Cast(p.out_dtype, v)
                            else:
                                C[row, col] = T.Cast(p.out_dtype, v)

    @T.macro
    def write_c(C, Cs, Bias, ob, acc, bm0, bn0, wr, wc, tx, tid):
        """The block's accumulators, finished, into C (the choice made when the kernel runs
        where C's row length is only known then: the same for every block)."""
        if p.staged is True:
            stage_fragments(Cs, Bias, acc, bm0, bn0, wr, wc, tx)
            copy_out(C, Cs, ob, bm0, bn0, tid)
        elif p.staged is False:
            store_fragments(C, Bias, acc, bm0, bn0, wr, wc, tx)
        else:
            if p.staged:
                stage_fragments(Cs, Bias, acc, bm0, bn0, wr, wc, tx)
                copy_out(C, Cs, ob, bm0, bn0, tid)
            else:
                store_fragments(C, Bias, acc, bm0, bn0, wr, wc, tx)

    return SimpleNamespace(write_c=write_c)
