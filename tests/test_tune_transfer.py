"""Zero-shot picks (sparsec.tune.transfer): the model ranks configurations that won on the
logged matrices, with the matrix-dependent format knobs left free."""
import numpy as np
import pytest
import scipy.sparse as sp

from sparsec.tune import records as rec
from sparsec.tune.features import MatrixContext
from sparsec.tune.model import CostModel
from sparsec.tune.space import Space, candidate_id
from sparsec.tune.transfer import config_key, transfer_pool, winning_keys, zero_shot_pick


def _matrix(n=2000, seed=0):
    rng = np.random.default_rng(seed)
    lens = np.minimum(rng.zipf(1.8, n), n // 2)
    rows = np.repeat(np.arange(n), lens)
    m = sp.csr_matrix((np.ones(rows.size, np.float32), (rows, rng.integers(0, n, rows.size))), shape=(n, n))
    m.sum_duplicates()
    return m


def _record(cand, time_ms, signature="m-0000000000000001", status="ok", feat=64):
    return rec.Record(op=cand["op"], format=cand["format"], format_knobs=cand["format_knobs"],
                      schedule_knobs=cand["schedule_knobs"], feat=feat, signature=signature, target="cuda",
                      versions={}, stats={"nnz": 10}, status=status, time_ms=time_ms if status == "ok" else None)


@pytest.fixture(scope="module")
def space():
    return Space("spmm", _matrix(), 64)


def test_winning_keys_take_the_fastest_per_case(space):
    cands = space.candidates[:6]
    recs = [_record(c, t) for c, t in zip(cands, [5.0, 1.0, 3.0, 2.0, 9.0, 4.0])]
    recs.append(_record(cands[4], None, status="timeout"))
    recs += [_record(c, 1.0 + i, signature="m-0000000000000002") for i, c in enumerate(cands[4:6])]
    keys = winning_keys(recs, "spmm", top=2)
    assert keys == {config_key(cands[i]) for i in (1, 3, 4, 5)}
    assert winning_keys(recs, "spmm", top=2, exclude_signature="m-0000000000000002") == \
        {config_key(cands[i]) for i in (1, 3)}
    assert winning_keys(recs, "sddmm") == set()


def test_pool_keeps_hyb_buckets_free_and_the_default(space):
    hyb = [c for c in space.candidates if c["format"] == "hyb"]
    widths = {c["format_knobs"]["buckets"] for c in hyb}
    assert len(widths) > 1
    pool = transfer_pool(space, {config_key(hyb[0])})
    ids = {candidate_id(c) for c in pool}
    assert candidate_id(space.default) in ids
    same = [c for c in hyb if config_key(c) == config_key(hyb[0])]
    assert len(same) > 1 and {candidate_id(c) for c in same} <= ids  # every bucket width of that config
    assert all(config_key(c) == config_key(hyb[0]) or candidate_id(c) == candidate_id(space.default) for c in pool)
    assert len(transfer_pool(space, set())) == len(space)  # nothing fits: the whole space


def test_zero_shot_pick_comes_from_the_pool(space):
    ctx = MatrixContext(space.matrix)
    other = MatrixContext(_matrix(seed=3))
    train = [space.candidates[i] for i in range(0, len(space), max(1, len(space) // 40))]
    model = CostModel().fit([(c, other, 1.0 + 0.01 * i) for i, c in enumerate(train)])
    recs = [_record(c, 1.0 + 0.01 * i, signature=other.signature) for i, c in enumerate(train)]
    pick = zero_shot_pick(model, space, ctx, recs)
    pool = transfer_pool(space, winning_keys(recs, "spmm"))
    assert candidate_id(pick) in {candidate_id(c) for c in pool}
    scores = model.predict(pool, ctx)
    assert candidate_id(pick) == candidate_id(pool[int(np.argmax(scores))])
