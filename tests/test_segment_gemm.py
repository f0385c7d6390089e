"""The segment contraction's GEMM tile (``segment_contract.Tile``): every (segment, column) of
a chunk computed by exactly one thread, every shared read in bounds and 16-byte aligned, the
budget kept, and nvcc turning the tile's reads into 128-bit shared loads."""
import re
import types

import numpy as np
import pytest

import sparsec
from sparsec import ops
from sparsec.formats import convert, stack_rows
from sparsec.schedules import segment_contract
from sparsec.schedules.segment_contract import PER_THREAD, SHARED_BYTES, THREADS, tile
from tests.nvcc_tools import nvcc_ptx, nvcc_sources
from tests.test_axis_trees import _graph

SHAPES = [(G, F) for G in (1, 2, 3, 4, 7, 16, 40, 64, 100, 128, 160, 256, 512) for F in (5, 8, 64)]


# one step of the loop over f: a 128-bit load of Zs and one of Ws (no scalar shared load or
# branch between), then the 4x4 tile's 16 FMAs
GEMM_STEP = re.compile(r"(?:\s*ld\.shared\.v4\.f32[^\n]*\n(?:(?!\s*ld\.shared\.f32|\s*@?%?p?\d*\s*bra)[^\n]*\n)*?){2}"
                       r"(?:\s*fma\.rn\.f32[^\n]*\n){16}")


def _eval(text: str, **env) -> int:
    """A tile index text in Python (``//`` and ``%`` floor like TVM's on these non-negative ints)."""
    return eval(text, {"T": types.SimpleNamespace(min=min)}, env)


@pytest.mark.parametrize("itemsize", [4, 8])
def test_every_segment_and_column_of_a_chunk_is_computed_exactly_once(itemsize):
    checked = 0
    for G, F in SHAPES:
        t = tile(G, F, itemsize)
        if t is None:
            assert F * G * itemsize + 32 * F * itemsize > SHARED_BYTES - 32 * 4, (G, F)  # only big W is refused
            continue
        checked += 1
        assert t.active <= THREADS and t.TS <= THREADS and t.shared_bytes(itemsize) <= SHARED_BYTES
        assert t.stride >= t.TS and t.stride % 4 == 0 and (G % 4 or t.vec == 4)
        seen = np.zeros((t.TS, G), int)
        for tid in range(t.active):
            for a in range(PER_THREAD):
                seg = _eval(t.segment("tid", "a"), tid=tid, a=a)
                assert 0 <= seg < t.TS
                if a == 0:
                    assert seg % 4 == 0  # Zs[f, seg:seg + 4] is one aligned 4-wide run
                for b in range(t.groups):
                    first = _eval(t.column_read("tid", "b", "v"), tid=tid, b=b, v=0)
                    assert first % t.vec == 0
                    for v in range(t.vec):
                        assert 0 <= _eval(t.column_read("tid", "b", "v"), tid=tid, b=b, v=v) < G
                        g = _eval(t.column("tid", "b", "v"), tid=tid, b=b, v=v)
                        if g < G:  # the kernel stores only these
                            assert _eval(t.column_read("tid", "b", "v"), tid=tid, b=b, v=v) == g
                            seen[seg, g] += 1
        assert (seen == 1).all(), (G, F, t)
    assert checked > len(SHAPES) // 2


def test_wide_outputs_take_4x4_tiles_and_others_the_scalar_mapping():
    t = tile(64, 64, 4)
    assert (t.vec, t.lanes, t.groups, t.rows, t.TS, t.active) == (4, 16, 1, 16, 64, 256)
    assert tile(256, 32, 4).groups == 2 and tile(256, 32, 4).vec == 4
    assert tile(7, 5, 4).vec == 1 and tile(7, 5, 4).lanes == 7
    assert tile(64, 128, 4) is None  # Ws alone takes 32 KiB; no chunk of 32 segments fits beside it


def _rgcn_source(fin, fout):
    adj = _graph()
    inst = convert(stack_rows(adj, np.arange(adj.nnz) % 4, 4).astype(np.float32), "csr")
    return sparsec.compile(ops.rgcn(), inst, target="cuda", rel=4, fin=fin, fout=fout).source()


def test_gemm_loop_reads_shared_memory_128_bits_at_a_time():
    sources = {(f"rgcn_{fin}x{fout}", "sm_90a"): _rgcn_source(fin, fout) for fin, fout in ((64, 64), (64, 16), (8, 40))}
    for key, (ok, log) in nvcc_sources(sources).items():
        assert ok, f"{key}: {log[-2000:]}"
    for (name, arch), src in sources.items():
        assert "l__zr_ptr" in src and "l__wr_ptr" in src, name  # the tile's registers
        ptx = nvcc_ptx(src, arch)
        assert GEMM_STEP.search(ptx), f"{name}: no 128-bit shared loads of Zs and Ws feeding 16 FMAs"


def test_the_ptx_pattern_tells_128_bit_loads_from_scalar_ones():
    step = "ld.shared.v4.f32 {%f1, %f2, %f3, %f4}, [%r1];\nadd.s32 %r2, %r3, %r4;\n" \
           "ld.shared.v4.f32 {%f5, %f6, %f7, %f8}, [%r2];\n" + "fma.rn.f32 %f9, %f1, %f5, %f9;\n" * 16
    assert GEMM_STEP.search(step)
    assert not GEMM_STEP.search(step.replace("v4.f32 {%f5, %f6, %f7, %f8}", "f32 %f5"))
