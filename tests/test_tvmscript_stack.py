"""sparsec.tvmscript_stack: the cheaper inspect.stack TVMScript sees while TVM's intrinsics
are imported gives what TVMScript reads (source context of the third frame, every frame
object), parses a closure as before, and is undone after, also on error."""
import inspect

import pytest

from sparsec.tvmscript_stack import FULL_FRAMES, shallow_stack


def _frames():
    return inspect.stack()


def test_the_first_frames_keep_their_context_and_every_frame_its_object():
    full = _frames()
    with shallow_stack():
        cheap = _frames()
    assert len(cheap) == len(full)
    assert [f.frame for f in cheap[1:]] == [f.frame for f in full[1:]]  # [0]: each call's own frame
    assert [(f.filename, f.function) for f in cheap] == [(f.filename, f.function) for f in full]
    assert cheap[0].code_context == full[0].code_context and cheap[2].code_context == full[2].code_context
    assert "cheap = _frames()" in cheap[1].code_context[0]
    assert all(f.code_context is None for f in cheap[FULL_FRAMES:])
    assert inspect.stack is not None and inspect.stack.__module__ == "inspect"


def test_tvmscript_parses_a_closure_under_it_and_the_real_stack_comes_back_on_error():
    from tvm.script import tirx as T

    width = 8

    with shallow_stack():
        @T.prim_func(s_tir=True)
        def fill(a: T.Buffer((width,), "float32")):
            for i in range(width):
                a[i] = T.float32(1)
    assert "fill" in fill.script() and "8" in fill.script()
    with pytest.raises(RuntimeError):
        with shallow_stack():
            raise RuntimeError("boom")
    assert inspect.stack.__module__ == "inspect"
