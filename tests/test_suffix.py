"""The memory-lean suffix array against sorting the suffixes directly."""

import numpy as np
import pytest

from ngspec.datastore import suffix
from ngspec.datastore.suffix import suffix_array


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32])
def test_suffix_array_is_the_sorted_suffixes(dtype, monkeypatch):
    monkeypatch.setattr(suffix, "CHUNK", 7)  # exercise the chunked in-place compaction
    rng = np.random.default_rng(0)
    for n in (0, 1, 2, 5, 40, 300):
        for high in (2, 300, 70000):
            high = min(high, np.iinfo(dtype).max)
            tokens = rng.integers(0, high, n).astype(dtype)
            expected = sorted(range(n), key=lambda i: tokens[i:].tolist())
            assert suffix_array(tokens).tolist() == expected
