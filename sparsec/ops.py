"""Library operators, written once in the DSL and bound to a format at compile time."""
from __future__ import annotations

import re
from typing import Callable, Dict, Optional

from .dsl import Operator, exp, less, maximum, select


def _spmm_sum(op: Operator):
    """SpMM's axes, buffers and sum ``C[i, k] += A[i, j] * B[j, k]`` in ``op``; (I, K, C)."""
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    K = op.dense_fixed("k", extent="feat")
    A = op.sparse_input("A", (I, J))
    B = op.dense_input("B", (J, K))
    C = op.dense_output("C", (I, K))
    with op.iterate([I, J, K], "SRS") as (i, j, k):
        C[i, k] += A[i, j] * B[j, k]
    return I, K, C


def spmm() -> Operator:
    """SpMM: ``C[i, k] = sum_j A[i, j] * B[j, k]`` (sparse A, dense B and C)."""
    op = Operator("spmm", "C[i, k] = sum_j A[i, j] * B[j, k]")
    _spmm_sum(op)
    return op


def linear(out_dtype: Optional[str] = None, bias_dtype: Optional[str] = None) -> Operator:
    """A linear layer's product on token-major activations, as ``torch.nn.Linear`` holds them:
    ``Y[k, i] = sum_j A[i, j] * X[k, j]`` (A the weight, out x in; X tokens x in; Y tokens x
    out), plus ``bias[i]`` when ``bias_dtype`` is given; ``out_dtype`` declares Y's dtype
    (the kernel sums in its own and stores that). For float16 BSR weights on sm_90 it
    compiles to ``schedules.bsr_tokens``."""
    suffix = "" if out_dtype is None and bias_dtype is None else f"_{out_dtype or 'out'}_{bias_dtype or 'nobias'}"
    op = Operator("linear" + suffix, "Y[k, i] = sum_j A[i, j] * X[k, j]" + (" + bias[i]" if bias_dtype else ""))
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    K = op.dense_fixed("k", extent="feat")
    A = op.sparse_input("A", (I, J))
    X = op.dense_input("X", (K, J))
    bias = op.dense_input("bias", (I,), dtype=bias_dtype) if bias_dtype else None
    Y = op.dense_output("Y", (K, I), dtype=out_dtype)
    with op.iterate([I, J, K], "SRS") as (i, j, k):
        Y[k, i] += A[i, j] * X[k, j]
    if bias is not None:
        with op.iterate([K, I], "SS") as (k, i):
            Y[k, i] = Y[k, i] + bias[i]
    return op


def spmm_bias() -> Operator:
    """SpMM plus a bias per column: ``C[i, k] = sum_j A[i, j] * B[j, k] + b[k]`` (a graph
    convolution's output in one pass: the bias is stored with each row's sum, or is the value
    a shared-row sum starts from, ``lower.fold_epilogue``)."""
    op = Operator("spmm_bias", "C[i, k] = sum_j A[i, j] * B[j, k] + b[k]")
    I, K, C = _spmm_sum(op)
    b = op.dense_input("b", (K,))
    with op.iterate([I, K], "SS") as (i, k):
        C[i, k] = C[i, k] + b[k]
    return op


def spmm_add() -> Operator:
    """SpMM plus a dense term: ``C[i, k] = sum_j A[i, j] * B[j, k] + R[i, k]`` (GraphSAGE's
    neighbour mean plus its root term, in one pass)."""
    op = Operator("spmm_add", "C[i, k] = sum_j A[i, j] * B[j, k] + R[i, k]")
    I, K, C = _spmm_sum(op)
    R = op.dense_input("R", (I, K))
    with op.iterate([I, K], "SS") as (i, k):
        C[i, k] = C[i, k] + R[i, k]
    return op


def sddmm() -> Operator:
    """SDDMM: ``C[i, j] = A[i, j] * sum_k X[i, k] * Y[j, k]`` over A's stored entries.

    Both dense operands are row-major over the features (X is rows x feat, Y is cols x feat),
    as in DGL and SparseTIR: a stored entry reads two contiguous feature rows."""
    op = Operator("sddmm", "C[i, j] = A[i, j] * sum_k X[i, k] * Y[j, k] over A's non-zeros")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    K = op.dense_fixed("k", extent="feat")
    A = op.sparse_input("A", (I, J))
    X = op.dense_input("X", (I, K))
    Y = op.dense_input("Y", (J, K))
    C = op.sparse_output("C", (I, J))
    # The dot product first, then the scale: an infinite A[i, j] gives +-inf as scipy does,
    # where folding A into every term (inf * x - inf * y) would give NaN.
    with op.iterate([I, J, K], "SSR") as (i, j, k):
        C[i, j] += X[i, k] * Y[j, k]
    with op.iterate([I, J], "SS") as (i, j):
        C[i, j] = A[i, j] * C[i, j]
    return op


def attention() -> Operator:
    """Sparse attention: ``O = softmax_j(A[i, j] * Q[i, :] . Kt[j, :]) @ V`` over A's stored entries.

    A is the mask: every stored entry is a (query, key) pair that attends, and its value
    scales the score (1/sqrt(d) for scaled dot-product attention). Q is rows x feat, Kt
    (the keys) and V are cols x feat, all row-major like SDDMM's operands. Several heads fold
    into the rows: a block-diagonal mask with Q, Kt and V stacked per head.

    The scores S live on the mask's entries (a sparse temp: nnz values, never rows x cols);
    mx and s are the row max and the row sum of exp(S - mx) (softmax with the max
    subtracted, so large scores do not overflow); the probabilities exp(S - mx) / s are
    recomputed inside the SpMM rather than stored. A row with no entries gives O = 0.
    The mask is the matrix's coordinates (its logical pattern), whatever the format: an
    explicit zero the user stored attends (with score 0), while a format's padding -- a BSR
    block's implicit zeros, the rows of an N:M or SR-BCRS vector lacking a column -- does not
    (lowering guards the max, the exp sums and the SpMM with the format's slot mask)."""
    op = Operator("attention", "O[i, d] = sum_j softmax_j(A[i, j] * sum_k Q[i, k] * Kt[j, k]) * V[j, d] "
                               "over A's non-zeros")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    K = op.dense_fixed("k", extent="feat")  # the features of the dot product
    D = op.dense_fixed("d", extent="feat")  # the features of V and O (another loop, same width)
    A = op.sparse_input("A", (I, J))
    Q = op.dense_input("Q", (I, K))
    Kt = op.dense_input("Kt", (J, K))
    V = op.dense_input("V", (J, D))
    O = op.dense_output("O", (I, D))
    S = op.sparse_temp("S", (I, J))
    mx = op.dense_temp("mx", (I,))
    s = op.dense_temp("s", (I,))
    with op.iterate([I, J, K], "SSR") as (i, j, k):  # SDDMM: the dot first, then the scale (as sddmm)
        S[i, j] += Q[i, k] * Kt[j, k]
    with op.iterate([I, J], "SS") as (i, j):
        S[i, j] = A[i, j] * S[i, j]
    with op.iterate([I, J], "SR") as (i, j):
        mx[i] = maximum(mx[i], S[i, j])
    with op.iterate([I, J], "SR") as (i, j):
        s[i] += exp(S[i, j] - mx[i])
    with op.iterate([I, J, D], "SRS") as (i, j, d):  # SpMM with the probabilities made on the fly
        O[i, d] += exp(S[i, j] - mx[i]) / s[i] * V[j, d]
    return op


def rgcn(bias: bool = False) -> Operator:
    """Relational graph convolution: ``Y[i, g] = sum_r sum_j A[r, i, j] sum_f X[j, f] W[r, f, g]``
    (``+ b[g]`` with ``bias``).

    One pattern per relation r (the structure (r, i, j): relations above the rows), bound to
    the relations' matrices stacked along the rows (``sparsec.formats.stack_rows``: row
    r * n + i), in any format family: csr is CSR per relation, hyb buckets the (r, i)
    segments by length. A's values weigh the edges (1 / deg_r(i) for PyG's mean); a
    self-loop relation with W[r] = W_root carries the root term. X is cols x fin, W is
    rel x fin x fout, b is fout, Y is n x fout. On CUDA the schedule sums each segment's X
    rows first and multiplies once by W[r] (``schedules.segment_contract``); the bias is
    the value the output starts from (``lower.fold_epilogue``), so it costs no pass of its own."""
    name, text = ("rgcn_bias", " + b[g]") if bias else ("rgcn", "")
    op = Operator(name, f"Y[i, g] = sum_r sum_j A[r, i, j] * sum_f X[j, f] * W[r, f, g]{text}")
    R = op.dense_fixed("r", extent="rel")
    I = op.dense_fixed("i", parent=R)
    J = op.sparse_variable("j", parent=I)
    F = op.dense_fixed("f", extent="fin")
    G = op.dense_fixed("g", extent="fout")
    A = op.sparse_input("A", (R, I, J))
    X = op.dense_input("X", (J, F))
    W = op.dense_input("W", (R, F, G))
    b = op.dense_input("b", (G,)) if bias else None
    Y = op.dense_output("Y", (I, G))
    with op.iterate([R, I, J, G, F], "RSRSR") as (r, i, j, g, f):
        Y[i, g] += A[r, i, j] * X[j, f] * W[r, f, g]
    if bias:
        with op.iterate([I, G], "SS") as (i, g):
            Y[i, g] = Y[i, g] + b[g]
    return op


def batched_spmm() -> Operator:
    """SpMM over a batch of graphs: ``C[b, i, k] = sum_j A[b, i, j] * X[b, j, k]``.

    The batch axis sits above the rows (structure (b, i, j)); the graphs, n x m each, are
    stacked along the rows (``sparsec.formats.stack_rows``), X is batch x m x feat and C
    batch x n x feat: one launch for the whole batch, never a block-diagonal matrix."""
    op = Operator("batched_spmm", "C[b, i, k] = sum_j A[b, i, j] * X[b, j, k]")
    B = op.dense_fixed("b", extent="batch")
    I = op.dense_fixed("i", parent=B)
    J = op.sparse_variable("j", parent=I)
    K = op.dense_fixed("k", extent="feat")
    A = op.sparse_input("A", (B, I, J))
    X = op.dense_input("X", (B, J, K))
    C = op.dense_output("C", (B, I, K))
    with op.iterate([B, I, J, K], "SSRS") as (b, i, j, k):
        C[b, i, k] += A[b, i, j] * X[b, j, k]
    return op


def multihead_spmm() -> Operator:
    """Multi-head SpMM: ``C[i, h, f] = sum_j P[i, j, h] * B[j, h, f]`` over A's stored entries.

    A (the matrix) gives the pattern only; its values are not read. P holds one weight per
    stored entry per head (edge data with a trailing head axis, ``(nnz, heads)`` in canonical
    CSR order, or ``A.edge_values(P)``), B is ``(cols, heads, feat)`` and C ``(rows, heads,
    feat)``, all row-major: the heads are an axis of their own, never folded into the rows, so
    an entry reads one contiguous ``heads x feat`` row of B. Compile-time extents ``heads``
    and ``feat``. A row without entries gives 0."""
    op = Operator("multihead_spmm", "C[i, h, f] = sum_j P[i, j, h] * B[j, h, f] over A's non-zeros")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    H = op.dense_fixed("h", extent="heads")
    F = op.dense_fixed("f", extent="feat")
    op.sparse_input("A", (I, J))
    P = op.sparse_input("P", (I, J, H))
    B = op.dense_input("B", (J, H, F))
    C = op.dense_output("C", (I, H, F))
    with op.iterate([I, J, H, F], "SRSS") as (i, j, h, f):
        C[i, h, f] += P[i, j, h] * B[j, h, f]
    return op


def multihead_sddmm() -> Operator:
    """Multi-head SDDMM: ``C[i, j, h] = A[i, j] * sum_k X[i, h, k] * Y[j, h, k]`` over A's
    stored entries.

    X is ``(rows, heads, feat)``, Y ``(cols, heads, feat)``, row-major; C is a sparse output with
    a trailing head axis, one value per stored slot per head (``(stored, heads)``, 0 at a
    format's padding; ``A.coordinate_values(C)`` gives it per entry in canonical CSR order).
    The dot product first, then the scale (as ``sddmm``: an infinite A gives +-inf)."""
    op = Operator("multihead_sddmm", "C[i, j, h] = A[i, j] * sum_k X[i, h, k] * Y[j, h, k] over A's non-zeros")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    H = op.dense_fixed("h", extent="heads")
    K = op.dense_fixed("k", extent="feat")
    A = op.sparse_input("A", (I, J))
    X = op.dense_input("X", (I, H, K))
    Y = op.dense_input("Y", (J, H, K))
    C = op.sparse_output("C", (I, J, H))
    with op.iterate([I, J, H, K], "SSSR") as (i, j, h, k):
        C[i, j, h] += X[i, h, k] * Y[j, h, k]
    with op.iterate([I, J, H], "SSS") as (i, j, h):
        C[i, j, h] = A[i, j] * C[i, j, h]
    return op


GAT_SLOPE = 0.2  # PyG's and DGL's default negative slope of the LeakyReLU


def _leaky(x, slope: float):
    """LeakyReLU as ``max(x, slope * x)`` (exact for 0 <= slope <= 1)."""
    return maximum(x, x * slope)


def _check_slope(slope) -> float:
    slope = float(slope)
    if not 0.0 <= slope <= 1.0:
        raise ValueError(f"negative_slope should be in [0, 1] (LeakyReLU as max(x, slope * x)), got {slope}")
    return slope


def _slope_name(base: str, slope: float) -> str:
    """The operator's name: ``base`` at the default slope, else with the slope in it (compiled
    kernels are cached by name, so two slopes must not share one)."""
    return base if slope == GAT_SLOPE else f"{base}_slope_" + re.sub(r"\W", "_", repr(slope))


def _gat_logits(op: Operator):
    """The axes and inputs GAT's operators share: (I, J, H, el, er)."""
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    H = op.dense_fixed("h", extent="heads")
    op.sparse_input("A", (I, J))
    el = op.dense_input("el", (I, H))
    er = op.dense_input("er", (J, H))
    return I, J, H, el, er


def gat(negative_slope: float = GAT_SLOPE, stats: bool = False) -> Operator:
    """GAT's attention and aggregation (edge softmax with its SDDMM-like logits and its SpMM)
    as one operator, over A's stored entries (A's pattern is the neighbourhood; its values are
    not read)::

        e[i, j, h]     = leaky_relu(el[i, h] + er[j, h], negative_slope)
        alpha[i, j, h] = exp(e[i, j, h] - max_j e[i, j, h]) / sum_j exp(e[i, j, h] - max_j e[i, j, h])
        O[i, h, f]     = sum_j alpha[i, j, h] * Z[j, h, f]

    Z is the transformed node features ``(cols, heads, feat)`` (``x @ W`` viewed per head), el
    ``(rows, heads)`` and er ``(cols, heads)`` the two halves of the attention logits (``Z .
    att_dst`` and ``Z . att_src`` in PyG's names, for target i and source j), O ``(rows, heads,
    feat)``; compile-time extents ``heads`` and ``feat``. The slope is a compile-time constant
    (LeakyReLU as ``max(x, slope * x)``, so 0 <= slope <= 1). The softmax subtracts the row max
    per head; a row without entries gives O = 0. Logits are recomputed from el and er where
    they are needed (two loads per entry and head), never stored.

    ``stats=True`` (the operator ``gat_stats``) also returns the softmax's row statistics
    ``mx[i, h] = max_j e`` and ``s[i, h] = sum_j exp(e - mx)`` (``(rows, heads)``; for a row
    without entries s = 0 and mx the identity of max, the dtype's lowest value), which the
    forward pass computes anyway: the backward operators (:func:`gat_grad_rows`,
    :func:`gat_grad_cols`) rebuild alpha from them (``lse = mx + log(s)``), el and er, with no
    pass of their own over the rows."""
    slope = _check_slope(negative_slope)
    op = Operator(_slope_name("gat_stats" if stats else "gat", slope),
                  f"O[i, h, f] = sum_j softmax_j(leaky_relu(el[i, h] + er[j, h], {slope:g})) * Z[j, h, f] "
                  "over A's non-zeros" + ("; mx, s: the softmax's row max and row sum" if stats else ""))
    I, J, H, el, er = _gat_logits(op)
    F = op.dense_fixed("f", extent="feat")
    Z = op.dense_input("Z", (J, H, F))
    O = op.dense_output("O", (I, H, F))
    stat = op.dense_output if stats else op.dense_temp
    mx = stat("mx", (I, H))
    s = stat("s", (I, H))
    with op.iterate([I, J, H], "SRS") as (i, j, h):
        mx[i, h] = maximum(mx[i, h], _leaky(el[i, h] + er[j, h], slope))
    with op.iterate([I, J, H], "SRS") as (i, j, h):
        s[i, h] += exp(_leaky(el[i, h] + er[j, h], slope) - mx[i, h])
    with op.iterate([I, J, H, F], "SRSS") as (i, j, h, f):
        O[i, h, f] += exp(_leaky(el[i, h] + er[j, h], slope) - mx[i, h]) / s[i, h] * Z[j, h, f]
    return op


def edge_softmax(negative_slope: float = GAT_SLOPE) -> Operator:
    """GAT's attention weights per stored entry and head, as a sparse output::

        alpha[i, j, h] = softmax_j(leaky_relu(el[i, h] + er[j, h], negative_slope))

    (the row max per head subtracted; definitions and layouts as :func:`gat`). alpha is
    ``(stored, heads)``, 0 at a format's padding. Why an operator of its own: the backward
    pass of :func:`gat` needs alpha, which the forward operator never stores."""
    slope = _check_slope(negative_slope)
    op = Operator(_slope_name("edge_softmax", slope),
                  f"alpha[i, j, h] = softmax_j(leaky_relu(el[i, h] + er[j, h], {slope:g})) over A's non-zeros")
    I, J, H, el, er = _gat_logits(op)
    alpha = op.sparse_output("alpha", (I, J, H))
    mx = op.dense_temp("mx", (I, H))
    s = op.dense_temp("s", (I, H))
    with op.iterate([I, J, H], "SRS") as (i, j, h):
        mx[i, h] = maximum(mx[i, h], _leaky(el[i, h] + er[j, h], slope))
    with op.iterate([I, J, H], "SRS") as (i, j, h):
        s[i, h] += exp(_leaky(el[i, h] + er[j, h], slope) - mx[i, h])
    with op.iterate([I, J, H], "SSS") as (i, j, h):
        alpha[i, j, h] = exp(_leaky(el[i, h] + er[j, h], slope) - mx[i, h]) / s[i, h]
    return op


# ---- GAT's backward pass: row reductions into dense outputs, no per-edge tensor ----------------------
# With alpha[i, j, h] = exp(e[i, j, h] - lse[i, h]), lse = mx + log(s) the softmax's log-sum-exp
# (from gat(stats=True)), O the forward output and dO its gradient, the softmax's backward pass is
#     de[i, j, h] = alpha * (sum_f dO[i, h, f] Z[j, h, f] - sum_f dO[i, h, f] O[i, h, f]) * leaky_relu'(x)
#                 = sum_f alpha * leaky_relu'(x) * dO[i, h, f] * (Z[j, h, f] - O[i, h, f]),   x = el[i, h] + er[j, h]
# (sum_j alpha dalpha = dO . O), so every gradient is a sum over one axis of the pattern of terms
# made from node arrays: d_el over each row of A, dZ and d_er over each row of A's transpose.
# Each iteration is then an SpMM-like row reduction (any format: hyb splits long rows and adds
# their pieces atomically), never a per-edge tensor that would have to be carried between A's
# and A^T's slot layouts.
def _gat_grad_axes(op: Operator, row: str, col: str):
    """(R, C, H, F) of a GAT gradient operator: its matrix (A with rows i, or A's transpose with
    rows j), heads and features."""
    R = op.dense_fixed(row)
    C = op.sparse_variable(col, parent=R)
    H = op.dense_fixed("h", extent="heads")
    F = op.dense_fixed("f", extent="feat")
    return R, C, H, F


def _gat_grad_inputs(op: Operator, I, J, H, F):
    """el, er, lse (node arrays), Z, O, dO ((nodes, heads, feat)): what both gradient operators read."""
    return (op.dense_input("el", (I, H)), op.dense_input("er", (J, H)), op.dense_input("lse", (I, H)),
            op.dense_input("Z", (J, H, F)), op.dense_input("O", (I, H, F)), op.dense_input("dO", (I, H, F)))


def _alpha(el, er, lse, i, j, h, slope: float):
    """alpha[i, j, h] rebuilt from node arrays: exp(leaky_relu(el[i, h] + er[j, h]) - lse[i, h])."""
    return exp(_leaky(el[i, h] + er[j, h], slope) - lse[i, h])


def _leaky_grad(x, slope: float):
    """leaky_relu'(x): 1 where x > 0, else the slope (as torch's backward pass)."""
    return select(less(0.0, x), 1.0, slope)


def gat_grad_rows(negative_slope: float = GAT_SLOPE) -> Operator:
    """The gradient of :func:`gat` w.r.t. el, on A (rows i)::

        d_el[i, h] = sum_j de[i, j, h]
                   = sum_f dO[i, h, f] * sum_j alpha[i, j, h] * leaky_relu'(x) * (Z[j, h, f] - O[i, h, f])

    with alpha = exp(leaky_relu(x) - lse[i, h]), x = el[i, h] + er[j, h], ``lse = mx + log(s)``
    from ``gat(stats=True)``, O the forward output and dO its gradient, ``(rows, heads, feat)``.
    A's values are not read. Two iterations: the sum over j per feature (an SpMM-like row
    reduction into the dense temporary ``Dl``), then the dot with dO[i] (a dense one). A row
    without entries gives 0."""
    slope = _check_slope(negative_slope)
    op = Operator(_slope_name("gat_grad_rows", slope),
                  f"d_el[i, h] = sum_j d softmax-logit of gat (slope {slope:g}) over A's non-zeros")
    I, J, H, F = _gat_grad_axes(op, "i", "j")
    op.sparse_input("A", (I, J))
    el, er, lse, Z, O, dO = _gat_grad_inputs(op, I, J, H, F)
    Dl = op.dense_temp("Dl", (I, H, F))
    d_el = op.dense_output("d_el", (I, H))
    with op.iterate([I, J, H, F], "SRSS") as (i, j, h, f):
        Dl[i, h, f] += _alpha(el, er, lse, i, j, h, slope) * _leaky_grad(el[i, h] + er[j, h], slope) \
            * (Z[j, h, f] - O[i, h, f])
    with op.iterate([I, H, F], "SSR") as (i, h, f):
        d_el[i, h] += dO[i, h, f] * Dl[i, h, f]
    return op


def gat_grad_cols(negative_slope: float = GAT_SLOPE) -> Operator:
    """The gradients of :func:`gat` w.r.t. Z and er, on A's transpose ``At`` (rows j, the
    sources; columns i, the targets)::

        dZ[j, h, f] = sum_i alpha[i, j, h] * dO[i, h, f]
        d_er[j, h]  = sum_i de[i, j, h]
                    = sum_f sum_i alpha[i, j, h] * leaky_relu'(x) * dO[i, h, f] * (Z[j, h, f] - O[i, h, f])

    (definitions as :func:`gat_grad_rows`; el, lse, O and dO are read at the column i, er and Z
    at the row j). At's values are not read. Three iterations: dZ and the per-feature sum
    ``Dr`` (two SpMM-like row reductions), then d_er, Dr summed over the features (a dense
    one). A row without entries (a node no edge leaves) gives 0."""
    slope = _check_slope(negative_slope)
    op = Operator(_slope_name("gat_grad_cols", slope),
                  f"dZ[j, h, f] = sum_i alpha[i, j, h] * dO[i, h, f], d_er[j, h] = sum_i d softmax-logit of gat "
                  f"(slope {slope:g}) over At's non-zeros")
    J, I, H, F = _gat_grad_axes(op, "j", "i")
    op.sparse_input("At", (J, I))
    el, er, lse, Z, O, dO = _gat_grad_inputs(op, I, J, H, F)
    dZ = op.dense_output("dZ", (J, H, F))
    Dr = op.dense_temp("Dr", (J, H, F))
    d_er = op.dense_output("d_er", (J, H))
    with op.iterate([J, I, H, F], "SRSS") as (j, i, h, f):
        dZ[j, h, f] += _alpha(el, er, lse, i, j, h, slope) * dO[i, h, f]
    with op.iterate([J, I, H, F], "SRSS") as (j, i, h, f):
        Dr[j, h, f] += _alpha(el, er, lse, i, j, h, slope) * _leaky_grad(el[i, h] + er[j, h], slope) \
            * dO[i, h, f] * (Z[j, h, f] - O[i, h, f])
    with op.iterate([J, H, F], "SSR") as (j, h, f):
        d_er[j, h] += Dr[j, h, f]
    return op


LIBRARY: Dict[str, Callable[[], Operator]] = {"spmm": spmm, "linear": linear, "spmm_bias": spmm_bias,
                                              "spmm_add": spmm_add,
                                              "sddmm": sddmm, "attention": attention,
                                              "multihead_spmm": multihead_spmm, "multihead_sddmm": multihead_sddmm,
                                              "gat": gat, "edge_softmax": edge_softmax, "gat_grad_rows": gat_grad_rows,
                                              "gat_grad_cols": gat_grad_cols, "rgcn": rgcn,
                                              "rgcn_bias": lambda: rgcn(bias=True),
                                              "batched_spmm": batched_spmm}


def get(name: str) -> Operator:
    """A fresh library operator by name."""
    if name not in LIBRARY:
        raise ValueError(f"operator should be one of {sorted(LIBRARY)}, got {name!r}")
    return LIBRARY[name]()
