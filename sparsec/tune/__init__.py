"""Autotuning (issue 5): tuning records, candidate measurement in isolated processes, and
(later) the XGBoost cost model and the model-guided search over formats x schedule knobs."""
