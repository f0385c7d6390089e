"""Which transformations schedule a program on a target, found without scheduling it.

The default schedules (``default_cpu``, ``default_cuda``, the Tensor Core template) decide
per nest which transformation runs; :func:`templates` gives the same answer as data, so
that the tuner derives its search space from the declarations (``schedules.knobs``)
instead of declaring knobs again: each transformation with the shapes of the nests it
schedules and the subjects it is applied to (nests, or the whole program for the Tensor
Core template), which its ``prune`` and ``resolve`` take.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

from . import bsr_dispatch, cpu, csr_split, cuda, tensorcore, tensorcore_packed, tensorcore_sddmm
from .knobs import ANY, Transformation, group

TARGET_KINDS = ("llvm", "cuda")


@dataclass(frozen=True)
class Use:
    """One transformation of a program's schedule, with the shapes of the nests it runs on."""

    transformation: Transformation
    shapes: Tuple[str, ...]
    subjects: Tuple[Any, ...]

    @property
    def knobs(self) -> Tuple[str, ...]:
        """The knobs that take effect here."""
        return self.transformation.knobs_for(self.shapes)


def templates(program, target_kind: str, knobs: Optional[dict] = None, shape: Optional[Tuple[int, int]] = None,
              density: Optional[float] = None, clusters: bool = True,
              rows: Optional[Tuple[int, float]] = None) -> List[Use]:
    """The transformations the default schedule applies to ``program`` on ``target_kind``
    ("llvm" or "cuda"); ``knobs`` as far as they decide the template (the Tensor Core
    template's ``n_tile``, a CUDA-core knob that keeps an SDDMM off Tensor Cores);
    ``shape`` and ``density`` (stored entries per element) of the matrix a kernel is
    compiled for, where they decide it as they do in ``sparsec.compile`` (BSR float16 at few
    columns: ``bsr_ring``, ``bsr_stream`` or the block-row template); ``clusters``: the CUDA
    arch has thread-block clusters (sm_90 on), as ``sparsec.compile`` reads it off the target;
    ``rows``: (the longest row's stored entries, the mean), where they decide it (CSR float32
    SpMM on skewed rows: ``csr_split``)."""
    if target_kind not in TARGET_KINDS:
        raise ValueError(f"target_kind should be one of {TARGET_KINDS}, got {target_kind!r}")
    packed = tensorcore_packed.match(program, target_kind, shape=shape, density=density, clusters=clusters)
    if packed is not None and not bsr_dispatch.defers(packed, knobs):
        return [Use(tensorcore_packed.transformation_for(packed, knobs), (ANY,), (program,))]
    if tensorcore.applies(program, target_kind, knobs):
        return [Use(tensorcore.bsr_tensorcore, (ANY,), (program,))]
    if tensorcore_sddmm.applies(program, target_kind, knobs):
        return [Use(tensorcore_sddmm.bsr_tensorcore_sddmm, (ANY,), (program,))]
    if csr_split.applies(program, target_kind, knobs, rows):
        return [Use(csr_split.csr_split_spmm, (ANY,), (program,))]
    steps = cpu.plan(program) if target_kind == "llvm" else cuda.plan(program)
    return [Use(t, shapes, nests) for t, shapes, nests in group(steps)]
