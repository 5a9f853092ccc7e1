"""Searching a datastore: longest suffix match of a token context and its most frequent continuation.

The suffix array orders suffixes by token values; big-endian fixed-width bytes of the tokens sort
the same way, so each probe of the binary search is one C-level bytes comparison.
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ngspec.datastore.format import (
    DatastoreMeta, load_arrays, pack_documents, read_meta, token_dtype, tokenizer_fingerprint,
)
from ngspec.datastore.suffix import suffix_array
from ngspec.errors import NgspecError

# up to this many occurrences a continuation is read in plain Python, a token at a time: a depth
# read with numpy (a gather and five small operations) costs about 8 us, a Python read about
# 0.09 us an occurrence (Intel VM); numpy hands over to Python too once the occurrences still
# agreeing are this few
FEW = 64
CONTINUATIONS = 4096  # continuations remembered per datastore (about a kilobyte each at depth 16)


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
        # plain arrays over the memory maps: a memmap's slicing and indexing run Python code for
        # every view they make (a continuation reads up to 64 slices)
        self.tokens = np.asarray(tokens)
        self.sa = np.asarray(sa)
        # binary searches index the suffix array one entry at a time: a memoryview hands back
        # Python ints at C speed (a memmap's __getitem__ is Python code returning numpy scalars)
        self._sa_items = memoryview(np.ascontiguousarray(sa)).cast("B").cast("i" if sa.dtype.itemsize == 4 else "q") if len(sa) else []
        self._token_items = memoryview(np.ascontiguousarray(tokens)).cast("B").cast("H" if tokens.dtype.itemsize == 2 else "I") if len(tokens) else []
        self._width = tokens.dtype.itemsize
        self._key = tokens.astype(tokens.dtype.newbyteorder(">")).tobytes()
        self._starts: np.ndarray | None = None  # first suffix of each token's bucket
        # continuations already read, by match and depth: the same short match of a common phrase
        # recurs from step to step and row to row (a third of a batch-8 run's reads, and half
        # their time: BENCHMARKS.md 10zh)
        self._continuation = functools.lru_cache(maxsize=CONTINUATIONS)(self._read_continuation)

    @classmethod
    def from_documents(cls, docs: list[list[int]], vocab_size: int, source: str = "in-memory") -> "Datastore":
        """An in-memory datastore of token-id documents (e.g. a holdout set)."""
        dtype = token_dtype(vocab_size)
        tokens = pack_documents(docs, dtype)
        sa = suffix_array(tokens)
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

    def forget(self) -> None:
        """Empty the memory of continuations read, so that a timed run reads the datastore as a
        fresh process would (benchmarks repeat the same prompts: a second round would find every
        continuation already read)."""
        self._continuation.cache_clear()

    def _encode(self, query: Sequence[int]) -> bytes:
        return np.asarray(query, dtype=self.tokens.dtype.newbyteorder(">")).tobytes()

    def _bucket(self, first: int) -> tuple[int, int]:
        """Suffix-array range of the suffixes starting with token ``first`` (a lookup table built
        on first use), so every binary search runs inside one token's bucket."""
        if self._starts is None:
            # the suffix array is sorted by first token, so token t's bucket starts after every
            # suffix that begins with a smaller token: a running count (one pass, no random reads)
            vocab = self.meta.vocab_size
            counts = np.bincount(np.minimum(self.tokens, vocab), minlength=vocab + 1)  # separators -> vocab
            self._starts = np.concatenate([[0], np.cumsum(counts[:vocab])])
        if first >= self.meta.vocab_size:
            return int(self._starts[-1]), len(self.sa)
        return int(self._starts[first]), int(self._starts[first + 1])

    def _bounds(self, q: bytes, first: int, upper: bool) -> int:
        """Lower or upper bound of the encoded query ``q`` (first token ``first``) in the suffix array."""
        w, key, n = self._width, self._key, len(q)
        lo, hi = self._bucket(first)
        search = bisect.bisect_right if upper else bisect.bisect_left
        return search(self._sa_items, q, lo, hi, key=lambda s: key[s * w : s * w + n])

    def _lower_if_occurs(self, q: bytes, first: int) -> int | None:
        lo = self._bounds(q, first, upper=False)
        if lo >= len(self.sa):
            return None
        s = self._sa_items[lo] * self._width
        return lo if self._key[s : s + len(q)] == q else None

    def occurs(self, query: Sequence[int]) -> bool:
        """Whether ``query`` occurs anywhere (never across a document boundary)."""
        return self._lower_if_occurs(self._encode(query), int(query[0])) is not None

    def longest_suffix_match(self, context: Sequence[int], min_len: int = 1, max_len: int = 16) -> Match | None:
        """The longest suffix of ``context`` (between min_len and max_len tokens) found here.

        If a suffix of length L occurs, so does every shorter one, so the length is found by
        probing lengths ``min_len``, twice that, and so on until one does not occur, then by
        binary search between the last two (most contexts match nothing or two or three tokens:
        one to three probes, where a binary search over 2-32 took five); the lower bound of the
        last successful probe is reused for the range. The context's last ``max_len`` tokens are
        encoded once; each suffix is a tail of those bytes. A suffix never holds the separator
        (a document's end), so every occurrence has its continuation in its own document."""
        min_len, max_len = max(min_len, 1), min(max_len, len(context))
        if max_len < min_len:
            return None
        tail = [int(t) for t in context[len(context) - max_len :]]
        if self.meta.separator in tail:  # a document ended there: no match runs through it
            tail = tail[len(tail) - tail[::-1].index(self.meta.separator) :]
            max_len = len(tail)
            if max_len < min_len:
                return None
        encoded, w = self._encode(tail), self._width

        def lower(length: int) -> int | None:
            return self._lower_if_occurs(encoded[(max_len - length) * w :], tail[max_len - length])

        found, found_lo, length = None, None, min_len
        while True:  # doubling: the largest length known to occur, and the smallest known not to
            at = lower(length)
            if at is None:
                break
            found, found_lo = length, at
            if length == max_len:
                break
            length = min(2 * length, max_len)
        if found is None:
            return None
        lo_len, hi_len = found + 1, length - 1  # search the largest length in [lo_len, hi_len] that occurs
        while lo_len <= hi_len:
            mid = (lo_len + hi_len) // 2
            at = lower(mid)
            if at is None:
                hi_len = mid - 1
            else:
                found, found_lo, lo_len = mid, at, mid + 1
        return Match(found, found_lo, self._bounds(encoded[(max_len - found) * w :], tail[max_len - found], upper=True))

    def greedy_continuation(self, match: Match, depth: int, smoothing: float = 0.0, max_occurrences: int = 4096) -> tuple[list[int], list[float]]:
        """The most frequent continuation of the matched occurrences, chosen token by token (at
        each depth the commonest next token among the occurrences that agreed so far), up to
        ``depth`` tokens and never past a document end; with each token's conditional frequency
        (count of occurrences continuing with it / (occurrences that reached that depth +
        ``smoothing``), as `NGramTrie.greedy_path` smooths).

        Past ``max_occurrences`` an evenly spaced sample of them is read: the suffix array orders
        occurrences by what follows them, so the first ones alone would all continue alike (in a
        large store, a common phrase's first 4,096 occurrences may all go on with the same few
        smallest token ids)."""
        tokens, probs = self._continuation(match, depth, smoothing, max_occurrences)
        return list(tokens), list(probs)  # copies: the remembered lists stay as read

    def _read_continuation(self, match: Match, depth: int, smoothing: float, max_occurrences: int) -> tuple[list[int], list[float]]:
        """`greedy_continuation` read from the arrays (what the memory of continuations holds)."""
        sep = self.meta.separator
        found = match.hi - match.lo
        if found <= FEW:
            return self._greedy_few([self._sa_items[i] + match.length for i in range(match.lo, match.hi)], depth, smoothing)
        if found > max_occurrences:
            rows = match.lo + (np.arange(max_occurrences, dtype=np.int64) * found) // max_occurrences
        else:
            rows = slice(match.lo, match.hi)
        # the occurrences come in suffix-array order: those agreeing on the tokens chosen so far are
        # one contiguous run [a, b) of them, and their next tokens are sorted (every document ends
        # with the separator, the largest id, so none reads past the arrays' end while it agrees).
        # Each depth reads one column of the run and takes its longest stretch of equal tokens
        # (the first of equally long ones: the smallest id, as a count per token would)
        starts = np.asarray(self.sa[rows], dtype=np.int64) + match.length
        a, b = 0, len(starts)
        tokens: list[int] = []
        probs: list[float] = []
        for d in range(depth):
            column = self.tokens[starts[a:b] + d]
            end = int(np.searchsorted(column, sep))  # occurrences whose document ended here come last
            if not end:
                break
            bounds = np.flatnonzero(column[1:end] != column[: end - 1]) + 1
            bounds = np.concatenate(([0], bounds, [end]))
            best = int(np.diff(bounds).argmax())
            low, high = int(bounds[best]), int(bounds[best + 1])
            tokens.append(int(column[low]))
            probs.append(float(high - low) / (float(b - a) + smoothing))
            a, b = a + low, a + high
            if high - low <= FEW:  # a few occurrences left: read in Python from here on
                more, more_probs = self._greedy_few((starts[a:b] + (d + 1)).tolist(), depth - d - 1, smoothing)
                tokens.extend(more)
                probs.extend(more_probs)
                break
        return tokens, probs

    def _greedy_few(self, starts: list[int], depth: int, smoothing: float) -> tuple[list[int], list[float]]:
        """`greedy_continuation` over a few occurrences continuing at ``starts`` (in suffix-array
        order), read a token at a time: as in the arrays' reading, the ones still agreeing are a
        contiguous run and their next tokens sorted, so each depth takes the longest stretch of
        equal tokens (the first of equally long ones: the smallest id), separators last; one
        occurrence left, the rest of its document is read at once."""
        text, sep = self._token_items, self.meta.separator
        tokens: list[int] = []
        probs: list[float] = []
        a, b = 0, len(starts)
        for d in range(depth):
            if b - a == 1:
                rest = text[starts[a] + d : starts[a] + depth].tolist()
                rest = rest[: rest.index(sep)] if sep in rest else rest
                tokens.extend(rest)
                probs.extend([1.0 / (1.0 + smoothing)] * len(rest))
                break
            column = [text[s + d] for s in starts[a:b]]
            low, best, best_low, best_high = 0, None, 0, 0
            for i, token in enumerate(column):
                if token != column[low]:
                    low = i
                if i + 1 - low > best_high - best_low and token != sep:
                    best, best_low, best_high = token, low, i + 1
            if best is None:  # every document ended here
                break
            tokens.append(best)
            probs.append((best_high - best_low) / (b - a + smoothing))
            a, b = a + best_low, a + best_high
        return tokens, probs
