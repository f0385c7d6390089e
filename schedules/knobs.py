"""Schedule transformations with declared knobs.

A transformation is a function ``fn(sch, nest, **knobs)`` of a ``tvm.s_tir.Schedule``
and one loop nest of the lowered program. ``@transformation(knobs={...})`` declares
each knob's choices (the first is the default); ``apply`` checks the values it is
given against them, so a tuner record that names an impossible value fails loudly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Tuple


@dataclass(frozen=True)
class Transformation:
    name: str
    fn: Callable
    knobs: Dict[str, Tuple[Any, ...]]

    def defaults(self) -> Dict[str, Any]:
        return {k: v[0] for k, v in self.knobs.items()}

    def apply(self, sch, nest, **values):
        unknown = set(values) - set(self.knobs)
        if unknown:
            raise ValueError(f"{self.name}: unknown knobs {sorted(unknown)}; known: {sorted(self.knobs)}")
        chosen = self.defaults()
        for k, v in values.items():
            if v not in self.knobs[k]:
                raise ValueError(f"{self.name}: knob {k} should be one of {self.knobs[k]}, got {v!r}")
            chosen[k] = v
        return self.fn(sch, nest, **chosen)

    __call__ = apply


def transformation(knobs: Dict[str, Tuple[Any, ...]] | None = None):
    def wrap(fn):
        return Transformation(fn.__name__, fn, dict(knobs or {}))
    return wrap
