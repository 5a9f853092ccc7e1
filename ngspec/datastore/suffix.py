"""The suffix array of a token array, by pydivsufsort, in about 12 bytes per token.

libdivsufsort sorts bytes, so pydivsufsort sorts the big-endian bytes of wider tokens (their byte
order equals the token order) and keeps the suffixes that start on a token boundary. Its own
wrapper does that with several full-size temporaries (about 20 bytes per uint16 token on top of
the input). Here the same steps run with one big-endian copy and the byte-level suffix array,
compacted in place chunk by chunk, so the peak is the input + its copy + 4 bytes per byte of
input (2 + 2 + 8 = 12 bytes per uint16 token).
"""

from __future__ import annotations

import numpy as np
import pydivsufsort

CHUNK = 1 << 20


def suffix_array(tokens: np.ndarray) -> np.ndarray:
    """Start positions of the suffixes of ``tokens`` (unsigned ints) in lexicographic order."""
    if len(tokens) == 0:
        return np.zeros(0, dtype=np.int32)
    width = tokens.dtype.itemsize
    if width == 1:
        return pydivsufsort.divsufsort(np.ascontiguousarray(tokens, dtype=np.uint8))
    big_endian = tokens.astype(tokens.dtype.newbyteorder(">"))
    byte_sa = pydivsufsort.divsufsort(big_endian.view(np.uint8))
    del big_endian
    kept = 0
    for start in range(0, len(byte_sa), CHUNK):
        chunk = byte_sa[start : start + CHUNK]
        starts = chunk[chunk % width == 0] // width
        byte_sa[kept : kept + len(starts)] = starts  # kept <= start: never overwrites unread entries
        kept += len(starts)
    assert kept == len(tokens)
    return byte_sa[:kept]  # a view; the bytes past it are freed with the whole array
