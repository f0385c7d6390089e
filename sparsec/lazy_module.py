"""Modules imported on first use. TVM (and tvm_ffi, which imports torch where it is
installed) take seconds to import; code that only names schedules and their knobs -- the
cost model's features, a learned format pick -- never builds a kernel and should not pay it."""
from __future__ import annotations

import importlib
import types


class LazyModule(types.ModuleType):
    """Stands in for the module ``name``: the first attribute read imports it, and every read
    is answered by the real module from then on."""

    def __init__(self, name: str):
        super().__init__(name)
        self.__dict__["_lazy_real"] = None

    def _real(self) -> types.ModuleType:
        real = self.__dict__["_lazy_real"]
        if real is None:
            real = importlib.import_module(self.__name__)
            self.__dict__["_lazy_real"] = real
        return real

    def __getattr__(self, attr: str):
        return getattr(self._real(), attr)

    def __dir__(self):
        return dir(self._real())


def lazy(name: str) -> types.ModuleType:
    """The module ``name``, imported when first used (``tvm = lazy("tvm")``)."""
    return LazyModule(name)
