"""The benchmark's timer, kept importable here (``sparsec.bench.timing.Timer``); it lives in
:mod:`sparsec.measure`, which the tuner shares."""
from ..measure import (DEFAULT_L2_BYTES, Timer, Timing, device_l2_bytes, free_device_bytes,  # noqa: F401
                       rotation_count)
