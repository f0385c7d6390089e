"""The tuner's cost model: gradient-boosted trees (XGBoost) that predict a candidate's
throughput on a matrix from ``features.feature_matrix``, so the search measures the
candidates most likely to be fast instead of all of them.

The target is the log throughput ``log(2 * nnz * feat / time_ms)`` (higher is faster): a
log so that a 2x error counts the same on a tiny and on a huge matrix, and per entry-feature
so that matrices of different sizes share one scale. The data are small (thousands of
measurements), so ``fit`` retrains from scratch each time, deterministically (fixed seed
and threads): a search that replays the same measurements makes the same choices.

``xgboost`` is imported only when a model is fitted or predicted with after a fit, so
importing this module costs nothing extra; it comes with ``pip install 'sparsec[tune]'``. A
model loaded from a file (the shipped one) predicts through ``trees.TreeEnsemble``, numpy
over the saved trees, and never imports it.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import warnings
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from .features import FEATURE_NAMES, MatrixContext, feature_matrix, stored_row
from .trees import TreeEnsemble

MODEL_FORMAT = "sparsec-cost-model"
MODEL_VERSION = 1
MIN_SAMPLES = 4  # below this a fit is noise: predict zeros, and let the search explore
NUM_ROUNDS = 200
PARAMS: Dict[str, Any] = {
    "objective": "reg:squarederror",
    "tree_method": "hist",
    "max_depth": 6,
    "eta": 0.1,
    "min_child_weight": 1.0,
    "subsample": 0.8,
    "colsample_bytree": 0.8,
    "lambda": 1.0,
    "seed": 0,
    "nthread": 2,   # small data: more threads cost more than they save, and stay deterministic
    "verbosity": 0,
}
FEATURES_KEY = "features"  # where a tuning record keeps its candidate's feature row
MAX_PRIOR = 40000  # training rows taken from a log (newest first)

Sample = Tuple[Mapping[str, Any], MatrixContext, float]


def _xgboost():
    try:
        import xgboost
    except ImportError as e:
        raise ImportError("the tuner's cost model needs xgboost: pip install 'sparsec[tune]'") from e
    return xgboost


def log_throughput(cand: Mapping[str, Any], ctx: MatrixContext, time_ms: float) -> float:
    """The model's target for one measurement: log(2 * nnz * feat / time_ms), nnz at least 1."""
    return math.log(2.0 * max(ctx.nnz, 1) * int(cand["feat"]) / time_ms)


def _check_time(time_ms, i: int) -> float:
    if isinstance(time_ms, bool) or not isinstance(time_ms, (int, float, np.floating, np.integer)) \
            or not math.isfinite(time_ms) or time_ms <= 0:
        raise ValueError(f"sample {i}: time_ms should be a finite positive number, got {time_ms!r}")
    return float(time_ms)


class CostModel:
    """Predicts log throughput (higher = faster) of candidates on a matrix; untrained (fewer
    than ``MIN_SAMPLES`` measurements) it predicts zeros."""

    def __init__(self, params: Optional[Mapping[str, Any]] = None, num_rounds: int = NUM_ROUNDS):
        self.params: Dict[str, Any] = {**PARAMS, **(params or {})}
        self.num_rounds = int(num_rounds)
        self._booster = None
        self._trees: Optional[TreeEnsemble] = None  # a loaded model's trees (numpy), its JSON in _saved
        self._saved: Optional[str] = None
        self._n_samples = 0
        # what the model was fitted on, saved with it (sparsec.tune.apply: the log's digest and
        # the records a pick needs, so a fresh model answers without reading the log)
        self.meta: Dict[str, Any] = {}

    @property
    def trained(self) -> bool:
        return self._booster is not None or self._trees is not None

    @property
    def n_samples(self) -> int:
        """Measurements the current model was fitted on (0 before any fit)."""
        return self._n_samples

    def fit(self, samples: Sequence[Sample]) -> "CostModel":
        """Retrain from scratch on (candidate, context, time_ms) samples, time_ms > 0."""
        samples = list(samples)
        for i, s in enumerate(samples):
            if not isinstance(s, (tuple, list)) or len(s) != 3 or not isinstance(s[1], MatrixContext):
                raise ValueError(f"sample {i} should be a (candidate, MatrixContext, time_ms) tuple, got {s!r}")
        times = [_check_time(t, i) for i, (_, _, t) in enumerate(samples)]
        y = np.array([log_throughput(c, ctx, t) for (c, ctx, _), t in zip(samples, times)])
        return self.fit_arrays(_features_by_context(samples), y)

    def fit_arrays(self, X: np.ndarray, y: np.ndarray) -> "CostModel":
        """Retrain from scratch on feature rows ``X`` (columns in ``FEATURE_NAMES`` order, NaN
        for missing) and their log throughputs ``y`` -- for rows kept from earlier runs."""
        X = np.asarray(X, dtype=np.float32)
        y = np.asarray(y, dtype=np.float64).ravel()
        if X.ndim != 2 or X.shape[1] != len(FEATURE_NAMES):
            raise ValueError(f"X should have {len(FEATURE_NAMES)} columns (FEATURE_NAMES), got shape {X.shape}")
        if y.size != X.shape[0]:
            raise ValueError(f"y should have one value per row of X ({X.shape[0]}), got {y.size}")
        if not np.all(np.isfinite(y)):
            raise ValueError("y (log throughput) should be finite, got NaN or infinity")
        self._n_samples = int(y.size)
        self._trees = self._saved = None
        if y.size < MIN_SAMPLES:
            self._booster = None
            return self
        xgb = _xgboost()
        dtrain = xgb.DMatrix(X, label=y, feature_names=list(FEATURE_NAMES), missing=np.nan,
                             nthread=self.params["nthread"])
        self._booster = xgb.train(self.params, dtrain, num_boost_round=self.num_rounds)
        return self

    def predict(self, cands: Sequence[Mapping[str, Any]], ctx: MatrixContext) -> np.ndarray:
        """Predicted log throughput of each candidate on ``ctx``'s matrix (float64)."""
        return self.predict_arrays(feature_matrix(list(cands), ctx))  # rejects bad candidates, trained or not

    def predict_arrays(self, X: np.ndarray) -> np.ndarray:
        """Predicted log throughput of feature rows ``X`` (float64; zeros while untrained)."""
        X = np.asarray(X, dtype=np.float32)
        if X.ndim != 2 or X.shape[1] != len(FEATURE_NAMES):
            raise ValueError(f"X should have {len(FEATURE_NAMES)} columns (FEATURE_NAMES), got shape {X.shape}")
        if not self.trained or not len(X):
            return np.zeros(len(X), dtype=np.float64)
        if self._booster is None:
            return self._trees.predict(X)
        xgb = _xgboost()
        d = xgb.DMatrix(X, feature_names=list(FEATURE_NAMES), missing=np.nan, nthread=self.params["nthread"])
        return self._booster.predict(d).astype(np.float64)

    def save(self, path: Union[str, os.PathLike]) -> None:
        """One JSON file: the booster (XGBoost's JSON model, as a string) and its trees as
        arrays (what a load predicts with), the feature names it was trained on and a format
        version. Written to a temporary file and renamed,
        so a reader never sees half a model."""
        booster = self._saved if self._booster is None else self._booster.save_raw("json").decode("utf-8")
        trees = self._trees or _ensemble_or_none(booster)
        doc = {"format": MODEL_FORMAT, "version": MODEL_VERSION, "feature_names": list(FEATURE_NAMES),
               "params": self.params, "num_rounds": self.num_rounds, "n_samples": self._n_samples,
               "booster": booster, "meta": self.meta,
               # the booster's trees as arrays, read back without parsing its JSON (trees.TreeEnsemble)
               "trees": trees.to_doc() if trees is not None else None}
        path = os.fspath(path)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".model-", suffix=".json")
        try:
            os.chmod(tmp, 0o644)  # mkstemp's 0600 would keep a shipped model from other users
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(doc, f)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise

    @classmethod
    def load(cls, path: Union[str, os.PathLike]) -> "CostModel":
        """A model written by ``save``. Features are positional, so a model trained on other
        feature names (another sparsec version) is refused with ValueError: retrain it."""
        with open(path, encoding="utf-8") as f:
            try:
                doc = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{os.fspath(path)}: not a cost model file ({e})") from None
        if not isinstance(doc, dict) or doc.get("format") != MODEL_FORMAT:
            raise ValueError(f"{os.fspath(path)}: not a cost model file (format should be {MODEL_FORMAT!r})")
        if doc.get("version") != MODEL_VERSION:
            raise ValueError(f"{os.fspath(path)}: cost model version {doc.get('version')!r}, "
                             f"this sparsec reads version {MODEL_VERSION}")
        names = doc.get("feature_names")
        if names != list(FEATURE_NAMES):
            raise ValueError(f"{os.fspath(path)}: the model's feature names differ from this sparsec's "
                             f"FEATURE_NAMES ({_first_difference(names)}); retrain the model")
        model = cls(params=doc.get("params"), num_rounds=doc.get("num_rounds", NUM_ROUNDS))
        model._n_samples = int(doc.get("n_samples", 0))
        model.meta = doc.get("meta") if isinstance(doc.get("meta"), dict) else {}
        if doc.get("booster") is not None:
            saved = doc.get("trees")
            try:
                trees = TreeEnsemble.from_doc(saved) if saved else _ensemble_or_none(doc["booster"])
            except ValueError as e:
                raise ValueError(f"{os.fspath(path)}: the saved trees cannot be read ({e}); retrain the model") from None
            if trees is None:  # a booster numpy does not read (another objective, categorical splits)
                xgb = _xgboost()
                model._booster = xgb.Booster()
                model._booster.load_model(bytearray(doc["booster"].encode("utf-8")))
                names = model._booster.feature_names
            else:
                model._trees, model._saved = trees, doc["booster"]
                names = trees.feature_names
            if names is not None and list(names) != list(FEATURE_NAMES):
                raise ValueError(f"{os.fspath(path)}: the booster's feature names differ from FEATURE_NAMES "
                                 f"({_first_difference(names)}); retrain the model")
        return model


def _ensemble_or_none(booster_json: Optional[str]) -> Optional[TreeEnsemble]:
    """The booster's trees for numpy, or None where there is no booster or it is one that
    ``TreeEnsemble`` does not read (xgboost predicts with it then)."""
    if booster_json is None:
        return None
    try:
        return TreeEnsemble.from_json(booster_json)
    except (ValueError, KeyError, TypeError):
        return None


def _first_difference(names) -> str:
    if not isinstance(names, list):
        return f"got {type(names).__name__}"
    for i, (a, b) in enumerate(zip(names, FEATURE_NAMES)):
        if a != b:
            return f"column {i} is {a!r}, expected {b!r}"
    return f"{len(names)} names, expected {len(FEATURE_NAMES)}"


def _features_by_context(samples: Sequence[Sample]) -> np.ndarray:
    """The samples' feature rows in sample order, computed one matrix at a time."""
    X = np.empty((len(samples), len(FEATURE_NAMES)), dtype=np.float32)
    groups: Dict[int, List[int]] = {}
    for i, (_, ctx, _) in enumerate(samples):
        groups.setdefault(id(ctx), []).append(i)
    for idx in groups.values():
        ctx = samples[idx[0]][1]
        X[idx] = feature_matrix([samples[i][0] for i in idx], ctx)
    return X


def training_rows(records: Iterable[Any], exclude_signature: Optional[str] = None
                  ) -> Tuple[np.ndarray, np.ndarray]:
    """(X, y) from logged records (``records.Record``) that carry their feature row
    (``extra[FEATURES_KEY]``, written by the tuner): y is log throughput, as the model
    predicts it, so a model trains from a log without the matrices. Records of ``exclude_signature`` are left out; the newest
    :data:`MAX_PRIOR` rows are kept. Rows logged before the newest features were added are
    extended with the values their kernels ran with (``features.stored_row``)."""
    rows, ys = [], []
    for r in reversed(records):
        if r.status != "ok" or not r.time_ms or r.signature == exclude_signature:
            continue
        # knob and packed-format columns from the record, not by position
        x = stored_row(r.extra.get(FEATURES_KEY), r.schedule_knobs, r.format, r.format_knobs)
        if x is None:
            continue
        rows.append(x)
        ys.append(math.log(2.0 * max(int(r.stats.get("nnz", 0)), 1) * r.feat / r.time_ms))  # log_throughput
        if len(rows) >= MAX_PRIOR:
            break
    X = np.array(rows, np.float32).reshape(len(rows), len(FEATURE_NAMES))
    y = np.array(ys, np.float64)
    keep = np.isfinite(y)
    return X[keep], y[keep]


def spearman(pred, measured_time_ms) -> float:
    """Spearman rank correlation between predicted throughput and measured throughput
    (-log time: for one matrix and feat the same ranking), over the pairs where both are
    finite and the time positive; NaN with fewer than two such pairs or a constant side."""
    from scipy.stats import spearmanr

    p = np.asarray(pred, dtype=np.float64).ravel()
    t = np.asarray(measured_time_ms, dtype=np.float64).ravel()
    if p.shape != t.shape:
        raise ValueError(f"pred and measured_time_ms should have the same length, got {p.size} and {t.size}")
    ok = np.isfinite(p) & np.isfinite(t) & (t > 0)
    if np.count_nonzero(ok) < 2:
        return math.nan
    p, y = p[ok], -np.log(t[ok])
    if np.all(p == p[0]) or np.all(y == y[0]):
        return math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rho = spearmanr(p, y).statistic
    return float(rho)
