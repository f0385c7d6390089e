"""``sparsec bench`` without a GPU: the report and roofline arithmetic on hand-computed
numbers, case building, the CLI's errors, and CPU dry runs of the whole pipeline
(``--target llvm``: torch's CPU peers, every result checked; times are not asserted)."""
from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

torch = pytest.importorskip("torch")

from sparsec import cli  # noqa: E402
from sparsec.bench import report, roofline  # noqa: E402
from sparsec.bench.cases import Case, MatrixCases, build_cases, normalize_spec, parse_count, parse_knobs  # noqa: E402
from sparsec.bench.peers import PEERS, Peer, main_peer  # noqa: E402
from sparsec.bench.run import Bench  # noqa: E402
from sparsec.measure import Prepared, Timer, nbytes_of, rotation_count  # noqa: E402
from sparsec.reference import max_rel_err  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Sparse")  # torch's beta notes on sparse tensors
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def quick_timer():
    return Timer("cpu", warmup_ms=0.0, budget_ms=1.0, min_reps=1, max_reps=2)


@pytest.fixture
def small_npz(tmp_path):
    m = sp.random(120, 96, density=0.05, format="csr", dtype=np.float32, random_state=np.random.default_rng(3))
    path = tmp_path / "small.npz"
    sp.save_npz(path, m)
    return str(path)


@pytest.fixture(autouse=True)
def small_probes(monkeypatch):
    monkeypatch.setitem(roofline.PROBE_SIZES, "cpu", {"copy_bytes": 2**20, "matmul_n": 64})


# ---- arithmetic ------------------------------------------------------------------------------
def test_geomean():
    assert report.geomean([1.0, 4.0]) == pytest.approx(2.0)
    assert report.geomean([2.0, 8.0, None, 0.0, math.inf]) == pytest.approx(4.0)  # only positive finite values
    assert report.geomean([]) is None


def test_compulsory_bytes_and_flops():
    # CSR spmm, 4 x 6 with 10 entries, F = 8, float32: A 10*(4+4) + 5*4, B 6*8*4, C 4*8*4
    assert roofline.compulsory("spmm", 4, 6, 10, 8, "float32") == (80 + 20 + 192 + 128, 2 * 10 * 8)
    # SDDMM: A, X 4*8*4, Y 8*6*4, C 10*4; (2F + 1) flops per entry
    assert roofline.compulsory("sddmm", 4, 6, 10, 8, "float32") == (80 + 20 + 128 + 192 + 40, 17 * 10)
    # BSR 2x2, 3 stored blocks of an 8 x 8 fp16 matrix, F = 4: blocks 3*(2*2*2 + 4), 4 block rows + 1
    assert roofline.compulsory("spmm", 8, 8, 9, 4, "float16", (2, 2), 3) == (36 + 20 + 64 + 64, 2 * 12 * 4)
    with pytest.raises(ValueError, match="stored_blocks"):
        roofline.compulsory("spmm", 8, 8, 9, 4, "float16", (2, 2))


def test_roofline_fraction():
    # memory bound: 1 GB at 1 TB/s is 1 ms, 1 GFLOP at 1 PFLOP/s is 1 us; in 2 ms -> half the roofline
    assert roofline.time_bound_s(1e9, 1e9, 1e12, 1e15) == pytest.approx(1e-3)
    assert roofline.roofline_fraction(2e-3, 1e9, 1e9, 1e12, 1e15) == pytest.approx(0.5)
    # compute bound: 1 MB (1 us) against 1 TFLOP at 100 TFLOP/s (10 ms), in 40 ms -> 25 %
    assert roofline.roofline_fraction(40e-3, 1e6, 1e12, 1e12, 1e14) == pytest.approx(0.25)
    assert roofline.achieved(1e-3, 2e9, 3e12) == {"GBps": pytest.approx(2000.0), "TFLOPs": pytest.approx(3000.0)}


def test_rotation_count():
    mb = 2**20
    assert rotation_count(10 * mb, 50 * mb, 10**12) == 20  # 4 L2 caches of 10 MB sets
    assert rotation_count(10 * mb, 50 * mb, 100 * mb) == 3  # a quarter of 100 MB holds 2 extra copies
    assert rotation_count(1 * mb, 50 * mb, 10**12) == 64  # at most MAX_COPIES
    assert rotation_count(10 * 2**30, 50 * mb, 2**30) == 1  # bigger than L2: itself only


def test_summary_of_ratios():
    recs = [{"op": "spmm", "dtype": "float32", "format": "csr", "matrix": m, "feat": f,
             "peers": {"torch_csr": {"status": "ok", "ms": r}}, "ratios": {"torch_csr": r}}
            for m, f, r in (("a", 32, 0.5), ("a", 64, 8.0), ("b", 32, 0.25))]
    s = report.summarize(recs)["torch_csr"]
    assert s["cases"] == 3 and s["geomean"] == pytest.approx(1.0) and s["min"] == 0.25 and s["max"] == 8.0
    assert s["faster"] == 1 and s["min_case"] == "b F=32"
    assert list(report.groups(recs)) == ["spmm float32 csr"]


def test_max_rel_err_and_poison():
    ref = torch.tensor([[1.0, -2.0], [4.0, 0.0]], dtype=torch.float64)
    out = torch.tensor([[1.0, -2.0], [4.0, 0.5]])
    assert max_rel_err(out, ref) == pytest.approx(0.5 / 4.0)
    out[0, 0] = float("nan")  # an element the kernel never wrote
    assert max_rel_err(out, ref) == math.inf


def test_prepared_clone_copies_every_buffer():
    a = torch.ones(3, 4)
    crow, col = torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32)
    s = torch.sparse_csr_tensor(crow, col, torch.ones(2), size=(2, 3))
    p = Prepared(torch.sparse.mm, (s, a))
    assert p.nbytes == nbytes_of(s) + 48 and nbytes_of(s) == 3 * 4 + 2 * 4 + 2 * 4
    q = p.clone()
    assert q.args[1].data_ptr() != a.data_ptr() and torch.equal(q(), p())


# ---- cases -----------------------------------------------------------------------------------
def test_cases_from_a_matrix(small_npz):
    (g,) = build_cases("spmm", matrix=small_npz, feats=[8, 16])
    assert g.name == "small" and g.matrix.shape == (120, 96)
    assert [(c.spec, c.dtype, c.feat) for c in g.cases] == [("csr", "float32", 8), ("csr", "float32", 16)]
    (g,) = build_cases("sddmm", matrix=small_npz, blocks=[4, 8], dtype="float16", knobs=parse_knobs('{"vec": 2}'))
    assert [(c.spec, c.block, c.feat, c.knobs) for c in g.cases] == [("bsr:4x4", 4, 64, (("vec", 2),)),
                                                                     ("bsr:8x8", 8, 64, (("vec", 2),))]
    assert build_cases("spmm", matrix=small_npz, spec="bsr:16")[0].cases[0].spec == "bsr:16x16"


@pytest.mark.parametrize("kw, text", [
    ({"suite": "graphs", "matrix": "NPZ"}, "one matrix source"),
    ({}, "one matrix source"),
    ({"matrix": "NPZ", "sparsities": [0.9]}, "--sparsity"),
    ({"matrix": "NPZ", "dtype": "int8"}, "floating-point"),
    ({"matrix": "NPZ", "spec": "bsr:4x4", "blocks": [4]}, "either --format or --block"),
    ({"matrix": "NPZ", "spec": "nosuch"}, "nosuch"),
    ({"matrix": "missing.npz"}, "does not exist"),
])
def test_case_errors(small_npz, kw, text):
    kw = {k: small_npz if v == "NPZ" else v for k, v in kw.items()}
    with pytest.raises((ValueError, TypeError), match=text):
        build_cases("spmm", **kw)


def test_missing_suite_data_names_fetch(tmp_path):
    with pytest.raises(ValueError, match="benchmarks/data/fetch.py"):
        build_cases("spmm", suite="graphs", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="benchmarks/data/fetch.py"):
        build_cases("spmm", suite="blocks", cache_dir=tmp_path)


def test_small_helpers():
    assert parse_count("4M") == 4_000_000 and parse_count("500k") == 500_000 and parse_count("0") == 0
    with pytest.raises(ValueError, match="k/M/G"):
        parse_count("lots")
    with pytest.raises(ValueError, match="JSON object"):
        parse_knobs("[1, 2]")
    assert normalize_spec("bsr:32") == "bsr:32x32" and normalize_spec("hyb") == "hyb"
    assert main_peer("spmm", "bsr:32x32") == "torch_bsr" and main_peer("spmm", "csr") == "torch_csr"
    assert main_peer("sddmm", "csr") == "torch_sddmm"


def test_run_suite_gpu_names():
    from script_modules import load_script

    mod = load_script(Path(ROOT) / "benchmarks" / "run_suite.py", "run_suite")  # with its _preamble on the path
    assert mod.gpu_short_name("NVIDIA H200") == "H200"
    assert mod.gpu_short_name("NVIDIA H100 80GB HBM3") == "H100"
    assert mod.gpu_short_name("Some GPU (rev 2)") == "Some_GPU_rev_2"


# ---- the command line ------------------------------------------------------------------------
def bench_fails(capsys, argv, text):
    code = cli.main(["bench", *argv])
    _, err = capsys.readouterr()
    assert code == 2, err
    assert "Traceback" not in err and text in err, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_cli_without_gpu(capsys, small_npz):
    bench_fails(capsys, ["spmm", "--matrix", small_npz], "CUDA GPU")


def test_cli_argument_errors(capsys, small_npz):
    bench_fails(capsys, ["spmm"], "--matrix")  # argparse: one source is required
    bench_fails(capsys, ["spmm", "--matrix", small_npz, "--suite", "graphs"], "not allowed with")
    bench_fails(capsys, ["spmm", "--matrix", small_npz, "--max-rmat", "many"], "k/M/G")
    bench_fails(capsys, ["spmm", "--matrix", small_npz, "--target", "llvm", "--knobs", "{bad"], "--knobs")
    bench_fails(capsys, ["nosuch", "--matrix", small_npz, "--target", "llvm"], "op should be one of")


# ---- dry runs on the CPU ---------------------------------------------------------------------
def test_cli_dry_run(capsys, small_npz, tmp_path):
    js, md = tmp_path / "r.json", tmp_path / "r.md"
    code = cli.main(["bench", "spmm", "--matrix", small_npz, "--feat", "8", "--target", "llvm", "--repeat", "2",
                     "--json", str(js), "--markdown", str(md)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "[1/1] spmm csr float32 small F=8: sparsec" in err
    result = json.loads(js.read_text())
    (r,) = result["records"]
    assert r["status"] == "ok" and r["sparsec_ms"] > 0 and r["sparsec_max_rel_err"] < 1e-5
    for key in ("op", "format", "dtype", "matrix", "rows", "cols", "nnz", "feat", "ratios", "roofline_fraction",
                "GBps", "TFLOPs", "knobs", "device", "versions"):
        assert key in r
    assert r["peers"]["torch_csr"]["status"] == "ok" and r["ratios"]["torch_csr"] > 0
    assert r["speedup"] == r["ratios"]["torch_csr"]
    assert (r["bytes"], r["flops"]) == roofline.compulsory("spmm", 120, 96, r["nnz"], 8, "float32")
    assert "## spmm float32 csr" in md.read_text() and md.read_text() in out + "\n"
    assert result["ceilings"]["copy_GBps"] > 0 and "float32" in result["ceilings"]["matmul_TFLOPs"]


def dry_bench(**kw):
    return Bench("llvm", timer=quick_timer(), log=lambda msg: None, **kw)


def test_sddmm_on_bsr_dry_run(small_npz):
    """Slot-order reference for a non-CSR SDDMM, every peer checked in CSR order."""
    groups = build_cases("sddmm", matrix=small_npz, feats=[8], spec="bsr:4x4")
    bench = dry_bench()
    (r,) = bench.run(groups)
    assert r["status"] == "ok", r["error"]
    assert r["peers"]["torch_sddmm"]["status"] == "ok" and r["peers"]["torch_dense"]["status"] == "ok"
    assert r["stored"] > r["nnz"]  # block padding: the sparsec output has one value per stored slot


def test_wrong_peer_and_compile_failure_are_recorded(small_npz, monkeypatch):
    def wrong_setup(o):
        return Prepared(lambda a, b: torch.zeros(o.rows, o.feat), (o.csr, o.dense[0]))

    wrong = Peer("wrong", "always zero", lambda o: None, wrong_setup)
    m = sp.load_npz(small_npz).tocsr()
    groups = [MatrixCases("small", m, [Case("spmm", "small", "csr", "float32", 8)])]
    bench = dry_bench(peers=PEERS[:1] + (wrong,))
    (r,) = bench.run(groups)
    assert r["status"] == "failed" and "wrong" in r["error"] and r["sparsec_ms"] is not None
    assert r["peers"]["torch_csr"]["status"] == "ok"

    import sparsec.bench.run as run_mod

    calls = []

    def broken_compile(*a, **kw):
        calls.append(1)
        raise RuntimeError("no tensor cores here")

    monkeypatch.setattr(run_mod, "sparsec_compile", broken_compile)
    groups = [MatrixCases("small", m, [Case("spmm", "small", "csr", "float32", 16)] * 2)]
    bench = dry_bench()
    recs = bench.run(groups)
    assert [x["status"] for x in recs] == ["failed", "failed"] and len(calls) == 1  # the failure is cached
    assert "compile failed: RuntimeError: no tensor cores here" in recs[0]["error"]
    assert len(bench.failed()) == 2


def test_markdown_and_plot(tmp_path, small_npz):
    bench = dry_bench()
    bench.run(build_cases("spmm", matrix=small_npz, feats=[8, 16]))
    text = report.markdown(bench.result())
    assert "| small | 120 | " in text and "geomean" in text
    pytest.importorskip("matplotlib")
    assert report.plot_speedups(bench.result(), str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").stat().st_size > 1000



def test_timer_times_uncapturable_calls_eagerly_on_the_cpu_too():
    """graph_safe=False is honoured (and a CPU timer never tries graphs)."""
    calls = [Prepared(lambda: sum(range(100)), (), graph_safe=False)]
    t = Timer("cpu", warmup_ms=0.0, budget_ms=1.0, min_reps=2, max_reps=3).measure(calls)
    assert t.method == "cpu" and t.median_ms >= 0.0
    with pytest.raises(ValueError, match="mode"):
        Timer("cuda", mode="fast")


def test_finish_writes_the_rows_and_prints_a_right_aligned_table(tmp_path, capsys):
    from sparsec.bench.report import finish

    rows = [{"name": "a", "ms": 1.5}, {"name": "b", "ms": 0.25}]
    out = tmp_path / "r.json"
    assert finish(rows, [("name", lambda r: r["name"]), ("ms:", lambda r: f"{r['ms']:.2f}")], "cpu", str(out),
                  ", tokens 8") == "cpu"
    assert json.loads(out.read_text()) == {"device": "cpu", "rows": rows}
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["device: cpu, tokens 8", "| name | ms |", "|---|---:|", "| a | 1.50 |", "| b | 0.25 |"]


def test_back_to_back_ms_times_rounds_of_calls_with_one_sync_each():
    """The eager-loop timing of the host-cost scripts: warm-up calls, then ``rounds`` rounds of
    ``calls`` calls, each round ended by one sync; the best round per call, in ms."""
    import time

    from sparsec.measure import back_to_back_ms

    calls, syncs = [], []
    ms = back_to_back_ms(lambda: (calls.append(1), time.sleep(0.001)), 4, rounds=3,
                         sync=lambda: syncs.append(1), warmup=2)
    assert len(calls) == 2 + 3 * 4 and len(syncs) == 1 + 3
    assert 1.0 <= ms < 50.0


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
