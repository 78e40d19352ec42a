"""The block codecs on blocks whose peak is subnormal-small: a scale whose inverse overflows
float32 once turned a block's zeros into NaN before the cast (a value outside the stated
bound, silently); each such value must decode within the bound like any other."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from wanxport.collective import codec, error_bound


@pytest.mark.parametrize("compress", ["int8", "int4"])
def test_a_block_of_tiny_values_decodes_within_the_bound(compress: str) -> None:
    x = np.zeros(600, np.float32)
    x[:5] = np.array([1e-40, -5e-41, 3e-39, 0.0, 2e-45], np.float32)  # block 0: only tiny values
    x[500] = 1.5  # a later block of ordinary size
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow or invalid cast on the way
        back = codec.decode(compress, codec.encode(compress, x), x.size)
    assert np.all(np.abs(x - back) <= error_bound(compress, x))
    assert back[3] == 0.0  # a zero stays zero
