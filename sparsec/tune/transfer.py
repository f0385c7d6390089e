"""Zero-shot picks: on a matrix with no measurements, the model ranks the configurations
that won on the logged matrices, not the whole space.

Why not the whole space: it holds thousands of candidates the model never saw measured on
anything like this matrix, and the arg-max over thousands of noisy predictions lands on
the model's largest over-estimate (the optimiser's curse) -- on the H200 graphs log, with
the model trained on half of the real graphs, whole-space picks reached as little as 21 %
of an unseen case's tuned best where the pool's picks reached 62 % at worst and 96 % on
average (``benchmarks/tune_eval.py zero-shot``). A winning
configuration (format family and schedule knobs) is one the model has measured doing well
somewhere; ranking those on the new matrix asks the model only to transfer, which it does
well (held-out Spearman 0.97). The format knobs that depend on the matrix (hyb's column
ranges and buckets) stay free: every space candidate with a winning family and schedule is
in the pool, so the model still chooses the buckets for this matrix.
"""
from __future__ import annotations

import json
from typing import Any, Dict, Iterable, List, Mapping, Optional, Set

import numpy as np

TOP_PER_CASE = 3  # configurations kept from each logged (matrix, feat, dtype) case


def config_key(cand: Mapping[str, Any]) -> str:
    """What transfers between matrices: the format family, hyb's column ranges and the
    schedule knobs (hyb's buckets follow the matrix's row lengths: they stay free)."""
    parts = cand.get("format_knobs", {}).get("col_parts") if cand["format"] == "hyb" else None
    return json.dumps([cand["op"], cand["format"], parts, cand["schedule_knobs"]], sort_keys=True)


def winning_keys(records: Iterable[Any], op: str, top: int = TOP_PER_CASE,
                 exclude_signature: Optional[str] = None) -> Set[str]:
    """``config_key`` of the ``top`` fastest ok records of every logged case of ``op``
    (a case: matrix signature, target, feature width, dtype)."""
    cases: Dict[tuple, List[Any]] = {}
    for r in records:
        if r.op == op and r.status == "ok" and r.time_ms and r.signature != exclude_signature:
            cases.setdefault((r.signature, r.target, r.feat, r.dtype), []).append(r)
    keys = set()
    for rs in cases.values():
        for r in sorted(rs, key=lambda r: r.time_ms)[:top]:
            keys.add(config_key({"op": r.op, "format": r.format, "format_knobs": r.format_knobs,
                                 "schedule_knobs": r.schedule_knobs}))
    return keys


def transfer_pool(space, keys: Set[str]) -> List[Dict[str, Any]]:
    """The space's candidates whose configuration won somewhere, and the default; the whole
    space when no logged configuration fits this space."""
    from .space import candidate_id

    pool = [c for c in space.candidates if config_key(c) in keys]
    if not pool:
        return list(space.candidates)
    if candidate_id(space.default) not in {candidate_id(c) for c in pool}:
        pool.append(space.default)
    return pool


def zero_shot_pick(model, space, ctx, records: Iterable[Any], keys: Optional[Set[str]] = None) -> Dict[str, Any]:
    """The model's top prediction over ``transfer_pool`` built from ``records`` (``keys``:
    their ``winning_keys`` for this matrix, where the caller has them already)."""
    if keys is None:
        keys = winning_keys(records, space.op, exclude_signature=ctx.signature)
    pool = transfer_pool(space, keys)
    scores = model.predict(pool, ctx)
    return pool[int(np.argmax(scores))]
