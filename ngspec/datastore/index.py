"""Searching a datastore: longest suffix match of a token context and its top continuations.

The suffix array orders suffixes by token values; big-endian fixed-width bytes of the tokens sort
the same way, so each probe of the binary search is one C-level bytes comparison.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pydivsufsort

from ngspec.datastore.format import (
    DatastoreMeta, load_arrays, pack_documents, read_meta, token_dtype, tokenizer_fingerprint,
)
from ngspec.errors import NgspecError


@dataclass(frozen=True)
class Match:
    length: int  # tokens of the context's suffix that were found
    lo: int  # suffix-array range [lo, hi) of its occurrences
    hi: int

    @property
    def count(self) -> int:
        return self.hi - self.lo


class Datastore:
    def __init__(self, path: Path, meta: DatastoreMeta, tokens: np.ndarray, sa: np.ndarray) -> None:
        self.path = path
        self.meta = meta
        self.tokens = tokens
        self.sa = sa
        self._width = tokens.dtype.itemsize
        self._key = tokens.astype(tokens.dtype.newbyteorder(">")).tobytes()

    @classmethod
    def from_documents(cls, docs: list[list[int]], vocab_size: int, source: str = "in-memory") -> "Datastore":
        """An in-memory datastore of token-id documents (e.g. a holdout set)."""
        dtype = token_dtype(vocab_size)
        tokens = pack_documents(docs, dtype)
        sa = pydivsufsort.divsufsort(tokens) if len(tokens) else np.zeros(0, dtype=np.int32)
        meta = DatastoreMeta(
            tokenizer_name="", tokenizer_fingerprint="", vocab_size=vocab_size, source=source,
            records=len(docs), documents=len(docs), tokens=len(tokens) - len(docs),
            token_dtype=str(dtype), separator=int(np.iinfo(dtype).max),
        )
        return cls(Path(source), meta, tokens, sa)

    @classmethod
    def open(cls, path: Path | str, tokenizer=None) -> "Datastore":
        """Open (memory-map) a datastore; with ``tokenizer``, refuse one built with another."""
        path = Path(path)
        meta = read_meta(path)
        if tokenizer is not None and tokenizer_fingerprint(tokenizer) != meta.tokenizer_fingerprint:
            raise NgspecError(
                f"{path} was built with tokenizer {meta.tokenizer_name!r}, which differs from this "
                "model's tokenizer; rebuild it with --model/--tokenizer of the model you use"
            )
        tokens, sa = load_arrays(path, meta)
        return cls(path, meta, tokens, sa)

    def _encode(self, query: Sequence[int]) -> bytes:
        return np.asarray(query, dtype=self.tokens.dtype.newbyteorder(">")).tobytes()

    def _bound(self, query: bytes, upper: bool) -> int:
        w, key, n = self._width, self._key, len(query)
        probe = (lambda s: key[s * w : s * w + n])
        if upper:
            return bisect.bisect_right(self.sa, query, key=probe)
        return bisect.bisect_left(self.sa, query, key=probe)

    def find(self, query: Sequence[int]) -> tuple[int, int]:
        """Suffix-array range [lo, hi) of the suffixes starting with ``query``."""
        q = self._encode(query)
        return self._bound(q, upper=False), self._bound(q, upper=True)

    def occurs(self, query: Sequence[int]) -> bool:
        """Whether ``query`` occurs anywhere (never across a document boundary)."""
        q = self._encode(query)
        lo = self._bound(q, upper=False)
        if lo >= len(self.sa):
            return False
        s = int(self.sa[lo]) * self._width
        return self._key[s : s + len(q)] == q

    def longest_suffix_match(self, context: Sequence[int], min_len: int = 1, max_len: int = 16) -> Match | None:
        """The longest suffix of ``context`` (between min_len and max_len tokens) found here.

        If a suffix of length L occurs, so does every shorter one, so the length is found by
        binary search."""
        max_len = min(max_len, len(context))
        if max_len < min_len or not self.occurs(context[len(context) - min_len :]):
            return None
        lo_len, hi_len = min_len, max_len  # lo_len occurs; search the largest that does
        while lo_len < hi_len:
            mid = (lo_len + hi_len + 1) // 2
            if self.occurs(context[len(context) - mid :]):
                lo_len = mid
            else:
                hi_len = mid - 1
        lo, hi = self.find(context[len(context) - lo_len :])
        return Match(lo_len, lo, hi)

    def continuations(self, match: Match, depth: int, top: int, max_occurrences: int = 4096) -> list[tuple[tuple[int, ...], int]]:
        """The ``top`` most frequent continuations (up to ``depth`` tokens, stopping at document
        ends) of the matched occurrences, with their counts; ties go to the earlier suffix."""
        sep = self.meta.separator
        counts: Counter[tuple[int, ...]] = Counter()
        hi = min(match.hi, match.lo + max_occurrences)
        for start in self.sa[match.lo : hi]:
            s = int(start) + match.length
            follow = self.tokens[s : s + depth].tolist()
            if sep in follow:
                follow = follow[: follow.index(sep)]
            if follow:
                counts[tuple(follow)] += 1
        return counts.most_common(top)
