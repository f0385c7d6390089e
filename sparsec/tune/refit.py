"""Refit the cost models shipped beside the tuning logs: ``python -m sparsec.tune.refit
[LOG ...]`` (default: every ``tuning_logs/*.jsonl`` of the source checkout).

Each log's model is saved as ``<log stem>.model.json`` with the log's SHA-256 and the top
records of each logged case (``apply.fit_log_model``), so ``tuned_config`` answers from the
model file alone while the log is unchanged, and refits by itself once the log changes.
Run it after committing new measurements (``sparsec tune`` also saves the model of the log
it wrote)."""
from __future__ import annotations

import argparse
import glob
import os
import sys
from pathlib import Path

from .apply import model_path
from .records import LOG_DIR
from .tuner import save_log_model


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sparsec.tune.refit", description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", nargs="*", help="tuning logs (default: the checkout's tuning_logs/*.jsonl)")
    args = ap.parse_args(argv)
    logs = args.logs or sorted(glob.glob(str(Path(__file__).resolve().parents[2] / LOG_DIR / "*.jsonl")))
    missing = [log for log in logs if not os.path.isfile(log)]
    if missing:
        ap.error(f"no such log: {', '.join(missing)}")
    status = 0
    for log in logs:
        path = save_log_model(log)
        if path is None:
            print(f"{log}: too few measurements with features for a model", file=sys.stderr)
            status = 1
        else:
            print(f"{log} -> {model_path(log)}")
    return status


if __name__ == "__main__":
    sys.exit(main())
