"""Every refusal of an operator a user writes: the exception type, and a message that names the
construct and says what to write instead (or which format / target / dtype to use instead).

Inventory (message, abridged -- where raised -- what it says instead). Out of scope: runtime
data (a matrix, an edge-value array, an index value out of range: ``sparsec/edge_args.py``,
``sparsec/kernel.py``), API argument types (``lower.pipeline.LowerContext``), schedule knob
values (``schedules/knobs.py``), ``RuntimeError`` for statements outside ``op.iterate``. Not
reachable from an operator today, so not tested: ``lower.emit``'s "rows repeat in this format,
so its max reduction needs an atomic max" (every accumulation dtype, float32, float64 and
int32, has one) and ``lower.flatten``'s "a chunked value order needs fixed dense axes" (a
format's own declaration).

=====================================================================  ======================  ==============================================
message                                                                where raised            instead
=====================================================================  ======================  ==============================================
sparse_fixed j: width should be a positive int                         dsl.sparse_fixed        a positive int width
axis j: parent should be an axis of <op>                               dsl._parent             an axis declared on the operator
axis j: parent should be the row axis (dense_fixed with no extent)     dsl._parent             the row axis
axis j2: <op> already has the sparse structure (i, j)                  dsl._parent             a further sparse input on (i, j), or an
                                                                                               operator of its own
axis name 'i' is used twice                                            dsl._axis               give each axis its own name
buffer name should be a Python identifier                              dsl._buffer             an identifier not starting with '_'
buffer name 'T' is reserved                                            dsl._buffer             choose another name
buffer name 'B' is used twice                                          dsl._buffer             give each buffer its own name
buffer B: axis .. does not belong to <op>                              dsl._buffer             declare the axis on the operator
buffer B: dtype should be None or one of ..                            dsl.buffer_dtype        one of the listed dtypes
sparse buffer S is declared over [..]                                  dsl._check_sparse_axes  (i, j, [dense axes]); a dense buffer otherwise
sparse buffer S: trailing axis j should be a dense axis                dsl._check_sparse_axes  op.dense_fixed(.., extent=...)
sparse buffer S names an axis twice                                    dsl._check_sparse_axes  list each axis once
sparse input A is the operator's first sparse input, the matrix        dsl._check_sparse_axes  the matrix over (i, j) first, then A
operator <op> has no sparse structure yet                              dsl.structure           declare the column axis under a row axis
operator <op> declares j as DenseVariable: no default format           dsl.default_format      pass a format
kinds should be one S or R per axis                                    dsl.iterate             one S or R per axis
an iteration lists each axis once                                      dsl.iterate             each axis once
iteration over DenseFixed(k): the axis does not belong to <op>         dsl.iterate             the operator's own axes
iteration t has no statement                                           dsl.iterate             X[..] = e or X[..] += e
iteration t already has a statement                                    dsl._add_statement      open another iteration
A[i, j] writes A, an input                                             dsl._add_statement      op.dense_output / dense_temp / sparse_output
iteration t reduces over [j] but the statement is a plain assignment   dsl._add_statement      X[..] += e or maximum(X[..], e)
iteration t has a reduction statement but no R axis                    dsl._add_statement      mark the axis R, or an assignment
O[i, j] is indexed by the reduction axis j                             dsl._add_statement      mark j S, or index without it
D[i, k] is assigned a reduction of C[i, k]                             dsl.Buffer.__setitem__  D[i, k] += e
buffer B has 2 axes, indexed with 1                                    dsl.Buffer.__getitem__  B[j, k]              (IndexError)
axis k of B is indexed with 0                                          dsl.Buffer.__getitem__  an iteration variable (TypeError)
sparse buffer A is indexed by k for its axis i                         dsl.Buffer.__getitem__  its own axes, or A[i, jd] (IndexError)
axis k of B cannot be indexed by f                                     dsl.Buffer.__getitem__  k's variable, or declare B over f (IndexError)
sparse buffer A is indexed by a read of E                              dsl.Buffer._indirect    a dense buffer W[E[..], f] (IndexError)
axis r of W is indexed by a read of E, which is float                  dsl.Buffer._indirect    dtype='int32' (TypeError)
axis r of W is indexed by a read of P, a temp                          dsl.Buffer._indirect    an input
axis r of W is indexed by the matrix A                                 dsl.Buffer._indirect    a further sparse input E (dtype int32)
C is written through an indirect index (a scatter)                     dsl.Buffer.__setitem__  write at iteration variables
O[i, jd] writes the sparse buffer O at a dense column axis             dsl.Buffer.__setitem__  O[i, j] over its entries
iteration t iterates (i, j) and reads A[i, jd], a lookup               dsl._check_no_lookup    A[i, j], or iterate [i, jd, ...] without j
iteration t over [i] .. cannot read the sparse buffer A[i, j]          dsl._check_dense_stmt.  iterate [i, j, ...], reduce first, or A[i, jd]
iteration t over [i] .. cannot write the sparse buffer O[i, j]         dsl._check_dense_stmt.  iterate [i, j, ...]
iteration t over [i] reads B[i, k], but axis k is not iterated here    dsl._check_dense_stmt.  add k, or compute it over k first
unknown compile parameter feet=4                                       lower.bind.check_params its compile parameters
operator <op> needs compile-time values for ['feat']                   lower.bind.check_params feat=64
feat should be a positive int                                          lower.bind.check_params a positive int
operator axis 'jo' clashes with an axis of format bsr                  lower.bind              rename it
buffer names clash with the format's index arrays                      lower.emit              rename the buffers
a reduction into the scalar s over several parts or rows               lower.positions._fill   give it an axis, sum afterwards
A[i, jd] reads a sparse buffer at a coordinate that may not be stored  lower.lookup            csr, ell or bsr:RxC
stage flat: the format stores int4 values (lower() only)              lower.flatten           dtype='int4' (TypeError)
format ell needs its width to compile                                  build.compile           'ell:W' or a converted matrix
<op> x <fmt> is not supported on CUDA: the sparse output S has ..      build.refuse_on_cuda    csr, ell, bsr or bsr+csr on CUDA, or llvm
<op> x <fmt> x <dtype>: the format stores int8 values                  build.refuse_unsupported dtype='int8'
<op> x <fmt> x int8: <fmt> stores float values                         build.refuse_unsupported srbcrs:v8,int8, or float32
<op> x <fmt> x int8: <op> calls exp                                    build.refuse_unsupported a float dtype
t: a dense iteration that reduces over its first axis                  schedules.cuda          the spatial axis first
=====================================================================  ======================  ==============================================
"""
from __future__ import annotations

import re

import pytest

import sparsec
from sparsec import dsl
from sparsec.formats import make_format
from sparsec.lower import lower


def _op(cols: str = "sparse_variable"):
    op = dsl.Operator("t")
    I = op.dense_fixed("i")
    J = getattr(op, cols)("j", parent=I)
    return op, I, J


def _spmm(name: str = "t"):
    op = dsl.Operator(name)
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    K = op.dense_fixed("k", extent="feat")
    A = op.sparse_input("A", (I, J))
    B = op.dense_input("B", (J, K))
    C = op.dense_output("C", (I, K))
    return op, (I, J, K), (A, B, C)


def _iterate(op, axes, kinds, body):
    with op.iterate(axes, kinds) as vs:
        body(*vs)
    return op


# ---- builders: each raises the refusal it is named after -------------------------------------------------
def width_zero():
    op, I, _ = _op()
    op.sparse_fixed("j2", I, 0)


def parent_foreign():
    op, I, _ = _op()
    op.sparse_variable("j2", parent=dsl.Operator("x").dense_fixed("r"))


def parent_not_row():
    op = dsl.Operator("t")
    K = op.dense_fixed("k", extent=4)
    op.sparse_variable("j", parent=K)


def second_structure():
    op, I, J = _op()
    op.sparse_variable("j2", parent=I)


def axis_twice():
    op, I, J = _op()
    op.dense_fixed("i", extent=3)


def buffer_not_identifier():
    op, I, J = _op()
    op.dense_input("my buffer", (I,))


def buffer_reserved():
    op, I, J = _op()
    op.dense_input("T", (I,))


def buffer_twice():
    op, I, J = _op()
    op.dense_input("B", (I,))
    op.dense_input("B", (J,))


def buffer_foreign_axis():
    op, I, J = _op()
    op.dense_input("B", (dsl.Operator("x").dense_fixed("r", extent=2),))


def buffer_bad_dtype():
    op, I, J = _op()
    op.dense_input("B", (I,), dtype="complex64")


def sparse_over_other_axes():
    op, I, J = _op()
    op.sparse_input("S", (J, I))


def sparse_trailing_structural():
    op, I, J = _op()
    op.sparse_input("A", (I, J))
    op.sparse_input("S", (I, J, I))


def sparse_axis_twice():
    op, I, J = _op()
    H = op.dense_fixed("h", extent=2)
    op.sparse_input("A", (I, J))
    op.sparse_input("S", (I, J, H, H))


def matrix_with_trailing():
    op, I, J = _op()
    H = op.dense_fixed("h", extent=2)
    op.sparse_input("A", (I, J, H))


def no_structure():
    op = dsl.Operator("t")
    I = op.dense_fixed("i")
    op.sparse_input("A", (I,))


def no_default_format():
    op, I, J = _op("dense_variable")
    op.default_format()


def bad_kinds():
    op, (I, J, K), _ = _spmm()
    _iterate(op, [I, J, K], "SR", lambda *v: None)


def axis_twice_in_iteration():
    op, (I, J, K), _ = _spmm()
    _iterate(op, [I, J, J], "SRR", lambda *v: None)


def foreign_axis_in_iteration():
    op, (I, J, K), _ = _spmm()
    _iterate(op, [I, dsl.Operator("x").dense_fixed("k", extent=2)], "SS", lambda *v: None)


def empty_iteration():
    op, (I, J, K), _ = _spmm()
    _iterate(op, [I, J, K], "SRS", lambda *v: None)


def two_statements():
    op, (I, J, K), (A, B, C) = _spmm()

    def body(i, j, k):
        C[i, k] += A[i, j] * B[j, k]
        C[i, k] += A[i, j]

    _iterate(op, [I, J, K], "SRS", body)


def write_input():
    op, (I, J, K), (A, B, C) = _spmm()

    def body(i, j):
        A[i, j] = A[i, j] * 2.0

    _iterate(op, [I, J], "SS", body)


def reduce_with_assignment():
    op, (I, J, K), (A, B, C) = _spmm()

    def body(i, j, k):
        C[i, k] = A[i, j] * B[j, k]

    _iterate(op, [I, J, K], "SRS", body)


def reduction_without_r_axis():
    op, (I, J, K), (A, B, C) = _spmm()

    def body(i, j, k):
        C[i, k] += A[i, j] * B[j, k]

    _iterate(op, [I, J, K], "SSS", body)


def output_indexed_by_r_axis():
    op, I, J = _op()
    A = op.sparse_input("A", (I, J))
    O = op.sparse_output("O", (I, J))

    def body(i, j):
        O[i, j] += A[i, j]

    _iterate(op, [I, J], "SR", body)


def reduction_into_another_element():
    op, (I, J, K), (A, B, C) = _spmm()
    D = op.dense_output("D", (I, K))

    def body(i, j, k):
        acc = C[i, k]
        acc += A[i, j] * B[j, k]
        D[i, k] = acc

    _iterate(op, [I, J, K], "SRS", body)


def wrong_index_count():
    op, (I, J, K), (A, B, C) = _spmm()
    _iterate(op, [I, J, K], "SRS", lambda i, j, k: C.__setitem__((i, k), A[i, j] * B[j]))


def index_with_int():
    op, (I, J, K), (A, B, C) = _spmm()
    _iterate(op, [I, J, K], "SRS", lambda i, j, k: C.__setitem__((i, k), A[i, j] * B[j, 0]))


def sparse_wrong_row():
    op, (I, J, K), (A, B, C) = _spmm()
    _iterate(op, [I, J, K], "SRS", lambda i, j, k: C.__setitem__((i, k), A[k, j]))


def dense_wrong_axis():
    op, (I, J, K), (A, B, C) = _spmm()
    F = op.dense_fixed("f", extent=2)
    _iterate(op, [I, J, F], "SRS", lambda i, j, f: C.__setitem__((i, f), A[i, j]))


def _relational():
    op, I, J = _op()
    F = op.dense_fixed("f", extent=2)
    R = op.dense_fixed("r", extent=3)
    A = op.sparse_input("A", (I, J))
    W = op.dense_input("W", (R, F))
    Y = op.dense_output("Y", (I, F))
    return op, (I, J, F, R), (A, W, Y)


def sparse_indexed_indirectly():
    op, (I, J, F, R), (A, W, Y) = _relational()
    E = op.sparse_input("E", (I, J), dtype="int32")
    S = op.sparse_input("S", (I, J))
    _iterate(op, [I, J], "SR", lambda i, j: None if S[E[i, j], j] else None)


def float_index():
    op, (I, J, F, R), (A, W, Y) = _relational()
    E = op.sparse_input("E", (I, J))
    _iterate(op, [I, J, F], "SRS", lambda i, j, f: None if W[E[i, j], f] else None)


def index_from_temp():
    op, (I, J, F, R), (A, W, Y) = _relational()
    P = op.dense_temp("P", (J,), dtype="int32")
    _iterate(op, [I, J, F], "SRS", lambda i, j, f: None if W[P[j], f] else None)


def index_by_matrix():
    op, (I, J, F, R), (A, W, Y) = _relational()
    _iterate(op, [I, J, F], "SRS", lambda i, j, f: None if W[A[i, j], f] else None)


def scatter_write():
    op, (I, J, F, R), (A, W, Y) = _relational()
    E = op.sparse_input("E", (I, J), dtype="int32")
    Z = op.dense_output("Z", (R, F))

    def body(i, j, f):
        Z[E[i, j], f] = A[i, j]

    _iterate(op, [I, J, F], "SSS", body)


def _lookup_op():
    op, I, J = _op()
    Jd = op.dense_fixed("jd", extent="n")
    A = op.sparse_input("A", (I, J))
    return op, (I, J, Jd), A


def lookup_write():
    op, (I, J, Jd), A = _lookup_op()
    O = op.sparse_output("O", (I, J))

    def body(i, jd):
        O[i, jd] = 1.0

    _iterate(op, [I, Jd], "SS", body)


def lookup_in_sparse_iteration():
    op, (I, J, Jd), A = _lookup_op()
    y = op.dense_output("y", (I,))

    def body(i, j, jd):
        y[i] += A[i, jd]

    _iterate(op, [I, J, Jd], "SRR", body)


def dense_reads_sparse():
    op, I, J = _op()
    A = op.sparse_input("A", (I, J))
    y = op.dense_output("y", (I,))
    _iterate(op, [I], "S", lambda i: y.__setitem__(i, A[i, dsl.IterVar(J)]))


def dense_writes_sparse():
    op, I, J = _op()
    op.sparse_input("A", (I, J))
    O = op.sparse_output("O", (I, J))
    _iterate(op, [I], "S", lambda i: O.__setitem__((i, dsl.IterVar(J)), 1.0))


def dense_axis_not_iterated():
    op, (I, J, K), (A, B, C) = _spmm()
    y = op.dense_output("y", (I,))
    _iterate(op, [I], "S", lambda i: y.__setitem__(i, C[i, dsl.IterVar(K)]))


def _compile(op, fmt, target="llvm", **params):
    return lambda: sparsec.compile(op(), fmt, target=target, **params)


def _scalar_sum():
    op, I, J = _op()
    A = op.sparse_input("A", (I, J))
    s = op.dense_output("s", ())
    with op.iterate([I, J], "RR") as (i, j):
        s[()] += A[i, j]
    return op


def _axis_named_like_bsr():
    op = dsl.Operator("t")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    Jo = op.dense_fixed("jo", extent=2)
    A = op.sparse_input("A", (I, J))
    y = op.dense_output("y", (I, Jo))
    return _iterate(op, [I, J, Jo], "SRS", lambda i, j, jo: y.__setitem__((i, jo), y[i, jo].__iadd__(A[i, j])))


def _buffer_named_indptr():
    op, I, J = _op()
    A = op.sparse_input("A", (I, J))
    y = op.dense_output("indptr", (I,))
    return _iterate(op, [I, J], "SR", lambda i, j: y.__setitem__(i, y[i].__iadd__(A[i, j])))


def _lookup_spmm():
    op, (I, J, Jd), A = _lookup_op()
    y = op.dense_output("y", (I,))
    return _iterate(op, [I, Jd], "SR", lambda i, jd: y.__setitem__(i, y[i].__iadd__(A[i, jd])))


def _sparse_trailing_output():
    op, I, J = _op()
    H = op.dense_fixed("h", extent=2)
    A = op.sparse_input("A", (I, J))
    S = op.sparse_output("S", (I, J, H))
    return _iterate(op, [I, J, H], "SSS", lambda i, j, h: S.__setitem__((i, j, h), A[i, j] * 2.0))


def _row_sum():
    op, I, J = _op()
    A = op.sparse_input("A", (I, J))
    y = op.dense_output("y", (I,))
    return _iterate(op, [I, J], "SR", lambda i, j: y.__setitem__(i, y[i].__iadd__(A[i, j])))


def _row_exp():
    op, I, J = _op()
    A = op.sparse_input("A", (I, J))
    y = op.dense_output("y", (I,))
    return _iterate(op, [I, J], "SR", lambda i, j: y.__setitem__(i, y[i].__iadd__(dsl.exp(A[i, j]))))


def _dense_reduce_first():
    op, (I, J, K), (A, B, C) = _spmm()
    _iterate(op, [I, J, K], "SRS", lambda i, j, k: C.__setitem__((i, k), C[i, k].__iadd__(A[i, j] * B[j, k])))
    s = op.dense_output("s", (K,))
    return _iterate(op, [I, K], "RS", lambda i, k: s.__setitem__(k, s[k].__iadd__(C[i, k])))


E = pytest.param
REFUSALS = [
    # ---- declarations
    E(width_zero, ValueError, ["sparse_fixed j2", "width should be a positive int"], id="sparse_fixed-width"),
    E(parent_foreign, ValueError, ["axis j2", "parent should be an axis of t"], id="parent-foreign"),
    E(parent_not_row, ValueError, ["axis j", "parent should be the row axis (dense_fixed with no extent)"],
      id="parent-not-row"),
    E(second_structure, ValueError, ["axis j2", "already has the sparse structure (i, j)",
                                     "op.sparse_input('W', (i, j))"], id="second-structure"),
    E(axis_twice, ValueError, ["axis name 'i' is used twice", "give each axis its own name"], id="axis-twice"),
    E(buffer_not_identifier, ValueError, ["'my buffer'", "should be a Python identifier"], id="buffer-identifier"),
    E(buffer_reserved, ValueError, ["buffer name 'T' is reserved", "choose another name"], id="buffer-reserved"),
    E(buffer_twice, ValueError, ["buffer name 'B' is used twice", "give each buffer its own name"], id="buffer-twice"),
    E(buffer_foreign_axis, ValueError, ["buffer B: axis DenseFixed(r) does not belong to t",
                                        "declare the axis on t"], id="buffer-foreign-axis"),
    E(buffer_bad_dtype, ValueError, ["buffer B: dtype should be None", "'float32'"], id="buffer-dtype"),
    E(sparse_over_other_axes, ValueError, ["sparse buffer S is declared over ['j', 'i']", "(i, j, h)",
                                           "declare a dense buffer"], id="sparse-axes"),
    E(sparse_trailing_structural, ValueError, ["sparse buffer S: trailing axis i",
                                               "op.dense_fixed('i', extent=...)"], id="sparse-trailing"),
    E(sparse_axis_twice, ValueError, ["sparse buffer S names an axis twice", "list each axis once"],
      id="sparse-axis-twice"),
    E(matrix_with_trailing, ValueError, ["sparse input A is the operator's first sparse input",
                                         "declare the matrix over (i, j) first"], id="matrix-trailing"),
    E(no_structure, ValueError, ["operator t has no sparse structure yet",
                                 "j = op.sparse_variable('j', parent=i)"], id="no-structure"),
    E(no_default_format, ValueError, ["declares j as DenseVariable", "pass a format (e.g. 'csr'"],
      id="no-default-format"),
    # ---- iterations and statements
    E(bad_kinds, ValueError, ["kinds should be one S or R per axis (3 axes)", "'SR'"], id="kinds"),
    E(axis_twice_in_iteration, ValueError, ["an iteration lists each axis once", "['i', 'j', 'j']"],
      id="iteration-axis-twice"),
    E(foreign_axis_in_iteration, ValueError, ["iteration over DenseFixed(k)", "iterate the axes declared on t"],
      id="iteration-foreign-axis"),
    E(empty_iteration, ValueError, ["iteration t has no statement", "X[..] += e"], id="no-statement"),
    E(two_statements, ValueError, ["iteration t already has a statement", "open another iteration"],
      id="two-statements"),
    E(write_input, ValueError, ["A[i, j] writes A, an input", "op.dense_output"], id="write-input"),
    E(reduce_with_assignment, ValueError, ["reduces over ['j'] but the statement is a plain assignment",
                                           "X[..] += e"], id="reduce-assignment"),
    E(reduction_without_r_axis, ValueError, ["has a reduction statement but no R axis",
                                             "mark the reduced axis R"], id="reduction-no-r"),
    E(output_indexed_by_r_axis, ValueError, ["O[i, j] is indexed by the reduction axis j", "mark j S"],
      id="output-r-axis"),
    E(reduction_into_another_element, ValueError, ["D[i, k] is assigned a reduction of C[i, k]",
                                                   "write D[i, k] += e"], id="reduction-target"),
    # ---- indexing
    E(wrong_index_count, IndexError, ["buffer B has 2 axes, indexed with 1", "write B[j, k]"], id="index-count"),
    E(index_with_int, TypeError, ["axis k of B is indexed with 0", "iteration variable"], id="index-int"),
    E(sparse_wrong_row, IndexError, ["sparse buffer A is indexed by k for its axis i",
                                     "index it by its own axes ['i', 'j']", "A[i, jd]"], id="sparse-index"),
    E(dense_wrong_axis, IndexError, ["axis k of C cannot be indexed by f", "declare C over f"], id="dense-index"),
    E(sparse_indexed_indirectly, IndexError, ["sparse buffer S is indexed by a read of E",
                                              "index a dense buffer instead"], id="sparse-indirect"),
    E(float_index, TypeError, ["axis r of W is indexed by a read of E", "dtype='int32'"], id="index-float"),
    E(index_from_temp, ValueError, ["axis r of W is indexed by a read of P, a temp", "should come from an input"],
      id="index-temp"),
    E(index_by_matrix, ValueError, ["axis r of W is indexed by the matrix A",
                                    "op.sparse_input('E', (i, j), dtype='int32')"], id="index-matrix"),
    E(scatter_write, ValueError, ["Z is written through an indirect index (a scatter)",
                                  "write it at iteration variables"], id="scatter"),
    E(lookup_write, ValueError, ["O[i, jd] writes the sparse buffer O at a dense column axis",
                                 "write O[i, j] in an iteration over them"], id="lookup-write"),
    E(lookup_in_sparse_iteration, ValueError, ["iterates the sparse structure (i, j) and reads A[i, jd]",
                                               "read A[i, j] at the entry instead", "[i, jd, ...] without j"],
      id="lookup-sparse-iteration"),
    E(dense_reads_sparse, ValueError, ["over [i] does not iterate the sparse structure (i, j)",
                                       "cannot read the sparse buffer A[i, j]", "iterate [i, j, ...] together",
                                       "read it at a dense column axis (A[i, jd]"], id="dense-reads-sparse"),
    E(dense_writes_sparse, ValueError, ["cannot write the sparse buffer O[i, j]", "iterate [i, j, ...] together"],
      id="dense-writes-sparse"),
    E(dense_axis_not_iterated, ValueError, ["reads C[i, k], but axis k is not iterated here",
                                            "add k to the iteration's axes"], id="dense-axis-not-iterated"),
    # ---- compile: parameters, lowering, build
    E(_compile(_lookup_spmm, "csr", feet=4), ValueError, ["unknown compile parameter feet=4",
                                                          "its compile parameters are ['n']"], id="param-unknown"),
    E(_compile(_lookup_spmm, "csr"), ValueError, ["needs compile-time values for ['n']", "n=64"],
      id="param-missing"),
    E(_compile(_lookup_spmm, "csr", n=0), ValueError, ["n should be a positive int", "got 0"], id="param-value"),
    E(_compile(_axis_named_like_bsr, "bsr:2x2"), ValueError, ["stage bind", "operator axis 'jo' clashes with an axis "
                                                              "of format bsr", "rename it"], id="axis-clash"),
    E(_compile(_buffer_named_indptr, "csr"), ValueError, ["stage script", "clash with the format's index arrays: "
                                                          "['indptr']", "rename the buffers"], id="buffer-clash"),
    E(_compile(_scalar_sum, "hyb:2:1/2/4"), ValueError, ["a reduction into the scalar s over several parts or rows",
                                                         "give it an axis"], id="scalar-over-parts"),
    E(_compile(_lookup_spmm, "hyb:2:1/2/4", n=8), ValueError, ["A[i, jd]", "composite format hyb",
                                                               "bind the operator to csr, ell or bsr:RxC instead"],
      id="lookup-format"),
    E(lambda: lower(_row_sum(), make_format("srbcrs:v8,int4"), {}), TypeError,
      ["stage flat: the format stores int4 values", "dtype='int4'"], id="int4-dtype"),
    E(_compile(_row_sum, "ell"), ValueError, ["format ell needs its width", "give 'ell:W'"], id="ell-width"),
    E(_compile(_sparse_trailing_output, "hyb:2:1/2/4", target="cuda:sm_90a"), ValueError,
      ["not supported on CUDA: the sparse output S has trailing axes (h)", "compile it for csr, ell, bsr or bsr+csr "
       "on CUDA, or for llvm"], id="cuda-trailing-sparse-output"),
    E(_compile(_row_sum, "srbcrs:v8,int8", dtype="float32"), ValueError,
      ["t x srbcrs", "the format stores int8 values", "compile it with dtype='int8'"], id="format-dtype"),
    E(_compile(_row_sum, "csr", dtype="int8"), ValueError,
      ["csr stores float values", "srbcrs", "or compile for float32"], id="int-precision-float-format"),
    E(_compile(_row_exp, "srbcrs:v8,int8", dtype="int8"), ValueError, ["t calls exp", "compile it with a float dtype"],
      id="int-precision-exp"),
    E(_compile(_dense_reduce_first, "csr", target="cuda:sm_90a", feat=4), ValueError,
      ["a dense iteration that reduces over its first axis i", "iterate [k, i, ...] with the spatial axis first"],
      id="cuda-dense-reduce-first"),
]


@pytest.mark.parametrize("build, exc, fragments", REFUSALS)
def test_refusal_names_the_construct_and_what_to_write_instead(build, exc, fragments):
    with pytest.raises(exc) as e:
        build()
    text = str(e.value)
    for f in fragments:
        assert f in text, f"{f!r} not in {text!r}"


def test_inventory_lists_every_refusal_tested():
    """The docstring's table has one row per refusal above (the inventory stays complete)."""
    rows = [line for line in __doc__.splitlines() if re.match(r"^\S.*\s{2,}(dsl|lower|build|schedules)\.", line)]
    assert len(rows) == len(REFUSALS), (len(rows), len(REFUSALS))
