"""Format families by name, and the text specs the CLI and records use.

A spec is ``family`` or ``family:params`` — ``csr``, ``bsr:4x4``, ``bsr:3x5``,
``ell``, ``ell:8``. Each family module parses its own parameter text, so adding a
format means adding a module and one line here.
"""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import List, Tuple

from .base import FAMILIES, Format

# one module per family, in the order `sparsec formats` lists them
FAMILY_MODULES = ("csr", "bsr", "ell", "nm", "srbcrs", "rell", "hyb", "bsr_csr")


_FAMILIES = {m.NAME: m for m in (importlib.import_module(f".{n}", __package__) for n in FAMILY_MODULES)}
FAMILIES.update(_FAMILIES)


def families() -> List[Tuple[str, str]]:
    """(name, one-line description) of every format family."""
    return [(name, m.DESCRIPTION) for name, m in _FAMILIES.items()]


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
