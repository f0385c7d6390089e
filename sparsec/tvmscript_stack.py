"""A cheaper ``inspect.stack()`` while TVMScript parses a module's functions at import.

TVM's ``@T.prim_func`` takes ``inspect.stack()`` on every decoration, and that reads the
source context of every frame on the stack; a frame with no file on disk (the import
machinery's own, ``<frozen importlib._bootstrap>``) makes ``inspect.getmodule`` walk all of
``sys.modules``. Importing ``tvm.s_tir.tensor_intrin.cuda`` decorates ~500 functions from
inside an import, so in a process that has torch loaded (2 000+ modules) it took 70 s on the
2-core CPU machine, against 9 s with this in place. TVMScript reads the source context of
the stack's third frame only (``is_defined_in_class``) and the frame objects of the rest
(``resolve_closure_vars``), which is what this stack gives.
"""
from __future__ import annotations

import contextlib
import inspect
import sys

FULL_FRAMES = 3  # the frames given with their source context


def _stack(context: int = 1):
    """``inspect.stack(context)`` with source context for the first FULL_FRAMES frames only."""
    frame, out = sys._getframe(1), []
    while frame is not None:
        if len(out) < FULL_FRAMES:
            info = inspect.getframeinfo(frame, context)
            out.append(inspect.FrameInfo(frame, *info, positions=info.positions))
        else:
            code = frame.f_code
            out.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name, None, None))
        frame = frame.f_back
    return out


@contextlib.contextmanager
def shallow_stack():
    """Within it, ``inspect.stack`` is :func:`_stack` (restored after, also on error)."""
    real = inspect.stack
    inspect.stack = _stack
    try:
        yield
    finally:
        inspect.stack = real
