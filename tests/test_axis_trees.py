"""Structures with an outer axis (r, i, j): the DSL, the stacked binding on several formats,
the library's rgcn and batched_spmm, CUDA's segment contraction, and sparsec.torch_rgcn."""
import os

import numpy as np
import pytest
import scipy.sparse as sp

import sparsec
from sparsec import dsl, ops
from sparsec.formats import convert, stack_rows, unstack_rows
from sparsec.reference import evaluate, max_rel_err


def _graph(n=29, seed=0):
    a = sp.random(n, n, density=0.15, random_state=seed, format="lil", dtype=np.float32)
    a[3, :] = 0
    a[5, :] = 1.5  # a long row
    a = sp.csr_matrix(a)
    a.data[::7] = 0.0  # explicit zeros
    return a


@pytest.mark.parametrize("fmt, n", [("csr", 29), ("hyb", 29), ("ell", 29), ("bsr:2x2", 30)])
def test_rgcn_matches_per_relation_reference(fmt, n):
    rng = np.random.default_rng(1)
    adj, rel = _graph(n), 3
    stacked = stack_rows(adj, rng.integers(0, rel, adj.nnz), rel).astype(np.float32)
    X = rng.standard_normal((adj.shape[1], 5)).astype(np.float32)
    W = rng.standard_normal((rel, 5, 7)).astype(np.float32)
    ref = sum(a.astype(np.float64) @ (X.astype(np.float64) @ W[r].astype(np.float64)) for r, a in enumerate(unstack_rows(stacked, rel)))
    inst = convert(stacked, fmt)
    k = sparsec.compile(ops.rgcn(), inst, target="llvm", rel=rel, fin=5, fout=7)
    assert max_rel_err(k(inst, X, W, poison=True), ref) < 1e-5
    assert max_rel_err(evaluate(ops.rgcn(), inst, X, W, params=dict(rel=rel, fin=5, fout=7)), ref) < 1e-12


def test_batched_spmm_one_graph_per_batch_entry():
    rng = np.random.default_rng(2)
    mats = [_graph(seed=s)[:, :23] for s in range(3)]
    X = rng.standard_normal((3, 23, 4)).astype(np.float32)
    inst = convert(stack_rows(mats).astype(np.float32), "hyb")
    k = sparsec.compile(ops.batched_spmm(), inst, target="llvm", batch=3, feat=4)
    ref = np.stack([m.astype(np.float64) @ X[b] for b, m in enumerate(mats)])
    assert max_rel_err(k(inst, X, poison=True), ref) < 1e-5


def _fill_fusion(on: bool):
    from sparsec.lower import fuse_fill

    saved, fuse_fill.ENABLED = fuse_fill.ENABLED, on
    yield
    fuse_fill.ENABLED = saved


@pytest.fixture
def fused_fill():
    """Kernels compiled in the test run the output's fill in the contraction's launch."""
    yield from _fill_fusion(True)


@pytest.fixture
def separate_fill():
    """Kernels compiled in the test give the output's fill a launch of its own
    (SPARSEC_FUSE_FILL=0)."""
    yield from _fill_fusion(False)


def test_rgcn_is_one_cuda_launch_by_default():
    """The fill's fusion is on unless turned off: the library RGCN is one launch a layer."""
    from sparsec.lower import fuse_fill

    assert fuse_fill.ENABLED == (os.environ.get("SPARSEC_FUSE_FILL", "1") == "1")
    if not fuse_fill.ENABLED:
        pytest.skip("SPARSEC_FUSE_FILL=0 in this environment")
    inst = convert(stack_rows(_graph(), np.arange(_graph().nnz) % 4, 4).astype(np.float32), "csr")
    src = sparsec.compile("rgcn_bias", inst, target="cuda", rel=4, fin=64, fout=32).source()
    assert src.count("__global__") // 2 == 1 and "atomicCAS" in src


def test_segment_contraction_is_one_cuda_kernel_after_the_fill_and_compiles(separate_fill):
    from nvcc_tools import nvcc_compile

    adj = _graph()
    inst = convert(stack_rows(adj, np.arange(adj.nnz) % 4, 4).astype(np.float32), "csr")
    k = sparsec.compile(ops.rgcn(), inst, target="cuda", rel=4, fin=64, fout=16)
    src = k.source()
    assert "l__Zs" in src and "atomicAdd" in src  # the segment sums in shared memory, rows shared by relations
    assert src.count("__global__") // 2 == 2  # the output's fill, then one launch for every relation
    assert "atomicCAS" not in src
    ok, log = nvcc_compile(src, "sm_90a")
    assert ok, log[-2000:]


@pytest.mark.parametrize("fout", [16, 64])
def test_fused_fill_contraction_is_one_kernel_that_compiles(fused_fill, fout):
    """With lower.fuse_fill on, the fill runs in the contraction's launch: groups of rows
    claimed (atomicCAS) and marked filled (atomicExch) through the workspace, nvcc-clean."""
    from nvcc_tools import nvcc_compile

    adj = _graph()
    inst = convert(stack_rows(adj, np.arange(adj.nnz) % 4, 4).astype(np.float32), "csr")
    k = sparsec.compile("rgcn_bias", inst, target="cuda", rel=4, fin=64, fout=fout)
    src = k.source()
    assert src.count("__global__") // 2 == 1
    assert "atomicCAS" in src and "atomicExch" in src and "sparsec_sync_s1" in src
    ok, log = nvcc_compile(src, "sm_90a")
    assert ok, log[-2000:]


@pytest.mark.parametrize("fmt, launches", [("csr", 1), ("ell", 1), ("hyb", 2)])
def test_rgcn_with_bias_is_one_launch_where_rows_follow_positions(fused_fill, fmt, launches):
    """The fill runs in the contraction's launch where output rows are p % rows of the root
    position (csr, ell); hyb reaches its rows through a row map and keeps the fill's own."""
    adj = _graph()
    inst = convert(stack_rows(adj, np.arange(adj.nnz) % 3, 3).astype(np.float32), fmt)
    k = sparsec.compile("rgcn_bias", inst, target="cuda", rel=3, fin=32, fout=64)
    src = k.source()
    assert src.count("__global__") // 2 == launches
    assert any(p.name.startswith("sparsec_sync_s") for p in k.params) == (launches == 1)


def test_fill_workspace_is_zeros_sized_for_the_instance_and_cached():
    """The workspace: zeros, a claim and a fill count per 256 rows and a call count per
    block (splits per group, from its name), the same array on every call of the instance."""
    from sparsec.ir_attrs import sync_words
    from sparsec.tc_operands import packed_operands

    adj = _graph()
    inst = convert(stack_rows(adj, np.arange(adj.nnz) % 3, 3).astype(np.float32), "csr")
    ws = packed_operands(inst, ["sparsec_sync_s8"])["sparsec_sync_s8"]
    assert ws.dtype == np.int32 and not ws.any()
    assert ws.size == sync_words(inst.shape[0], 8) == (2 + 8) * -(-inst.shape[0] // 256)
    assert packed_operands(inst, ["sparsec_sync_s8"])["sparsec_sync_s8"] is ws
    with pytest.raises(ValueError, match="sparsec_sync_sx"):
        packed_operands(inst, ["sparsec_sync_sx"])


def test_batched_spmm_on_bsr_blocks_within_each_graph():
    """BSR over a stacked structure: a block of rows lies in one graph (lrows = 28, blocks of 4),
    r and i read from the block's first row; its CUDA kernel keeps a block's rows in registers."""
    rng = np.random.default_rng(4)
    mats = [_graph(28, seed=s)[:, :23] for s in range(3)]
    X = rng.standard_normal((3, 23, 8)).astype(np.float32)
    inst = convert(stack_rows(mats).astype(np.float32), "bsr:4x4")
    k = sparsec.compile(ops.batched_spmm(), inst, target="llvm", batch=3, feat=8)
    ref = np.stack([m.astype(np.float64) @ X[b] for b, m in enumerate(mats)])
    assert max_rel_err(k(inst, X, poison=True), ref) < 1e-5
    assert max_rel_err(evaluate(ops.batched_spmm(), inst, X, params=dict(batch=3, feat=8)), ref) < 1e-12


def test_outer_axis_on_bsr_compiles_for_cuda():
    from nvcc_tools import nvcc_sources

    sources = {(name, "sm_90a"): sparsec.compile(name, "bsr:4x4", target="cuda:sm_90a", **params).source()
               for name, params in (("batched_spmm", dict(batch=3, feat=16)), ("rgcn", dict(rel=4, fin=16, fout=16)))}
    assert "float C_local_ptr[16];" in sources[("batched_spmm", "sm_90a")]  # a block's 4 rows x 4 features per thread
    for key, (ok, log) in nvcc_sources(sources).items():
        assert ok, f"{key}: {log[-2000:]}"


def test_blocks_of_rows_that_straddle_two_graphs_are_refused():
    inst = convert(stack_rows([_graph(), _graph(seed=1)]).astype(np.float32), "bsr:2x2")  # lrows = 29
    k = sparsec.compile(ops.batched_spmm(), inst, target="llvm", batch=2, feat=2)
    with pytest.raises(ValueError, match=r"bsr:2x2 stores rows in blocks of 2.*lrows = 29.*pad each pattern"):
        k(inst, np.zeros((2, 29, 2), np.float32))


def test_refusals_name_the_construct():
    op = dsl.Operator("x")
    R = op.dense_fixed("r", extent="rel")
    with pytest.raises(ValueError, match="drop extent"):
        op.dense_fixed("i", extent=4, parent=R)
    I = op.dense_fixed("i", parent=R)
    J = op.sparse_variable("j", parent=I)
    F = op.dense_fixed("f", extent="feat")
    with pytest.raises(ValueError, match=r"lives on the operator's sparse structure \(r, i, j\)"):
        op.sparse_input("A", (I, J))
    op.sparse_input("A", (R, I, J))
    X = op.dense_input("X", (J, F))
    Y = op.dense_output("Y", (I, F))
    with pytest.raises(ValueError, match=r"without its outer axis r.*op.iterate\(\[r, i, j"):
        with op.iterate([I, J, F], "SRS") as (i, j, f):
            Y[i, f] += X[j, f]
    with pytest.raises(ValueError, match="types holds 5, out of range"):
        stack_rows(sp.csr_matrix(np.ones((2, 2))), [0, 1, 5, 0], 3)


def test_rows_that_are_not_whole_blocks_are_refused():
    inst = convert(_graph().astype(np.float32), "csr")  # 29 rows: not 3 relations of equal size
    k = sparsec.compile(ops.rgcn(), inst, target="llvm", rel=3, fin=2, fout=2)
    with pytest.raises(ValueError, match="3 equal blocks of rows"):
        k(inst, np.zeros((29, 2), np.float32), np.zeros((3, 2, 2), np.float32))


def test_torch_rgcn_matches_dense_autograd():
    torch = pytest.importorskip("torch")
    from sparsec.torch_rgcn import RelationalGraph, RGCNConv

    adj, R = _graph(), 3
    adj.setdiag(0)
    adj.eliminate_zeros()
    types = np.random.default_rng(3).integers(0, R, adj.nnz)
    g = RelationalGraph(adj, types, R)
    torch.manual_seed(0)
    conv = RGCNConv(4, 3, R)
    with torch.no_grad():
        conv.bias.normal_()
    x = torch.randn(adj.shape[0], 4, requires_grad=True)
    up = torch.randn(adj.shape[0], 3)
    (conv(g, x) * up).sum().backward()
    mats = [torch.tensor(m.toarray()) for m in unstack_rows(g.matrix.to_scipy(), g.rel)]
    x2 = x.detach().clone().requires_grad_(True)
    W2 = torch.cat([conv.weight, conv.root[None]]).detach().clone().requires_grad_(True)
    b2 = conv.bias.detach().clone().requires_grad_(True)
    y2 = sum(m @ x2 @ W2[r] for r, m in enumerate(mats)) + b2
    (y2 * up).sum().backward()
    assert torch.allclose(conv.bias.grad, b2.grad, atol=1e-5)
    assert torch.allclose(x.grad, x2.grad, atol=1e-5)
    assert torch.allclose(conv.weight.grad, W2.grad[:R], atol=1e-5)
    assert torch.allclose(conv.root.grad, W2.grad[R], atol=1e-5)


def test_packed_weight_follows_parameter_updates():
    torch = pytest.importorskip("torch")
    from sparsec.torch_rgcn import RelationalGraph, RGCNConv

    adj, R = _graph(), 2
    g = RelationalGraph(adj, np.random.default_rng(4).integers(0, R, adj.nnz), R)
    conv = RGCNConv(3, 2, R)
    x = torch.randn(adj.shape[0], 3)
    before = conv(g, x).detach().clone()
    assert conv.packed_weight() is conv.packed_weight()  # no repacking while the parameters hold still
    with torch.no_grad():
        conv.root.mul_(2.0)  # an optimizer step: in place
    mats = [torch.tensor(m.toarray()) for m in unstack_rows(g.matrix.to_scipy(), g.rel)]
    W = torch.cat([conv.weight, conv.root[None]]).detach()
    expected = sum(m @ x @ W[r] for r, m in enumerate(mats)) + conv.bias.detach()
    after = conv(g, x).detach()
    assert torch.allclose(after, expected, atol=1e-5) and not torch.allclose(after, before)


@pytest.mark.parametrize("fmt", ["csr", "hyb"])
def test_bias_is_the_value_the_sum_starts_from(fmt):
    """rgcn_bias has no pass for its bias: the fill nest stores b, and the result, empty rows
    included, is the sum plus b."""
    from sparsec.lower.bind import bind
    from sparsec.lower.fold_epilogue import fold_epilogues
    from sparsec.lower.positions import lower_positions

    R, n = 3, 10
    mats = [sp.random(n, n, density=0.3, random_state=r, format="csr", dtype=np.float32) for r in range(R)]
    mats[1] = sp.csr_matrix((n, n), dtype=np.float32)  # a relation without edges: every row empty
    inst = convert(stack_rows(mats), fmt)
    prog = fold_epilogues(lower_positions(bind(ops.get("rgcn_bias"), inst.format, {"rel": R, "fin": 2, "fout": 3})))
    assert not any(nest.dense for nest in prog.nests)
    assert [nest.value for nest in prog.nests if nest.fill][0].buffer == "b"
    rng = np.random.default_rng(5)
    X, W, b = rng.standard_normal((n, 2)), rng.standard_normal((R, 2, 3)), rng.standard_normal(3)
    k = sparsec.compile("rgcn_bias", inst, target="llvm", rel=R, fin=2, fout=3)
    y = k(inst, X.astype(np.float32), W.astype(np.float32), b.astype(np.float32), poison=True)
    ref = sum(m.toarray().astype(np.float64) @ X @ W[r] for r, m in enumerate(mats)) + b
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op_name", ["spmm_bias", "spmm_add"])
def test_owning_buckets_start_from_the_added_term(op_name):
    """On hyb, rows in the narrow buckets are owned by one part (it starts them with T.init)
    and the widest bucket's split rows add into the fill: a folded bias or root term must
    reach both, and the empty rows the fill covers (a hub row, short rows, empty rows)."""
    from sparsec.lower.bind import bind
    from sparsec.lower.fold_epilogue import fold_epilogues
    from sparsec.lower.positions import lower_positions

    rng = np.random.default_rng(7)
    m = sp.random(90, 90, density=0.04, random_state=3, format="lil", dtype=np.float64)
    m[:9, :] = 0                                   # empty rows
    m[40, :] = rng.standard_normal(90)             # a row split across the widest bucket
    m = m.tocsr().astype(np.float32)
    inst = convert(m, "hyb")
    assert "dup" in inst.format.spec
    prog = fold_epilogues(lower_positions(bind(ops.get(op_name), inst.format, {"feat": 5})))
    assert not any(nest.dense for nest in prog.nests)  # no pass of its own
    owners = [nest for nest in prog.nests if not nest.fill and nest.init]
    assert owners and all(nest.init_value is not None for nest in owners)
    B = rng.standard_normal((90, 5))
    term = rng.standard_normal(5) if op_name == "spmm_bias" else rng.standard_normal((90, 5))
    k = sparsec.compile(op_name, inst, target="llvm", feat=5)
    y = k(inst, B.astype(np.float32), term.astype(np.float32), poison=True)
    np.testing.assert_allclose(y, m.toarray().astype(np.float64) @ B + term, rtol=1e-5, atol=1e-5)


def test_fused_fill_kernel_takes_a_launch_bound(fused_fill, monkeypatch):
    """segment_contract.FUSED_MIN_BLOCKS bounds the fused kernel to that many resident blocks
    per SM (registers capped to fit), what time_rgcn_fill.py's fused_bN variants measure."""
    from nvcc_tools import nvcc_compile
    from sparsec.schedules import segment_contract

    monkeypatch.setattr(segment_contract, "FUSED_MIN_BLOCKS", 8)
    adj = _graph()
    inst = convert(stack_rows(adj, np.arange(adj.nnz) % 4, 4).astype(np.float32), "csr")
    src = sparsec.compile("rgcn_bias", inst, target="cuda", rel=4, fin=64, fout=64).source()
    assert "__launch_bounds__(256, 8)" in src and src.count("__global__") // 2 == 1
    ok, log = nvcc_compile(src, "sm_90a")
    assert ok, log[-2000:]
