"""`specloop.strategies._arrays.all_finite` (the learners' one-reduction finiteness
check) against the elementwise test, NumPy and torch, including finite entries whose
sum overflows."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from specloop.strategies._arrays import all_finite, check_params


@pytest.mark.parametrize("lib", ["numpy", "torch"])
@pytest.mark.parametrize("values", [[1.0, 2.0], [np.nan, 1.0], [np.inf, 1.0], [-np.inf, 1.0], [np.inf, -np.inf],
                                    [3e38, 3e38], [-3e38, -3e38, np.nan], [0.0]])
def test_all_finite_equals_the_elementwise_test(lib, values):
    array = np.asarray(values, dtype=np.float32)
    exact = bool(np.isfinite(array).all())
    assert all_finite(array if lib == "numpy" else torch.from_numpy(array)) is exact


def test_check_params_refuses_a_non_finite_tensor():
    check_params([torch.full((4,), 3e38), torch.zeros(2)])           # sum overflows, entries finite: accepted
    with pytest.raises(ValueError, match=r"params\[1\] contains NaN"):
        check_params([torch.zeros(3), torch.tensor([1.0, float("nan")])])
