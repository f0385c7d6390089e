"""Format families by name, and the text specs the CLI and records use.

A spec is ``family`` or ``family:params`` — ``csr``, ``bsr:4x4``, ``bsr:3x5``,
``ell``, ``ell:8``. Each family module parses its own parameter text, so adding a
format means adding a module and one line here. A composite's spec may end with its
part list (``hyb:col_parts=1,buckets=1/2[rell:1+rell:2,dup]``, what kernels record):
``format_from_spec`` reads it back exactly, ``reuse_refusal`` compares it with a matrix.
"""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import List, Optional, Tuple

from .base import FAMILIES, Format
from .composite import CompositeFormat, reuse_problem, takes_part
from .composite import matrix_requirements as _requirements

# one module per family, in the order `sparsec formats` lists them
FAMILY_MODULES = ("csr", "bsr", "ell", "nm", "srbcrs", "rell", "hyb", "bsr_csr", "mma_sp_format", "nm_tc_format",
                  "tiled")


_FAMILIES = {m.NAME: m for m in (importlib.import_module(f".{n}", __package__) for n in FAMILY_MODULES)}
FAMILIES.update(_FAMILIES)


def families() -> List[Tuple[str, str]]:
    """(name, one-line description) of every format family."""
    return [(name, m.DESCRIPTION) for name, m in _FAMILIES.items()]


def tensor_core_layout(fmt: Format, dtype: str) -> Optional[str]:
    """The packed Tensor Core operand a format hands a kernel for values of ``dtype``
    (``schedules.tensorcore_packed.OPERANDS`` names them), or None: each family declares its
    own capability (a ``tensor_core_layout(fmt, dtype)`` function)."""
    m = _FAMILIES.get(fmt.name)
    fn = getattr(m, "tensor_core_layout", None)
    return fn(fmt, dtype) if fn is not None else None


def _module(name: str) -> ModuleType:
    m = _FAMILIES.get(str(name).strip().lower())
    if m is None:
        raise ValueError(f"format family should be one of {', '.join(_FAMILIES)}, got {name!r}")
    return m


def module_for(fmt) -> ModuleType:
    """The module implementing ``fmt`` (a Format or a family name)."""
    return _module(fmt if isinstance(fmt, str) else fmt.name)


def parse_spec(spec: str) -> Tuple[ModuleType, dict]:
    """``"bsr:4x4"`` -> (bsr module, {"block": (4, 4)})."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"format spec should be a string like 'csr', 'bsr:4x4' or 'ell:8', got {spec!r}")
    name, _, arg = spec.strip().partition(":")
    m = _module(name)
    return m, m.parse_spec(arg.strip() or None)


def make_format(spec: str, **params) -> Format:
    """A Format from a spec (``make_format("bsr:3x5")``) or a family name plus keyword
    parameters (``make_format("bsr", block=(3, 5))``, ``make_format("ell", width=8)``).
    Keywords override parameters given in the spec."""
    m, parsed = parse_spec(spec)
    parsed.update(params)
    if m.NAME == "bsr" and parsed.get("block") is None:
        raise ValueError("block should be RxC with positive integers, got none (e.g. 'bsr:4x4')")
    try:
        return m.declare(**parsed)
    except TypeError as e:
        raise ValueError(f"{m.NAME} does not take parameters {sorted(params)}: {e}") from None


def format_from_spec(spec: str):
    """The format a spec names exactly. A composite spec with a part list gets those parts
    (each checked to be one the family's parameters allow), without one the family's
    template (``make_format``); other specs are ``make_format(spec)``."""
    head, bracket, tail = str(spec).partition("[")
    template = make_format(head)
    if not bracket or not isinstance(template, CompositeFormat):
        return template
    if not tail.endswith("]"):
        raise ValueError(f"a composite spec's part list should end with ']', got {spec!r}")
    parts = tuple(make_format(p) for p in tail[:-1].split("+"))
    if len(parts) != len(template.parts) or not all(
            takes_part(t, p) for p, t in zip(parts, template.parts)):
        raise ValueError(f"{head} has parts {'+'.join(t.spec for t in template.parts)} (a part may list rows "
                         f"once where these repeat), got {tail[:-1]!r}")
    return CompositeFormat(template.name, parts, template.params, template.disjoint_rows)


_REFUSALS: dict = {}  # (compiled spec, matrix format spec) -> refusal or None: kernels ask on every call


def reuse_refusal(compiled_spec: str, got) -> Optional[str]:
    """The message refusing a matrix in format ``got`` to a kernel compiled for
    ``compiled_spec``, or None when the kernel computes correctly on it (the same spec, or a
    composite with the same parts: ``composite.reuse_problem``). Remembered per pair of
    specs (a spec names its format exactly), so a reused kernel's calls cost a dict lookup."""
    got_spec = got.spec
    if got_spec == compiled_spec:
        return None
    key = (compiled_spec, got_spec)
    if key not in _REFUSALS:
        if len(_REFUSALS) > 1024:
            _REFUSALS.clear()
        _REFUSALS[key] = _refusal(compiled_spec, got)
    return _REFUSALS[key]


def _refusal(compiled_spec: str, got) -> Optional[str]:
    compiled = _exact(compiled_spec)
    if compiled is None:
        return f"this kernel was compiled for format {compiled_spec}, got a matrix in {got.spec}"
    problem = reuse_problem(compiled, got)
    if problem is None:
        return None
    fix = ""
    if reuse_problem(make_format(compiled.family_spec), got) is None:  # the spec's own kernel would take it
        fix = (f": compile for the spec '{compiled.family_spec}' rather than for a matrix "
               f"(sparsec.compile(op, '{compiled.family_spec}', ...)); that kernel takes any matrix converted with it")
    return f"this kernel was {problem}{fix}"


def matrix_requirements(compiled_spec: str) -> List[str]:
    """What a kernel compiled for ``compiled_spec`` asks of a matrix beyond its spec (empty: any
    matrix converted with the spec runs). Only composites compiled for a converted matrix
    have any: a part compiled for rows listed once where the spec's template lets them repeat."""
    compiled = _exact(compiled_spec)
    return [] if compiled is None else _requirements(compiled, make_format(compiled.family_spec))


def _exact(spec: str) -> Optional[CompositeFormat]:
    """The composite a recorded spec with a part list names, or None (not a composite, or parts
    this sparsec would not produce for its parameters: a module exported by an older one)."""
    if "[" not in spec:
        return None
    try:
        fmt = format_from_spec(spec)
    except ValueError:
        return None
    return fmt if isinstance(fmt, CompositeFormat) else None


def convert_spec(compiled_spec: str) -> str:
    """The spec to convert matrices with for a kernel compiled for ``compiled_spec``: a
    composite's ``family_spec`` (its part list dropped), else the spec itself."""
    return compiled_spec.split("[", 1)[0]
