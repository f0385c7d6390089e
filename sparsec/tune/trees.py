"""A saved XGBoost model (its JSON: ``Booster.save_raw("json")``) evaluated with numpy, so
that a pick from the shipped cost model does not import xgboost (and scikit-learn and
scipy.special with it: a tenth of a second or more on a 2-core machine). Only what the
tuner's models use is read: ``gbtree`` boosters of numeric splits with one target; anything
else is a ValueError and the caller loads xgboost instead."""
from __future__ import annotations

import base64
import json
from typing import Any, Dict, List, Optional

import numpy as np

# the arrays a saved ensemble keeps (``to_doc``), with their dtypes
_ARRAYS = {"left": np.int32, "right": np.int32, "feature": np.int32, "threshold": np.float32,
           "default_left": np.bool_, "value": np.float32}


class TreeEnsemble:
    """The trees of one booster as padded arrays (tree x node), evaluated for every row and
    tree at once, one tree level a step: XGBoost's rule, ``x < threshold`` goes left and a
    missing value (NaN) goes where ``default_left`` says, in float32 as XGBoost compares."""

    def __init__(self, left, right, feature, threshold, default_left, value, base_score: float, depth: int,
                 feature_names: Optional[List[str]]):
        self.left, self.right, self.feature = left, right, feature
        self.threshold, self.default_left, self.value = threshold, default_left, value
        self.base_score, self.depth, self.feature_names = base_score, depth, feature_names

    @classmethod
    def from_json(cls, text: str) -> "TreeEnsemble":
        learner = json.loads(text)["learner"]
        booster = learner["gradient_booster"]
        if booster.get("name") != "gbtree":
            raise ValueError(f"only gbtree boosters are read, got {booster.get('name')!r}")
        params = learner["learner_model_param"]
        if int(params.get("num_target", "1")) != 1 or int(params.get("num_class", "0")) > 1:
            raise ValueError("only single-target regression boosters are read")
        if learner["objective"]["name"] != "reg:squarederror":
            raise ValueError(f"only reg:squarederror boosters are read, got {learner['objective']['name']!r}")
        trees = booster["model"]["trees"]
        if any(t.get("categories_nodes") for t in trees) or any(any(t["split_type"]) for t in trees):
            raise ValueError("categorical splits are not read")
        n = max(len(t["left_children"]) for t in trees)

        def padded(key, dtype, fill):
            out = np.full((len(trees), n), fill, dtype=dtype)
            for i, t in enumerate(trees):
                out[i, :len(t[key])] = t[key]
            return out

        left = padded("left_children", np.int32, -1)
        leaf = left < 0
        right = np.where(leaf, np.arange(n)[None, :], padded("right_children", np.int32, -1))
        left = np.where(leaf, np.arange(n)[None, :], left)  # a leaf stays where it is
        cond = padded("split_conditions", np.float32, 0.0)  # a leaf's value is kept here
        base = str(params["base_score"]).strip("[]")
        return cls(left, right, padded("split_indices", np.int32, 0), cond, padded("default_left", bool, True),
                   np.where(leaf, cond, 0.0).astype(np.float32), float(base), _depth(trees),
                   learner.get("feature_names") or None)

    def to_doc(self) -> Dict[str, Any]:
        """The ensemble as JSON data: its arrays as base64 of their little-endian bytes, so
        that a model file is read back without parsing the booster's JSON again (about 30 ms
        of a pick's first call on a 2-core machine)."""
        return {"shape": list(self.left.shape), "base_score": self.base_score, "depth": self.depth,
                "feature_names": self.feature_names,
                "arrays": {name: base64.b64encode(np.ascontiguousarray(getattr(self, name), dtype=np.dtype(dt)
                                                                       .newbyteorder("<")).tobytes()).decode("ascii")
                           for name, dt in _ARRAYS.items()}}

    @classmethod
    def from_doc(cls, doc: Dict[str, Any]) -> "TreeEnsemble":
        """The ensemble :meth:`to_doc` wrote; ValueError if it is not one."""
        try:
            shape = tuple(int(n) for n in doc["shape"])
            arrays = {name: np.frombuffer(base64.b64decode(doc["arrays"][name]), dtype=np.dtype(dt).newbyteorder("<"))
                      .astype(dt).reshape(shape) for name, dt in _ARRAYS.items()}
            return cls(**arrays, base_score=float(doc["base_score"]), depth=int(doc["depth"]),
                       feature_names=doc.get("feature_names"))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a saved tree ensemble ({type(e).__name__}: {e})") from None

    def predict(self, X: np.ndarray) -> np.ndarray:
        """The booster's prediction for each row of ``X`` (float32 features, NaN missing)."""
        X = np.ascontiguousarray(X, dtype=np.float32)
        n_trees, n_nodes = self.left.shape
        needed = int(self.feature[self.left != np.arange(n_nodes)[None, :]].max(initial=-1)) + 1
        if X.ndim != 2 or X.shape[1] < needed:
            raise ValueError(f"X should be 2-D with at least {needed} feature columns (the trees split on them), "
                             f"got shape {X.shape}")
        flat = X.ravel()
        row_base = (np.arange(len(X), dtype=np.int64) * X.shape[1])[:, None]
        # node ids made global (tree * n_nodes + node), so every step is one flat take
        offset = (np.arange(n_trees, dtype=np.int32) * n_nodes)[None, :]
        left, right = (self.left + offset[0][:, None]).ravel(), (self.right + offset[0][:, None]).ravel()
        feature, threshold = self.feature.ravel(), self.threshold.ravel()
        default_left = self.default_left.ravel()
        node = np.broadcast_to(offset, (len(X), n_trees)).copy()
        for _ in range(self.depth):
            x = flat.take(row_base + feature.take(node))
            go_left = np.where(np.isnan(x), default_left.take(node), x < threshold.take(node))
            node = np.where(go_left, left.take(node), right.take(node))
        leaves = self.value.ravel().take(node)
        # as XGBoost adds them: from the base score, tree after tree, in float32
        total = np.full(len(X), self.base_score, dtype=np.float32)
        for t in range(n_trees):
            total += leaves[:, t]
        return total.astype(np.float64)


def _depth(trees: List[Dict[str, Any]]) -> int:
    """The deepest leaf over all trees (steps from the root)."""
    deepest = 0
    for t in trees:
        level = {0: 0}
        for node, (a, b) in enumerate(zip(t["left_children"], t["right_children"])):
            if a >= 0:
                level[a] = level[b] = level[node] + 1
        deepest = max(deepest, max(level.values()))
    return deepest
