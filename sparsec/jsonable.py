"""Values as ``json.dump`` takes them, for every JSON sparsec writes (benchmark results,
exported modules' metadata): a leaf, so that the runtime side and the apps share it."""
from __future__ import annotations

import math


def jsonable(x):
    """x with tuples as lists, numpy scalars as Python ones and non-finite floats as text: what json.dump takes."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):  # numpy scalars
        return jsonable(x.item())
    return x
