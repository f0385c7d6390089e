"""`sparsec tune` on the Tensor Core formats, on the CPU: the spaces of the packed (mma_sp,
nm_tc, int8 srbcrs), tiled and BSR Tensor Core templates are featurized with their knobs; their
candidates build for sm_90a; a tuning run (a fake runner standing in for the GPU) logs
records that ``sparsec.compile(inst, knobs="tuned")`` finds for the matrix its format
stores, and on a matrix no record names the model picks among the winning configurations;
the CLI takes int8, refuses a family tuned in a dtype it does not pack, and tunes the
pruned families end to end on llvm."""
import json
import math

import numpy as np
import pytest
import scipy.sparse as sp

import sparsec
from nvcc_tools import nvcc_ptx
from sparsec import workload
from sparsec.cli import main
from sparsec.tune import records as R
from sparsec.tune.apply import INSTANCE_SIGNATURE, tuned_schedule_knobs
from sparsec.tune.features import FEATURE_NAMES, MatrixContext, feature_matrix
from sparsec.tune.signature import matrix_signature
from sparsec.tune.space import Space
from sparsec.tune.tuner import Case, tune_cases

pytest.importorskip("xgboost")

TARGET = "cuda:sm_90a"


def _weight(seed, rows=128, cols=256):
    return sp.csr_matrix((0.02 * np.random.default_rng(seed).standard_normal((rows, cols))).astype(np.float32))


def _blocky(rows=128, cols=256, b=32, keep=0.3, seed=0):
    rng = np.random.default_rng(seed)
    mask = rng.random((rows // b, cols // b)) < keep
    mask[0, 0] = True
    return sp.csr_matrix((np.kron(mask, np.ones((b, b))) * rng.standard_normal((rows, cols))).astype(np.float32))


def _col(name):
    return FEATURE_NAMES.index(name)


def test_tensor_core_spaces_are_featurized_with_their_knobs():
    w = _weight(0)
    s = Space("spmm", w, 64, "float16", families=("mma_sp", "nm_tc"), size="small", target=TARGET)
    assert s.default["format"] == "mma_sp"  # searched alone: the baseline is the packed format's untuned kernel
    X = feature_matrix(s.candidates, MatrixContext(w))
    fmts = [c["format"] for c in s.candidates]
    sp24, gather = fmts.index("mma_sp"), fmts.index("nm_tc:1:8:v128")
    assert X[sp24, _col("fmt_mma_sp")] == 1 and X[gather, _col("fmt_nm_tc")] == 1
    assert X[gather, _col("packed_kept")] == 0.125 and X[gather, _col("log2_row_vec")] == 7
    assert np.isfinite(X[:, _col("knob_warps_m")]).all() and len({tuple(r) for r in X}) == len(X)

    q = Space("spmm", w, 64, "int8", families=("srbcrs",), size="small", target=TARGET)
    Xq = feature_matrix(q.candidates, MatrixContext(w))
    assert {c["format"] for c in q.candidates} == {"srbcrs:v2,int8", "srbcrs:v4,int8", "srbcrs:v8,int8"}
    assert len({c["schedule_knobs"]["warps"] for c in q.candidates}) > 1
    assert np.isfinite(Xq[:, _col("knob_n_bytes")]).all() and (Xq[:, _col("dtype_bytes")] == 1).all()

    b = _blocky()
    d = Space("sddmm", b, 64, "float16", families=("bsr",), size="small", target=TARGET)
    tc = [c for c in d.candidates if "row_split" in c["schedule_knobs"]]
    assert {c["format"] for c in tc} == {"bsr:16x16", "bsr:32x32"} and len(tc) > 4
    Xd = feature_matrix(d.candidates, MatrixContext(b))
    rows = [i for i, c in enumerate(d.candidates) if "row_split" in c["schedule_knobs"]]
    assert np.isfinite(Xd[rows, _col("knob_row_split")]).all()

    with pytest.raises(ValueError, match=r"dtype float16: srbcrs packs int8 values .*--dtype int8"):
        Space("spmm", w, 64, "float16", families=("srbcrs",), target=TARGET)


def test_tensor_core_candidates_build_for_sm90a():
    """A non-default candidate of the packed templates compiles with the knobs it names, and
    nvcc takes the code (the BSR SDDMM template's first compile in a process takes half a
    minute: tests/test_tensorcore_sddmm.py builds it with its knobs)."""
    w = _weight(1)
    picks = []
    for fam, dtype, spec in (("nm_tc", "float16", "nm_tc:1:8:v128"), ("srbcrs", "int8", "srbcrs:v8,int8"),
                             ("tiled", "float16", "tiled:32x128")):
        s = Space("spmm", w, 64, dtype, families=(fam,), size="small", target=TARGET)
        picks.append(("spmm", w, [c for c in s.candidates if c["format"] == spec][-1]))
    want = {"nm_tc": "mma.sync.aligned.m16n8k16", "srbcrs": "s8.s8.s32", "tiled": "mma.sync.aligned.m16n8k16"}
    for op, m, c in picks:
        inst, _ = workload.convert(m, c["format"], c["format_knobs"], c["dtype"])
        k = sparsec.compile(op, inst, feat=64, target=TARGET, knobs=c["schedule_knobs"])
        assert k.knobs == c["schedule_knobs"]
        assert want[c["format"].split(":")[0]] in nvcc_ptx(k.source(), "sm_90a")


@pytest.mark.parametrize("fam,spec,dtype,rows,cols,feat", [("bsr", "bsr:16x16", "float16", 1024, 4096, 64),
                                                          ("nm_tc", "nm_tc:1:8:v128", "float16", 128, 4096, 512),
                                                          ("mma_sp", "mma_sp", "float16", 4096, 512, 64),
                                                          ("srbcrs", "srbcrs:v2,int8", "int8", 8192, 128, 64),
                                                          ("tiled", "tiled", "float16", 300, 512, 16)])
def test_the_spaces_untuned_candidate_is_the_kernel_compile_builds(fam, spec, dtype, rows, cols, feat):
    """The baseline a search measures first is the kernel ``sparsec.compile`` builds for the
    converted matrix by the templates' rule (``knobs="default"``), whose Tensor Core defaults follow its shape (BSR's N tile, the
    pipeline's tiles by gathered row length, int8's warps by rows), not the defaults of a
    format spec alone: a tuned record then never loses to the untuned kernel unmeasured.
    For BSR that is the largest block the matrix fills (16 here: a 32 x 32 block would be
    mostly padding), not the CSR kernel sparsec picks for the matrix as a whole."""
    w = _blocky(rows, cols, 16, 0.3, seed=rows) if fam == "bsr" else _weight(2, rows, cols)
    s = Space("spmm", w, feat, dtype, families=(fam,), size="small", target=TARGET)
    inst, _ = workload.convert(w, spec, {}, dtype)
    untuned = sparsec.compile("spmm", inst, feat=feat, target=TARGET, knobs="default")
    assert s.format_default(spec)["schedule_knobs"] == untuned.knobs
    assert s.default == s.format_default(spec)  # the search measures it in its first round


def _fake_ms(c):
    """Times from the knobs alone: warps_m=2 with k_steps=4 is the fastest, whatever the matrix
    (the untuned kernel has warps_m=4 at 64 features)."""
    k = c["schedule_knobs"]
    return 0.1 + 0.05 * (k["warps_m"] != 2) + 0.03 * (k["k_steps"] != 4) + 0.01 * k["stages"]


class _FakeGPU:
    def measure(self, cands, matrix, seed=0):
        return [{"status": "ok", "time_ms": _fake_ms(c)} for c in cands]

    def close(self):
        pass


def test_tuned_records_and_the_model_reach_knobs_tuned(tmp_path, monkeypatch):
    logs = tmp_path / "logs"
    log = str(logs / R.default_log_path("spmm", TARGET).split("/")[-1])
    weights = [_weight(s) for s in (2, 3)]
    res = tune_cases("spmm", [Case(f"w{i}", w, 64) for i, w in enumerate(weights)], target=TARGET, trials=8,
                     batch=8, log=log, families=["mma_sp"], size="small", dtype="float16", runner=_FakeGPU())
    assert all(r.speedup and r.speedup > 1 for r in res)  # over mma_sp's untuned kernel
    recs = R.load(log)
    assert len(recs) == 16 and all(r.extra[INSTANCE_SIGNATURE] != r.signature for r in recs)  # pruned, float16
    monkeypatch.setenv("SPARSEC_TUNING_LOGS", str(logs))
    monkeypatch.chdir(tmp_path)

    inst, _ = workload.convert(weights[0], "mma_sp", {}, "float16")
    assert matrix_signature(inst.to_scipy()) == recs[0].extra[INSTANCE_SIGNATURE]
    best = res[0].search.best.candidate["schedule_knobs"]
    assert tuned_schedule_knobs("spmm", inst, 64, TARGET, "float16") == best
    assert sparsec.compile("spmm", inst, feat=64, target=TARGET, knobs="tuned").knobs == best

    # a matrix no record names: the model ranks the configurations that won (3 a case) and
    # the untuned kernel; the knobs alone decide the fake times, so it should find the fastest
    unseen, _ = workload.convert(_weight(9), "mma_sp", {}, "float16")
    winners = [t.candidate for r in res for t in sorted(r.search.measured, key=lambda t: t.time_ms)[:3]]
    picked = tuned_schedule_knobs("spmm", unseen, 64, TARGET, "float16")
    assert picked and _fake_ms({"schedule_knobs": picked}) == min(map(_fake_ms, winners))
    assert tuned_schedule_knobs("spmm", unseen, 64, "cuda", "float16") == {}  # no log for the target: defaults


def test_cli_tunes_pruned_families_and_refuses_a_dtype_they_do_not_pack(tmp_path, capsys):
    path = str(tmp_path / "w.npz")
    sp.save_npz(path, _weight(5, 64, 128))
    log = str(tmp_path / "spmm_llvm.jsonl")
    out = str(tmp_path / "out.json")
    assert main(["tune", "spmm", "--matrix", path, "--feat", "16", "--target", "llvm", "--formats", "mma_sp,nm_tc",
                 "--dtype", "float16", "--trials", "4", "--batch", "4", "--workers", "2", "--size", "small",
                 "--log", log, "--json", out]) == 0
    recs = R.load(log)
    assert {r.format for r in recs} == {"mma_sp", "nm_tc:1:8:v128"} and all(r.status == "ok" for r in recs)
    row = json.load(open(out))["cases"][0]
    assert row["default_candidate"]["format"] == "mma_sp" and math.isfinite(row["speedup"])
    capsys.readouterr()
    assert main(["tune", "spmm", "--matrix", path, "--formats", "srbcrs", "--dtype", "float16"]) == 2
    assert "srbcrs packs int8 values" in capsys.readouterr().err
    assert main(["tune", "spmm", "--matrix", path, "--dtype", "bfloat16"]) == 2
    assert "int8" in capsys.readouterr().err  # the choices name int8


def test_tiled_space_searches_the_kernels_knobs_without_dead_combinations():
    """The tiled family's space (float16, CUDA): its tile shapes and the knobs of the kernel
    that runs them -- the streaming kernel at 16 columns, the expanding one at 128, where no
    candidate pairs a batched-loads setting with the staged kernel (it does nothing there, so
    it would only measure one kernel twice); other precisions are refused by name."""
    from sparsec.schedules import tiled_stream

    w = _weight(3, 300, 512)
    s = Space("spmm", w, 16, "float16", families=("tiled",), size="small", target=TARGET)
    assert {c["format"] for c in s.candidates} == {"tiled:16x64", "tiled", "tiled:32x128"}
    assert all(set(c["schedule_knobs"]) == set(tiled_stream.KNOBS) for c in s.candidates)
    assert {c["schedule_knobs"]["cap"] for c in s.candidates} == {1, 4}
    s = Space("spmm", w, 128, "float16", families=("tiled",), size="small", target=TARGET)
    knobs = [c["schedule_knobs"] for c in s.candidates]
    assert all(set(k) == {"nb", "splits", "loads", "pipeline"} for k in knobs)
    assert not [k for k in knobs if k["pipeline"] and k["loads"] != 1]
    assert {k["pipeline"] for k in knobs} == {0, 2} and {k["loads"] for k in knobs} == {1, 16}
    assert any("loads applies to pipeline 0 only" in why for why in s.pruned)
    with pytest.raises(ValueError, match=r"dtype float32: tiled packs float16 values"):
        Space("spmm", w, 16, "float32", families=("tiled",), target=TARGET)
