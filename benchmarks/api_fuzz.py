"""A random search over the Python API: the values a script hands `Speculator.load`,
`Speculator.from_model`, `generate` and `generate_batch`, right or wrong in kind and range.

The command-line searches (cli_fuzz, input_fuzz, bench_fuzz, serve_fuzz) send text that Typer or
JSON has parsed; a script sends Python values: numpy and torch scalars, tensors of ids, a lone
string where a list was meant, a list where a path was meant, a callback that raises. Probing
those by hand found 15 faults in one session (BENCHMARKS.md 10zzzc); this search draws them.

Each run makes one `Speculator` for a tiny random Llama saved with the default model's tokenizer
(mostly `from_model`, now and then `load` from its directory), with a drafter and options drawn
mostly valid, and calls `generate` or `generate_batch` once with a prompt (text, chat messages,
token ids as a list, tuple, numpy array or tensor) and keyword arguments, each drawn valid or odd.
A run passes when it

- returns outputs that hold together (one per prompt, ``new_tokens`` the number of tokens, no
  more than ``max_new_tokens``, a finish reason that fits, streamed text that adds up to the
  text, ``on_output`` called once per prompt with its output) and whose tokens are plain
  decoding's (greedy, or sampling replayed with the output's seed: `ngspec.check`), short of a
  float32 near-tie, or
- raises `NgspecError` with one line in the input's words (no Python type names: the judge of
  input_fuzz), or passes on the exception a callback of ours raised,

and warns nothing. Anything else is a finding, written with the call that made it.

    python benchmarks/api_fuzz.py --runs 300 --first 0 --out bench-out/api_fuzz

With ``--feed`` each run is instead a batch a server of one's own would run: requests made with
`Speculator.request`, each with its settings (some streaming text, some cancelled part-way),
handed to `run_batch` by a ``feed`` a few at a time. It passes when every request gets one
result, handed to ``on_finish`` once, that `generate` would have returned (a cancelled one: a
start of plain decoding), or is refused or propagates as above. Its first 60 runs found a feed
that hands back None, one request or a list of texts failing with Python's TypeError from inside
the batch, and two requests under one index sharing one result; both are refused now. In two runs
of five the first batch also has prompts given at the start (`run_batch`'s first argument, decoded
by one `DecodeConfig`), drawn from a stream of their own so that the rest replays as before; on
the code before they were checked, 32 of 100 runs failed inside the batch (a text prompt read as
its characters, a `DecodeConfig` of another kind), now refused or run as `generate_batch` runs.

    python benchmarks/api_fuzz.py --feed --runs 300 --first 0 --out bench-out/api_fuzz

Runs are fixed by (seed, run number) (``--feed`` runs apart): ``--first N`` continues a search,
``--only N,M`` replays runs.
Its first 80 runs found two faults: a bigram table built for the model with its tokenizer, given
to the same model without one, was refused as "built for another model"; and `generate_batch([],
raw=None)` returned [] where a batch with prompts refused ``raw``. They also showed the API's
refusals naming CLI flags ("--batch-layout must be one of ..." for ``layout=``); they now name its
arguments. An option the drafter does not read (``k=`` for `search`) was ignored, as on the CLI;
both refuse it now.
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Callable

from input_fuzz import PYTHON_WORDS, Fixtures, run_numbers

# drafter options' valid values (each run draws valid ones; a run with a fault puts one wrong in)
NAT = [1, 2, 3, 4, 8]  # small positive counts, right for every count option
OPTIONS = {
    "num_draft": NAT + [16, 64],
    "lookup_ngram": NAT,
    "lookup_tokens": NAT,
    "ngram_q": NAT,
    "search_depth": NAT + [16, 64],
    "trie_update": [True, False],
    "deepen": [True, False],
    "head_int8": [True, False],
    "k": [1, 2, 4, "2", "1"],
    "w": [1, 2, 4, "3"],
    "tree_top_k": [1, 2, 4, 8],
    "tree_depth": [1, 2, 5],
    "total_tokens": [1, 4, 16, 32],
    "draft_vocab": [0, 16, 8192],
}
ODD_VALUES = [0, -1, 2.5, None, True, "3", "x", [2], 10**12, float("nan")]
# which options each drafter reads (eagle's tree options are drawn by `eagle_options`)
READS = {
    "vanilla": [],
    "prompt-lookup": ["lookup_ngram", "lookup_tokens"],
    "trie": ["num_draft", "trie_update"],
    "context-ngram": ["k", "w", "ngram_q"],
    "unigram": ["k", "w"],
    "bigram": ["k", "w"],
    "mixed": ["k", "w", "ngram_q"],
    "eagle": ["draft_vocab", "head_int8"],
    "search": ["search_depth"],
    "eagle+search": ["search_depth", "deepen", "tree_top_k", "tree_depth", "total_tokens", "draft_vocab", "head_int8"],
}
ODD_DRAFTERS = ["Trie", "eagle-search", None, 3, ["trie"], ""]
TEXTS = [
    "Summarise: the cat sat on the mat. The cat sat on the mat. The dog sat on the log.",
    "def add(a, b):\n    return a + b\n\ndef add(",
    "猫は🐱です。猫は",
    " ",
    "a\x00b",
]
ODD_TEXTS = ["", "half \ud83d of an emoji", "long " * 700]  # empty, a lone surrogate, past the 512-token window
CALLS = {  # generate's keyword arguments: (valid values, wrong ones)
    "max_new_tokens": ([1, 2, 5, 8, 16, 24, 24, "np.int64(6)", 600], [0, -1, 2.0, True, None, "8"]),
    "temperature": ([0.0, 0.0, 0, 0.7, 1.0, "np.float32(0.5)"], [-1.0, float("nan"), "0.5", None]),
    "top_p": ([1.0, 0.9, 0.5], [0.0, 1.5, -0.1, float("nan")]),
    "top_k": ([0, 1, 5, 50, 10**9], [-1, 2.5]),
    "seed": ([None, 0, 7, 12345, "np.int64(3)"], [-1, 2**70, 1.5, "7"]),
    "stop": ([(), ["."], [".", "\n"], ("the",), ["x"] * 40, "."], [[""], [None], ["\ud800"], [3], ""]),
    "raw": ([False, True], [1, "no", None]),
    "check": ([False, True, True], ["yes", 1]),
}
BATCH_CALLS = {  # and generate_batch's
    "batch_size": ([1, 2, 3, 8], [0, -1, 2.5, 10**12, None]),
    "rearrange_every": ([None, 1, 4], [-1, 1.5]),
    "rearrange_min_share": ([None, 0.0, 0.5], [1.0, -0.5, 2.0, float("nan"), "0.5"]),
    "layout": (["padded", "packed"], ["PACKED", "x", None, 3]),
    "prefill_tokens": ([None, 0, 16, 100_000], [-1, 2.5]),
}
# where a run with a fault puts it, and how often
FAULTS = ["drafter", "option", "unread option", "unknown option", "prompt", "prompts", "argument", "callback", "model"]


class Boom(Exception):
    """What our callbacks raise: it must come out of the call as it went in."""


def value_of(text):
    """A pool's stand-ins for numpy scalars ("np.int64(6)") as the values themselves."""
    import numpy as np

    if isinstance(text, str) and text.startswith("np."):
        kind, number = text[3:].rstrip(")").split("(")
        return getattr(np, kind)(float(number) if "float" in kind else int(number))
    return text


def eagle_options(rng: random.Random, run_dir: Path) -> dict:
    """A tree for the eagle drafter: dynamic with its sizes, or static with a shape file."""
    if rng.random() < 0.5:
        opts = {"tree": "dynamic"} if rng.random() < 0.5 else {}
        for name in ("tree_top_k", "tree_depth", "total_tokens"):
            if rng.random() < 0.5:
                opts[name] = rng.choice(OPTIONS[name])
        return opts
    path = run_dir / "choices.json"
    path.write_text(json.dumps(rng.choice([[[0], [1], [0, 0]], [[0], [0, 0], [0, 0, 0]], [[0]], [[0], [1], [2], [0, 0], [1, 0]]])))
    return {"tree": "static", "tree_choices": rng.choice([path, str(path)])} if rng.random() < 0.5 else {"tree_choices": path}


def drafter_options(rng: random.Random, fx: Fixtures, drafter: str, run_dir: Path) -> dict:
    """Valid keyword options for ``drafter``: its files and some of the options it reads."""
    opts = {name: rng.choice(OPTIONS[name]) for name in READS[drafter] if rng.random() < 0.5}
    if drafter == "trie" and rng.random() < 0.5:
        opts["ngram_n"] = n = rng.choice([2, 3, 5, 13])
        opts["prefix_len"] = rng.randrange(1, n)
    if drafter == "search" and rng.random() < 0.3:
        opts["prefix_len"] = rng.choice(NAT)
    if drafter in ("eagle", "eagle+search"):
        opts["eagle_head"] = rng.choice([fx.model / "head", str(fx.model / "head")])
    if drafter == "eagle":
        opts |= eagle_options(rng, run_dir)
    if drafter in ("search", "eagle+search") and rng.random() < 0.7:
        opts["datastore"] = rng.choice([fx.datastore, str(fx.datastore)])
    if drafter in ("unigram", "bigram", "mixed") and rng.random() < 0.5:
        opts["bigram_table"] = rng.choice([fx.table, str(fx.table)])
    return opts


def messages(rng: random.Random, fault: bool = False):
    text = rng.choice(TEXTS[:3])
    if fault:
        return rng.choice([[{"role": "user"}], [{"role": "user", "content": None}], [{"content": text}],
                           [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], [{"role": "user", "content": 3}],
                           [{"role": "user", "content": text}, "x"], [{"role": "user", "content": "\udc00"}]])
    return rng.choice([[{"role": "user", "content": text}],
                       [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}],
                       [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": text}],
                       [{"role": "user", "content": [{"type": "text", "text": "Read: "}, {"type": "text", "text": text}]}]])


def ids_prompt(rng: random.Random, vocab: int, fault: bool = False):
    """Token ids in one of the forms a script holds them; with ``fault``, out of range, not
    integers or in a form that is not a prompt."""
    import numpy as np
    import torch

    base = [rng.randrange(vocab) for _ in range(rng.randrange(1, 8))]
    ids = (base * rng.randrange(1, 6))[: rng.choice([1, 5, 20, 60])]
    if fault:
        kind = rng.randrange(6)
        if kind == 0:
            ids[rng.randrange(len(ids))] = rng.choice([-1, vocab, 2**70, True, 1.0, "7", None])
            return ids
        if kind == 1:
            return np.array(ids, dtype=np.float32)
        if kind == 2:
            return torch.tensor([ids, ids])
        if kind == 3:
            return range(1, 1 + len(ids))
        if kind == 4:
            return (base * 600)[:600]  # past the window (base: 1 to 7 ids)
        return [[t] for t in ids]
    form = rng.choice(["list", "list", "tuple", "numpy", "tensor", "tensor2d"])
    if form == "tuple":
        return tuple(ids)
    if form == "numpy":
        return np.array(ids, dtype=rng.choice([np.int64, np.int32]))
    if form == "tensor":
        return torch.tensor(ids)
    if form == "tensor2d":  # a tokenizer's batch of one (return_tensors="pt")
        return torch.tensor([ids])
    return ids


def prompt(rng: random.Random, vocab: int, fault: bool = False):
    kind = rng.random()
    if fault and kind < 0.1:
        return rng.choice([None, 3, b"bytes", {"role": "user", "content": "hi"}, []])
    if kind < 0.4:
        return rng.choice(ODD_TEXTS if fault else TEXTS)
    if kind < 0.6:
        return messages(rng, fault)
    return ids_prompt(rng, vocab, fault)


class Calls:
    """A callback that records its calls, or raises `Boom` on its first."""

    def __init__(self, raises: bool) -> None:
        self.raises, self.seen = raises, []

    def __call__(self, *args) -> None:
        if self.raises:
            raise Boom("a callback of ours raised")
        self.seen.append(args)


def call_kwargs(rng: random.Random, batch: bool, fault: bool) -> dict:
    """`generate`'s (or `generate_batch`'s) keyword arguments, each drawn or left out; with
    ``fault``, one of them wrong."""
    pools = CALLS | (BATCH_CALLS if batch else {})
    out = {name: value_of(rng.choice(good)) for name, (good, _) in pools.items() if rng.random() < 0.5}
    if fault:
        name = rng.choice(sorted(pools))
        out[name] = value_of(rng.choice(pools[name][1]))
    return out


def shown(value) -> str:
    text = repr(value)
    return text if len(text) < 80 else text[:60] + f"... ({type(value).__name__}, {len(text)} chars)"


def call_text(how: str, drafter, opts: dict, method: str, first, kwargs: dict) -> str:
    args = ", ".join([shown(drafter)] + [f"{k}={shown(v)}" for k, v in opts.items()])
    call = ", ".join([shown(first)] + [f"{k}={shown(v)}" for k, v in kwargs.items()])
    return f"Speculator.{how}(model, {args}).{method}({call})"


def single(value):
    """A numpy or torch scalar as the Python number it holds (for our own checks)."""
    return value.item() if hasattr(value, "item") else value


def call_config(spec, kwargs: dict, max_new_tokens: int | None = None):
    """The `DecodeConfig` a call with ``kwargs`` ran by (``max_new_tokens``: another budget)."""
    budget = kwargs.get("max_new_tokens", 256) if max_new_tokens is None else max_new_tokens
    return spec._config(budget, kwargs.get("temperature", 0.0), kwargs.get("top_p", 1.0), kwargs.get("top_k", 0),
                        kwargs.get("seed"), kwargs.get("stop", ()), False)


def check_outputs(spec, method: str, prompts: list, kwargs: dict, result) -> tuple[str, str]:
    """(verdict, detail) for a call that returned: outputs that hold together and match plain
    decoding (near-ties excepted)."""
    from ngspec import Output
    from ngspec.check import check_against_greedy

    outs = [result] if method == "generate" else result
    if not isinstance(outs, list) or len(outs) != len(prompts) or not all(isinstance(o, Output) for o in outs):
        return "FINDING", f"returned {shown(result)} for {len(prompts)} prompt(s)"
    budget = single(kwargs.get("max_new_tokens", 256))
    cfg = call_config(spec, kwargs)
    ties = 0
    for i, (p, out) in enumerate(zip(prompts, outs)):
        if out.finish_reason == "error":
            if not out.error or "\n" in out.error or PYTHON_WORDS.search(out.error):
                return "FINDING", f"prompt {i} failed with {out.error!r}"
            continue
        if out.new_tokens != len(out.token_ids) or len(out.token_ids) > budget:
            return "FINDING", f"prompt {i}: {out.new_tokens} new tokens, {len(out.token_ids)} ids, budget {budget}"
        if out.finish_reason not in ("eos", "stop", "length", "context") or (out.finish_reason == "length" and len(out.token_ids) != budget):
            return "FINDING", f"prompt {i}: finish reason {out.finish_reason!r} with {len(out.token_ids)} of {budget} tokens"
        if out.finish_reason == "stop" and not cfg.stop_strings:
            return "FINDING", f"prompt {i}: finish reason 'stop' without stop strings"
        ids = spec.encode(p, kwargs.get("raw", False))
        if out.prompt_tokens != len(ids):
            return "FINDING", f"prompt {i}: prompt_tokens {out.prompt_tokens}, but it encodes to {len(ids)}"
        check = check_against_greedy(spec.engine, ids, out.token_ids, cfg, out.seed)
        if not check.exact_match:
            if check.steps is None or check.steps > 16:
                return "FINDING", f"prompt {i}: differs from plain decoding at token {check.first_mismatch} (margin {check.margin}, {check.steps} steps)"
            ties += 1
        if kwargs.get("check") is True and (out.greedy_check is None or out.greedy_check["exact_match"] != check.exact_match):
            return "FINDING", f"prompt {i}: greedy_check {out.greedy_check} where the oracle says exact_match={check.exact_match}"
    callback = kwargs.get("on_text" if method == "generate" else "on_output")
    if isinstance(callback, Calls):
        if method == "generate" and "".join(a[0] for a in callback.seen) != outs[0].text:
            return "FINDING", f"streamed text {''.join(a[0] for a in callback.seen)!r} is not the output's {outs[0].text!r}"
        if method == "generate_batch" and sorted(a[0] for a in callback.seen) != list(range(len(outs))):
            return "FINDING", f"on_output called for {sorted(a[0] for a in callback.seen)} of {len(outs)} prompts"
        if method == "generate_batch" and any(o.token_ids != outs[i].token_ids for i, o in callback.seen):
            return "FINDING", "on_output was handed other tokens than the output returned"
    return ("near-tie" if ties else "ok"), f"{len(outs)} output(s), {sum(o.new_tokens for o in outs)} tokens"


def judge_error(exc: BaseException) -> tuple[str, str]:
    from ngspec.errors import NgspecError

    if isinstance(exc, Boom):
        return "propagated", str(exc)
    message = str(exc)
    if isinstance(exc, NgspecError) and message and "\n" not in message and not PYTHON_WORDS.search(message):
        return "refused", message
    return "FINDING", f"{type(exc).__name__}: {message}"


def one_run(rng: random.Random, fx: Fixtures, model, tokenizer, run_dir: Path) -> tuple[str, str, str, str]:
    """(verdict, detail, a traceback for a finding, the call) for one drawn call: all valid, or
    (two runs in five) with one fault."""
    from ngspec import Speculator

    fault = rng.choice(FAULTS) if rng.random() < 0.4 else None
    method = "generate" if rng.random() < 0.6 else "generate_batch"
    if fault == "prompts" and method == "generate":
        fault = "prompt"
    drafter = rng.choice(list(READS))
    opts = drafter_options(rng, fx, drafter, run_dir)
    if fault == "drafter":
        drafter = rng.choice(ODD_DRAFTERS)
    elif fault == "option":
        name = rng.choice(sorted(OPTIONS | {"eagle_head": 0, "datastore": 0, "bigram_table": 0, "tree_choices": 0, "ngram_n": 0, "prefix_len": 0}))
        opts[name] = rng.choice(ODD_VALUES + [run_dir / "missing", fx.corpus] * (name in ("eagle_head", "datastore", "bigram_table", "tree_choices")))
    elif fault == "unread option":
        name = rng.choice(sorted(set(OPTIONS) | {"eagle_head", "datastore", "bigram_table", "tree_choices", "head_graphs", "tree"}))
        opts[name] = {"eagle_head": fx.model / "head", "datastore": fx.datastore, "bigram_table": fx.table, "tree_choices": [[0]],
                      "head_graphs": True, "tree": "static"}.get(name) or rng.choice(OPTIONS[name])
    elif fault == "unknown option":
        opts[rng.choice(["num_drafts", "eagle-head", "temperature", "max_new_tokens", "Datastore", "batch_size"])] = 1
    vocab = model.get_input_embeddings().num_embeddings
    if method == "generate":
        first = prompt(rng, vocab, fault == "prompt")
    else:
        first = [prompt(rng, vocab) for _ in range(rng.choice([0, 1, 2, 3, 5]))]
        if fault == "prompt" and first:
            first[rng.randrange(len(first))] = prompt(rng, vocab, True)
        elif fault in ("prompt", "prompts"):
            first = rng.choice(["a prompt", {"p": 1}, None, 3, b"ab"])
        elif rng.random() < 0.1:  # any iterable of prompts
            first = rng.choice([iter(first), (p for p in first)])
    listed = [first] if method == "generate" else first
    if hasattr(first, "__next__"):  # an iterator of prompts: read once, by the call; checked from its list
        listed = list(first)
        first = iter(listed)
    kwargs = call_kwargs(rng, method == "generate_batch", fault == "argument")
    callback = "on_output" if method == "generate_batch" else "on_text"
    if rng.random() < 0.3 or fault == "callback":
        kwargs[callback] = rng.choice([Calls(True), 5, "print"]) if fault == "callback" else Calls(False)
    how = "load" if rng.random() < 0.15 else "from_model"
    with_tokenizer = rng.random() < 0.9
    load_kw = {"device": "auto", "dtype": "auto"}
    if fault == "model":
        if how == "load":
            load_kw[rng.choice(["device", "dtype"])] = rng.choice(["cuda", "tpu", 3, None, "float64", "bfloat16", "int8"])
        else:
            load_kw = {"name": rng.choice([3, ["m"], b"m"])}
    model_args = "(model" + (", None" if how == "from_model" and not with_tokenizer else "") + "".join(
        f", {k}={shown(v)}" for k, v in load_kw.items() if how == "load" or fault == "model")
    text = call_text(how, drafter, opts, method, first, kwargs).replace("(model", model_args, 1)

    def attempt() -> tuple[str, str]:
        if how == "load":
            spec = Speculator.load(str(fx.model), drafter, **load_kw, **opts)
        else:
            spec = Speculator.from_model(model, tokenizer if with_tokenizer else None, drafter, **(load_kw if fault == "model" else {}), **opts)
        result = getattr(spec, method)(first, **kwargs)
        return check_outputs(spec, method, listed, kwargs, result)

    return (*judged(attempt, fault), text)


def judged(attempt: Callable[[], tuple[str, str]], fault: str | None) -> tuple[str, str, str]:
    """(verdict, detail, a traceback for a finding) of a run's ``attempt``: what its check said,
    or its exception judged; a warning it gave is a finding."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            verdict, detail = attempt()
            trace = ""
        except Exception as exc:  # noqa: BLE001 (judged)
            verdict, detail = judge_error(exc)
            trace = traceback.format_exc() if verdict == "FINDING" else ""
    ours = [w for w in caught if not str(w.message).startswith("ngspec: ")]
    if ours and verdict != "FINDING":
        w = ours[0]
        verdict, detail = "FINDING", f"warned {w.category.__name__}: {w.message} ({Path(w.filename).name}:{w.lineno})"
    if fault is not None and verdict == "ok":
        detail = f"{detail} (with a fault: {fault})"
    return verdict, detail, trace


# runs with --feed: `request` + `run_batch(feed=)`, the path a server of one's own batches by
FEED_FAULTS = ["request", "feed", "callback", "index"]
ODD_FEEDS = ["None", "one request", "texts", "not callable"]
# a batch's prompts given at the start, decoded by one `DecodeConfig`: what a fault there puts wrong
START_FAULTS = ["prompt", "prompts", "config", "batch"]
ODD_STARTS = {  # run_batch's first three arguments, as a script might get them wrong
    "prompts": ["a prompt", None, 3, "tensor2d"],
    "config": [None, {"max_new_tokens": 8}, 8, "BatchConfig"],
    "batch": [4, None, {"batch_size": 4}, "DecodeConfig"],
}


class Cancel:
    """A ``cancelled`` that says True from its ``after``-th question on (a client that left)."""

    def __init__(self, after: int, raises: bool = False) -> None:
        self.after, self.raises, self.asked = after, raises, 0

    def __call__(self) -> bool:
        self.asked += 1
        if self.raises and self.asked >= self.after:
            raise Boom("a cancelled() of ours raised")
        return self.asked >= self.after


def request_kwargs(rng: random.Random, fault: bool) -> dict:
    """`request`'s keyword arguments: `generate`'s but ``check``; with ``fault``, one wrong."""
    pools = {name: pool for name, pool in CALLS.items() if name != "check"}
    pools["max_new_tokens"] = ([1, 2, 5, 8, 16, 24], pools["max_new_tokens"][1])  # rows that end at different steps
    out = {name: value_of(rng.choice(good)) for name, (good, _) in pools.items() if rng.random() < 0.5}
    if fault:
        name = rng.choice(sorted(pools) + ["cancelled", "on_text"])
        out[name] = value_of(rng.choice(pools[name][1])) if name in pools else rng.choice([5, "x", True])
    return out


def check_fed(spec, prompts: list, settings: list[dict], results: dict, finished: list) -> tuple[str, str]:
    """(verdict, detail) for fed requests that all ran: one result for each, handed to
    ``on_finish`` once, as `generate` would return it; a cancelled one a prefix of it."""
    from ngspec.check import check_against_greedy

    if sorted(results) != list(range(len(prompts))):
        return "FINDING", f"results for indices {sorted(results)} of {len(prompts)} requests"
    if sorted(id(r) for r in finished) != sorted(id(r) for r in results.values()):
        return "FINDING", f"on_finish was called {len(finished)} times for {len(results)} results"
    verdicts = []
    for i, (p, kwargs) in enumerate(zip(prompts, settings)):
        ids = spec.encode(p, kwargs.get("raw", False))
        out = spec.output(results[i], len(ids))
        if out.finish_reason == "error":
            if "\n" in out.error or PYTHON_WORDS.search(out.error):
                return "FINDING", f"request {i} failed with {out.error!r}"
            verdicts.append("ok")
            continue
        if out.finish_reason == "cancelled":
            if not isinstance(kwargs.get("cancelled"), Cancel):
                return "FINDING", f"request {i} was cancelled without a cancelled()"
            if not out.token_ids:
                verdicts.append("ok")
                continue
            # plain decoding of as many tokens as the row had made when it was cancelled
            check = check_against_greedy(spec.engine, ids, out.token_ids, call_config(spec, kwargs, len(out.token_ids)), out.seed)
            if not check.exact_match and (check.steps is None or check.steps > 16):
                return "FINDING", f"request {i} (cancelled) differs from plain decoding at token {check.first_mismatch}"
            streamed = "".join(a[0] for a in kwargs["on_text"].seen) if isinstance(kwargs.get("on_text"), Calls) else None
            if streamed is not None and out.text is not None and not out.text.startswith(streamed):
                return "FINDING", f"request {i} (cancelled) streamed {streamed!r}, not a start of {out.text!r}"
            verdicts.append("ok" if check.exact_match else "near-tie")
            continue
        verdict, detail = check_outputs(spec, "generate", [p], kwargs, out)
        if verdict == "FINDING":
            return verdict, f"request {i}: {detail}"
        verdicts.append(verdict)
    return ("near-tie" if "near-tie" in verdicts else "ok"), f"{len(results)} result(s), {sum(len(r.generation.token_ids) for r in results.values() if r.generation)} tokens"


def feed_run(rng: random.Random, fx: Fixtures, model, tokenizer, run_dir: Path, starts_rng: random.Random) -> tuple[str, str, str, str]:
    """(verdict, detail, a traceback for a finding, the call) for one drawn server's-eye batch:
    requests made with their own settings, fed to `run_batch` a few at a time (a feed that comes
    back empty while rows run, new batches for what arrives after the last row ended, as `ngspec
    serve` does), some cancelled part-way; (two runs in five) one fault: a request's wrong
    argument or prompt, a feed that hands back something other than new requests (or an index
    twice), or a callback that raises. ``starts_rng`` (a stream of its own, so that what ``rng``
    draws replays as before) draws the first batch's prompts given at the start, in two runs of
    five, and in a third of those without another fault one wrong: a prompt, the prompts, the
    `DecodeConfig` or the `BatchConfig`."""
    import torch

    from ngspec import Speculator
    from ngspec.batch import BatchConfig
    from ngspec.decode import DecodeConfig

    fault = rng.choice(FEED_FAULTS) if rng.random() < 0.4 else None
    drafter = rng.choice(list(READS))
    opts = drafter_options(rng, fx, drafter, run_dir)
    with_tokenizer = rng.random() < 0.9
    vocab = model.get_input_embeddings().num_embeddings
    prompts = [prompt(rng, vocab) for _ in range(rng.randrange(1, 6))]
    settings = [request_kwargs(rng, False) for _ in prompts]
    for p, kwargs in zip(prompts, settings):
        if isinstance(p, list) and p and isinstance(p[0], dict) and kwargs.get("raw"):
            del kwargs["raw"]  # chat messages with raw=True: refused, a fault of its own in generate's runs
    if fault == "request":  # a wrong argument, or a prompt that cannot be one
        wrong = rng.randrange(len(prompts))
        if rng.random() < 0.6:
            settings[wrong] = request_kwargs(rng, True)
        else:
            prompts[wrong] = prompt(rng, vocab, True)
    for kwargs in settings:
        if rng.random() < 0.3:
            kwargs["on_text"] = Calls(False)
        if rng.random() < 0.25:
            kwargs["cancelled"] = Cancel(rng.randrange(1, 6))
    raiser = rng.choice(["on_finish", "on_text", "cancelled", "feed"]) if fault == "callback" else None
    if raiser in ("on_text", "cancelled"):
        settings[rng.randrange(len(settings))][raiser] = Calls(True) if raiser == "on_text" else Cancel(rng.randrange(1, 4), raises=True)
    odd_feed = rng.choice(ODD_FEEDS) if fault == "feed" else None
    batch_size = rng.choice([1, 2, 3, 8])
    arrivals = [rng.random() < 0.6 for _ in range(40)]  # whether the feed's next question finds a request come
    starts = [prompt(starts_rng, vocab) for _ in range(starts_rng.randrange(1, 4))] if starts_rng.random() < 0.4 else []
    start_kwargs = {k: v for k, v in request_kwargs(starts_rng, False).items() if k not in ("raw", "on_text", "cancelled")}
    start_fault = starts_rng.choice(START_FAULTS) if starts and fault is None and starts_rng.random() < 1 / 3 else None
    odd_start = starts_rng.choice(ODD_STARTS[start_fault]) if start_fault in ODD_STARTS else None
    if start_fault == "prompt":
        starts[starts_rng.randrange(len(starts))] = prompt(starts_rng, vocab, True)
    if start_fault is not None:
        fault = f"start {start_fault}"
    m = len(starts)  # the starts take indices 0..m-1, the fed requests m on
    text = (f"Speculator.from_model(model{'' if with_tokenizer else ', None'}, {', '.join([shown(drafter)] + [f'{k}={shown(v)}' for k, v in opts.items()])})"
            f" fed {len(prompts)} request(s) at batch size {batch_size}: "
            + (f"after {m} prompt(s) given at the start, {shown(starts)}, with {start_kwargs}: " if starts else "")
            + (f"(run_batch's {start_fault} given as {shown(odd_start)}) " if odd_start is not None else "")
            + "; ".join(f"request({m + i}, {shown(p)}, {', '.join(f'{k}={shown(v)}' for k, v in kw.items())})" for i, (p, kw) in enumerate(zip(prompts, settings)))
            + (f"; {raiser} raises" if raiser else "") + (f"; the feed hands back {odd_feed}" if odd_feed else "") + (" ; an index twice" if fault == "index" else ""))
    results, finished = {}, []

    def attempt() -> tuple[str, str]:
        spec = Speculator.from_model(model, tokenizer if with_tokenizer else None, drafter, **opts)
        # what each of the feed's answers hands back: one request, or with an index fault a request
        # and a second under its index, together (a later batch may take an index again)
        queue = [[spec.request(m + i, p, **kw)] for i, (p, kw) in enumerate(zip(prompts, settings))]
        if fault == "index":
            twin = rng.randrange(len(queue))
            # the feed's first answer, in the batch the starts are in, may take a start's index
            again = starts_rng.randrange(m) if m and twin == 0 and starts_rng.random() < 0.5 else m + twin
            queue[twin].append(spec.request(again, prompts[0], 4))
        asked, opened = iter(arrivals), False

        def feed():
            nonlocal opened
            if not opened:  # a batch starts with the request that opened it
                opened = True
                return queue.pop(0)
            if raiser == "feed" and finished:
                raise Boom("a feed of ours raised")
            if odd_feed is not None and len(queue) <= 1:
                return {"None": None, "one request": queue.pop()[0] if queue else None, "texts": ["a prompt"]}.get(odd_feed, [])
            return queue.pop(0) if queue and next(asked, True) else []

        def on_finish(result):
            finished.append(result)
            results[result.index] = result
            if raiser == "on_finish":
                raise Boom("an on_finish of ours raised")

        given = {"prompts": starts, "config": call_config(spec, start_kwargs), "batch": BatchConfig(batch_size)}
        made = {"tensor2d": lambda: torch.tensor([[5, 6, 7]]), "BatchConfig": lambda: BatchConfig(batch_size), "DecodeConfig": DecodeConfig}
        if start_fault in ODD_STARTS:
            given[start_fault] = made[odd_start]() if isinstance(odd_start, str) and odd_start in made else odd_start
        while queue:  # what arrives after a batch's last row ends starts the next batch
            opened = False
            spec.run_batch(given["prompts"], given["config"], given["batch"], on_finish, feed=sum(queue, []) if odd_feed == "not callable" else feed)
            given["prompts"] = []  # the starts are the first batch's
        return check_fed(spec, starts + prompts, [start_kwargs] * m + settings, results, finished)

    return (*judged(attempt, fault), text)


def main() -> int:
    ns, numbers = run_numbers(__doc__.split("\n\n")[0], "bench-out/api_fuzz", {
        "--feed": "draw `request` + `run_batch(feed=)` batches instead of generate/generate_batch calls (runs of their own)"})

    from typer.testing import CliRunner
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ngspec.cli.app import app

    ns.out.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp, (ns.out / f"runs-{'feed-' * ns.feed}{ns.seed}-{'only' if ns.only else ns.first}.jsonl").open("w") as log:
        fx = Fixtures(Path(tmp), CliRunner(), app)
        model, tokenizer = AutoModelForCausalLM.from_pretrained(fx.model).eval(), AutoTokenizer.from_pretrained(fx.model)
        for n in numbers:
            run_dir = Path(tmp) / f"run{n}"
            run_dir.mkdir()
            start = time.perf_counter()
            if ns.feed:
                verdict, detail, trace, text = feed_run(random.Random(f"{ns.seed} {n} feed"), fx, model, tokenizer, run_dir, random.Random(f"{ns.seed} {n} starts"))
            else:
                verdict, detail, trace, text = one_run(random.Random(f"{ns.seed} {n}"), fx, model, tokenizer, run_dir)
            seconds = time.perf_counter() - start
            counts[verdict] = counts.get(verdict, 0) + 1
            log.write(json.dumps({"run": n, "verdict": verdict, "detail": detail, "seconds": round(seconds, 2), "call": text,
                                  **({"traceback": trace[-4000:]} if trace else {})}, ensure_ascii=False) + "\n")
            log.flush()
            print(f"{n:5d} {verdict:10s} {seconds:5.1f}s {detail[:110]}", flush=True)
            if verdict == "FINDING":
                print("      " + text[:400], flush=True)
    print(json.dumps(counts))
    return 1 if counts.get("FINDING") else 0


if __name__ == "__main__":
    sys.exit(main())
