"""Kernels read only inside their operands: each dense operand is a view into a larger
NaN-filled buffer, so a load through a padding slot (index -1) or past the matrix edge
reads NaN and shows up in the output. (Plain arrays hide such reads when the bytes next
to them happen to hold finite numbers.)"""
import numpy as np
import pytest

import sparsec
from sparsec import reference
from sparsec.formats import convert, nm

from conftest import check, make_matrix

MARGIN = 4096


def fenced(rng, shape, dtype):
    """A random array whose surroundings in memory are NaN (or, for integers, huge)."""
    size = int(np.prod(shape))
    fill = np.nan if np.dtype(dtype).kind == "f" else 100
    buf = np.full(size + 2 * MARGIN, fill, dtype=dtype)
    view = buf[MARGIN:MARGIN + size].reshape(shape)
    view[...] = rng.integers(-8, 8, shape) if np.dtype(dtype).kind == "i" else rng.standard_normal(shape)
    return view


def _instances(m):
    mi = m.copy()
    mi.data = np.clip(np.round(mi.data * 3), -8, 7).astype(np.float32)
    return {
        "bsr:3x5": convert(m, "bsr:3x5"),
        "ell": convert(m, "ell"),
        "hyb": convert(m, "hyb", col_parts=2, buckets=(1, 2, 4)),
        "nm 2:4": nm.prune(m.toarray(), n=2, m=4)[0],
        "nm 2:4 v4": nm.prune(m.toarray(), n=2, m=4, vec=4)[0],
        "srbcrs v4 int8": convert(mi, "srbcrs", vec=4, dtype="int8"),
        "srbcrs v8 int4": convert(mi, "srbcrs", vec=8, dtype="int4"),
        "srbcrs v2 float16": convert(m, "srbcrs", vec=2, dtype="float16"),
    }


@pytest.mark.parametrize("op", ["spmm", "sddmm"])
def test_padding_and_edges_are_never_read(op):
    rng = np.random.default_rng(11)
    m = make_matrix("powerlaw", 45, 37, seed=12)
    for name, A in _instances(m).items():
        k = sparsec.compile(op, A, feat=6)
        rows, cols = A.shape
        dts = k.dtypes
        if op == "spmm":
            B = fenced(rng, (cols, 6), dts.dense)
            out, ref = k(A, B, poison=True), reference.spmm(A, B)
        else:
            X, Y = fenced(rng, (rows, 6), dts.dense), fenced(rng, (cols, 6), dts.dense)
            out, ref = k(A, X, Y, poison=True), reference.sddmm(A, X, Y)
        if dts.exact:
            assert np.array_equal(out.astype(np.int64), ref.astype(np.int64)), name
        else:
            check(out, ref, 1e-2 if dts.dense == "float16" else 1e-5)
