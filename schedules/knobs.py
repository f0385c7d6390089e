"""Schedule transformations and their knobs, declared once.

A transformation is a function ``fn(sch, nest, **knobs)`` of a ``tvm.s_tir.Schedule``
and one loop nest of the lowered program. ``@transformation(knobs={...})`` declares
everything the rest of sparsec knows about its knobs, so that neither the build nor the
tuner (``sparsec.tune.space``, ``sparsec.tune.features``) declares them again:

* per knob (a :class:`Knob`): its choices (the first is the default), the loop *shapes*
  it takes effect on, and the subsets the tuner searches (``search`` in the full space,
  ``small`` in the small one);
* ``shape(nest)``: the shape of a nest for this transformation (e.g. rows of a fixed
  width, rows of a data-dependent length), which decides which knobs take effect on it;
* ``resolve(feat, knobs, ...)``: what the transformation makes of filled-in knob values
  (threads, rows a block, ...); the transformation itself schedules with it, and the
  tuner's features and pruning read the same numbers;
* ``prune(feat, knobs)``: why a combination is not a distinct valid kernel (a vector that
  does not divide the row, a block past the thread limit), or None.

``apply`` checks the values it is given against the choices, so a tuner record that names
an impossible value fails loudly, and returns the knobs that took effect on the nest.
:func:`check_applicable` is the program-level check the default schedules run: every knob
given must be taken by some transformation applied to the program.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

ANY = "any"  # the one shape of a transformation that does not tell nests apart
SIZES = ("full", "small")

Subset = Union[None, Tuple[Any, ...], Mapping[str, Tuple[Any, ...]]]

DECLARED: Dict[str, "Transformation"] = {}  # every declared transformation, by name (for "unknown knob")


@dataclass(frozen=True)
class Knob:
    """One knob of a transformation.

    choices       the values it takes, the default first
    shapes        the nest shapes it takes effect on (None: every shape)
    search        the values the tuner's full space tries: a tuple, or a tuple per shape
                  (a shape not listed: every choice). None: every choice
    small         the same for the small space (a shape not listed, or None: the default alone)
    omit_default  the tuner writes the knob into a candidate only when it is not at its
                  default, so kernels logged before the knob existed keep their identity
                  (``--resume``, committed logs); declare new knobs with it
    """

    choices: Tuple[Any, ...]
    shapes: Optional[Tuple[str, ...]] = None
    search: Subset = None
    small: Subset = None
    omit_default: bool = False

    def __post_init__(self):
        if not self.choices:
            raise ValueError("a knob needs at least one choice")
        for subset in (self.search, self.small):
            values = [v for s in subset.values() for v in s] if isinstance(subset, Mapping) else (subset or ())
            stray = [v for v in values if v not in self.choices]
            if stray:
                raise ValueError(f"searched values {stray} are not among the choices {self.choices}")

    @property
    def default(self):
        return self.choices[0]

    def applies(self, shape: str) -> bool:
        return self.shapes is None or shape in self.shapes

    def grid(self, size: str, shapes: Iterable[str]) -> Tuple[Any, ...]:
        """The values the tuner tries at ``size`` for nests of ``shapes`` (their union, in
        declaration order of the first shape that lists them)."""
        if size not in SIZES:
            raise ValueError(f"size should be one of {SIZES}, got {size!r}")
        spec, fallback = (self.search, self.choices) if size == "full" else (self.small, (self.default,))
        if spec is None:
            return tuple(fallback)
        if not isinstance(spec, Mapping):
            return tuple(spec)
        out: list = []
        for shape in shapes:
            out += [v for v in spec.get(shape, fallback) if v not in out]
        return tuple(out) or (self.default,)


def _as_knob(k) -> Knob:
    return k if isinstance(k, Knob) else Knob(tuple(k))


@dataclass(frozen=True)
class Transformation:
    name: str
    fn: Callable
    knobs: Dict[str, Knob]
    shape: Optional[Callable[[Any], str]] = field(default=None, compare=False)
    resolve: Optional[Callable[..., Dict[str, Any]]] = field(default=None, compare=False)
    prune: Optional[Callable[..., Optional[str]]] = field(default=None, compare=False)

    def defaults(self) -> Dict[str, Any]:
        return {k: v.default for k, v in self.knobs.items()}

    def shape_of(self, nest) -> str:
        return self.shape(nest) if self.shape is not None else ANY

    def knobs_for(self, shapes: Iterable[str]) -> Tuple[str, ...]:
        """The knobs that take effect on nests of any of ``shapes``, in declaration order."""
        shapes = tuple(shapes)
        return tuple(k for k, v in self.knobs.items() if any(v.applies(s) for s in shapes))

    def check(self, values: Mapping[str, Any]) -> None:
        unknown = set(values) - set(self.knobs)
        if unknown:
            raise ValueError(f"{self.name}: unknown knobs {sorted(unknown)}; known: {sorted(self.knobs)}")
        for k, v in values.items():
            if v not in self.knobs[k].choices:
                raise ValueError(f"{self.name}: knob {k} should be one of {self.knobs[k].choices}, got {v!r}")

    def apply(self, sch, nest, **values) -> Dict[str, Any]:
        """Run the transformation with ``values`` over its defaults; returns the knobs that
        take effect on this nest (defaults filled in)."""
        self.check(values)
        chosen = {**self.defaults(), **values}
        self.fn(sch, nest, **chosen)
        effective = self.knobs_for([self.shape_of(nest)])
        return {k: chosen[k] for k in effective}

    __call__ = apply

    def with_fn(self, fn: Callable) -> "Transformation":
        """The same declaration around another function (a wrapper that skips some nests)."""
        return replace(self, fn=fn)


def transformation(knobs: Optional[Mapping[str, Union[Knob, Sequence[Any]]]] = None, *,
                   shape: Optional[Callable[[Any], str]] = None, resolve: Optional[Callable] = None,
                   prune: Optional[Callable] = None):
    """Declare a transformation; a knob given as a plain tuple is ``Knob(choices)``."""
    def wrap(fn):
        t = Transformation(fn.__name__, fn, {k: _as_knob(v) for k, v in (knobs or {}).items()}, shape, resolve, prune)
        DECLARED[t.name] = t
        return t
    return wrap


def known_knobs() -> Tuple[str, ...]:
    """Every knob name some declared transformation takes."""
    return tuple(sorted({k for t in DECLARED.values() for k in t.knobs}))


def group(steps) -> List[Tuple[Transformation, Tuple[str, ...], Tuple[Any, ...]]]:
    """(transformation, shapes of its nests, its nests), once per transformation, from
    (nest, transformation or None) steps in order."""
    out: Dict[str, Tuple[Transformation, list, list]] = {}
    for nest, t in steps:
        if t is not None:
            entry = out.setdefault(t.name, (t, [], []))
            entry[1].append(t.shape_of(nest))
            entry[2].append(nest)
    return [(t, tuple(dict.fromkeys(shapes)), tuple(nests)) for t, shapes, nests in out.values()]


def check_applicable(given: Mapping[str, Any], uses: Sequence[Tuple[Transformation, Iterable[str]]],
                     where: str) -> None:
    """ValueError unless every knob in ``given`` takes effect through one of ``uses``
    ((transformation, shapes of the nests it is applied to)); the message names the
    offending knobs and the ones that do apply."""
    valid = {k for t, shapes in uses for k in t.knobs_for(shapes)}
    bad = sorted(set(given) - valid)
    if not bad:
        return
    known = set(known_knobs()) | {k for t, _ in uses for k in t.knobs}
    unknown = [k for k in bad if k not in known]
    inapplicable = [k for k in bad if k in known]
    parts = []
    if unknown:
        parts.append(f"unknown knob{'s' if len(unknown) > 1 else ''} {unknown}")
    if inapplicable:
        parts.append(f"knob{'s' if len(inapplicable) > 1 else ''} {inapplicable} "
                     f"{'do' if len(inapplicable) > 1 else 'does'} not apply")
    names = sorted({t.name for t, _ in uses})
    raise ValueError(f"{where}: {' and '.join(parts)}; the knobs that apply here "
                     f"(templates {', '.join(names) or 'none'}) are {sorted(valid) or 'none'}")
