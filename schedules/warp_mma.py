"""What the hand-written warp-level Tensor Core kernels (``tc_pipeline``,
``srbcrs_tensorcore``) share: argument checks that name the bad argument, compiling a
PrimFunc for one CUDA architecture, and reading back the CUDA source TVM keeps."""
from __future__ import annotations

from typing import Dict, Sequence


def check_sizes(**sizes: int):
    """Every size a positive int, else ValueError naming it."""
    for name, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} should be a positive int, got {v!r}")


def check_choice(name: str, value, choices: Sequence):
    if value not in choices:
        raise ValueError(f"{name} should be one of {list(choices)}, got {value!r}")


def check_knobs(knobs: Dict[str, int], choices: Dict[str, Sequence[int]]):
    """Every knob one the kernel has, set to one of its choices; else ValueError naming it."""
    unknown = sorted(set(knobs) - set(choices))
    if unknown:
        raise ValueError(f"unknown knob(s) {unknown}: this kernel's knobs are {list(choices)}")
    for name, value in knobs.items():
        check_choice(name, value, sorted(choices[name]))


def compile_for(func, arch: str):
    """The TVM executable of ``func`` for CUDA ``arch`` (sm_80, sm_90a, ...)."""
    import tvm

    return tvm.compile(func, target=tvm.target.Target({"kind": "cuda", "arch": arch}))


def cuda_source(ex) -> str:
    """The CUDA source TVM keeps in the module (compiled when the module is loaded)."""
    return ex.mod.imports[0].inspect_source("cuda")

