"""The lane-ordered 2:4 operands of mma.sp.m16n8k32 (formats.mma_sp), which the sp24 mode
of schedules.tc_pipeline reads: the packing round-trips and, replayed lane by lane the way
the instruction is specified, gives the dense product."""
import numpy as np
import pytest

from sparsec.formats import mma_sp


def _two_four(rows, cols, seed, empty_rows=(), dense_row=None):
    """A random 2:4 matrix (2 largest of every 4 along a row kept), with empty rows and
    groups holding one or no non-zero."""
    rng = np.random.default_rng(seed)
    cp = -(-cols // 4) * 4
    a = rng.standard_normal((rows, cp)).astype(np.float16)
    g = a.reshape(rows, cp // 4, 4)
    keep = np.argsort(-np.abs(g.astype(np.float32)), -1)[..., :2]
    mask = np.zeros(g.shape, bool)
    np.put_along_axis(mask, keep, True, -1)
    mask &= rng.random(g.shape) < 0.85  # some groups keep fewer than two
    a = np.where(mask, g, 0).reshape(rows, cp)[:, :cols]
    for r in empty_rows:
        a[r] = 0
    return np.ascontiguousarray(a)


@pytest.mark.parametrize("shape", [(16, 32), (37, 70), (64, 128), (5, 3), (1, 1), (130, 33)])
def test_pack_round_trips_and_pads_to_whole_tiles(shape):
    a = _two_four(*shape, seed=sum(shape), empty_rows=(0,))
    values, meta = mma_sp.pack(a)
    mp, kp = mma_sp.padded_shape(*shape)
    assert mp % 16 == 0 and kp % 32 == 0 and mp >= shape[0] and kp >= shape[1]
    assert values.shape == (mp, kp // 2) and values.dtype == np.float16
    assert meta.shape == (mp // 16, kp // 32, 16) and meta.dtype == np.uint32
    assert np.array_equal(mma_sp.unpack(values, meta, shape), a)


@pytest.mark.parametrize("shape, n", [((16, 32), 8), ((37, 70), 13), ((64, 128), 40), ((130, 33), 1)])
def test_lane_by_lane_replay_gives_the_dense_product(shape, n):
    a = _two_four(*shape, seed=3 + n, empty_rows=(1,))
    b = np.random.default_rng(n).standard_normal((shape[1], n)).astype(np.float16)
    values, meta = mma_sp.pack(a)
    got = mma_sp.emulate(values, meta, b)[:shape[0]]
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert np.abs(got - ref).max() <= 1e-9 * max(1.0, np.abs(ref).max())


def test_metadata_words_follow_the_ptx_nibbles():
    """Every group keeping slots {0, 1}: nibble 0x4 in all eight places of every word;
    slots {2, 3}: 0xE. Rows g and g+8 share a word (low and high half)."""
    a = np.zeros((16, 32), np.float16)
    a[:8, 0::4] = 1
    a[:8, 1::4] = 2
    a[8:, 2::4] = 3
    a[8:, 3::4] = 4
    _, meta = mma_sp.pack(a)
    assert set(meta.reshape(-1).tolist()) == {0xEEEE4444}


def test_more_than_two_of_four_is_refused_by_position():
    a = np.zeros((16, 32), np.float16)
    a[5, 8:11] = 1
    with pytest.raises(ValueError, match=r"row 5, columns 8\.\.11 hold 3 non-zeros"):
        mma_sp.pack(a)


def test_the_lane_layout_is_what_the_kernel_reads():
    """lane_registers (which emulate uses) names the elements in the order ldmatrix.x4 hands them to mma.sp:
    a0 row g, a1 row g+8, a2 and a3 eight compressed columns on; metadata from t < 2."""
    values = np.arange(32 * 32, dtype=np.float16).reshape(32, 32) % 2048
    meta = np.arange(2 * 2 * 16, dtype=np.uint32).reshape(2, 2, 16)
    regs, word = mma_sp.lane_registers(values, meta, 1, 1, lane=13)  # g = 3, t = 1
    assert [rc for rc, _ in regs] == [(19, 18), (27, 18), (19, 26), (27, 26)]
    assert word == meta[1, 1, 7]
    assert mma_sp.lane_registers(values, meta, 0, 0, lane=14)[1] == 0
