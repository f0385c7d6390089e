"""The CUDA compile mode sparsec leaves for TVM: NVRTC only where cuda-bindings exists."""
import importlib.util
import os

from sparsec.targets import choose_cuda_compiler


def test_a_mode_set_by_the_user_is_kept(monkeypatch):
    monkeypatch.setenv("TVM_CUDA_COMPILE_MODE", "nvrtc")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert choose_cuda_compiler() == "nvrtc"


def test_without_cuda_bindings_nvcc_is_chosen(monkeypatch):
    monkeypatch.delenv("TVM_CUDA_COMPILE_MODE", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert choose_cuda_compiler() == "nvcc"


def test_with_cuda_bindings_tvm_keeps_its_default(monkeypatch):
    monkeypatch.delenv("TVM_CUDA_COMPILE_MODE", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    assert choose_cuda_compiler() == "nvrtc"
    assert "TVM_CUDA_COMPILE_MODE" not in os.environ
