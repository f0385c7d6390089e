"""sparsec.inspect: describe_format (axis chains, value layouts, knobs) and describe (a
converted matrix's nnz, stored slots, padding, bytes and parts) for every family."""
from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp

from sparsec import inspect as si
from sparsec.formats import composite, convert, families, make_format, nm, srbcrs


def matrix(rows=97, cols=83, density=0.08, seed=0, dtype=np.float32):
    return sp.random(rows, cols, density, format="csr", dtype=dtype, random_state=np.random.default_rng(seed))


def instances():
    m = matrix()
    q, _ = srbcrs.quantize(m, 8)
    q4, _ = srbcrs.quantize(m, 4)
    return {
        "csr": convert(m, "csr"),
        "bsr": convert(m, "bsr:3x5"),
        "ell": convert(m, "ell"),
        "nm": nm.prune(m, n=2, m=4)[0],
        "nm-vec": nm.prune(m, n=1, m=8, vec=4)[0],
        "srbcrs-int8": convert(q, "srbcrs", vec=8, dtype="int8"),
        "srbcrs-int4": convert(q4, "srbcrs", vec=4, dtype="int4"),
        "srbcrs-fp16": convert(m, "srbcrs", vec=2, dtype="float16"),
        "rell": convert(m, "rell:16"),
        "hyb": convert(m, "hyb"),
        "hyb-4": convert(m, "hyb", col_parts=4, buckets=(1, 2, 4)),
        "bsr+csr": convert(m, "bsr+csr", block=(2, 2), block_fill=0.5),
        "bsr+csr-all-bsr": convert(m, "bsr+csr", block=(2, 2), block_fill=0.0),
    }


INSTANCES = instances()


@pytest.mark.parametrize("name", [n for n, _ in families()])
def test_describe_format_every_family(name):
    d = si.describe_format(name)
    json.dumps(d)  # plain data
    assert d["name"] == name and d["description"] and isinstance(d["knobs"], list)
    assert d["composite"] is (name in ("hyb", "bsr+csr"))
    for part in d["parts"]:
        assert part["axes"], part
        for a in part["axes"]:
            assert {"name", "kind", "dim", "scale", "flags"} <= set(a)
            assert a["kind"] in ("DenseFixed", "DenseVariable", "SparseFixed", "SparseVariable")
            assert set(a["flags"]) == {"variable", "sparse", "padded", "unique"}
            assert ("extent" in a) != ("width" in a) or a["kind"].endswith("Variable")
        assert set(part["value_layout"]) == {"chunk", "bits"}
    if not d["composite"]:
        assert d["axes"] == d["parts"][0]["axes"] and d["value_layout"] == d["parts"][0]["value_layout"]
    else:
        assert d["axes"] is None and len(d["parts"]) >= 2
    text = si.format_text(d)
    assert text.startswith(f"family    {name}:") and "knobs" in text


def test_describe_format_details():
    d = si.describe_format("bsr:4x2")
    assert d["example"] is False and d["params"] == {"block": [4, 2]}
    assert [a["name"] for a in d["axes"]] == ["io", "jo", "ii", "ji"]
    assert d["axes"][0]["scale"] == 4 and d["axes"][1]["scale"] == 2 and d["axes"][2]["extent"] == 4
    assert d["axes"][1]["flags"]["variable"] and d["axes"][1]["indptr"] == "indptr"
    assert d["knobs"][0]["name"] == "block" and d["knobs"][0]["cli"] == "--block RxC"
    assert si.describe_format("bsr")["example"] is True  # a block had to be assumed
    e = si.describe_format("ell")
    assert e["example"] is False and e["axes"][1]["width"] is None and e["axes"][1]["flags"]["padded"]
    n = si.describe_format("nm", n=1, m=8, vec=4)
    assert n["spec"] == "nm:1,8,4" and [a["name"] for a in n["axes"]] == ["io", "w", "s", "ii"]
    assert n["axes"][1]["scale"] == 8 and n["axes"][2]["width"] == 1 and n["axes"][3]["extent"] == 4
    s = si.describe_format("srbcrs:v4,int4")
    assert s["value_layout"] == {"chunk": 32, "bits": 4} and s["runtime_extents"] == ["io"]
    assert si.describe_format("srbcrs", vec=8, dtype="float16")["value_layout"] == {"chunk": 16, "bits": 0}
    h = si.describe_format("hyb:2:1/2/4")
    assert h["example"] is False and len(h["parts"]) == 6
    assert h["parts"][-1]["axes"][0]["flags"]["unique"] is False  # the widest bucket may repeat rows
    assert {k["name"] for k in h["knobs"]} == {"col_parts", "buckets"}
    b = si.describe_format("bsr+csr")
    assert [p["family"] for p in b["parts"]] == ["bsr", "csr"] and b["params"]["block_fill"] == 0.5
    assert si.describe_format(make_format("ell", width=8))["axes"][1]["width"] == 8
    with pytest.raises(ValueError, match="does not take"):
        si.describe_format("csr", width=3)
    with pytest.raises(ValueError, match="format family"):
        si.describe_format("coo")


def _bytes(p):
    return sum(a.nbytes for a in p.arrays.values()) + p.data.nbytes


@pytest.mark.parametrize("name", list(INSTANCES))
def test_describe_instance(name):
    A = INSTANCES[name]
    d = si.describe(A)
    json.dumps(d)
    parts = A.parts if isinstance(A, composite.CompositeInstance) else [A]
    assert d["format"] == A.format.spec and d["shape"] == list(A.shape) and d["nnz"] == A.nnz
    assert d["stored"] == A.stored == sum(p["stored"] for p in d["parts"])
    assert d["nnz"] == sum(p["nnz"] for p in d["parts"])
    assert d["padding_ratio"] == pytest.approx(A.stored / A.nnz) and d["padding_ratio"] >= 1.0 - 1e-12
    assert d["bytes"] == sum(_bytes(p) for p in parts) == d["index_bytes"] + d["value_bytes"]
    assert len(d["parts"]) == len(parts) and d["composite"] is isinstance(A, composite.CompositeInstance)
    for p, q in zip(d["parts"], parts):
        assert (p["format"], p["stored"], p["nnz"], p["bytes"]) == (q.format.spec, q.stored, q.nnz, _bytes(q))
    assert d["conversion_s"] == A.conversion_s > 0
    # the families' own statistics agree
    from sparsec.formats import module_for

    s = module_for(A.format.name).stats(A)
    assert (s["stored"], s["nnz"], s["bytes"]) == (d["stored"], d["nnz"], d["bytes"])
    assert s["padding_ratio"] == pytest.approx(d["padding_ratio"])
    assert si.instance_text(d).startswith(f"format    {A.format.spec}")


def test_describe_values():
    m = matrix()
    d = si.describe(INSTANCES["csr"])
    assert d["padding_ratio"] == 1.0 and d["bytes"] == (98 + 2 * m.nnz) * 4 and d["value_dtype"] == "float32"
    e = si.describe(INSTANCES["ell"])
    assert e["stored"] == 97 * int(np.diff(m.indptr).max())
    i4 = si.describe(INSTANCES["srbcrs-int4"])
    assert i4["value_dtype"] == "int4" and i4["value_bytes"] * 2 == i4["stored"]  # two values per byte
    assert i4["stored"] % 32 == 0
    h = si.describe(INSTANCES["hyb-4"])
    assert len(h["parts"]) > 1 and all(p["family"] == "rell" for p in h["parts"])
    assert h["params"] == {"col_parts": 4, "buckets": [1, 2, 4]} and h["padding_ratio"] < 2.0
    b = si.describe(INSTANCES["bsr+csr"])
    assert [p["family"] for p in b["parts"]] == ["bsr", "csr"]
    assert b["parts"][1]["padding_ratio"] == 1.0 and b["parts"][0]["padding_ratio"] >= 1.0
    all_bsr = si.describe(INSTANCES["bsr+csr-all-bsr"])["parts"]  # the CSR part stays, empty
    assert [p["family"] for p in all_bsr] == ["bsr", "csr"] and all_bsr[1]["nnz"] == 0
    n = si.describe(INSTANCES["nm"])
    assert n["stored"] == 97 * 21 * 2 and n["parts"][0]["format"] == "nm:2,4"


def test_describe_empty_and_errors():
    empty = sp.csr_matrix((10, 12), dtype=np.float32)
    for spec in ("csr", "hyb", "bsr+csr", "ell"):
        d = si.describe(convert(empty, spec))
        # composites keep every part of their spec, empty: hyb's 3 buckets 1/2/4, bsr+csr's 2
        assert d["nnz"] == 0 and d["padding_ratio"] == 1.0 and len(d["parts"]) == {"hyb": 3, "bsr+csr": 2}.get(spec, 1)
    with pytest.raises(TypeError, match="converted matrix"):
        si.describe(matrix())
