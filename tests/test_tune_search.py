"""The search loop on its own, with stand-in measurers (no processes): the round-by-round
path for a plain measure function, and the pipelined path for a measurer that hands
results back as they finish, where a slow candidate must not hold up the others."""
import numpy as np
import pytest
import scipy.sparse as sp

from sparsec.tune.features import MatrixContext
from sparsec.tune.search import Search
from sparsec.tune.space import Space, candidate_id


@pytest.fixture(scope="module")
def space_ctx():
    rng = np.random.default_rng(11)
    m = sp.random(400, 300, 0.02, format="csr", dtype=np.float32, random_state=rng)
    ctx = MatrixContext(m)
    return Space("spmm", ctx.matrix, 32, stats=ctx.stats), ctx


def _time(c) -> float:
    """A made-up kernel time that the model can learn: fewer rows per block, more vec is faster."""
    k = c["schedule_knobs"]
    return 1.0 + 0.1 * (k.get("rows_per_block") or 4) - 0.05 * (k.get("vec") or 1) + 0.01 * len(c["format"])


def _ok(c):
    return {"status": "ok", "time_ms": _time(c)}


class Pipelined:
    """Results of submitted candidates after ``delay`` collect calls; ``slow`` candidates
    (by submit order) take ``slow_delay`` calls instead."""

    def __init__(self, slow=(), delay=0, slow_delay=3):
        self.slow, self.delay, self.slow_delay = set(slow), delay, slow_delay
        self.pending, self.calls, self.submitted, self.max_in_flight = [], 0, [], 0

    def submit(self, cands):
        tickets = []
        for c in cands:
            t = len(self.submitted)
            self.submitted.append(c)
            self.pending.append((t, c, self.calls + (self.slow_delay if t in self.slow else self.delay)))
            tickets.append(t)
        self.max_in_flight = max(self.max_in_flight, len(self.pending))
        return tickets

    def collect(self, at_least=None):
        want = len(self.pending) if at_least is None else at_least
        out = []
        while len(out) < want:
            ready = [p for p in self.pending if p[2] <= self.calls]
            self.calls += 1
            for p in ready:
                self.pending.remove(p)
                out.append((p[0], _ok(p[1])))
        return out


def test_round_by_round_search_with_a_plain_function(space_ctx):
    space, ctx = space_ctx
    calls = []
    res = Search(space, ctx, lambda cs: calls.append(len(cs)) or [_ok(c) for c in cs],
                 trials=20, batch=8, seed=1).run()
    assert calls == [8, 8, 4] and res.stopped == "trial budget"
    assert res.trials[0].source == "default" and [t.index for t in res.trials] == list(range(20))
    assert len({candidate_id(t.candidate) for t in res.trials}) == 20


def test_pipelined_search_keeps_picking_while_a_slow_candidate_runs(space_ctx):
    space, ctx = space_ctx
    m = Pipelined(slow={1})
    seen = []
    res = Search(space, ctx, m, trials=24, batch=8, seed=1, on_trial=seen.append).run()
    assert res.stopped == "trial budget" and len(res.trials) == 24 and len(m.submitted) == 24
    assert [t.index for t in res.trials] == list(range(24))  # numbered in pick order
    assert res.trials[0].source == "default" and res.trials[0].round == 1
    assert len({candidate_id(t.candidate) for t in res.trials}) == 24
    assert [candidate_id(t.candidate) for t in res.trials] == [candidate_id(c) for c in m.submitted]
    # trial 1 came back after trials picked in later rounds: the slow one held nothing up
    order = [t.index for t in seen]
    assert order.index(1) > order.index(8) and m.max_in_flight <= 8
    assert res.trials[1].round == 1 and max(t.round for t in res.trials) > 3


def test_pipelined_search_stops_on_patience_and_drains_what_is_in_flight(space_ctx):
    space, ctx = space_ctx

    class Flat(Pipelined):
        def collect(self, at_least=None):
            return [(t, {"status": "ok", "time_ms": 1.0}) for t, _ in super().collect(at_least)]

    m = Flat(delay=1)
    res = Search(space, ctx, m, trials=200, batch=4, patience=2, seed=0).run()
    assert res.stopped == "no gain in 2 rounds"
    assert len(res.trials) == len(m.submitted) < 200 and not m.pending


def test_pipelined_search_exhausts_a_small_space(space_ctx):
    _, ctx = space_ctx
    small = Space("spmm", ctx.matrix, 32, size="small", stats=ctx.stats)
    m = Pipelined(slow={0, 5})
    res = Search(small, ctx, m, trials=10_000, batch=16, seed=2).run()
    assert res.stopped == "space exhausted" and len(res.trials) == len(small)
