"""The TVM modules the schedules use, bound lazily (``sparsec.lazy_module``): importing a
schedule to read its knobs -- the cost model's features, a learned format pick -- costs no
TVM import; the first schedule applied or kernel built imports it."""
from __future__ import annotations

from ..lazy_module import lazy

tvm = lazy("tvm")
tvm_ffi = lazy("tvm_ffi")
s_tir = lazy("tvm.s_tir")
tirx = lazy("tvm.tirx")
tvm_ir = lazy("tvm.ir")
ie = lazy("tvm.ir.expr")  # TVM's expression nodes: calls, tensor loads
pe = lazy("tvm.ir.prim.expr")  # its primitive expressions: vars, arithmetic, casts
te = lazy("tvm.tirx.expr")  # TIR's own (buffer loads)
T = lazy("tvm.script.tirx")  # TVMScript
