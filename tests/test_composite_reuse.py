"""Composite kernels (hyb, bsr+csr) compiled for one matrix run on others converted with the
same spec: the part list is the spec's (empty buckets are parts with no rows), the parts'
sizes are run-time extents. A kernel that does depend on its matrix (a hyb compiled for a
matrix without split rows) says so in its exported metadata and refuses, by name, a matrix
it would get wrong. Every result is checked against scipy in float64 on NaN-poisoned outputs."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import sparsec
from sparsec import cli
from sparsec.formats import convert, registry

FEAT = 8
TOL = 1e-5


# ---------------------------------------------------------------- graphs


def graph(n_rows, n_cols, lengths, seed, blocks=0):
    """Rows of the given lengths (distinct random columns), values in [0.5, 1.5); ``blocks``
    dense 4x4 blocks on the diagonal (so bsr+csr has a BSR part)."""
    rng = np.random.default_rng(seed)
    rows, cols = [], []
    for r, k in enumerate(lengths):
        k = min(int(k), n_cols)
        rows.append(np.full(k, r))
        cols.append(rng.choice(n_cols, size=k, replace=False))
    for b in range(blocks):
        rr, cc = np.meshgrid(np.arange(4) + 4 * b, np.arange(4) + 4 * b, indexing="ij")
        rows.append(rr.ravel())
        cols.append(cc.ravel())
    r, c = np.concatenate(rows), np.concatenate(cols)
    m = sp.csr_matrix((np.ones(r.size, np.float32), (r, c)), shape=(n_rows, n_cols))
    m.sum_duplicates()
    m.data = rng.uniform(0.5, 1.5, m.nnz).astype(np.float32)
    return m


def power_law(n, seed, longest=150):
    """Zipf row lengths (capped at 40), some empty rows, and two rows of ``longest`` entries:
    longer than any bucket the automatic rule picks (it covers the 99th percentile), so
    every hyb spec splits them."""
    rng = np.random.default_rng(seed)
    lengths = np.minimum(rng.zipf(2.0, n), 40)
    lengths[rng.random(n) < 0.1] = 0
    lengths[:2] = longest
    return graph(n, n, lengths, seed, blocks=6)


GRAPHS = {
    # the graph kernels are compiled for: split rows, every bucket used
    "g1": power_law(300, 1),
    # bigger, bucket 2 empty (lengths 1, 3-4, 5-8 and split rows only)
    "g2": graph(500, 450, np.random.default_rng(2).choice([0, 1, 3, 4, 6, 8, 25], 500), 2, blocks=4),
    # every row short: one entry or none (no split rows, buckets 2.. empty, no dense block)
    "g3": graph(200, 260, np.random.default_rng(3).choice([0, 1], 200), 3),
}


def dense(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


def spmm_ref(m, B):
    return m.astype(np.float64) @ B.astype(np.float64)


def assert_close(got, want):
    got = np.asarray(got, dtype=np.float64)
    assert np.all(np.isfinite(got)), "an output element was not written (NaN poison left)"
    scale = max(float(np.abs(want).max(initial=0.0)), 1.0)
    assert float(np.abs(got - want).max(initial=0.0)) <= TOL * scale


def run_spmm(kernel, m, spec, rng):
    A = convert(m, spec)
    B = dense(rng, (m.shape[1], FEAT))
    assert_close(kernel(A, B, poison=True), spmm_ref(m, B))
    return A


# ---------------------------------------------------------------- SpMM reuse


@pytest.mark.parametrize("spec", ["hyb:1:1/2/4/8", "hyb:2:1/2/4/8", "bsr+csr:4x4"])
def test_kernel_for_one_graph_runs_on_others(spec):
    rng = np.random.default_rng(0)
    A1 = convert(GRAPHS["g1"], spec)
    k = sparsec.compile("spmm", A1, feat=FEAT)
    assert registry.matrix_requirements(k.format_spec) == []  # g1 splits rows: the kernel adds them up
    run_spmm(k, GRAPHS["g1"], spec, rng)
    A2 = run_spmm(k, GRAPHS["g2"], spec, rng)
    A3 = run_spmm(k, GRAPHS["g3"], spec, rng)
    if spec.startswith("hyb"):
        n_b = 4
        assert len(A2.parts) == len(A3.parts) == len(A1.parts) == n_b * int(spec.split(":")[1])
        if spec.startswith("hyb:1:"):
            assert A2.parts[1].root_extent() == 0  # g2's bucket 2 is an empty part, not a missing one
        assert all(p.root_extent() == 0 for p in A3.parts if p.format.param("width") > 1)
        assert all(p.format.param("unique") for p in A3.parts)  # g3 splits no row
    else:
        assert A3.parts[0].root_extent() == -(-GRAPHS["g3"].shape[0] // 4) and A3.parts[0].nnz == 0  # BSR empty
        # the other extreme: everything in BSR, the CSR part empty
        A0 = run_spmm(k, GRAPHS["g2"], "bsr+csr:4x4,0", rng)
        assert A0.parts[1].nnz == 0


def test_automatic_spec_resolves_once_and_is_reused():
    rng = np.random.default_rng(1)
    A1 = convert(GRAPHS["g1"], "hyb")
    resolved = A1.format.family_spec
    assert resolved.startswith("hyb:col_parts=1,buckets=1/2/4") and "[" not in resolved
    assert A1.format.spec.startswith(resolved + "[")
    k = sparsec.compile("spmm", A1, feat=FEAT)
    for name in ("g2", "g3"):
        run_spmm(k, GRAPHS[name], resolved, rng)
    # plain "hyb" resolves from each matrix: g3's short rows get other buckets, refused by name
    other = convert(GRAPHS["g3"], "hyb")
    assert other.format.family_spec != resolved
    with pytest.raises(ValueError) as e:
        k(other, dense(rng, (GRAPHS["g3"].shape[1], FEAT)))
    msg = str(e.value)
    assert f"compiled for {resolved}, got {other.format.family_spec}" in msg
    assert f"convert the matrix with spec '{resolved}'" in msg


def test_bsr_csr_block_fill_steers_the_split_not_the_kernel():
    rng = np.random.default_rng(2)
    k = sparsec.compile("spmm", convert(GRAPHS["g1"], "bsr+csr:4x4,0.5"), feat=FEAT)
    run_spmm(k, GRAPHS["g2"], "bsr+csr:4x4,0.25", rng)
    with pytest.raises(ValueError, match=r"compiled for bsr\+csr:block=4/4,block_fill=0.5, got "
                                         r"bsr\+csr:block=2/2,block_fill=0.5: convert the matrix with spec "
                                         r"'bsr\+csr:block=4/4,block_fill=0.5'"):
        k(convert(GRAPHS["g2"], "bsr+csr:2x2"), dense(rng, (450, FEAT)))


def test_column_ranges_must_match():
    rng = np.random.default_rng(3)
    k = sparsec.compile("spmm", convert(GRAPHS["g1"], "hyb:2:1/2/4/8"), feat=FEAT)
    with pytest.raises(ValueError, match=r"compiled for hyb:col_parts=2,buckets=1/2/4/8, got "
                                         r"hyb:col_parts=4,buckets=1/2/4/8: convert the matrix with spec "
                                         r"'hyb:col_parts=2,buckets=1/2/4/8'"):
        k(convert(GRAPHS["g2"], "hyb:4:1/2/4/8"), dense(rng, (450, FEAT)))


# ---------------------------------------------------------------- the split-row dependency


def test_kernel_for_a_graph_without_split_rows_refuses_one_with_them():
    """Compiled for g3 (no row longer than the widest bucket), the widest bucket stores each
    row's result once (no atomics on CUDA: as fast as before). A matrix with split rows would
    get partial sums overwritten: it is refused naming the part, and the module says so."""
    rng = np.random.default_rng(4)
    spec = "hyb:1:1/2/4/8"
    k = sparsec.compile("spmm", convert(GRAPHS["g3"], spec), feat=FEAT)
    reqs = registry.matrix_requirements(k.format_spec)
    assert len(reqs) == 1 and reqs[0].startswith("part 3 (rell:8) lists each row once")
    run_spmm(k, GRAPHS["g3"], spec, rng)
    A1 = convert(GRAPHS["g1"], spec)
    with pytest.raises(ValueError) as e:
        k(A1, dense(rng, (300, FEAT)))
    msg = str(e.value)
    assert "part 3 (rell:8) lists each row once; this matrix's part 3 is rell:8,dup" in msg
    assert "compile for the spec 'hyb:col_parts=1,buckets=1/2/4/8' rather than for a matrix" in msg
    # the kernel for the spec takes both
    general = sparsec.compile("spmm", A1.format.family_spec, feat=FEAT)
    assert registry.matrix_requirements(general.format_spec) == []
    for name in ("g1", "g2", "g3"):
        run_spmm(general, GRAPHS[name], spec, rng)


# ---------------------------------------------------------------- SDDMM and attention


def sddmm_ref(A, X, Y):
    rows, cols = A.stored_coords()
    ok = rows >= 0
    out = np.zeros(A.stored)
    vals = A.slot_values()[ok].astype(np.float64)
    out[ok] = vals * np.einsum("ij,ij->i", X[rows[ok]].astype(np.float64), Y[cols[ok]].astype(np.float64))
    return out


def attention_ref(m, Q, Kt, V):
    """Softmax over each row's non-zeros of A[i, j] * Q[i] . Kt[j], times V (empty rows: 0)."""
    c = m.tocoo()
    s = c.data.astype(np.float64) * np.einsum("ij,ij->i", Q[c.row].astype(np.float64), Kt[c.col].astype(np.float64))
    mx = np.full(m.shape[0], -np.inf)
    np.maximum.at(mx, c.row, s)
    e = np.exp(s - mx[c.row])
    p = e / np.bincount(c.row, weights=e, minlength=m.shape[0])[c.row]
    return sp.csr_matrix((p, (c.row, c.col)), shape=m.shape) @ V.astype(np.float64)


@pytest.mark.parametrize("spec", ["hyb:1:1/2/4/8", "bsr+csr:4x4"])
def test_sddmm_kernel_reused(spec):
    rng = np.random.default_rng(5)
    k = sparsec.compile("sddmm", convert(GRAPHS["g1"], spec), feat=FEAT)
    for name in ("g2", "g3"):
        m = GRAPHS[name]
        A = convert(m, spec)
        X, Y = dense(rng, (m.shape[0], FEAT)), dense(rng, (m.shape[1], FEAT))
        assert_close(k(A, X, Y, poison=True), sddmm_ref(A, X, Y))


def test_attention_kernel_reused():
    rng = np.random.default_rng(6)
    spec = "hyb:1:1/2/4/8"
    k = sparsec.compile("attention", convert(GRAPHS["g1"], spec), feat=FEAT)
    for name in ("g2", "g3"):
        m = GRAPHS[name]
        A = convert(m, spec)
        Q, Kt, V = dense(rng, (m.shape[0], FEAT)), dense(rng, (m.shape[1], FEAT)), dense(rng, (m.shape[1], FEAT))
        assert_close(k(A, Q, Kt, V, poison=True), attention_ref(m, Q, Kt, V))


# ---------------------------------------------------------------- exported modules


@pytest.mark.parametrize("fmt_args, spec", [
    (["--format", "hyb", "--col-parts", "1", "--buckets", "1,2,4,8"], "hyb:col_parts=1,buckets=1/2/4/8"),
    (["--format", "hyb"], None),  # automatic: the module records the resolved spec
    (["--format", "bsr+csr", "--block", "4x4"], "bsr+csr:block=4/4,block_fill=0.5"),
])
def test_exported_module_runs_on_another_graph(tmp_path, fmt_args, spec):
    rng = np.random.default_rng(7)
    src = tmp_path / "g1.npz"
    sp.save_npz(src, GRAPHS["g1"])
    out = tmp_path / "mod.so"
    assert cli.main(["build", "spmm", *fmt_args, "--matrix", str(src), "--feat", str(FEAT), "-o", str(out)]) == 0
    k = sparsec.load(out)
    meta = k.extra["metadata"]
    if spec is None:
        spec = convert(GRAPHS["g1"], "hyb").format.family_spec
    assert meta["convert_spec"] == spec and meta["matrix_requirements"] == []
    for name in ("g2", "g3"):
        run_spmm(k, GRAPHS[name], meta["convert_spec"], rng)


def test_exported_module_records_its_matrix_dependency(tmp_path):
    rng = np.random.default_rng(8)
    k = sparsec.compile("spmm", convert(GRAPHS["g3"], "hyb:1:1/2/4/8"), feat=FEAT)
    meta = k.export(tmp_path / "short.so")
    assert meta["matrix_requirements"] == registry.matrix_requirements(k.format_spec) != []
    loaded = sparsec.load(tmp_path / "short.so")
    run_spmm(loaded, GRAPHS["g3"], meta["convert_spec"], rng)
    with pytest.raises(ValueError, match=r"part 3 \(rell:8\) lists each row once"):
        loaded(convert(GRAPHS["g1"], meta["convert_spec"]), dense(rng, (300, FEAT)))


# ---------------------------------------------------------------- specs


def test_recorded_spec_reads_back_exactly():
    for spec in ("hyb:2:1/2/4/8", "hyb", "bsr+csr:4x4"):
        for m in GRAPHS.values():
            fmt = convert(m, spec).format
            assert registry.format_from_spec(fmt.spec) == fmt
            assert registry.format_from_spec(fmt.family_spec) == registry.make_format(fmt.family_spec)
    with pytest.raises(ValueError, match=r"hyb:col_parts=1,buckets=1/2 has parts rell:1\+rell:2,dup"):
        registry.format_from_spec("hyb:col_parts=1,buckets=1/2[rell:2]")


def test_a_module_from_an_older_part_list_is_refused_plainly():
    """A spec whose part list this sparsec would not produce (empty buckets dropped, as
    before): the plain refusal, naming both specs."""
    A = convert(GRAPHS["g2"], "hyb:1:1/2/4/8")
    old = "hyb:col_parts=1,buckets=1/2/4/8[rell:1+rell:4+rell:8,dup]"
    assert registry.reuse_refusal(old, A.format) == f"this kernel was compiled for format {old}, got a matrix in {A.format.spec}"


# ---------------------------------------------------------------- empty parts on CUDA


@pytest.mark.parametrize("spec", ["hyb:1:1/2/4", "hyb:2:1/2/4", "bsr+csr:4x4,2"])
def test_empty_parts_launch_one_idle_block_on_cuda(spec):
    """g3 leaves buckets 2 and 4 (bsr+csr: the BSR part) empty. Each part's grid is at least
    one block (a CUDA grid of 0 blocks is a launch error) and its body is guarded by the
    part's run-time extent, so an empty part reads no index and costs one idle block;
    nvcc compiles the source."""
    import re
    import shutil

    from nvcc_tools import nvcc_compile

    A = convert(GRAPHS["g3"], spec)
    k = sparsec.compile("spmm", A, target="cuda:sm_90a", feat=32)
    extents = [p.name for p in k.params if p.role == "scalar" and p.name.startswith("n_p")]
    assert len(extents) == len(A.parts)
    for name in extents:  # in the grid extent (fused parts: in the sum of the parts' blocks)
        assert f"T.max({name}, 1)" in k.script, name
        assert re.search(rf"< {name}\)", k.source()), name
    assert any(part.root_extent() == 0 or part.nnz == 0 for part in A.parts)
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    ok, log = nvcc_compile(k.source(), "sm_90a")
    assert ok, log[-2000:]
