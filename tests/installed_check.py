"""Run by tests/test_wheel.py with the python of a fresh venv where the sparsec wheel is
installed (non-editable), from a directory outside the checkout: every module imports
under the one root ``sparsec``, and the library works from its installed files alone.
Prints ``installed sparsec ok`` at the end; any failure is a traceback and exit 1."""
import importlib
import os
import pkgutil
import sys
import tempfile

import numpy as np
import scipy.sparse as sp

import sparsec

# the installed copy, not a checkout (editable finder, PYTHONPATH or the working directory)
here = os.path.realpath(sparsec.__file__)
assert here.startswith(os.path.realpath(sys.prefix) + os.sep), f"sparsec imported from {here}, not {sys.prefix}"
assert not any("editable" in type(f).__name__.lower() or "editable" in getattr(f, "__module__", "")
               for f in sys.meta_path), sys.meta_path
for bare in ("formats", "schedules"):
    assert importlib.util.find_spec(bare) is None, f"a top-level '{bare}' is importable: {importlib.util.find_spec(bare)}"

# every module of every subpackage imports (a bare 'formats' / 'schedules' import anywhere fails here)
names = [m.name for m in pkgutil.walk_packages(sparsec.__path__, "sparsec.")]
for sub in ("formats", "schedules", "lower", "bench", "tune"):
    assert any(n.startswith(f"sparsec.{sub}.") for n in names), f"no modules of sparsec.{sub} installed: {names}"
for name in names:
    importlib.import_module(name)
assert "formats" not in sys.modules and "schedules" not in sys.modules

from sparsec import formats, tc_linear  # noqa: E402
from sparsec.formats import nm  # noqa: E402
from sparsec.reference import TOLERANCE, max_rel_err  # noqa: E402

rng = np.random.default_rng(0)
m = sp.random(45, 38, density=0.2, format="csr", dtype=np.float32, random_state=rng)
m.data = rng.standard_normal(m.nnz).astype(np.float32)
dense = m.toarray()

# one instance of every format family, each holding the matrix it was converted from
instances = {
    "csr": formats.convert(m, "csr"),
    "bsr": formats.convert(m, "bsr:4x4"),
    "ell": formats.convert(m, "ell"),
    "rell": formats.convert(m, "rell"),
    "hyb": formats.convert(m, "hyb"),
    "bsr+csr": formats.convert(m, "bsr+csr:4x4"),
    "srbcrs": formats.convert(sp.csr_matrix(np.round(dense * 10).astype(np.float32)), "srbcrs:v4,int8"),
    "tiled": formats.convert(m, "tiled:16x8"),
}
pruned, keep = nm.prune(m, n=2, m=4)
instances["nm"] = pruned
instances["mma_sp"] = formats.convert(pruned.to_scipy(), "mma_sp", dtype=np.float16)
vector_wise = formats.nm_tc.prune(dense, n=2, m=4, vec=16)  # rows in vectors of 16 share their kept columns
instances["nm_tc"] = formats.convert(sp.csr_matrix(vector_wise), "nm_tc:2:4:v16", dtype=np.float16)
assert {i.format.name for i in instances.values()} == {name for name, _ in formats.registry.families()}
for name, inst in instances.items():
    if name in ("mma_sp", "nm_tc"):  # values stored in float16, as their Tensor Core kernels read them
        kept = np.where(keep, dense, 0) if name == "mma_sp" else vector_wise
        np.testing.assert_array_equal(inst.to_scipy().toarray(), kept.astype(np.float16), err_msg=name)
        continue
    want = np.where(keep, dense, 0) if name == "nm" else (np.round(dense * 10) if name == "srbcrs" else dense)
    np.testing.assert_array_equal(inst.to_scipy().toarray(), want, err_msg=name)

# Tensor Core N:M pruning (formats.nm_tc through tc_linear)
w = rng.standard_normal((64, 80)).astype(np.float32)
p = tc_linear.prune(w, "nm_tc:1,10")
assert p.shape == w.shape and 0 < np.count_nonzero(p) <= w.size // 10

# a CPU kernel per family, checked against scipy
B = rng.standard_normal((m.shape[1], 8)).astype(np.float32)
for name, inst in instances.items():
    k = sparsec.compile("spmm", inst, feat=8, target="llvm")
    Bk = np.round(B * 4).astype(np.int8) if k.dtypes.dense == "int8" else B.astype(k.dtypes.dense)
    ref = inst.to_scipy().astype(np.float64) @ Bk.astype(np.float64)
    err = max_rel_err(k(inst, Bk), ref)
    assert err <= TOLERANCE[k.dtype], (name, err)

# export an llvm kernel and load it back with the runtime
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "spmm_csr.so")
    k = sparsec.compile("spmm", instances["csr"], feat=8, target="llvm")
    meta = k.export(path)
    assert meta["sparsec_version"] == sparsec.__version__
    loaded = sparsec.load(path)
    np.testing.assert_allclose(loaded(instances["csr"], B), m @ B, rtol=1e-5, atol=1e-5)

# the learned default reads the tuning log and model shipped inside the package (this
# directory has no tuning_logs/): CSR SpMM on sm_90a, compiled without a GPU
from sparsec.tune.apply import log_candidates

(shipped,) = log_candidates("spmm", "cuda:sm_90a")
assert os.path.dirname(shipped) == os.path.join(os.path.dirname(sparsec.__file__), "tuning_logs"), shipped
k = sparsec.compile("spmm", instances["csr"], feat=32, target="cuda:sm_90a")
assert k.extra["knobs_source"] in ("model", "record") or k.extra["knobs_source"].startswith("default: the tuning log"), \
    k.extra["knobs_source"]

print("installed sparsec ok")
