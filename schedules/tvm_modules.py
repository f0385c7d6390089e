"""The TVM modules the schedules use, bound lazily (``sparsec.lazy_module``): importing a
schedule to read its knobs -- the cost model's features, a learned format pick -- costs no
TVM import; the first schedule applied or kernel built imports it."""
from __future__ import annotations

import importlib
import sys

from ..lazy_module import lazy
from ..tvmscript_stack import shallow_stack

tvm = lazy("tvm")
tvm_ffi = lazy("tvm_ffi")
s_tir = lazy("tvm.s_tir")
tirx = lazy("tvm.tirx")
tvm_ir = lazy("tvm.ir")
ie = lazy("tvm.ir.expr")  # TVM's expression nodes: calls, tensor loads
pe = lazy("tvm.ir.prim.expr")  # its primitive expressions: vars, arithmetic, casts
te = lazy("tvm.tirx.expr")  # TIR's own (buffer loads)
T = lazy("tvm.script.tirx")  # TVMScript


def cuda_intrinsics():
    """``tvm.s_tir.tensor_intrin.cuda`` (TVM's ldmatrix / mma / fill / store intrinsics),
    imported with :func:`sparsec.tvmscript_stack.shallow_stack`: its ~500 TVMScript parses
    otherwise take over a minute in a process with torch loaded."""
    name = "tvm.s_tir.tensor_intrin.cuda"
    if name in sys.modules:
        return sys.modules[name]
    with shallow_stack():
        return importlib.import_module(name)
