"""The segment contraction's split of long segments over blocks (``schedules.segment_split``):
every entry of every segment summed exactly once, the kernel's rendered arithmetic equal to
the model's, and the CUDA kernel with and without splits compiling for sm_90a."""
import re
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.sparse as ssp

import sparsec
from sparsec import dsl, ops
from sparsec.formats import convert, stack_rows
from sparsec.schedules import segment_contract
from sparsec.schedules.segment_split import Partition, Sym
from nvcc_tools import nvcc_ptx, nvcc_sources
from test_axis_trees import _graph

PARTITIONS = [Partition(segment_contract.SPLITS, segment_contract.CHUNK, segment_contract.STEP),
              Partition(16, 32, 8), Partition(3, 4, 2), Partition(1, 16, 4), Partition(2, 1, 1)]


def _lengths(p: Partition):
    S, C = p.splits, p.chunk
    rng = np.random.default_rng(0)
    return sorted({0, 1, C - 1, C, C + 1, S * C - 1, S * C, S * C + 1, 2 * S * C + C - 1, 5000,
                   *rng.integers(0, 6 * S * C, 20).tolist()} - {-1})


@pytest.mark.parametrize("p", PARTITIONS, ids=str)
def test_every_entry_is_summed_by_exactly_one_split(p):
    for count in _lengths(p):
        walked = [p.entries(count, s) for s in range(p.splits)]
        assert sorted(q for w in walked for q in w) == list(range(count)), count
        for s, w in enumerate(walked):
            assert bool(w) == p.holds(count, s), (count, s)  # a block keeps exactly the segments it sums
            assert all(q // p.chunk % p.splits == s for q in w)  # chunk c belongs to split c mod S


@pytest.mark.parametrize("p", PARTITIONS[:3], ids=str)
def test_rendered_arithmetic_is_the_model_arithmetic(p):
    """The text the kernel computes with (int32 floor division, as Python's ``//``) gives the
    model's numbers, for every split of segments of every length."""
    n, s, k, b = Sym("n"), Sym("s"), Sym("k"), Sym("b")
    text = {name: str(fn) for name, fn in (("holds", p.holds(n, s)), ("chunks", p.chunks(n, s)),
                                            ("first", p.first(s, k)), ("full", p.full(n, b)), ("steps", p.steps(n, b)))}
    for count in _lengths(p):
        for si in range(p.splits):
            env = {"n": count, "s": si, "k": 1, "b": p.first(si, 1)}
            assert eval(text["holds"], env) == p.holds(count, si)
            if p.holds(count, si):
                assert eval(text["chunks"], env) == p.chunks(count, si)
            assert eval(text["first"], env) == p.first(si, 1)
            assert eval(text["full"], env) == p.full(count, env["b"])
            assert eval(text["steps"], env) == p.steps(count, env["b"])


def test_a_partition_with_bad_sizes_is_refused():
    with pytest.raises(ValueError, match="step dividing chunk"):
        Partition(4, 16, 5)
    with pytest.raises(ValueError, match="positive sizes"):
        Partition(0, 16, 4)


def _owned_rows_op():
    """Y[i, g] = sum_j A[i, j] sum_f X[j, f] W[f, g]: a contraction whose rows are owned (stored)."""
    op = dsl.Operator("spmm_then_w", "Y[i, g] = sum_j A[i, j] * sum_f X[j, f] * W[f, g]")
    I = op.dense_fixed("i")
    J = op.sparse_variable("j", parent=I)
    F, G = op.dense_fixed("f", extent="fin"), op.dense_fixed("g", extent="fout")
    A, X = op.sparse_input("A", (I, J)), op.dense_input("X", (J, F))
    W, Y = op.dense_input("W", (F, G)), op.dense_output("Y", (I, G))
    with op.iterate([I, J, G, F], "SRSR") as (i, j, g, f):
        Y[i, g] += A[i, j] * X[j, f] * W[f, g]
    return op


def test_split_kernel_for_atomic_outputs_one_split_for_owned_rows_and_narrow_segments():
    adj = _graph()
    stacked = stack_rows(adj, np.arange(adj.nnz) % 4, 4).astype(np.float32)
    # compiled for the format alone (no matrix to size the split by): DEFAULT_SPLITS
    shared_rows = sparsec.compile(ops.rgcn(), "csr", target="cuda", rel=4, fin=64, fout=16).source()
    owned = sparsec.compile(_owned_rows_op(), convert(adj.astype(np.float32), "ell"), target="cuda",
                            fin=8, fout=40).source()
    S, C = segment_contract.DEFAULT_SPLITS, segment_contract.CHUNK
    assert S > 1 and re.search(rf"l__sp_ptr\[0\] = \(\(\(int\)blockIdx\.x\) (& {S - 1}|% {S})\)", shared_rows)
    assert f"(l__sp_ptr[0] * {C}) < l__cnt_ptr[0]" in shared_rows  # split s keeps the segments longer than s * C
    assert "atomicAdd" in shared_rows and "__syncthreads_or" in shared_rows
    assert "l__Zs" in owned and "l__sp_ptr[0] = 0;" in owned and "atomicAdd" not in owned
    narrow = sparsec.compile(ops.rgcn(), convert(stacked, "rell:4,dup"), target="cuda", rel=4, fin=8, fout=8).source()
    assert "l__sp_ptr[0] = 0;" in narrow  # segments of at most 4 entries: one chunk, one split
    results = nvcc_sources({("rgcn", "sm_90a"): shared_rows, ("owned", "sm_90a"): owned})
    for key, (ok, output) in results.items():
        assert ok, f"{key}: {output[-2000:]}"


def _split_line(inst) -> str:
    k = sparsec.compile(ops.rgcn(), inst, target="cuda:sm_90a", rel=2, fin=8, fout=8)
    return re.search(r"l__sp: T.int32 = [^\n]*", k.script).group(0)


def test_split_count_follows_the_matrix():
    """A kernel compiled for a matrix splits its groups only as far as that matrix's heaviest
    group needs (segment_contract.splits_for): none for even rows, up to SPLITS for a hub."""
    sc = segment_contract
    assert sc.splits_for(np.full(4096, 3)) == 1
    assert sc.splits_for(np.zeros(100, np.int64)) == 1
    hub = np.full(256 * 1024, 2)  # 1024 groups of 512 entries
    hub[:256] = 1000  # one group ~340x the mean: capped at SPLITS
    assert sc.splits_for(hub) == sc.SPLITS == 16
    hub[:256] = 40  # 19.6x the mean: 2^ceil(log2(19.6 / 8)) = 4
    assert sc.splits_for(hub) == 4

    rng = np.random.default_rng(0)
    even = ssp.random(4096, 4096, density=0.001, format="csr", random_state=rng, dtype=np.float32)
    hubby = even.tolil()
    hubby[:40, :] = 1.0  # the first group of rows of each relation holds ~15x the mean group
    hubby = hubby.tocsr()
    insts = {name: convert(stack_rows(m, rng.integers(0, 2, m.nnz), 2), "csr")
             for name, m in (("even", even), ("hub", hubby))}
    want = sc.splits_for(np.diff(insts["hub"].to_scipy().indptr))
    assert want > 1
    assert _split_line(insts["even"]).endswith("= 0")
    assert _split_line(insts["hub"]).endswith(f"% {want}")


def test_contraction_product_loads_shared_tiles_as_vectors_and_reuses_the_w_slice():
    """The per-run product: at G = 64 (two adjacent columns a thread) the f loop is unrolled
    so that nvcc loads a thread's Z row four words at a time and its W columns two at a time;
    at G = 16 it stays a loop. A run whose W slice is already in shared memory skips its
    load (the load sits under the position it was loaded for, l__lp)."""
    inst = convert(stack_rows(_graph(), np.arange(_graph().nnz) % 4, 4).astype(np.float32), "csr")
    wide = sparsec.compile(ops.rgcn(), inst, target="cuda:sm_90a", rel=4, fin=64, fout=64)
    narrow = sparsec.compile(ops.rgcn(), inst, target="cuda:sm_90a", rel=4, fin=64, fout=16)
    assert "l__lp[0] = l__sgt" in wide.script and "l__lp[0] = -1" in wide.script
    assert "for l__f in T.unroll(64)" in wide.script and "for l__f in T.unroll(64)" not in narrow.script
    ptx = nvcc_ptx(wide.source(), "sm_90a")
    assert "ld.shared.v4.f32" in ptx and "ld.shared.v2.f32" in ptx


@pytest.mark.parametrize("fout", [1, 2, 3])
def test_narrow_outputs_keep_their_one_chunk(fout):
    """Below 4 output columns a chunk's segments (TS = 256 / G x 4) outnumber a block's 256
    positions; the kernel still walks that one chunk (it walked none before: the output kept
    its fill, silently wrong), summing, multiplying and adding into Y."""
    inst = convert(stack_rows(_graph(), np.arange(_graph().nnz) % 3, 3).astype(np.float32), "csr")
    k = sparsec.compile(ops.rgcn(), inst, target="cuda:sm_90a", rel=3, fin=8, fout=fout)
    _, TS, _ = segment_contract.tile(SimpleNamespace(G=fout))
    assert TS >= segment_contract.THREADS
    src = k.source()
    assert "atomicAdd" in src and "l__Zs_ptr[" in src and "__ballot_sync" in src


def test_runs_are_found_by_ballots_and_visited_once_each():
    """The runs of one W slice within a chunk: a ballot of the run starts per 32 segments, each
    segment's start by counting leading zeros, and a loop over the set bits (find first set),
    not a walk back and a visit of every segment; at G = 8 a chunk's 128 segments take four
    ballot words."""
    inst = convert(stack_rows(_graph(), np.arange(_graph().nnz) % 4, 4).astype(np.float32), "csr")
    for fout, words in ((16, 2), (8, 4)):
        k = sparsec.compile(ops.rgcn(), inst, target="cuda:sm_90a", rel=4, fin=64, fout=fout)
        src = k.source()
        assert "__ballot_sync" in src and "__clz" in src and "__ffs" in src
        assert f'l__rm = T.alloc_shared(({words},), "uint32")' in k.script
