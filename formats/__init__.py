"""Sparse formats as compositions of axes, and conversion of user matrices into them.

    from sparsec.formats import convert
    inst = convert(scipy_matrix, "bsr:4x4")     # FormatInstance: arrays, data, shape
    inst.to_scipy()                               # exact round trip

Note: the name ``convert`` here is the function; the module is ``formats.convert``
(import ``as_csr`` from it with ``from sparsec.formats.convert import as_csr``).
"""
from __future__ import annotations

from . import bsr, bsr_csr, csr, ell, hyb, nm, rell, srbcrs, validate
from .axes import AXIS_KINDS, Axis, DenseFixed, DenseVariable, SparseFixed, SparseVariable
from .base import SUPPORTED_VALUE_DTYPES, Format, FormatInstance
from .composite import CompositeFormat, CompositeInstance
from .convert import as_csr
from .registry import families, make_format, module_for, parse_spec


def convert(matrix, fmt_or_spec, **kw) -> FormatInstance:
    """``matrix`` (anything ``as_csr`` accepts) stored in a format given as a Format or
    a spec string; keyword arguments (shape, dtype, block, width) override the spec's."""
    if isinstance(fmt_or_spec, (Format, CompositeFormat)):
        m, params = module_for(fmt_or_spec), dict(fmt_or_spec.params)
    else:
        m, params = parse_spec(fmt_or_spec)
    params.update(kw)
    return m.from_matrix(matrix, **params)


__all__ = [
    "Axis", "DenseFixed", "DenseVariable", "SparseFixed", "SparseVariable", "AXIS_KINDS",
    "Format", "FormatInstance", "CompositeFormat", "CompositeInstance", "SUPPORTED_VALUE_DTYPES",
    "make_format", "families", "module_for", "parse_spec", "convert", "as_csr",
    "csr", "bsr", "ell", "nm", "srbcrs", "rell", "hyb", "bsr_csr", "validate",
]
