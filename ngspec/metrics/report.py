"""Running the self-repetition metric over a dataset and summarising it."""

from __future__ import annotations

import statistics
import time
from collections import Counter
from dataclasses import dataclass, field

from ngspec.metrics.pairs import Pair
from ngspec.metrics.self_repetition import Searchable, self_repetition

BUCKETS = ((0, 0), (1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (17, 32), (33, 64), (65, 10**9))


def bucket(length: int) -> str:
    for lo, hi in BUCKETS:
        if lo <= length <= hi:
            return str(lo) if lo == hi else (f"{lo}-{hi}" if hi < 10**9 else f"{lo}+")
    raise ValueError(length)


@dataclass
class MetricReport:
    per_record: list[dict] = field(default_factory=list)
    histogram: Counter = field(default_factory=Counter)
    tokens: int = 0
    steps: int = 0
    tokenize_seconds: float = 0.0
    metric_seconds: float = 0.0

    def as_dict(self) -> dict:
        values = [r["value"] for r in self.per_record if r["tokens"]]
        return {
            "records": len(self.per_record),
            "mean": statistics.fmean(values) if values else 0.0,
            "median": statistics.median(values) if values else 0.0,
            "token_weighted": self.tokens / self.steps if self.steps else 0.0,
            "response_tokens": self.tokens,
            "steps": self.steps,
            "match_length_histogram": {label: self.histogram.get(label, 0) for label in (bucket(lo) for lo, _ in BUCKETS)},
            "tokenize_seconds": self.tokenize_seconds,
            "metric_seconds": self.metric_seconds,
            "tokens_per_second": self.tokens / self.metric_seconds if self.metric_seconds else 0.0,
            "per_record": self.per_record,
        }


def tokenize_pairs(tokenizer, pairs: list[Pair]) -> list[tuple[list[int], list[int]]]:
    enc = lambda texts: tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []  # noqa: E731
    return list(zip(enc([p.input for p in pairs]), enc([p.response for p in pairs])))


def measure(pairs: list[Pair], encoded: list[tuple[list[int], list[int]]], datastore: Searchable | None) -> MetricReport:
    report = MetricReport()
    start = time.perf_counter()
    for pair, (inp, resp) in zip(pairs, encoded):
        result = self_repetition(inp, resp, datastore)
        report.per_record.append({"id": pair.id, "tokens": result.tokens, "steps": result.steps, "value": result.value})
        report.histogram.update(bucket(L) for L in result.match_lengths)
        report.tokens += result.tokens
        report.steps += result.steps
    report.metric_seconds = time.perf_counter() - start
    return report
