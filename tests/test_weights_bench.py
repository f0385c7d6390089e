"""benchmarks/weights.py (issue 24's one command) on the CPU: each pattern prunes to its
sparsity and format with the kept values untouched, the case grid, and the summary's two
figures (the geomean over the big layers at 1024+ tokens, the lowest ratio at 16-128)."""
import numpy as np
import pytest

from script_modules import ROOT, load_script

weights = load_script(ROOT / "benchmarks" / "weights.py", "sparsec_benchmark_weights")


@pytest.fixture(autouse=True)
def _script_paths(monkeypatch):
    """The script imports its siblings (lowprec, time_cslt_peer) when it runs."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "data"))
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))


def test_each_pattern_prunes_to_its_sparsity_and_format():
    w = np.random.default_rng(0).standard_normal((256, 320)).astype(np.float32)
    formats = {}
    for pattern in weights.PATTERNS:
        s = 70 if pattern.startswith("bsr") else weights.pattern_sparsity(pattern)
        wp, formats[pattern] = weights.pruned(w, pattern, s)
        assert wp.shape == w.shape and abs(1 - np.count_nonzero(wp) / wp.size - s / 100) < 0.02, pattern
        kept = wp != 0
        assert np.array_equal(wp[kept], w[kept]), pattern
    assert formats == {"bsr32": "bsr:32x32", "bsr64": "bsr:64x64", "2:4": "mma_sp:2,4", "nm1:10": "nm_tc:1,10",
                       "nm1:8": "nm_tc:1,8", "nm1:4": "nm_tc:1,4", "int8": "srbcrs:v8,int8"}
    assert [weights.pattern_sparsity(p) for p in ("2:4", "nm1:10", "nm1:8", "nm1:4", "int8")] == [50, 90, 88, 75, 90]


def test_the_case_grid(capsys):
    assert weights.main(["--list", "--layers", "bert-attn", "llm-up", "--patterns", "bsr32", "2:4",
                         "--sparsity", "70", "90", "--tokens", "16", "4096"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == "12 cases"  # 2 layers x (bsr32 at 2 sparsities + 2:4) x 2 token counts
    assert any("llm-up" in x and "11008 x 4096" in x and "2:4" in x and "50 %" in x for x in lines)


def test_the_summary_reads_the_issues_two_figures():
    def rec(rows, cols, tokens, speedup, ok=True):
        return {"pattern": "bsr32", "sparsity": 90, "rows": rows, "cols": cols, "tokens": tokens,
                "speedup_vs_dense": speedup, "ok": ok}

    records = [rec(3072, 768, 4096, 2.0), rec(4096, 4096, 1024, 8.0), rec(384, 384, 4096, 100.0),
               rec(384, 384, 16, 0.9), rec(4096, 4096, 128, 1.2), rec(4096, 4096, 8192, 0.01, ok=False)]
    (s,) = weights.summary(records)
    assert s["cases"] == 5 and s["big_geomean"] == pytest.approx(4.0) and s["few_tokens_min"] == 0.9
