"""Values as standard JSON takes them, for every JSON sparsec writes (CLI output, benchmark
results, exported modules' metadata): a leaf, so that the runtime side, the apps and the CLI
share one rule. Non-finite floats become null: JSON has no inf or nan, and the strings
"inf" / "nan" would pass for text where a reader expects a number."""
from __future__ import annotations

import json
import math


def jsonable(x):
    """x with tuples as lists, numpy scalars as Python ones and non-finite floats as None."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):  # numpy scalars
        return jsonable(x.item())
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def dumps(value, **kw) -> str:
    """Standard JSON (no NaN / Infinity tokens); other objects as their str."""
    return json.dumps(jsonable(value), allow_nan=False, default=str, **kw)
