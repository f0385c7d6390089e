"""sparsec.reference.max_rel_err, the one relative error (``--check``, the benchmark, the
tuner, the examples): the same answer for numpy arrays and torch tensors, NaN and infinity
rules included, computed on the tensors' device when given torch."""
from __future__ import annotations

import math

import numpy as np
import pytest

from sparsec.reference import max_rel_err

torch = pytest.importorskip("torch")

CASES = [
    # (out, ref, expected): max |out - ref| / max |ref| over the elements that do not match
    ([[1.0, -2.0], [4.0, 0.5]], [[1.0, -2.0], [4.0, 0.0]], 0.5 / 4.0),
    ([1.0, 2.0], [1.0, 2.0], 0.0),
    ([0.5, 0.0], [0.0, 0.0], 0.5),  # a zero reference: the absolute error
    ([math.nan, 1.0], [math.nan, 2.0], 0.5),  # NaN where the reference has NaN matches
    ([math.inf, 1.0], [math.inf, 2.0], 0.5),  # the same infinity matches
    ([math.nan, 1.0], [0.0, 1.0], math.inf),  # an unwritten (poisoned) element
    ([1.0, 1.0], [math.nan, 1.0], math.inf),  # a NaN in the reference alone
    ([math.inf, 1.0], [1.0, 1.0], math.inf),
    ([-math.inf, 1.0], [math.inf, 1.0], math.inf),
    ([1.0, 1.0], [math.inf, 1.0], math.inf),
    ([], [], 0.0),
]


@pytest.mark.parametrize("out, ref, expected", CASES)
def test_numpy_and_torch_give_the_same_error(out, ref, expected):
    got = [max_rel_err(np.array(out, np.float32), np.array(ref)),
           max_rel_err(torch.tensor(out, dtype=torch.float32), torch.tensor(ref, dtype=torch.float64)),
           max_rel_err(torch.tensor(out), np.array(ref)),  # mixed: compared in torch
           max_rel_err(np.array(out), torch.tensor(ref))]
    assert got == [pytest.approx(expected)] * 4


def test_the_frobenius_norm_forgives_one_element():
    out, ref = np.array([1.0, 2.0, 2.0 + 0.3]), np.array([1.0, 2.0, 2.0])
    assert max_rel_err(out, ref) == pytest.approx(0.3 / 2.0)
    assert max_rel_err(out, ref, norm="fro") == pytest.approx(0.3 / 3.0)
    assert max_rel_err(torch.tensor(out), torch.tensor(ref), norm="fro") == pytest.approx(0.3 / 3.0)
    assert max_rel_err([math.nan, 1.0], [0.0, 1.0], norm="fro") == math.inf


def test_half_precision_and_integer_outputs_compare_in_float64():
    ref = np.array([1.0, 3.0])
    assert max_rel_err(torch.tensor([1.0, 3.0], dtype=torch.float16), ref) == 0.0
    assert max_rel_err(np.array([1, 4], np.int32), ref) == pytest.approx(1 / 3)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match=r"output shape \(2,\) should match the reference \(3,\)"):
        max_rel_err(np.zeros(2), np.zeros(3))
    with pytest.raises(ValueError, match=r"output shape \(2,\) should match the reference \(3,\)"):
        max_rel_err(torch.zeros(2), torch.zeros(3))
    with pytest.raises(ValueError, match="norm should be 'max' or 'fro'"):
        max_rel_err(np.zeros(2), np.zeros(2), norm="l2")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_tensors_are_compared_on_the_gpu():
    out = torch.tensor([1.0, 2.5], device="cuda")
    assert max_rel_err(out, np.array([1.0, 2.0])) == pytest.approx(0.25)
