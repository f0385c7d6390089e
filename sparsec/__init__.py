"""sparsec: a sparse tensor compiler for deep learning on Apache TVM.

    import sparsec
    A = sparsec.formats.convert(scipy_matrix, "bsr:4x4")
    kernel = sparsec.compile("spmm", A, feat=64, target="llvm")
    C = kernel(A, B)
"""
import os as _os

# A source checkout on PYTHONPATH (as on the GPU host) keeps formats/ and schedules/ beside this
# package; an installed sparsec has them mapped inside it (pyproject's package-dir).
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if not _os.path.isdir(_os.path.join(__path__[0], "formats")) and _os.path.isfile(
        _os.path.join(_root, "formats", "__init__.py")):
    __path__.append(_root)

from ._version import __version__  # noqa: E402,F401

from . import formats  # noqa: E402
from .kernel import Kernel  # noqa: E402
from .runtime import load  # noqa: E402
from .targets import choose_cuda_compiler  # noqa: E402

choose_cuda_compiler()  # before any CUDA module is loaded: NVRTC only where cuda-bindings is present

# The compiler side (DSL, lowering, schedules) imports TVM's compiler, which a runtime-only
# TVM (TVM_USE_RUNTIME_LIB=1, where exported modules are loaded) does not have: import it on
# first use, so that ``import sparsec; sparsec.load(path)`` works there.
_LAZY = {"compile": ("api", "compile"), "dsl": ("dsl", None), "inspect": ("inspect", None),
         "ops": ("ops", None)}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = importlib.import_module(f".{module}", __name__)
        value = getattr(value, attr) if attr else value
        globals()[name] = value
        return value
    raise AttributeError(f"module 'sparsec' has no attribute {name!r}")


__all__ = ["compile", "load", "Kernel", "dsl", "formats", "inspect", "ops", "__version__"]
