"""compile(): operator x format x target -> Kernel.

lower (sparsec.lower) -> schedule (sparsec.schedules, the target's default template
with any knobs given) -> tvm.compile. CUDA kernels compile on a machine without a
GPU: TVM keeps their CUDA source in the module (``Kernel.source()``).
"""
from __future__ import annotations

import os
import time
from typing import Any, Dict, Optional, Tuple, Union

import numpy as np
import tvm
from tvm import s_tir

from . import ops as library
from .dsl import Operator
from .dtypes import dtype_spec
from .expr import BinOp, Call, Const, walk
from .formats import Format, FormatInstance, make_format
from .formats.composite import CompositeFormat, CompositeInstance
from .kernel import Kernel, ParamSpec
from .lower import lower_program
from .schedules import (bsr_dispatch, csr_split, default_cpu, default_cuda, finalize_cpu, finalize_cuda,
                        segment_contract, tensorcore, tensorcore_packed, tensorcore_sddmm)
from .targets import parse_target

UNROLL_MODES = ("explicit", "pragma")
DEFAULT_UNROLL = "pragma"  # measured on the H200: same kernel times (geomean 1.002), builds up to 2.5x faster


def cuda_unroll_config(mode: Optional[str] = None) -> Dict[str, Any]:
    """TVM pass config for the CUDA templates' unrolled loops. ``explicit`` (TVM copies the
    loop body) or ``pragma`` (TVM emits ``#pragma unroll`` and nvcc unrolls); the mode comes
    from ``SPARSEC_CUDA_UNROLL`` when not given. Why it matters: hyb with many parts and
    interleaved row groups unrolls into megabytes of CUDA source when TVM copies the bodies,
    and its build then takes a minute instead of seconds."""
    mode = mode or os.environ.get("SPARSEC_CUDA_UNROLL") or DEFAULT_UNROLL
    if mode not in UNROLL_MODES:
        raise ValueError(f"SPARSEC_CUDA_UNROLL should be one of {list(UNROLL_MODES)}, got {mode!r}")
    return {} if mode == "explicit" else {"tirx.UnrollLoop": {"explicit_unroll": False}}


def compile(op: Union[str, Operator], fmt: Union[str, Format, FormatInstance, CompositeInstance, None] = None, *,
            target: str = "llvm",
            dtype: Optional[str] = None, knobs: Optional[Dict[str, Any]] = None, dump_ir: Optional[str] = None,
            **params: int) -> Kernel:
    """Compile ``op`` (a library name or a DSL Operator) for ``fmt`` (a spec such as
    ``"bsr:4x4"``, a Format, or a converted matrix whose format and dtype are used).
    Compile-time extents such as ``feat=64`` go in ``params``. Without ``fmt`` the format is
    the one the operator's declared axis kinds describe (``Operator.default_format``).
    ``knobs`` is a dict of schedule knobs; ``knobs="tuned"`` is resolved from the tuning logs
    by ``sparsec.compile`` (``sparsec.api``), above this compiler."""
    t0 = time.perf_counter()
    operator = library.get(op) if isinstance(op, str) else op
    if not isinstance(operator, Operator):
        raise TypeError(f"op should be an operator name or a sparsec.dsl.Operator, got {type(op).__name__}")
    if fmt is None:
        fmt = operator.default_format()
    if isinstance(knobs, str):
        raise ValueError(f"knobs should be a dict of schedule knobs, got {knobs!r}; knobs='tuned' is resolved from "
                         "the tuning logs by sparsec.compile (sparsec.api.compile), not by sparsec.build.compile")
    splits = instance = None
    if isinstance(fmt, (FormatInstance, CompositeInstance)):
        dtype = dtype or fmt.value_dtype
        splits = _segment_splits(fmt)
        instance, fmt = fmt, fmt.format
    elif isinstance(fmt, str):
        fmt = make_format(fmt)
    if isinstance(fmt, CompositeFormat):
        parts = fmt.parts
    elif isinstance(fmt, Format):
        parts = (fmt,)
    else:
        raise TypeError(f"fmt should be a format spec, Format or converted matrix, got {type(fmt).__name__}")
    unset = [a.name for p in parts for a in p.axes[1:] if getattr(a, "width", 1) is None]
    if unset:
        raise ValueError(f"format {fmt.spec} needs its width to compile (axis {unset[0]}); give 'ell:W' "
                         "or compile for a converted matrix, whose width is known")
    dtype = dtype_spec(dtype or "float32").name
    refuse_unsupported(operator, fmt, dtype)
    spec = parse_target(target)
    if spec.kind == "cuda":
        refuse_on_cuda(operator, fmt)
    func, program = lower_program(operator, fmt, params, dtype, dump_ir=dump_ir, atomics=spec.kind == "cuda",
                                  segment_splits=splits)
    config, params = {}, _param_specs(program)
    packed = tensorcore_packed.match(program, spec.kind, kc=_gathered_row_length(instance),
                                     shape=None if instance is None else instance.shape,
                                     density=_density(instance), clusters=spec.has_clusters,
                                     skew=_row_skew(instance))
    if packed is not None and bsr_dispatch.defers(packed, knobs):
        packed = None  # BSR: the block-row template's knobs given, or a matrix where it wins
    if packed is not None:  # 2:4 mma.sp, vector-wise N:M and int8 SR-BCRS SpMM on Tensor Cores
        sch, used = tensorcore_packed.schedule(program, packed, **(knobs or {}))
        mod, params = sch.mod, [ParamSpec(*p) for p in tensorcore_packed.kernel_params(program, packed)]
    elif tensorcore.applies(program, spec.kind, knobs):  # BSR fp16/bf16 SpMM on Tensor Cores
        sch, used = tensorcore.schedule(program, shape=None if instance is None else instance.shape, **(knobs or {}))
        mod, config = sch.mod, tensorcore.PASS_CONFIG
    elif tensorcore_sddmm.applies(program, spec.kind, knobs):  # block SDDMM fp16/bf16 on Tensor Cores
        sch, used = tensorcore_sddmm.schedule(program, **(knobs or {}))
        mod, config = sch.mod, tensorcore_sddmm.PASS_CONFIG
    elif csr_split.applies(program, spec.kind, knobs, row_lengths(instance)):  # CSR fp32, entries over warps
        mod, used = csr_split.schedule(program, **(knobs or {}))
        params = [ParamSpec(*p) for p in csr_split.kernel_params(program)]
    else:
        sch = s_tir.Schedule(func, enable_check=False)  # data-dependent predicates are non-affine
        template = default_cpu if spec.kind == "llvm" else default_cuda
        used = template(sch, program, **(knobs or {}))
        mod = finalize_cuda(sch.mod, program) if spec.kind == "cuda" else finalize_cpu(sch.mod, program)
        if spec.kind == "cuda":
            config = cuda_unroll_config()
    with spec.tvm_target(), tvm.transform.PassContext(opt_level=2, config=config):
        ex = tvm.compile(mod, target=spec.tvm_target())
    kernel = Kernel(operator.name, fmt.spec, spec, dtype, params, used, ex,
                    compile_s=time.perf_counter() - t0, script=mod.script())
    if packed is not None and packed.layout == "bsr_tokens":  # TMA rows, 16-byte stores: checked per call
        kernel.extra["shape_multiple"] = tensorcore_packed.TOKEN_MAJOR_MULTIPLE
    return kernel


def _density(inst) -> Optional[float]:
    """Stored entries per element of the matrix compiled for (None without one)."""
    if not isinstance(inst, FormatInstance):
        return None
    elements = int(np.prod(inst.shape))
    return inst.nnz / elements if elements else 0.0


def row_lengths(inst) -> Optional[Tuple[int, float]]:
    """(the longest row's stored entries, the mean) by the matrix's ``indptr`` (a BSR
    matrix's block rows; None without one or with no rows): a real matrix's rows are
    uneven, and the longest walk sets the time of a kernel that gives a row one group."""
    if not isinstance(inst, FormatInstance) or "indptr" not in inst.arrays:
        return None
    lengths = np.diff(np.asarray(inst.arrays["indptr"], dtype=np.int64))
    return (int(lengths.max()), float(lengths.mean())) if lengths.size else None


def _row_skew(inst) -> Optional[float]:
    """The longest row's stored entries over the mean (None without rows or entries)."""
    rows = row_lengths(inst)
    return rows[0] / rows[1] if rows and rows[1] > 0 else None


def _gathered_row_length(inst) -> Optional[int]:
    """The gathered row length of a vector-wise N:M matrix packed for the Tensor Cores
    (``nm_tc``'s ``gather_values``), which sets the pipeline's depth; None for any other."""
    if isinstance(inst, FormatInstance) and "gather_values" in inst.arrays:
        return int(inst.arrays["gather_values"].shape[1])
    return None


def _segment_splits(inst):
    """For a kernel compiled for a converted matrix: how many blocks share a segment
    contraction's groups of rows (``schedules.segment_contract.splits_for``), from the
    matrix's row lengths, computed only if the operator has such a nest. A kernel may still
    run on other matrices of its format; the count only sets how their work is spread."""
    def splits() -> int:
        return segment_contract.splits_for(np.diff(inst.to_scipy().indptr))
    return splits


def refuse_on_cuda(operator: Operator, fmt) -> None:
    """Refuse what the CUDA templates are known to get wrong, by capability: a sparse output
    or temporary with trailing axes (``S[i, j, h]``) on a format whose parts list their rows
    (hyb's row lists) gave wrong scores on the H200 (``benchmarks/results/edge_data_H200.json``),
    while csr, ell, bsr and bsr+csr were right. Better a refusal than a wrong answer."""
    parts = fmt.parts if isinstance(fmt, CompositeFormat) else (fmt,)
    if not any(p.axes[0].sparse for p in parts):
        return
    for b in operator.buffers:
        if b.sparse and b.role != "input" and len(b.axes) > 2:
            raise ValueError(f"{operator.name} x {fmt.spec} is not supported on CUDA: the sparse {b.role} {b.name} has "
                             f"trailing axes ({', '.join(a.name for a in b.axes[2:])}) and {fmt.spec}'s parts list "
                             "their rows; compile it for csr, ell, bsr or bsr+csr on CUDA, or for llvm")


FLOAT_ONLY_CALLS = ("exp", "sqrt", "tanh", "erf")  # DSL calls whose result is not an integer


def refuse_unsupported(operator: Operator, fmt, dtype: str) -> None:
    """Refuse, before anything is lowered, an operator x format x dtype the pipeline cannot
    compile, naming the combination and why (instead of TVM's complaint about the TVMScript
    it was handed, or a kernel no matrix can be given to). By capability, never by name:

    * a format that stores one precision declares it (its ``dtype`` parameter: SR-BCRS) and
      takes kernels of that dtype only;
    * an integer precision (int8/int4 values, exact int32 results) needs a format that
      stores integers (one that declares an integer ``dtype``), and an operator that stays in
      the integers: no division, no ``exp``/``sqrt``, no fractional constant."""
    spec = dtype_spec(dtype)
    combo = f"{operator.name} x {fmt.spec} x {dtype} is not supported"
    parts = fmt.parts if isinstance(fmt, CompositeFormat) else (fmt,)
    declared = sorted({p.param("dtype") for p in parts if p.param("dtype")})
    if declared and declared != [spec.sparse]:
        raise ValueError(f"{combo}: the format stores {declared[0]} values; compile it with dtype={declared[0]!r}")
    if not spec.exact:
        return
    if not declared:
        raise ValueError(f"{combo}: {fmt.spec} stores float values, and the integer precision {dtype} needs a "
                         f"format that stores integers (srbcrs, e.g. 'srbcrs:v8,{dtype}'), or compile for float32")
    for it in operator.iterations:
        st = it.statement
        if st is None:
            continue
        for e in walk(st.value):
            fraction = isinstance(e, Const) and isinstance(e.value, float) and not e.value.is_integer()
            what = ("divides" if isinstance(e, BinOp) and e.op == "/" else
                    f"calls {e.fn}" if isinstance(e, Call) and e.fn in FLOAT_ONLY_CALLS else
                    f"uses the constant {e.value}" if fraction else None)
            if what:
                raise ValueError(
                    f"{combo}: {operator.name} {what} (iteration {it.name}), which the integer precision {dtype} "
                    f"(exact {spec.out} results) cannot compute; compile it with a float dtype (float16, float32) "
                    f"and a format that stores floats")


def index_extents(operator: Operator, bound) -> dict:
    """Buffer name -> ((extent, what it indexes), ...) for every indirect index
    (``W[E[i, j], f]``): the extents its values must stay under (int, "rows" or "cols")."""
    from .dsl import accesses

    row, col = operator.structure()
    out: dict = {}
    for it in operator.iterations:
        if it.statement is None:
            continue
        for acc in accesses(it.statement.value):
            for a, declared in zip(acc.axes, acc.buffer.axes):
                if not hasattr(a, "buffer"):
                    continue
                dim = ("lrows" if row.parent is not None else "rows") if declared is row else \
                    "cols" if declared is col else bound.extent(declared)
                use = (dim, f"axis {declared.name} of {acc.buffer.name}")
                out.setdefault(a.buffer.name, [])
                if use not in out[a.buffer.name]:
                    out[a.buffer.name].append(use)
    return {k: tuple(v) for k, v in out.items()}


def _param_specs(program):
    out = []
    op = program.bound.op
    by_name = {b.name: b for b in op.buffers}
    extents = index_extents(op, program.bound)
    for b in program.buffers:
        shape = tuple(_dim(s) for s in b.shape)
        buf = by_name.get(b.name)
        out.append(ParamSpec(b.name, b.role, b.dtype, shape, buf is not None and buf.sparse,
                             buf is not None and buf.matrix, extents.get(b.name, ())))
    outer = 1
    for a in op.outer_axes():
        outer *= program.bound.extent(a)
    for s in program.scalars:
        # lrows (rows per outer coordinate) carries the outer extent: a call derives it from rows
        out.append(ParamSpec(s, "scalar", "int32", (outer,) if s == "lrows" else ()))
    return out


def _dim(e):
    from .expr import Const, Var

    if isinstance(e, Const):
        return int(e.value)
    if isinstance(e, Var) and e.name in ("rows", "cols", "lrows"):
        return e.name
    return None
