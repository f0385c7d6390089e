"""Sparse formats as compositions of axes, and conversion of user matrices into them.

    from sparsec.formats import convert
    inst = convert(scipy_matrix, "bsr:4x4")     # FormatInstance: arrays, data, shape
    inst.to_scipy()                               # exact round trip

Note: the name ``convert`` here is the function; the module is ``formats.convert``
(import ``as_csr`` from it with ``from sparsec.formats.convert import as_csr``).
"""
from __future__ import annotations

from . import bsr, bsr_csr, choose, csr, ell, hyb, nm, rell, srbcrs, tiled, validate
from .axes import AXIS_KINDS, Axis, DenseFixed, DenseVariable, SparseFixed, SparseVariable
from .base import SUPPORTED_VALUE_DTYPES, Format, FormatInstance
from .composite import CompositeFormat, CompositeInstance
from .edge_values import EdgeValues
from .stack import stack_rows, unstack_rows
from .convert import Canonical, as_csr
from .registry import families, make_format, module_for, parse_spec


def convert(matrix, fmt_or_spec, **kw) -> FormatInstance:
    """``matrix`` (anything ``as_csr`` accepts) stored in a format given as a Format or
    a spec string; keyword arguments (shape, dtype, block, width) override the spec's.
    The result is sealed (``FormatInstance.seal``; every part of a composite): its index arrays
    are read-only and a kernel call trusts them without a pass over them; an instance changed
    since (an array replaced, the shape changed) is checked in full before each launch.

    ``"auto"`` picks the format: ``convert(m, "auto", op="spmm", feat=32,
    target="cuda:sm_90a")`` takes the tuning logs' pick for this matrix (format and format
    knobs: ``choose.auto_format``), else the rule-based default; the instance's
    ``format_source`` says which ("record", "model" or "default")."""
    if isinstance(fmt_or_spec, str) and fmt_or_spec.strip() == "auto":
        picked = {k: kw.pop(k) for k in choose.AUTO_KEYWORDS if k in kw}
        spec, knobs, source = choose.auto_format(matrix, dtype=kw.get("dtype"), **picked)
        inst = convert(matrix, spec, **{**knobs, **kw})
        inst.format_source = source
        return inst
    if isinstance(fmt_or_spec, (Format, CompositeFormat)):
        m, params = module_for(fmt_or_spec), dict(fmt_or_spec.params)
    else:
        m, params = parse_spec(fmt_or_spec)
    params.update(kw)
    inst = m.from_matrix(matrix, **params)
    # sealed without another pass: every family builds its indices from a validated canonical
    # CSR; only a Canonical input can share its arrays with the result, so those are copied
    for part in inst.parts if isinstance(inst, CompositeInstance) else (inst,):
        part.seal(checked=True, copy=isinstance(matrix, Canonical))
    return inst


__all__ = [
    "stack_rows", "unstack_rows",
    "Axis", "DenseFixed", "DenseVariable", "SparseFixed", "SparseVariable", "AXIS_KINDS",
    "Format", "FormatInstance", "CompositeFormat", "CompositeInstance", "EdgeValues", "SUPPORTED_VALUE_DTYPES",
    "make_format", "families", "module_for", "parse_spec", "convert", "as_csr",
    "csr", "bsr", "ell", "nm", "srbcrs", "rell", "hyb", "bsr_csr", "tiled", "validate",
]
