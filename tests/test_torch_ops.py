"""sparsec.torch (issue 7): the custom ops against dense torch, autograd against finite
differences and dense autograd, torch.compile without graph breaks, and bad input."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

torch = pytest.importorskip("torch")
st = pytest.importorskip("sparsec.torch")

from sparsec.reference import REFERENCES, max_rel_err  # noqa: E402


def random_csr(rows, cols, density, seed, dtype=np.float32):
    m = sp.random(rows, cols, density=density, format="lil", random_state=seed, dtype=np.float64)
    m[: max(1, rows // 10), :] = 0  # empty rows
    m[rows // 2, :] = np.linspace(-1, 1, cols)  # one full row
    return m.tocsr().astype(dtype)


def test_spmm_and_sddmm_match_the_references():
    m = random_csr(77, 53, 0.1, 0)
    A = st.SparseTensor(m)
    B = torch.randn(53, 12)
    assert max_rel_err(st.spmm(A, B).numpy(), m.astype(np.float64) @ B.double().numpy()) < 1e-5
    X, Y = torch.randn(77, 12), torch.randn(53, 12)
    ref = REFERENCES["sddmm"](A.instance, X.numpy(), Y.numpy())
    assert max_rel_err(st.sddmm(A, X, Y).numpy(), ref) < 1e-5


@pytest.mark.parametrize("fmt", ["csr", "hyb", "ell", "bsr:2x3", "auto"])
def test_spmm_gradients_match_dense_autograd(fmt):
    m = random_csr(64, 48, 0.08, 1)
    A = st.SparseTensor(m, fmt, requires_grad=True)
    B = torch.randn(48, 10, requires_grad=True)
    w = torch.randn(64, 10)
    (st.spmm(A, B) * w).sum().backward()
    dense = torch.tensor(m.toarray(), requires_grad=True)
    Bd = B.detach().clone().requires_grad_(True)
    ((dense @ Bd) * w).sum().backward()
    assert torch.allclose(B.grad, Bd.grad, atol=1e-5)
    rows, cols = A.instance.stored_coords()
    real = rows >= 0
    assert np.allclose(A.values.grad.numpy()[real], dense.grad.numpy()[rows[real], cols[real]], atol=1e-5)
    assert not A.values.grad.numpy()[~real].any()  # padding slots get no gradient


def test_spmm_gradcheck_finite_differences():
    m = random_csr(23, 17, 0.2, 2, np.float64)
    A = st.SparseTensor(m, dtype="float64")

    def f(values, b):
        return st._SpMMFunction.apply(values, b, A)

    v = A.values.detach().clone().requires_grad_(True)
    b = torch.randn(17, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(f, (v, b))


def test_fake_implementations_and_schemas():
    m = random_csr(40, 30, 0.1, 3)
    A = st.SparseTensor(m)
    B, X, Y = torch.randn(30, 8), torch.randn(40, 8), torch.randn(30, 8)
    torch.library.opcheck(torch.ops.sparsec.spmm.default, (A.key, A.index, A.values, A.sizes, A.size_names, B),
                          test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(torch.ops.sparsec.sddmm.default,
                          (A.key, A.index, A.values, A.sizes, A.size_names, X, Y),
                          test_utils=("test_schema", "test_faketensor"))



def test_eager_calls_skip_the_dispatcher_but_modes_and_tracing_see_the_ops(monkeypatch):
    """Eager calls on plain tensors run the ops' bodies directly (torch.library's dispatch
    costs tens of microseconds of host time a call); a dispatch mode, a meta tensor or a
    gradient to record still go through the registered op, with the same result."""
    from torch.utils._python_dispatch import TorchDispatchMode

    m = random_csr(40, 30, 0.1, 4)
    A = st.SparseTensor(m, requires_grad=True)
    B, X, Y = torch.randn(30, 8), torch.randn(40, 8), torch.randn(30, 8)
    with torch.no_grad():
        direct_spmm, direct_sddmm = st.spmm(A, B), st.sddmm(A, X, Y)

    class Seen(TorchDispatchMode):
        ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), Seen():
        seen_spmm, seen_sddmm = st.spmm(A, B), st.sddmm(A, X, Y)
    assert "sparsec.spmm.default" in Seen.ops and "sparsec.sddmm.default" in Seen.ops
    assert torch.equal(direct_spmm, seen_spmm) and torch.equal(direct_sddmm, seen_sddmm)

    def no_dispatch(*a, **k):
        raise AssertionError("an eager call went through torch.library's dispatch")

    meta = st.spmm(A, torch.empty((30, 8), device="meta"))  # shapes only: the op's fake implementation
    assert meta.device.type == "meta" and tuple(meta.shape) == (40, 8)
    monkeypatch.setattr(st, "_spmm_op", no_dispatch)
    monkeypatch.setattr(st, "_sddmm_op", no_dispatch)
    with torch.no_grad():
        assert torch.equal(st.spmm(A, B), direct_spmm) and torch.equal(st.sddmm(A, X, Y), direct_sddmm)
    Bg = B.clone().requires_grad_(True)
    st.spmm(A, Bg).sum().backward()  # the autograd Function's forward and backward run the bodies too
    assert Bg.grad is not None and A.values.grad is not None
    layer = st.SparseLinear.from_dense(torch.from_numpy(m.toarray()), fmt="csr")  # values: a Parameter
    with torch.no_grad():  # inference on a layer skips the dispatch too
        x = torch.randn(5, 30)
        assert torch.allclose(layer(x), x @ torch.from_numpy(m.toarray()).t(), atol=1e-5)


class SmallGCN(torch.nn.Module):
    """A pruned input projection (SparseLinear) and two graph convolutions."""

    def __init__(self, a_hat, n_in=24, hidden=16, n_out=4):
        super().__init__()
        self.a_hat = a_hat
        w = torch.randn(n_in, n_in)
        w[torch.rand(n_in, n_in) < 0.8] = 0
        self.proj = st.SparseLinear.from_dense(w, bias=torch.zeros(n_in))
        self.c1, self.c2 = st.GCNConv(n_in, hidden), st.GCNConv(hidden, n_out)

    def forward(self, x):
        return self.c2(self.a_hat, torch.relu(self.c1(self.a_hat, self.proj(x))))


def test_torch_compile_has_no_graph_breaks_and_same_gradients():
    torch.manual_seed(0)
    adj = sp.random(150, 150, density=0.03, format="csr", random_state=4)
    a_hat = st.SparseTensor(st.gcn_norm(((adj + adj.T) > 0).astype(np.float32)))
    model, x = SmallGCN(a_hat), torch.randn(150, 24)
    explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    model(x).square().sum().backward()
    eager = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    out = compiled(x)
    assert torch.allclose(out, model(x), atol=1e-5)
    out.square().sum().backward()
    for g, p in zip(eager, model.parameters()):
        assert torch.allclose(g, p.grad, atol=1e-4, rtol=1e-4)


def test_sparse_linear_formats_match_dense():
    torch.manual_seed(1)
    w = torch.randn(32, 48)
    w[torch.rand(32, 48) < 0.85] = 0
    x = torch.randn(5, 7, 48)
    dense = torch.nn.functional.linear(x, w, torch.ones(32))
    for fmt in ("csr", "bsr:4x4", "ell", "hyb"):
        layer = st.SparseLinear.from_dense(w, bias=torch.ones(32), fmt=fmt)
        assert layer.values.requires_grad
        assert torch.allclose(layer(x), dense, atol=1e-5), fmt
    from sparsec.formats import nm

    w24 = torch.where(torch.from_numpy(nm.prune(w.numpy(), n=2, m=4)[1]), w, 0)
    pruned = st.SparseLinear.from_dense(w24, fmt="nm:2:4")  # N:M: inference only
    assert not pruned.values.requires_grad
    assert torch.allclose(pruned(x), torch.nn.functional.linear(x, w24), atol=1e-5)
    with pytest.raises(ValueError, match="no backward pass"):
        st.SparseTensor(w24.numpy(), "nm:2:4", grad=True)


def test_sparse_linear_int8_srbcrs_is_exact_on_quantized_operands():
    torch.manual_seed(2)
    w = torch.randn(40, 64)
    w[torch.rand(40, 64) < 0.9] = 0
    x = torch.randn(3, 5, 64)
    layer = st.SparseLinear.from_dense(w, bias=torch.zeros(40), fmt="srbcrs:v4,int8")
    assert layer.quantized and not layer.values.requires_grad
    wq = torch.from_numpy(layer.weight.instance.to_scipy().toarray()).double()  # the int8 weight, dense
    x2 = x.reshape(-1, 64).double()
    sx = x2.abs().max() / 127
    xq = torch.clamp(torch.round(x2 / sx), -127, 127)
    exact = (xq @ wq.t()) * sx * layer.weight_scale  # the integer product, scaled
    assert torch.allclose(layer(x).reshape(-1, 40).double(), exact, rtol=1e-6, atol=1e-6)
    dense = torch.nn.functional.linear(x, w).reshape(-1, 40)
    assert (layer(x).reshape(-1, 40) - dense).abs().max() < 0.05 * dense.abs().max()  # int8 quantization error


def test_sparse_linear_int8_half_input_scales_before_leaving_int32():
    """The int32 sums of an int8 layer pass float16's range (65504) long before its scaled
    result does: a float16 input must get finite outputs, close to the float product."""
    torch.manual_seed(3)
    w = torch.rand(16, 256)  # all positive: every row's int32 sum is near 128 * 64 * 64
    w[torch.rand(16, 256) < 0.5] = 0
    x = torch.rand(4, 256)
    layer = st.SparseLinear.from_dense(w, fmt="srbcrs:v4,int8")
    y = layer(x.half())
    assert y.dtype == torch.float16 and torch.isfinite(y).all()
    dense = torch.nn.functional.linear(x, w)
    assert (y.float() - dense).abs().max() < 0.05 * dense.abs().max()


def test_bad_input_is_named():
    A = st.SparseTensor(random_csr(20, 10, 0.2, 5))
    with pytest.raises(ValueError, match="B should be 2-D with 10 rows"):
        st.spmm(A, torch.randn(11, 4))
    with pytest.raises(TypeError, match="should be torch.float32"):
        st.spmm(A, torch.randn(10, 4, dtype=torch.float64))
    with pytest.raises(TypeError, match="SparseTensor"):
        st.spmm(torch.randn(20, 10), torch.randn(10, 4))
    with pytest.raises(ValueError, match="same width"):
        st.sddmm(A, torch.randn(20, 4), torch.randn(10, 5))
    with pytest.raises(TypeError, match="no int4 matrices"):
        st.SparseTensor(sp.csr_matrix(np.eye(8, 16, dtype=np.float32) * 3), "srbcrs:v2,int4", dtype="int4")
    A.values = torch.randn(A.values.numel() + 3)  # would read past the stored slots
    with pytest.raises(ValueError, match="one per stored slot"):
        st.spmm(A, torch.randn(10, 4))
