"""Tuning records: one measurement per JSON line under ``tuning_logs/``.

The tuner measures candidates (format + format knobs, schedule knobs) on one matrix and
target, possibly for hours, in processes that may crash or be killed. The log therefore is
append-only JSON lines, each line written by a single ``os.write`` on an ``O_APPEND``
descriptor and fsync'd: concurrent writers never interleave within a line, and a killed run
leaves at worst one truncated last line, which ``load`` skips with a warning (the next
``append`` starts on a fresh line). A new run reads the log, skips the candidates in
``done_keys`` (``--resume``), and ``sparsec.compile`` looks up ``best`` for its
(op, matrix signature, target).
"""
from __future__ import annotations

import dataclasses
import fcntl
import json
import math
import os
import platform
import re
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, Hashable, Iterable, List, Mapping, Optional, Set, Tuple, Union

import numpy as np

STATUSES = ("ok", "compile_error", "runtime_error", "crash", "timeout", "wrong")
REQUIRED = ("op", "format", "signature", "target", "status")
DEFAULT_DTYPE = "float32"  # sparsec.compile's precision when none is given
LOG_DIR = "tuning_logs"


class TuningLogWarning(UserWarning):
    """A line of a tuning log was skipped (truncated by a killed writer, or corrupt)."""


def current_versions() -> Dict[str, str]:
    """The software a measurement was taken with, so stale records can be told apart."""
    import scipy

    from .._version import __version__

    versions = {"sparsec": __version__,
                "python": platform.python_version(),
                "numpy": np.__version__, "scipy": scipy.__version__}
    try:
        import tvm
        versions["tvm"] = str(tvm.__version__)
    except ImportError:  # records can still be read and written without TVM
        versions["tvm"] = "unavailable"
    return versions


def _plain(value: Any, where: str) -> Any:
    """``value`` as plain JSON data: numpy scalars and arrays unwrapped, tuples as lists,
    non-finite floats as None (JSON has no NaN; a NaN time means "no time"). Dict keys must
    be strings so that a record reads back exactly as it was written."""
    if isinstance(value, (np.generic, np.ndarray)):
        value = value.tolist()
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(f"{where}: keys must be strings, got {k!r}")
            out[k] = _plain(v, f"{where}.{k}")
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise ValueError(f"{where}: {type(value).__name__} value {value!r} is not JSON data")


def _optional_str(name: str, value: Any) -> Optional[str]:
    if value is not None and not isinstance(value, str):
        raise ValueError(f"record field '{name}' should be a string or None, got {value!r}")
    return value


@dataclass(kw_only=True)
class Record:
    """One measurement of one candidate. ``op``, ``format``, ``signature``, ``target`` and
    ``status`` are required; ``time_ms`` is required when status is "ok" (the kernel's time
    in milliseconds); ``error`` says what went wrong otherwise. ``extra`` keeps keys this
    version does not know (written by a newer sparsec) so that they survive a rewrite."""

    op: str = None
    format: str = None
    format_knobs: Dict[str, Any] = field(default_factory=dict)
    schedule_knobs: Dict[str, Any] = field(default_factory=dict)
    feat: Optional[int] = None
    dtype: str = DEFAULT_DTYPE
    matrix: Optional[str] = None
    signature: str = None
    stats: Dict[str, Any] = field(default_factory=dict)
    target: str = None
    device: Optional[str] = None
    time_ms: Optional[float] = None
    status: str = None
    error: Optional[str] = None
    versions: Dict[str, Any] = field(default_factory=current_versions)
    timestamp: float = field(default_factory=time.time)
    trial: int = 0
    extra: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        for name in REQUIRED:
            value = getattr(self, name)
            if value is None:
                raise ValueError(f"record is missing the required field '{name}'")
            if not isinstance(value, str) or not value:
                raise ValueError(f"record field '{name}' should be a non-empty string, got {value!r}")
        if self.status not in STATUSES:
            raise ValueError(f"record field 'status' should be one of {', '.join(STATUSES)}; "
                             f"got {self.status!r}")
        self.dtype = _optional_str("dtype", self.dtype) or DEFAULT_DTYPE
        for name in ("matrix", "device", "error"):
            _optional_str(name, getattr(self, name))
        for name in ("format_knobs", "schedule_knobs", "stats", "versions", "extra"):
            value = getattr(self, name)
            if value is None:
                value = {}
            if not isinstance(value, Mapping):
                raise ValueError(f"record field '{name}' should be a dict, got {value!r}")
            setattr(self, name, _plain(value, name))
        clash = set(self.extra) & {f.name for f in dataclasses.fields(self)}
        if clash:
            raise ValueError(f"record field 'extra' repeats the fields {sorted(clash)}")
        self.feat = self._int("feat", self.feat, optional=True, minimum=1)
        self.trial = self._int("trial", self.trial, optional=False, minimum=0)
        self.time_ms = self._float("time_ms", self.time_ms)
        if self.time_ms is not None and self.time_ms < 0:
            raise ValueError(f"record field 'time_ms' should not be negative, got {self.time_ms}")
        if self.status == "ok" and self.time_ms is None:
            raise ValueError("record field 'time_ms' is required (a finite number) when status is 'ok'")
        self.timestamp = self._float("timestamp", self.timestamp)
        if self.timestamp is None:
            raise ValueError("record field 'timestamp' should be a finite number")

    @staticmethod
    def _int(name: str, value: Any, optional: bool, minimum: int) -> Optional[int]:
        value = _plain(value, name)
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"record field '{name}' should be an integer >= {minimum}, got {value!r}")
        return value

    @staticmethod
    def _float(name: str, value: Any) -> Optional[float]:
        """A finite float, or None for None and non-finite values (how JSON stores them)."""
        value = _plain(value, name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"record field '{name}' should be a number, got {value!r}")
        return float(value)

    def to_dict(self) -> Dict[str, Any]:
        """Plain JSON data; ``extra`` keys go back to the top level where they came from."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        d.update(self.extra)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Record":
        """A record from a log line's object. Unknown keys go to ``extra``; a line without
        ``versions`` or ``timestamp`` reads as unknown versions at time 0, not as now."""
        if not isinstance(d, Mapping):
            raise ValueError(f"a record should be a JSON object, got {type(d).__name__}")
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in d.items() if k in names}
        extra = {k: v for k, v in d.items() if k not in names}
        known.setdefault("versions", {})
        known.setdefault("timestamp", 0.0)
        return cls(**known, extra=extra)

    @classmethod
    def trusted(cls, d: Mapping[str, Any]) -> "Record":
        """A record from fields this package checked when it wrote them (a saved model's
        top records), built without :meth:`from_dict`'s checks: a first pick reads a few
        hundred, and their checks were most of its 40 ms of reading. Fields not given take
        empty values (``versions`` and ``extra`` empty, ``timestamp`` 0: no clock or version
        probe); a required field missing or empty, an unknown status, or an ok record without
        a time, is a ValueError."""
        if not isinstance(d, Mapping):
            raise ValueError(f"a record should be a JSON object, got {type(d).__name__}")
        missing = [k for k in REQUIRED if not isinstance(d.get(k), str) or not d[k]]
        if missing:
            raise ValueError(f"record is missing the required field '{missing[0]}' (a non-empty string)")
        if d["status"] not in STATUSES:
            raise ValueError(f"record field 'status' should be one of {', '.join(STATUSES)}; got {d['status']!r}")
        time_ms = d.get("time_ms")
        if d["status"] == "ok" and (isinstance(time_ms, bool) or not isinstance(time_ms, (int, float))
                                    or not math.isfinite(time_ms)):
            raise ValueError("record field 'time_ms' is required (a finite number) when status is 'ok'")
        rec = object.__new__(cls)
        rec.__dict__.update(_TRUSTED_DEFAULTS)
        rec.__dict__.update({k: v for k, v in d.items() if k in _TRUSTED_DEFAULTS})
        for name in ("format_knobs", "schedule_knobs", "stats", "versions", "extra"):
            rec.__dict__[name] = dict(rec.__dict__[name])  # each record its own dicts
        return rec


# every field's value when a trusted record does not give it (default factories not called)
_TRUSTED_DEFAULTS = {f.name: ({} if f.default_factory is dict or f.name == "versions" else
                              0.0 if f.name == "timestamp" else f.default) for f in dataclasses.fields(Record)}

RecordLike = Union[Record, Mapping[str, Any]]


def _as_record(r: RecordLike) -> Record:
    return r if isinstance(r, Record) else Record.from_dict(r)


def to_plain(record: RecordLike) -> Dict[str, Any]:
    """The record as plain JSON data (what a log line holds)."""
    return _plain(_as_record(record).to_dict(), "record")


def to_json_line(record: RecordLike) -> str:
    """The record as one JSON line (keys sorted, no NaN, no raw newline), ending in "\\n"."""
    data = to_plain(record)
    return json.dumps(data, sort_keys=True, allow_nan=False, separators=(",", ":")) + "\n"


def append(path: Union[str, os.PathLike], record: RecordLike, fsync: bool = True) -> None:
    """Append ``record`` to the log at ``path`` (parent directories created).

    The whole line goes out in one ``os.write`` on an ``O_APPEND`` descriptor, which the
    kernel performs at the file's end under the inode lock, so lines from concurrent
    processes never interleave (an exclusive ``flock`` also orders the writers). If the
    file does not end in a newline (a writer was killed mid-line before, or a disk filled),
    the line starts with one, so the damage stays on the broken line. ``fsync`` makes the
    line survive a machine crash as well."""
    data = to_json_line(record).encode("utf-8")
    parent = os.path.dirname(os.fspath(path))
    if parent:
        os.makedirs(parent, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        # Writers take turns, so none sees another's line half-copied into the page cache
        # (file size grows page by page during a write) and adds a needless newline.
        # The lock dies with its process, so a killed writer never blocks the next.
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data
        view = memoryview(data)
        while view:  # a regular file takes the whole line unless the disk is full
            written = os.write(fd, view)
            view = view[written:]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def load(path: Union[str, os.PathLike]) -> List[Record]:
    """Every complete record in the log at ``path``, in file order; [] if there is no log.

    A line that is not a valid record -- normally the truncated last line of a killed
    writer, rarely a corrupt line elsewhere -- is skipped with a ``TuningLogWarning`` naming
    the file and line, so one damaged measurement never costs the rest of the log."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    lines = data.split(b"\n")
    records = []
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            records.append(Record.from_dict(json.loads(raw.decode("utf-8"))))
        except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            unterminated = number == len(lines)
            what = "truncated last line" if unterminated else "corrupt line"
            warnings.warn(f"{os.fspath(path)}:{number}: skipping {what} ({e})",
                          TuningLogWarning, stacklevel=2)
    return records


def best(records: Iterable[RecordLike], op: str, signature: str, target: str,
         feat: Optional[int] = None, dtype: Optional[str] = None) -> Optional[Record]:
    """The fastest successful record for (op, signature, target), and for ``feat`` and
    ``dtype`` when given (None: any); None if nothing matches. Ties go to the earlier
    measurement, so the answer does not depend on the order of the log."""
    matches = [r for r in map(_as_record, records)
               if r.status == "ok" and r.time_ms is not None and r.op == op
               and r.signature == signature and r.target == target
               and (feat is None or r.feat == feat) and (dtype is None or r.dtype == dtype)]
    if not matches:
        return None
    return min(matches, key=lambda r: (r.time_ms, r.timestamp, r.trial))


def _freeze(value: Any, where: str) -> Hashable:
    """A hashable, order-independent form of a knob value that equals the form of the same
    value after a JSON round trip (dicts as sorted pairs, lists and tuples as tuples)."""
    value = _plain(value, where)
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v, f"{where}.{k}")) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_freeze(v, f"{where}[{i}]") for i, v in enumerate(value))
    return value


CandidateKey = Tuple[str, str, tuple, tuple, Optional[int], str, str, str]


def candidate_key(candidate: RecordLike) -> CandidateKey:
    """(op, format, format knobs, schedule knobs, feat, dtype, signature, target) of a record
    or of a candidate dict with those keys: what identifies one measurement for
    ``--resume``. Knob dicts become sorted tuples, so their order does not matter."""
    if isinstance(candidate, Record):
        get = lambda name: getattr(candidate, name)  # noqa: E731
    elif isinstance(candidate, Mapping):
        get = candidate.get
    else:
        raise ValueError(f"a candidate should be a Record or a dict, got {type(candidate).__name__}")
    for name in ("op", "format", "signature", "target"):
        if not isinstance(get(name), str) or not get(name):
            raise ValueError(f"candidate is missing the required field '{name}'")
    feat = _plain(get("feat"), "feat")
    return (get("op"), get("format"),
            _freeze(get("format_knobs") or {}, "format_knobs"),
            _freeze(get("schedule_knobs") or {}, "schedule_knobs"),
            feat, get("dtype") or DEFAULT_DTYPE, get("signature"), get("target"))


def done_keys(records: Iterable[RecordLike], statuses: Optional[Iterable[str]] = None
              ) -> Set[CandidateKey]:
    """Keys of the candidates already measured, whatever the outcome (a candidate that failed
    to compile fails again), or only those with a status in ``statuses`` -- e.g. leave out
    "timeout" to retry candidates that may have lost to a busy machine."""
    wanted = None if statuses is None else set(statuses)
    return {candidate_key(r) for r in map(_as_record, records)
            if wanted is None or r.status in wanted}


def default_log_path(op: str, target: str, root: Union[str, os.PathLike, None] = None) -> str:
    """``tuning_logs/<op>_<target>.jsonl`` under ``root`` (default: the current directory),
    the target's ':' (and any other character unsafe in a file name) replaced by '_':
    ``default_log_path("spmm", "cuda:sm_90a") == "tuning_logs/spmm_cuda_sm_90a.jsonl"``."""
    safe = re.sub(r"[^A-Za-z0-9._=+-]", "_", f"{op}_{target}")
    return os.path.join(os.fspath(root) if root is not None else "", LOG_DIR, f"{safe}.jsonl")
