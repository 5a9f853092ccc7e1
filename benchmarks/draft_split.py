"""Where a batched run's drafting time goes, timed with clocks rather than a profiler: `ngspec bench`
runs in this process with the phases of the EAGLE-based drafters' work wrapped in timers
(`ngspec.perf.phases.wrapped`), and the sums are printed as seconds and as shares of those
drafters' batched runs. cProfile (`draft_profile.py`) slows Python more than torch's kernels, so
it overstates the drafters' own Python; these timers add a few microseconds a call.

Phases, of runs whose rows draft with a head (`eagle`, `eagle+search`):

* ``head prefill``: the head's keys and values of a new prompt (`_cache_unread` with pairs to
  cache: the head's first run of a row);
* ``head forwards``: the batched head runs of every step (`run_calls`, less the prefill above),
  and within them ``pooled attention`` (`pooled_attention`: the rows' masks and one attention);
* ``top-k``: the products over the draft vocabulary and their top-k (`TopCall`s);
* ``drafters' Python``: the rest of `propose_together` (the search, the gate, the trees' assembly);
* ``start`` (the prompt's tries, at admission) and ``observe`` (a step's tokens into the tries
  and calibration), which the bench's drafting share leaves out.

    python benchmarks/draft_split.py -q ../shared/data/spec_bench/question.jsonl --category rag \\
        --limit 16 -n 128 -b 8 -d eagle+search --eagle-head heads/amd-v41 --tree static \\
        --tree-choices shapes/amd-v23-cpu-b1-3.json --draft-vocab 8192 --datastore datastores/shipped --deepen

(every argument is `ngspec bench`'s; BENCHMARKS.md 10zzb).
"""

from __future__ import annotations

import sys
import time
from collections import Counter, defaultdict

import ngspec.eagle.batched as batched
import ngspec.engine as engine_module
from ngspec.cli.app import app
from ngspec.perf.phases import wrapped


def split(argv: list[str]) -> tuple[defaultdict[str, float], Counter[str]]:
    """Run `ngspec bench` with ``argv`` (its arguments, "bench" first) under the timers: each
    phase's seconds and calls ("run": the head-drafting runs themselves)."""
    seconds: defaultdict[str, float] = defaultdict(float)
    calls: Counter[str] = Counter()
    state = {"head": False}  # whether the current batched run drafts with a head

    def timed(name, method, label=None):
        def run(*args, **kwargs):
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                key = label(*args) if label else name
                if key is not None:
                    seconds[key] += time.perf_counter() - started
                    calls[key] += 1
        return run

    def wrap(name, method):
        if name == "answer":  # by the kind of call answered
            return timed(name, method, lambda group: {"HeadCall": "head runs", "TopCall": "top-k"}.get(type(group[0]).__name__))
        if name == "cache_unread":  # the head's prefill only: a call with pairs to cache
            return timed(name, method, lambda call, param: "head prefill" if call.keep_from else None)
        if name == "propose_together":
            def propose(drafters, contexts):
                state["head"] = state["head"] or any(hasattr(d, "drafting") for d in drafters)
                return timed(name, method, lambda *a: "drafting" if state["head"] else None)(drafters, contexts)
            return propose
        if name == "run_batch":
            def run_batch(self, *args, **kwargs):
                state["head"], started = False, time.perf_counter()
                try:
                    return method(self, *args, **kwargs)
                finally:
                    if state["head"]:
                        seconds["run"] += time.perf_counter() - started
                        calls["run"] += 1
            return run_batch
        if name in ("start", "observe"):  # a head drafter's own methods: counted wherever they run
            return timed(name, method)
        return timed(name, method, lambda *a: name if state["head"] else None)

    from ngspec.drafters.search import EagleSearchDrafter
    import ngspec.batch as batch_module

    phases = {
        "answer": (batched, "answer"), "cache_unread": (batched, "_cache_unread"), "pooled attention": (batched, "pooled_attention"),
        "propose_together": (batch_module, "propose_together"), "run_batch": (engine_module.Engine, "run_batch"),
        "start": (EagleSearchDrafter, "start"), "observe": (EagleSearchDrafter, "observe"),
    }
    with wrapped(phases, wrap):
        try:
            app(argv, standalone_mode=False)
        except SystemExit as exc:
            if exc.code:
                raise
    return seconds, calls


def main(argv: list[str]) -> None:
    seconds, calls = split(argv)
    run = seconds["run"]
    if not run:
        print("no batched run drafted with a head: give -b 2 or more and -d eagle or eagle+search", file=sys.stderr)
        sys.exit(1)
    head = seconds["head runs"] - seconds["head prefill"]
    rows = [
        ("drafting (propose_together)", seconds["drafting"], calls["drafting"]),
        ("  head prefill", seconds["head prefill"], calls["head prefill"]),
        ("  head forwards", head, calls["head runs"]),
        ("    of which pooled attention", seconds["pooled attention"], calls["pooled attention"]),
        ("  top-k", seconds["top-k"], calls["top-k"]),
        ("  drafters' Python", seconds["drafting"] - seconds["head runs"] - seconds["top-k"], calls["drafting"]),
        ("start (at admission)", seconds["start"], calls["start"]),
        ("observe", seconds["observe"], calls["observe"]),
    ]
    print(f"\nbatched runs drafting with a head: {run:.2f} s in {calls['run']} runs (the arms' warm-ups included)")
    print(f"{'phase':32} {'seconds':>8} {'calls':>7} {'ms/call':>8} {'of the runs':>12}")
    for name, s, n in rows:
        print(f"{name:32} {s:8.3f} {n:7d} {1e3 * s / max(n, 1):8.2f} {100 * s / run:11.2f}%")


if __name__ == "__main__":
    main(sys.argv[1:])
