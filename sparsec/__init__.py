"""sparsec: a sparse tensor compiler for deep learning on Apache TVM.

    import sparsec
    A = sparsec.formats.convert(scipy_matrix, "bsr:4x4")
    kernel = sparsec.compile("spmm", A, feat=64, target="llvm")
    C = kernel(A, B)

Every public name is imported on first use (PEP 562): ``import sparsec`` costs nothing, so
the command line starts fast and a runtime-only TVM (``TVM_USE_RUNTIME_LIB=1``, where
exported modules are loaded) never meets the compiler it lacks.
"""
import importlib as _importlib
import os as _os

from ._version import __version__

# A source checkout on PYTHONPATH (as on the GPU host) keeps formats/ and schedules/ beside this
# package; an installed sparsec has them mapped inside it (pyproject's package-dir).
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if not _os.path.isdir(_os.path.join(__path__[0], "formats")) and _os.path.isfile(
        _os.path.join(_root, "formats", "__init__.py")):
    __path__.append(_root)

# public name -> (submodule, attribute or None for the submodule itself)
_LAZY = {
    "compile": ("api", "compile"),  # resolves knobs="tuned" through sparsec.tune, then sparsec.build
    "load": ("runtime", "load"),
    "Kernel": ("kernel", "Kernel"),
    "formats": ("formats", None),
    "dsl": ("dsl", None),
    "inspect": ("inspect", None),
    "ops": ("ops", None),
}


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'sparsec' has no attribute {name!r}")
    module, attr = _LAZY[name]
    value = _importlib.import_module(f".{module}", __name__)
    value = getattr(value, attr) if attr else value
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["compile", "load", "Kernel", "dsl", "formats", "inspect", "ops", "__version__"]
