"""Distributed measuring through TVM's RPC tracker (issue 7), on loopback: a tracker and
two servers on this machine, the llvm target. The GPU run (one server per GPU) is
benchmarks/time_rpc.py."""
from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp

pytest.importorskip("tornado")

from sparsec import cli  # noqa: E402
from sparsec.tune.rpc import LocalCluster, RPCRunner, parse_tracker  # noqa: E402

KEY = "sparsec-ci"


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(KEY, servers=2, port=9590) as c:
        yield c


def matrix():
    m = sp.random(400, 300, density=0.02, format="lil", random_state=3, dtype=np.float32)
    m[:20, :] = 0
    m[50, :] = 1.0
    return m.tocsr()


def test_candidates_are_measured_on_both_servers_and_checked(cluster):
    cands = [{"op": "spmm", "format": "csr", "schedule_knobs": {"parallel": r % 2 == 0}, "feat": 16, "dtype": "float32"}
             for r in (1, 2, 4, 8)]
    cands += [{"op": "sddmm", "format": "hyb", "feat": 8, "dtype": "float32"},
              {"op": "spmm", "format": "ell", "feat": 16, "dtype": "float32", "inject": "compile_error"}]
    with RPCRunner(cluster.address, KEY, "llvm", workers=2) as runner:
        assert runner.servers() == 2
        res = runner.measure(cands, matrix())
    assert [r["status"] for r in res] == ["ok"] * 5 + ["compile_error"]
    assert all(r["time_ms"] > 0 and r["max_rel_err"] < 1e-5 and r["method"] == "rpc-evaluator" for r in res[:5])
    assert {r["session"] for r in res[:5]} == {0, 1}  # both sessions (servers) took candidates
    assert "injected compile error" in res[5]["error"]


def test_tune_cli_over_rpc(cluster, tmp_path, capsys):
    path = tmp_path / "m.npz"
    sp.save_npz(path, matrix())
    log = tmp_path / "log.jsonl"
    assert cli.main(["tune", "spmm", "--matrix", str(path), "--feat", "8", "--trials", "4", "--batch", "2",
                     "--formats", "csr,hyb", "--rpc", cluster.address, "--rpc-key", KEY, "--log", str(log),
                     "--workers", "2"]) == 0
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) == 4 and all(r["status"] == "ok" for r in records)
    assert cli.main(["tune", "spmm", "--matrix", str(path), "--rpc", cluster.address]) == 2
    assert "--rpc and --rpc-key go together" in capsys.readouterr().err


def test_rpc_errors_name_the_problem(cluster):
    for bad in ("localhost", "host:port", ":9190", "h:0"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            parse_tracker(bad)
    with RPCRunner(cluster.address, "no-such-key", "llvm", workers=1) as runner:
        with pytest.raises(RuntimeError, match="no RPC server is registered under key 'no-such-key'"):
            runner.measure([{"op": "spmm", "format": "csr", "feat": 8}], matrix())
    with pytest.raises(ValueError, match="timeout_s should be positive"):
        RPCRunner(cluster.address, KEY, "llvm", timeout_s=0)
    with pytest.raises(ValueError, match="parallel should be positive"):
        RPCRunner(cluster.address, KEY, "llvm", parallel=0)
