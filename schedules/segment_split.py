"""Which entries of a segment each thread block of the segment contraction sums: the
partition written once, rendered into the kernel (``schedules.segment_contract``) and
walked in Python by the tests, so both follow the same arithmetic.

A segment's entries [0, count) are cut in chunks of ``chunk`` consecutive entries; chunk c
belongs to split s = c mod ``splits`` (one block per split). Split s therefore holds a segment iff
count > s * chunk, and its k-th chunk starts at entry (s + k * splits) * chunk. A full chunk
is summed as one unrolled run (its loads in flight together); the segment's last, partial
chunk in unrolled steps of ``step`` entries, each entry guarded by q < count.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Union


class Sym:
    """Integer arithmetic on TVMScript text: the partition's formulas, given Syms instead of
    ints, return the text the kernel computes them with (``//`` is floor division in both)."""

    def __init__(self, text: str):
        self.text = text

    def _op(self, op: str, other, reflected=False) -> "Sym":
        a, b = self.text, other.text if isinstance(other, Sym) else str(other)
        return Sym(f"({b} {op} {a})" if reflected else f"({a} {op} {b})")

    def __add__(self, o): return self._op("+", o)
    def __radd__(self, o): return self._op("+", o, True)
    def __sub__(self, o): return self._op("-", o)
    def __rsub__(self, o): return self._op("-", o, True)
    def __mul__(self, o): return self._op("*", o)
    def __rmul__(self, o): return self._op("*", o, True)
    def __floordiv__(self, o): return self._op("//", o)
    def __gt__(self, o): return self._op(">", o)
    def __lt__(self, o): return self._op("<", o)
    def __le__(self, o): return self._op("<=", o)
    def __ge__(self, o): return self._op(">=", o)

    def __str__(self):
        return self.text


Int = Union[int, Sym]


@dataclass(frozen=True)
class Partition:
    splits: int  # S: blocks that share each group of root positions
    chunk: int  # C: entries of one unrolled run
    step: int  # V: entries of one unrolled step of a segment's last, partial chunk

    def __post_init__(self):
        if min(self.splits, self.chunk, self.step) < 1 or self.chunk % self.step:
            raise ValueError(f"a partition needs positive sizes with step dividing chunk, got {self}")

    def holds(self, count: Int, s: Int):
        """Split s has entries of a segment of ``count`` entries."""
        return count > s * self.chunk

    def chunks(self, count: Int, s: Int):
        """How many chunks of the segment split s sums (where it holds the segment)."""
        return (count - s * self.chunk + self.splits * self.chunk - 1) // (self.splits * self.chunk)

    def first(self, s: Int, k: Int):
        """The first entry of split s's k-th chunk."""
        return (s + k * self.splits) * self.chunk

    def full(self, count: Int, base: Int):
        """The chunk that starts at ``base`` is whole (no entry needs a guard)."""
        return base + self.chunk <= count

    def steps(self, count: Int, base: Int):
        """Unrolled steps of ``step`` entries that cover a partial chunk from ``base``."""
        return (count - base + self.step - 1) // self.step

    def entries(self, count: int, s: int) -> List[int]:
        """The entries split s sums, in the kernel's order (the kernel's loops, in Python)."""
        out: List[int] = []
        if not self.holds(count, s):
            return out
        for k in range(self.chunks(count, s)):
            base = self.first(s, k)
            if self.full(count, base):
                out += [base + u for u in range(self.chunk)]
                continue
            for v in range(self.steps(count, base)):
                out += [q for q in (base + v * self.step + u for u in range(self.step)) if q < count]
        return out
