"""`SamplingConfig` refuses values of the wrong type."""
from __future__ import annotations

import numpy as np
import pytest

from specloop.realmodels.sampling import SamplingConfig


@pytest.mark.parametrize("kwargs", [dict(top_k=2.5), dict(top_k=True), dict(top_k="3"), dict(top_k=-1),
                                    dict(temperature=True), dict(temperature="1.0"), dict(temperature=float("inf")),
                                    dict(top_p=True), dict(top_p=0.0), dict(top_p=1.5)])
def test_bad_values_refused(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        SamplingConfig(**{"temperature": 1.0, **kwargs})


def test_integer_like_values_accepted():
    assert SamplingConfig(1.0, top_k=np.int64(3)).top_k == 3
    assert SamplingConfig(1, top_k=0, top_p=1).greedy is False
    assert SamplingConfig().greedy
