"""Autotuning (issue 5): the search space (space), cost-model features and the XGBoost model
(features, model), the model-guided search (search), isolated building and measuring
(runner), JSON-lines records (records, signature), tuning runs (tuner), the ``sparsec
tune`` command (cli) and the use of what was found (apply)."""
