"""The sparsec DSL: axes, sparse and dense buffers, iterations in coordinate space.

An operator is written once, over coordinates, independent of the storage format:

    op = Operator("spmm", "C[i, k] = sum_j A[i, j] * B[j, k]")
    I = op.dense_fixed("i")                       # rows of the sparse operand
    J = op.sparse_variable("j", parent=I)         # its columns (CSR coordinate space)
    K = op.dense_fixed("k", extent="feat")        # a dense axis, size fixed at compile time
    A = op.sparse_input("A", (I, J))
    B = op.dense_input("B", (J, K))               # a sparse axis used densely: coordinate j
    C = op.dense_output("C", (I, K))
    with op.iterate([I, J, K], "SRS") as (i, j, k):
        C[i, k] += A[i, j] * B[j, k]

Axes come in SparseTIR's four kinds, the same four that formats are built of
(``sparsec.formats.AXIS_KINDS``: DenseFixed, DenseVariable, SparseFixed, SparseVariable);
``op.dense_fixed(...)`` and its siblings declare an axis of that kind. The pair (row axis, sparse axis) that the
sparse buffers live on is the operator's *sparse structure*; at compile time it is
bound to a format (``sparsec.formats``), whose own axis chain replaces it (CSR keeps
it, BSR splits it into block and in-block axes, ELL makes the columns sparse-fixed).
The declared kinds are the coordinate space and the default format.

Edge data. The first sparse input is the matrix (its values are the instance's data); every
further sparse input is per-entry data on the same pattern (edge weights, edge types,
attention logits), passed to the kernel among the dense inputs (``inst.edge_values(x)``).
Sparse buffers may carry trailing dense axes after (row, col): ``op.sparse_input("L", (I, J,
H))`` holds one value per stored slot per h, slot-major. A buffer's ``dtype`` (None: by role,
from the compile dtype) may be declared, e.g. ``"int32"`` for edge types.

Indirect reads. A dense buffer axis may be indexed by a read of an integer input:
``W[E[i, j], f, g]`` (a relation's weight per edge) or ``W[T[j], f, g]`` (per node type); a
kernel checks every index value against the axis extent before it launches.

Lookups. In a dense iteration a sparse buffer may be read at a dense column axis: ``A[i, jd]``
with ``jd = op.dense_fixed("jd", extent="n")`` is A's value where (i, jd) is an entry, else 0
(SparseTIR's ``csrmm_dense_iter``; a binary search in row i on csr, ell and bsr).

Statements: ``X[..] = e`` (assignment), ``X[..] += e`` (sum reduction) and
``X[..] = maximum(X[..], e)`` (max reduction, in an iteration with R axes; without R axes
it is an in-place assignment, e.g. a ReLU). Functions: ``exp``, ``maximum``,
``minimum``, ``sqrt``, ``select``.

An iteration that iterates the sparse structure (row and column axes together) visits the
matrix's stored entries. Any other iteration is a *dense* loop nest over coordinates: the
row axis alone runs over 0..rows, the column axis alone over 0..cols, dense axes over their
extents; it reads and writes dense buffers only, after the iterations before it (a bias
and ReLU epilogue over [I, K], a transform ``H[j, g] += X[j, f] * W[f, g]`` over [J, F, G]
computed once per column, not once per stored entry).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple, Union

from .expr import BinOp, Call, Const, Expr, Select, walk, wrap
from .formats.axes import AXIS_KINDS, DenseFixed, DenseVariable, SparseFixed, SparseVariable

__all__ = [
    "Operator", "Axis", "Buffer", "Access", "Iteration", "Statement",
    "exp", "maximum", "minimum", "sqrt", "tanh", "erf", "relu", "gelu", "gelu_tanh", "select", "less", "accesses",
]

# names of the emitted TVMScript (its namespace T, sizes, loop and block iterators) that a
# buffer name would shadow
RESERVED_NAMES = ("T", "rows", "cols", "slots")
RESERVED_PREFIXES = ("n_", "nnz_", "off_p", "l_", "v_", "fill_rows_p")


@dataclass(frozen=True, eq=False)
class Axis:
    """A coordinate axis of an operator. ``kind`` is one of the format axis kinds
    (``sparsec.formats.AXIS_KINDS``), so an operator and a format speak of their levels in
    one vocabulary. ``extent`` is an int, the name of a compile-time parameter (e.g.
    ``"feat"``), or None for an extent taken from the sparse operand."""

    name: str
    kind: type
    parent: Optional["Axis"] = None
    extent: Union[int, str, None] = None
    width: Optional[int] = None

    def __post_init__(self):
        if self.kind not in AXIS_KINDS:
            raise ValueError(f"axis {self.name}: kind should be one of {[k.__name__ for k in AXIS_KINDS]}, "
                             f"got {self.kind!r}")

    @property
    def structural(self) -> bool:
        """True for the axes of the sparse structure (a row axis with children, or a child):
        schedules ask it to tell a dense feature axis from the structure's own."""
        return self.parent is not None or self.extent is None

    def __repr__(self):
        return f"{self.kind.__name__}({self.name})"


# dtypes a buffer may declare (``dtype=``); None keeps the rule by role (``sparsec.dtypes``)
BUFFER_DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8")
INDEX_DTYPES = ("int8", "int16", "int32", "int64", "uint8")  # the ones an indirect index may have


def buffer_dtype(name: str, dtype) -> Optional[str]:
    """``dtype`` as a canonical name (numpy's, or ``bfloat16``), None kept; else a ValueError."""
    if dtype is None:
        return None
    text = str(dtype).replace("torch.", "")
    if text != "bfloat16":
        try:
            import numpy as np

            text = np.dtype(text).name
        except TypeError:
            pass
    if text not in BUFFER_DTYPES:
        raise ValueError(f"buffer {name}: dtype should be None (by role, from the compile dtype) or one of "
                         f"{BUFFER_DTYPES}, got {dtype!r}")
    return text


@dataclass(frozen=True, eq=False)
class Buffer:
    """A named tensor over axes. ``sparse`` buffers hold one value per stored slot of the
    sparse structure (times their trailing dense axes); dense ones are ordinary arrays indexed
    by coordinates. ``dtype`` None: the compile dtype's rule for the role (``sparsec.dtypes``)."""

    name: str
    axes: Tuple[Axis, ...]
    sparse: bool
    role: str  # input | output | temp
    dtype: Optional[str] = None
    matrix: bool = False  # the first sparse input: its values are the matrix's data
    levels: int = 2  # a sparse buffer's leading axes that are the structure's levels ((r,) i, j)

    @property
    def trailing(self) -> Tuple[Axis, ...]:
        """A sparse buffer's dense axes after the structure (one value per slot per coordinate)."""
        return self.axes[self.levels:] if self.sparse else ()

    @property
    def integer(self) -> bool:
        """Declared with an integer dtype (the only buffers an indirect index may read)."""
        return self.dtype in INDEX_DTYPES

    def __getitem__(self, idx) -> "Access":
        idx = idx if isinstance(idx, tuple) else (idx,)
        if len(idx) != len(self.axes):
            raise IndexError(f"buffer {self.name} has {len(self.axes)} axes, indexed with {len(idx)}: write "
                             f"{self.name}[{', '.join(a.name for a in self.axes)}]")
        out = []
        for n, (got, want) in enumerate(zip(idx, self.axes)):
            if isinstance(got, Access):
                out.append(self._indirect(got, want))
                continue
            if not isinstance(got, IterVar):
                raise TypeError(f"axis {want.name} of {self.name} is indexed with {got!r}: index an axis with an "
                                f"iteration variable (from op.iterate) or, for a dense buffer, with a read of an "
                                f"integer input (W[E[i, j], f]); arithmetic on indices is not supported")
            # a lookup: the column axis read at a dense axis's coordinate (A[i, jd], 0 where nothing is stored)
            lookup = n == 1 and want.parent is not None and not got.axis.structural
            if self.sparse and self.levels > 2 and got.axis is not want:
                lv = ", ".join(a.name for a in self.axes[:self.levels])
                raise IndexError(f"sparse buffer {self.name} is indexed by {got.axis.name} for its axis {want.name}: "
                                 f"a buffer over a structure with outer axes ({lv}) is read at its own entries only "
                                 f"(a lookup at a dense column axis needs the structure without outer axes); index "
                                 f"it {self.name}[{', '.join(a.name for a in self.axes)}]")
            if self.sparse and got.axis is not want and not lookup:
                raise IndexError(f"sparse buffer {self.name} is indexed by {got.axis.name} for its axis {want.name}: "
                                 f"index it by its own axes {[a.name for a in self.axes]} (one value per stored "
                                 f"entry), or read it at a dense column axis ({self.name}[{self.axes[0].name}, jd] "
                                 f"with jd = op.dense_fixed('jd', extent=...): 0 where nothing is stored)")
            if not self.sparse and not _compatible(got.axis, want):
                raise IndexError(f"axis {want.name} of {self.name} cannot be indexed by {got.axis.name}: index it "
                                 f"with the iteration variable of {want.name}, or declare {self.name} over "
                                 f"{got.axis.name}")
            out.append(got.axis)
        return Access(self, tuple(out))

    def _indirect(self, index: "Access", axis: Axis):
        """``W[E[i, j], ..]``: axis ``axis`` of this dense buffer at the value of ``index``."""
        src = index.buffer
        if self.sparse:
            raise IndexError(f"sparse buffer {self.name} is indexed by a read of {src.name}: a sparse buffer is read "
                             f"at its own entry (its axes {[a.name for a in self.axes]}); index a dense buffer "
                             f"instead (W[{src.name}[..], f])")
        if src.matrix:
            raise ValueError(f"axis {axis.name} of {self.name} is indexed by the matrix {src.name} (the first sparse "
                             f"input); declare the indices as a further sparse input, e.g. "
                             f"op.sparse_input('E', (i, j), dtype='int32')")
        if not src.integer:
            raise TypeError(f"axis {axis.name} of {self.name} is indexed by a read of {src.name}, which is "
                            f"{src.dtype or 'float (by role)'}; an index buffer should be declared with an integer "
                            f"dtype, e.g. op.{'sparse' if src.sparse else 'dense'}_input({src.name!r}, .., "
                            f"dtype='int32')")
        if src.role != "input":
            raise ValueError(f"axis {axis.name} of {self.name} is indexed by a read of {src.name}, a {src.role}: "
                             f"index values are checked against the extent of {axis.name} before launch, so they "
                             f"should come from an input")
        return index

    def __setitem__(self, idx, value):
        target = self[idx]
        if target.lookup:
            raise ValueError(f"{target.text} writes the sparse buffer {self.name} at a dense column axis "
                             f"({target.axes[1].name}); a sparse buffer is written at its own entries: write "
                             f"{self.name}[{', '.join(a.name for a in self.axes)}] in an iteration over them")
        if any(isinstance(a, Access) for a in target.axes):
            raise ValueError(f"{self.name} is written through an indirect index (a scatter), which is not "
                             f"supported; write it at iteration variables and read indirect values instead")
        op = _current_op()
        if isinstance(value, _Reduction):
            if value.target.buffer is not self or value.target.axes != target.axes:
                raise ValueError(f"{target.text} is assigned a reduction of {value.target.text}: a reduction writes "
                                 f"the element it reads; write {target.text} += e")
            op._add_statement(Statement(target, value.value, value.kind))
            return
        value = wrap(value)
        # X[..] = maximum(X[..], e) is a max reduction in an iteration with R axes; without
        # them it is an in-place assignment (a ReLU: C[i, k] = maximum(C[i, k], 0.0))
        reduces = op._open is not None and "R" in op._open.kinds
        if reduces and isinstance(value, Call) and value.fn in ("max", "min") and any(
                isinstance(a, Access) and a.buffer is self and a.axes == target.axes for a in value.args):
            rest = [a for a in value.args if not (isinstance(a, Access) and a.buffer is self and a.axes == target.axes)]
            op._add_statement(Statement(target, rest[0], value.fn))
            return
        op._add_statement(Statement(target, value, None))


def _compatible(used: Axis, declared: Axis) -> bool:
    """A dense buffer axis may be indexed by its own axis or by a structural axis standing
    for the same coordinate (``B[j, k]`` with B declared over (J, K))."""
    return used is declared


@dataclass(frozen=True, eq=False)
class IterVar:
    axis: Axis

    def __repr__(self):
        return self.axis.name


@dataclass(frozen=True, eq=False)
class Access(Expr):
    """A buffer read at the coordinates of the given axes (stage I form). An element of
    ``axes`` is an Axis (the coordinate of that iteration variable) or, for an indirect read
    (``W[E[i, j], f]``), the Access of an integer input whose value is the index."""

    buffer: Buffer
    axes: Tuple[Axis, ...]

    def __iadd__(self, other):
        return _Reduction(self, wrap(other), "sum")

    @property
    def lookup(self) -> bool:
        """A sparse buffer read at a dense column axis (``A[i, jd]``): its value where (i, jd) is
        an entry, else 0 (a binary search in the row, ``sparsec.lower.lookup``)."""
        return (self.buffer.sparse and self.buffer.levels == 2 and len(self.axes) > 1
                and self.axes[1] is not self.buffer.axes[1])

    @property
    def text(self) -> str:
        """How it reads in the operator: ``A[i, jd]``, ``W[E[i, j], f]``."""
        return f"{self.buffer.name}[{', '.join(a.text if isinstance(a, Access) else a.name for a in self.axes)}]"


def accesses(e: Expr):
    """Every buffer read in ``e``, the reads inside indirect indices included."""
    from .expr import walk

    for n in walk(e):
        if isinstance(n, Access):
            yield n
            for a in n.axes:
                if isinstance(a, Access):
                    yield from accesses(a)


@dataclass(frozen=True)
class _Reduction:
    target: Access
    value: Expr
    kind: str


@dataclass(frozen=True, eq=False)
class Statement:
    """``target (=|+=|max=) value``; ``reduce`` is None, "sum", "max" or "min"."""

    target: Access
    value: Expr
    reduce: Optional[str]


@dataclass(eq=False)
class Iteration:
    """A loop nest in coordinate space: axes with S(patial)/R(eduction) kinds and one statement."""

    name: str
    axes: Tuple[Axis, ...]
    kinds: str
    statement: Optional[Statement] = None

    def kind_of(self, axis: Axis) -> str:
        return self.kinds[self.axes.index(axis)]


@dataclass(eq=False)
class Operator:
    """A sparse operator: axes, buffers and a sequence of iterations."""

    name: str
    doc: str = ""
    axes: List[Axis] = field(default_factory=list)
    buffers: List[Buffer] = field(default_factory=list)
    iterations: List[Iteration] = field(default_factory=list)
    _open: Optional[Iteration] = field(default=None, repr=False)

    # ---- axes (SparseTIR's four kinds) ----------------------------------------------
    def dense_fixed(self, name: str, extent: Union[int, str, None] = None, parent: Optional[Axis] = None) -> Axis:
        """A dense axis. ``extent=None`` makes it the row axis of the sparse structure;
        ``parent`` (a dense axis with an extent, e.g. relations ``r``) puts that row axis under
        it: the structure is then (r, i, j), one pattern per r (``A[r, i, j]``), and a matrix
        bound to it holds the patterns stacked along its rows (row ``r * n + i``,
        ``sparsec.formats.stack_rows``)."""
        if parent is not None:
            if extent is not None:
                raise ValueError(f"axis {name}: an axis under parent {parent.name} is the structure's row axis, whose "
                                 f"extent comes from the matrix; drop extent={extent!r}")
            self._outer_parent(parent, name)
        return self._axis(Axis(name, DenseFixed, parent, extent))

    def _outer_parent(self, parent: Axis, name: str) -> None:
        if parent not in self.axes:
            raise ValueError(f"axis {name}: parent should be an axis of {self.name}, got {parent!r}")
        if parent.kind is not DenseFixed or parent.extent is None:
            raise ValueError(f"axis {name}: the parent of a row axis should be a dense axis with an extent "
                             f"(op.dense_fixed({parent.name!r}, extent='rel')), got {parent!r}")
        if any(a.parent is parent for a in self.axes):
            raise ValueError(f"axis {name}: {parent.name} already has a child axis; one sparse structure per "
                             f"operator, with at most one row axis")

    def dense_variable(self, name: str, parent: Axis) -> Axis:
        """A ragged dense axis under ``parent`` (a segment: positions, no column indices)."""
        return self._axis(Axis(name, DenseVariable, self._parent(parent, name)))

    def sparse_fixed(self, name: str, parent: Axis, width: int) -> Axis:
        """An ELL-like axis: ``width`` coordinate slots per parent coordinate."""
        if not isinstance(width, int) or width < 1:
            raise ValueError(f"sparse_fixed {name}: width should be a positive int, got {width!r}")
        return self._axis(Axis(name, SparseFixed, self._parent(parent, name), width=width))

    def sparse_variable(self, name: str, parent: Axis) -> Axis:
        """A CSR-like axis: a variable number of coordinates per parent coordinate."""
        return self._axis(Axis(name, SparseVariable, self._parent(parent, name)))

    def _parent(self, parent: Axis, name: str) -> Axis:
        if parent not in self.axes:
            raise ValueError(f"axis {name}: parent should be an axis of {self.name}, got {parent!r}")
        if not _is_row(parent):
            raise ValueError(f"axis {name}: parent should be the row axis (dense_fixed with no extent), got {parent!r}")
        other = next((a for a in self.axes if a.parent is not None and _is_row(a.parent)), None)
        if other is not None:
            raise ValueError(f"axis {name}: {self.name} already has the sparse structure ({other.parent.name}, "
                             f"{other.name}); an operator has one sparse structure, so a second sparse axis is not "
                             f"supported. Per-entry values on the same pattern are further sparse inputs "
                             f"(op.sparse_input('W', ({other.parent.name}, {other.name}))); a second matrix needs "
                             f"an operator of its own")
        return parent

    def _axis(self, axis: Axis) -> Axis:
        if any(a.name == axis.name for a in self.axes):
            raise ValueError(f"axis name {axis.name!r} is used twice in {self.name}; give each axis its own name")
        self.axes.append(axis)
        return axis

    # ---- buffers -----------------------------------------------------------------------
    def sparse_input(self, name, axes, dtype=None):
        """Values on the sparse structure. The first sparse input is the matrix (its values are
        the instance's data); a further one is per-entry data on the same pattern (edge weights,
        edge types), passed to the kernel among the dense inputs, in declaration order."""
        return self._buffer(name, axes, True, "input", dtype)

    def sparse_output(self, name, axes, dtype=None): return self._buffer(name, axes, True, "output", dtype)
    def dense_input(self, name, axes, dtype=None): return self._buffer(name, axes, False, "input", dtype)
    def dense_output(self, name, axes, dtype=None): return self._buffer(name, axes, False, "output", dtype)
    def dense_temp(self, name, axes, dtype=None): return self._buffer(name, axes, False, "temp", dtype)

    def sparse_temp(self, name, axes, dtype=None):
        """An intermediate with one value per stored slot of the sparse structure (the kernel
        allocates it like a dense temp, ``stored`` values long). Why: an operator that chains
        sparse steps (attention's scores, then their softmax) keeps the intermediate on the
        matrix's pattern, so it never exists as a dense rows x cols array."""
        return self._buffer(name, axes, True, "temp", dtype)

    def _buffer(self, name: str, axes: Sequence[Axis], sparse: bool, role: str, dtype=None) -> Buffer:
        axes = tuple(axes)
        if not name.isidentifier() or name.startswith("_"):
            raise ValueError(f"buffer name should be a Python identifier not starting with '_', got {name!r}")
        if name in RESERVED_NAMES or name.startswith(RESERVED_PREFIXES):
            raise ValueError(f"buffer name {name!r} is reserved: the generated TVMScript uses T, rows, cols, slots "
                             f"and names starting with {', '.join(RESERVED_PREFIXES)}; choose another name")
        if any(b.name == name for b in self.buffers):
            raise ValueError(f"buffer name {name!r} is used twice in {self.name}; give each buffer its own name")
        for a in axes:
            if a not in self.axes:
                raise ValueError(f"buffer {name}: axis {a!r} does not belong to {self.name}; declare the axis on "
                                 f"{self.name} (op.dense_fixed(...)) and use that")
        dtype = buffer_dtype(name, dtype)
        matrix = sparse and role == "input" and self.matrix() is None
        if sparse:
            self._check_sparse_axes(name, axes, matrix)
        buf = Buffer(name, axes, sparse, role, dtype, matrix, len(self.levels()) if sparse else 2)
        self.buffers.append(buf)
        return buf

    def _check_sparse_axes(self, name: str, axes: Tuple[Axis, ...], matrix: bool) -> None:
        """A sparse buffer lives on (row, col), optionally followed by dense axes of fixed
        extent (one value per stored slot per trailing coordinate); the matrix has none."""
        levels = self.levels()
        names = [a.name for a in axes]
        lv = ", ".join(a.name for a in levels)
        if axes[:len(levels)] != levels:
            raise ValueError(f"sparse buffer {name} is declared over {names}: a sparse buffer lives on the "
                             f"operator's sparse structure ({lv}), optionally followed by dense "
                             f"axes, e.g. ({lv}, h); for values over other axes declare a dense "
                             f"buffer (op.dense_input)")
        for a in axes[len(levels):]:
            if a.structural or a.extent is None:
                raise ValueError(f"sparse buffer {name}: trailing axis {a.name} should be a dense axis with an "
                                 f"extent (op.dense_fixed({a.name!r}, extent=...)), not an axis of the structure")
        if len(set(axes)) != len(axes):
            raise ValueError(f"sparse buffer {name} names an axis twice: {names}; list each axis once")
        if matrix and len(axes) > len(levels):
            raise ValueError(f"sparse input {name} is the operator's first sparse input, the matrix, whose values are "
                             f"one per entry; declare the matrix over ({lv}) first, then "
                             f"{name} as a further sparse input over {names}")

    def matrix(self) -> Optional[Buffer]:
        """The first sparse input (its values are the matrix's data), or None."""
        return next((b for b in self.buffers if b.matrix), None)

    def edge_inputs(self) -> List[Buffer]:
        """The further sparse inputs: per-entry data on the matrix's pattern."""
        return [b for b in self.buffers if b.sparse and b.role == "input" and not b.matrix]

    def call_inputs(self) -> List[Buffer]:
        """The inputs a kernel takes after the matrix, in declaration order: dense inputs and
        further sparse inputs (edge data)."""
        return [b for b in self.buffers if b.role == "input" and not b.matrix]

    # ---- iterations --------------------------------------------------------------------
    @contextlib.contextmanager
    def iterate(self, axes: Sequence[Axis], kinds: str, name: Optional[str] = None):
        """Open an iteration over ``axes``; ``kinds`` has one S or R per axis."""
        axes = tuple(axes)
        if self._open is not None:
            raise RuntimeError("iterations do not nest; close the previous one first")
        if len(kinds) != len(axes) or set(kinds) - {"S", "R"}:
            raise ValueError(f"kinds should be one S or R per axis ({len(axes)} axes), got {kinds!r}")
        if len(set(axes)) != len(axes):
            raise ValueError(f"an iteration lists each axis once, got {[a.name for a in axes]}")
        for a in axes:
            if a not in self.axes:
                raise ValueError(f"iteration over {a!r}: the axis does not belong to {self.name}; iterate the axes "
                                 f"declared on {self.name}")
        it = Iteration(name or f"{self.name}{len(self.iterations) or ''}", axes, kinds)
        self._open = it
        _STACK.append(self)
        try:
            yield tuple(IterVar(a) for a in axes)
        finally:
            _STACK.pop()
            self._open = None
        if it.statement is None:
            raise ValueError(f"iteration {it.name} has no statement; write one inside the with block (X[..] = e "
                             f"or X[..] += e)")
        self.iterations.append(it)

    def _add_statement(self, st: Statement):
        it = self._open
        if it is None:
            raise RuntimeError("statements belong inside `with op.iterate(...)`")
        if it.statement is not None:
            raise ValueError(f"iteration {it.name} already has a statement; open another iteration")
        if st.target.buffer.role == "input":
            raise ValueError(f"{st.target.text} writes {st.target.buffer.name}, an input; write an output or a "
                             f"temporary instead (op.dense_output, op.dense_temp, op.sparse_output)")
        reduce_axes = [a for a, k in zip(it.axes, it.kinds) if k == "R"]
        if reduce_axes and st.reduce is None:
            raise ValueError(f"iteration {it.name} reduces over {[a.name for a in reduce_axes]} but the statement is "
                             "a plain assignment; write X[..] += e or X[..] = maximum(X[..], e)")
        if st.reduce is not None and not reduce_axes:
            raise ValueError(f"iteration {it.name} has a reduction statement but no R axis; mark the reduced axis R, "
                             f"or write an in-place update as an assignment (X[..] = X[..] + e)")
        for a in st.target.axes:
            if a in reduce_axes:
                raise ValueError(f"{st.target.text} is indexed by the reduction axis {a.name} of iteration "
                                 f"{it.name}; mark {a.name} S, or index the output without it")
        if not self.is_sparse_iteration(it):
            _check_dense_statement(it, st)
        else:
            missing = [a.name for a in self.outer_axes() if a not in it.axes]
            if missing:
                lv = ", ".join(a.name for a in self.levels())
                row, col = self.structure()
                raise ValueError(f"iteration {it.name} iterates the structure's ({row.name}, {col.name}) without its "
                                 f"outer axis {', '.join(missing)}: the entries of "
                                 f"every {missing[0]} are visited, so list it too: op.iterate([{lv}, ...]) with "
                                 f"{missing[0]} as S (per {missing[0]}) or R (summed over {missing[0]})")
            _check_no_lookup(it, st)
        it.statement = st

    def is_sparse_iteration(self, it: "Iteration") -> bool:
        """True when ``it`` iterates the sparse structure (row and column axes together): its
        loops run over the matrix's stored entries. Any other iteration is a dense loop nest
        (row axis: 0..rows, column axis: 0..cols, dense axes: their extents)."""
        row, col = self.structure()
        return row in it.axes and col in it.axes

    # ---- queries used by lowering ----------------------------------------------------------
    def structure(self) -> Tuple[Axis, Axis]:
        """(row axis, sparse column axis) of the operator's sparse structure."""
        kids = [a for a in self.axes if a.parent is not None and _is_row(a.parent)]
        if len(kids) != 1:
            raise ValueError(f"operator {self.name} has no sparse structure yet: declare its column axis first, e.g. "
                             f"j = op.sparse_variable('j', parent=i) under a row axis i = op.dense_fixed('i')")
        return kids[0].parent, kids[0]

    def outer_axes(self) -> Tuple[Axis, ...]:
        """The dense axes above the row axis, outermost first (relations ``r`` in (r, i, j))."""
        out, a = [], self.structure()[0].parent
        while a is not None:
            out.insert(0, a)
            a = a.parent
        return tuple(out)

    def levels(self) -> Tuple[Axis, ...]:
        """The structure's levels, outermost first: (r, i, j), or (i, j) without outer axes."""
        return self.outer_axes() + self.structure()

    def default_format(self) -> str:
        """The format spec the declared axis kinds describe: a sparse_variable column axis is
        CSR, a sparse_fixed one ELL of its width. A dense_variable (ragged) axis has no stored
        column indices, so such an operator must be bound to a format explicitly."""
        _, col = self.structure()
        if col.kind is SparseVariable:
            return "csr"
        if col.kind is SparseFixed:
            return f"ell:{col.width}"
        raise ValueError(f"operator {self.name} declares {col.name} as {col.kind.__name__}, which has no default "
                         "matrix format; pass a format (e.g. 'csr', 'bsr:4x4') to compile")

    def params(self) -> Tuple[str, ...]:
        """Names of compile-time extents (e.g. "feat") that ``compile`` must be given."""
        return tuple(dict.fromkeys(a.extent for a in self.axes if isinstance(a.extent, str)))

    def inputs(self): return [b for b in self.buffers if b.role == "input"]
    def outputs(self): return [b for b in self.buffers if b.role == "output"]
    def temps(self): return [b for b in self.buffers if b.role == "temp"]

    def __repr__(self):
        return f"Operator({self.name}: {self.doc})" if self.doc else f"Operator({self.name})"


_STACK: List[Operator] = []


def _is_row(axis: Axis) -> bool:
    """The structure's row axis: dense_fixed without an extent (under an outer axis or not)."""
    return axis.kind is DenseFixed and axis.extent is None


def _check_dense_statement(it: Iteration, st: Statement) -> None:
    """A dense iteration sees coordinates only: no stored entry (sparse buffers, except a
    lookup's read A[i, jd]), no axis it does not iterate. Refused with what to write instead."""
    axes = ", ".join(a.name for a in it.axes)
    for acc in [st.target] + list(accesses(st.value)):  # an indirect index's reads included
        verb = "write" if acc is st.target else "read"
        if acc.buffer.sparse and not (acc.lookup and acc is not st.target):
            lv = acc.buffer.axes[:acc.buffer.levels]
            row, col = lv[-2:]
            raise ValueError(
                f"iteration {it.name} over [{axes}] does not iterate the sparse structure ({', '.join(a.name for a in lv)}), "
                f"so it cannot {verb} the sparse buffer {acc.text} (one value per stored entry); iterate [{row.name}, {col.name}, ...] "
                f"together to reach it, or reduce it into a dense buffer in such an iteration first"
                + (f", or read it at a dense column axis ({acc.buffer.name}[{', '.join(a.name for a in lv[:-1])}, jd"
                   f"{''.join(', ' + a.name for a in acc.axes[len(lv):])}]: 0 where nothing is stored)" if verb == "read" else ""))
        for a in acc.axes:
            if not isinstance(a, Access) and a not in it.axes:
                raise ValueError(
                    f"iteration {it.name} over [{axes}] {verb}s {acc.text}, but axis {a.name} is not "
                    f"iterated here; add {a.name} to the iteration's axes, or compute what it needs from "
                    f"{acc.buffer.name} in an iteration over {a.name} first")


def _check_no_lookup(it: Iteration, st: Statement) -> None:
    """A lookup (``A[i, jd]``) belongs to a dense iteration: one over the stored entries reads
    its sparse buffers at those entries."""
    for acc in accesses(st.value):
        if acc.lookup:
            row, col = acc.buffer.axes[:2]
            raise ValueError(
                f"iteration {it.name} iterates the sparse structure ({row.name}, {col.name}) and reads {acc.text}, a "
                f"lookup at the dense column axis {acc.axes[1].name}: read {acc.buffer.name}[{row.name}, {col.name}] "
                f"at the entry instead, or put the lookup in an iteration over [{row.name}, {acc.axes[1].name}, ...] "
                f"without {col.name}")


def _current_op() -> Operator:
    if not _STACK:
        raise RuntimeError("buffer writes belong inside `with op.iterate(...)`")
    return _STACK[-1]


# ---- elementwise functions ------------------------------------------------------------------
def exp(x) -> Expr: return Call("exp", (wrap(x),))
def sqrt(x) -> Expr: return Call("sqrt", (wrap(x),))
def maximum(a, b) -> Expr: return Call("max", (wrap(a), wrap(b)))
def minimum(a, b) -> Expr: return Call("min", (wrap(a), wrap(b)))
def tanh(x) -> Expr: return Call("tanh", (wrap(x),))
def erf(x) -> Expr: return Call("erf", (wrap(x),))


def relu(x) -> Expr:
    """``max(x, 0)``."""
    return maximum(x, 0.0)


def gelu(x) -> Expr:
    """Exact (erf) GELU, ``0.5 x (1 + erf(x / sqrt 2))``, as BERT's FFN; written out in DSL
    calls, so every target and the float64 reference compute it."""
    x = wrap(x)
    return 0.5 * x * (1.0 + erf(x * 0.7071067811865476))


def gelu_tanh(x) -> Expr:
    """PyTorch's ``gelu(approximate="tanh")``: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``."""
    x = wrap(x)
    return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


ACTIVATIONS = {"relu": relu, "gelu": gelu, "gelu_tanh": gelu_tanh}  # name -> DSL expression builder


def select(cond, then, other) -> Expr:
    return Select(wrap(cond), wrap(then), wrap(other))


def less(a, b) -> Expr:
    """``a < b``, a condition for ``select``."""
    return BinOp("<", wrap(a), wrap(b))


IDENTITY = {"sum": Const(0.0), "max": Const(float("-inf")), "min": Const(float("inf"))}
