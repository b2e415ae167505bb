"""The facts a precision carries, stated once (runner/config_choices.py) for every estimator and rank."""

from __future__ import annotations

import pytest
import torch

from runner.config import Precision
from runner.hardware.peak_flops import torch_dtype

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("precision", "element_bytes", "dtype"),
    [
        (Precision.fp32, 4, torch.float32),
        (Precision.bf16, 2, torch.bfloat16),
        (Precision.fp16, 2, torch.float16),
    ],
)
def test_a_precision_says_its_element_bytes_and_torch_dtype(precision, element_bytes, dtype):
    assert (precision.bytes, precision.torch_dtype) == (element_bytes, dtype)
    assert torch.tensor([], dtype=dtype).element_size() == element_bytes
    assert torch_dtype(precision.value) is dtype and torch_dtype(dtype) is dtype
    with pytest.raises(ValueError, match="one of fp32, bf16, fp16"):
        torch_dtype("fp8")
