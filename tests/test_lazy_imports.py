"""A learned pick from the shipped model imports neither TVM (nor torch, which tvm_ffi
imports where installed) nor xgboost: it names schedules and knobs, predicts with numpy over
the saved trees, and builds no kernel. The lazy module stand-in behaves as the module."""
import json
import subprocess
import sys

import numpy as np
import pytest

from sparsec.lazy_module import lazy
from sparsec.tune.trees import TreeEnsemble

PICK = """
import sys
import scipy.sparse as sp
from sparsec import formats
from sparsec.tune.apply import tuned_config
m = sp.random(3000, 3000, density=0.002, format="csr", random_state=0, dtype="float32")
cand, source = tuned_config("spmm", m, 32, "cuda:sm_90a")
inst = formats.convert(m, "auto", op="spmm", feat=32, target="cuda:sm_90a")
print(source, inst.format_source, sorted(n for n in ("tvm", "tvm_ffi", "torch", "xgboost") if n in sys.modules))
"""


def test_a_pick_from_the_shipped_model_imports_no_tvm_torch_or_xgboost():
    out = subprocess.run([sys.executable, "-c", PICK], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    source, fmt_source, imported = out.stdout.split(maxsplit=2)
    assert source == "model" and fmt_source == "model"
    assert imported.strip() == "[]", imported


def test_lazy_module_imports_on_first_use():
    json_ = lazy("json")
    assert json_.dumps({"a": 1}) == json.dumps({"a": 1}) and json_.__name__ == "json"
    missing = lazy("no_such_module_sparsec")
    with pytest.raises(ModuleNotFoundError):
        missing.anything


def test_tree_ensemble_refuses_what_it_does_not_read():
    doc = {"learner": {"gradient_booster": {"name": "gblinear"}, "learner_model_param": {}, "objective": {}}}
    with pytest.raises(ValueError, match="gbtree"):
        TreeEnsemble.from_json(json.dumps(doc))


def test_tree_ensemble_matches_xgboost_bit_for_bit():
    xgb = pytest.importorskip("xgboost")
    rng = np.random.default_rng(3)
    X = rng.standard_normal((400, 6)).astype(np.float32)
    y = X[:, 0] * 2 + np.sin(X[:, 1]) + (X[:, 2] > 0.5)
    X[rng.random(X.shape) < 0.2] = np.nan  # missing values take each split's default side
    booster = xgb.train({"max_depth": 5, "eta": 0.3, "seed": 0, "nthread": 1}, xgb.DMatrix(X, label=y), 30)
    ens = TreeEnsemble.from_json(booster.save_raw("json").decode())
    Xt = rng.standard_normal((200, 6)).astype(np.float32)
    Xt[rng.random(Xt.shape) < 0.3] = np.nan
    np.testing.assert_array_equal(ens.predict(Xt), booster.predict(xgb.DMatrix(Xt)).astype(np.float64))
    with pytest.raises(ValueError, match="feature columns"):  # never a read past a row's end
        ens.predict(Xt[:, :2])


def test_a_saved_ensemble_reads_back_as_saved_and_refuses_damage():
    xgb = pytest.importorskip("xgboost")
    rng = np.random.default_rng(5)
    X = rng.standard_normal((200, 4)).astype(np.float32)
    booster = xgb.train({"max_depth": 3, "seed": 0, "nthread": 1}, xgb.DMatrix(X, label=X[:, 0] - X[:, 1]), 10)
    ens = TreeEnsemble.from_json(booster.save_raw("json").decode())
    doc = json.loads(json.dumps(ens.to_doc()))  # as a model file holds it
    np.testing.assert_array_equal(TreeEnsemble.from_doc(doc).predict(X), ens.predict(X))
    doc["arrays"]["left"] = doc["arrays"]["left"][:8]
    with pytest.raises(ValueError, match="not a saved tree ensemble"):
        TreeEnsemble.from_doc(doc)


def test_a_model_numpy_does_not_read_saves_and_loads_through_xgboost(tmp_path):
    """A booster of another objective than the tuner's is no TreeEnsemble: its file keeps no
    trees and loading it predicts with xgboost, the same as before saving."""
    pytest.importorskip("xgboost")
    from sparsec.tune.features import FEATURE_NAMES
    from sparsec.tune.model import CostModel

    rng = np.random.default_rng(6)
    X = rng.standard_normal((60, len(FEATURE_NAMES))).astype(np.float32)
    model = CostModel(params={"objective": "reg:pseudohubererror"}).fit_arrays(X, rng.standard_normal(60))
    model.save(tmp_path / "m.json")
    assert json.loads((tmp_path / "m.json").read_text())["trees"] is None
    loaded = CostModel.load(tmp_path / "m.json")
    assert loaded.trained
    np.testing.assert_array_equal(loaded.predict_arrays(X), model.predict_arrays(X))
