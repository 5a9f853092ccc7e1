"""The Python API (`ngspec.Speculator`): token-identical to plain greedy decoding through every
door (a model passed in or loaded, one prompt or a batch, text, chat messages or token ids), its
options reach the drafters, and bad input raises one clear `NgspecError`."""

import json
import random
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest
import torch

from conftest import hf_greedy, repetitive_prompt, started_head
from ngspec import NgspecError, Output, Speculator
from test_lossless import VOCAB

pytestmark = pytest.mark.tiny_llama_only  # the Qwen2 tiny model runs the lossless matrices (conftest)


@pytest.fixture(scope="module")
def prompts_and_expected(tiny):
    rng = random.Random(11)
    prompts = [repetitive_prompt(rng, VOCAB, rng.randrange(5, 80)) for _ in range(5)]
    eos = tiny.generation_config.eos_token_id  # the API stops at the model's EOS, as transformers does
    return prompts, [hf_greedy(tiny, p, 24, eos) for p in prompts]


@pytest.mark.parametrize("drafter", ["vanilla", "trie", "prompt-lookup", "context-ngram", "search"])
def test_a_model_passed_in_generates_its_plain_greedy_tokens(tiny, prompts_and_expected, drafter):
    spec = Speculator.from_model(tiny, drafter=drafter)
    prompts, expected = prompts_and_expected
    for prompt, want in zip(prompts, expected):
        out = spec.generate(prompt, max_new_tokens=24)
        assert out.token_ids == want
        assert out.text is None  # no tokenizer
        assert out.new_tokens == len(want) and out.prompt_tokens == len(prompt)
        assert out.finish_reason == ("length" if len(want) == 24 else "eos")
        assert out.verify_calls >= 1 and out.mean_tokens_per_call == pytest.approx(len(want) / out.verify_calls)


@pytest.mark.parametrize("batch_size", [1, 4])
def test_a_batch_gives_each_prompt_its_own_plain_greedy_tokens_in_order(tiny, prompts_and_expected, batch_size):
    prompts, expected = prompts_and_expected
    too_long = [1] * 600  # the tiny model's context window is 512
    seen = []
    outs = Speculator.from_model(tiny, drafter="trie").generate_batch(
        prompts[:2] + [too_long] + prompts[2:], max_new_tokens=24, batch_size=batch_size, on_output=lambda i, o: seen.append((i, o)),
    )
    assert sorted(i for i, _ in seen) == list(range(len(outs))) and all(outs[i] is o for i, o in seen)
    assert [o.token_ids for o in outs[:2] + outs[3:]] == expected
    failed = outs[2]
    assert failed.finish_reason == "error" and failed.token_ids == [] and "context window is 512" in failed.error
    assert all(o.error is None for o in outs[:2] + outs[3:])


def test_options_reach_the_drafter(tiny, prompts_and_expected):
    """A row drafter's (k, w) and the trie's node cap are the keyword arguments given."""
    prompts, expected = prompts_and_expected
    rows = Speculator.from_model(tiny, drafter="context-ngram", k=3, w=2)
    assert (rows.options_for(10).k, rows.options_for(10).w) == (3, 2)
    out = rows.generate(prompts[0], max_new_tokens=24)
    assert out.token_ids == expected[0] and out.drafter_stats is not None
    capped = Speculator.from_model(tiny, drafter="trie", num_draft=1).generate(prompts[0], max_new_tokens=24)
    assert capped.token_ids == expected[0] and capped.mean_tree_size <= 1


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"drafter": "tri"}, "unknown drafter"),
        ({"nume_draft": 4}, "did you mean num_draft"),
        ({"eagle_head": "some/head"}, "^eagle_head is only used by the eagle"),
        ({"drafter": "eagle"}, r"need eagle_head \(an EAGLE"),
        ({"drafter": "search", "datastore": "no/such/store"}, "no datastore at"),
        ({"num_draft": 0}, "^num_draft must be >= 1"),
        ({"drafter": "search", "k": 3}, "^k is only used by the context-ngram, unigram, bigram and mixed drafters$"),  # was ignored
        ({"drafter": "eagle+search", "eagle_head": ".", "head_int8": False, "trie_update": False}, r"^trie_update=False is only used by the trie drafter$"),
        ({"drafter": "context-ngram", "k": 0}, "^k must be >= 1"),
        ({"target_graphs": True}, "target_graphs needs a model on a CUDA GPU"),
    ],
)
def test_bad_options_are_refused_before_anything_runs(tiny, kwargs, message):
    kwargs = {"drafter": "trie", **kwargs}
    with pytest.raises(NgspecError, match=message):
        Speculator.from_model(tiny, **kwargs)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda s: s.generate("some text"), "text prompts need a tokenizer"),
        (lambda s: s.generate([{"role": "user", "content": "hi"}]), "chat messages need a tokenizer"),
        (lambda s: s.generate([1, 2], stop=["x"]), "stop strings need a tokenizer"),
        (lambda s: s.generate([1, 2], on_text=print), r"streamed text \(on_text\) need a tokenizer"),
        (lambda s: s.generate([1, 200]), r"token id 200 is outside the model's vocabulary \(0..95\)"),
        (lambda s: s.generate([1, True]), "a prompt is a str"),
        (lambda s: s.generate([1, 2.0]), "a prompt is a str"),
        (lambda s: s.generate([]), "the prompt is empty"),
        (lambda s: s.generate(None), r"a prompt is a str.* \(got None\)$"),  # was "NoneType"
        (lambda s: s.generate(7), r"a prompt is a str.* \(got an int\)$"),
        (lambda s: s.generate_batch(7), r"generate_batch takes a list of prompts \(got an int\)$"),  # was "a int"
        (lambda s: s.generate(torch.tensor(3)), r"token ids must be one row \(got a Tensor of shape \(\)\)"),
        (lambda s: s.generate_batch("one prompt"), "generate_batch takes a list of prompts"),
        (lambda s: s.generate([1, 2], max_new_tokens=0), "^max_new_tokens must be at least 1"),
        (lambda s: s.generate([1, 2], top_p=0.0, temperature=1.0), "top_p"),
        (lambda s: s.generate_batch([[1, 2]], batch_size=0), "^batch_size must be at least 1"),
        (lambda s: s.generate_batch([[1, 2]], layout="diagonal"), "^layout must be one of"),
        (lambda s: s.generate_batch([[1, 2], [1, 200]]), r"^prompt 1: token id 200 is outside the model's vocabulary"),
    ],
)
def test_bad_input_raises_one_clear_error(tiny, call, message):
    with pytest.raises(NgspecError, match=message):
        call(Speculator.from_model(tiny, drafter="trie"))


def test_errors_shared_with_the_cli_name_the_python_arguments():
    """The checks the CLI shares name its flags; the API raises them in its own words, leaving
    commands quoted in backticks and flags that are no argument here as they are."""
    from ngspec.api import in_api_words

    assert in_api_words("--batch-size must be at least 1 (got 0)") == "batch_size must be at least 1 (got 0)"
    assert in_api_words("--target-graphs verifies the padded layout: leave out --batch-layout packed") == (
        "target_graphs verifies the padded layout: leave out layout='packed'")
    assert in_api_words("--tree-choices is a static tree's shape: use --tree static") == "tree_choices is a static tree's shape: use tree='static'"
    assert in_api_words("the eagle drafters need --eagle-head DIR (a head)") == "the eagle drafters need eagle_head (a head)"
    assert in_api_words("--head-float32 and --k, --w") == "head_int8=False and k, w"
    assert in_api_words("rebuild it with `ngspec build-bigram --bigram-table x --out y` or --json") == (
        "rebuild it with `ngspec build-bigram --bigram-table x --out y` or --json")


def test_a_tensor_or_array_of_token_ids_is_a_prompt(tiny):
    """As token ids come: a list (of Python or numpy integers), a 1-D tensor or array, or a
    tokenizer's one-row batch (``return_tensors="pt"``)."""
    import numpy as np

    spec = Speculator.from_model(tiny, drafter="trie")
    ids = [5, 9, 2, 7]
    want = spec.generate(ids, max_new_tokens=6).token_ids
    assert spec.generate(torch.tensor(ids), max_new_tokens=6).token_ids == want
    assert spec.generate(np.array(ids), max_new_tokens=6).token_ids == want
    assert spec.generate(torch.tensor([ids]), max_new_tokens=6).token_ids == want
    assert spec.generate([np.int64(t) for t in ids], max_new_tokens=np.int64(6)).token_ids == want
    assert [o.token_ids for o in spec.generate_batch(t for t in [ids, ids[:2]])] == [o.token_ids for o in spec.generate_batch([ids, ids[:2]])]


def test_a_pandas_column_or_numpy_array_of_prompts_is_a_list_of_prompts(tiny):
    """`generate_batch(df["prompt"])` (prompts kept in a table) was refused as "one prompt of
    token ids": a 1-D array or column of objects (texts, rows of ids) is a list of prompts; a
    1-D array of numbers is still one prompt, and a whole table is refused pointing to a column."""
    import numpy as np
    import pandas as pd

    spec = Speculator.from_model(tiny, drafter="trie")
    rows = [[5, 9, 2, 7], [3, 1]]
    want = [o.token_ids for o in spec.generate_batch(rows, max_new_tokens=6)]
    column = pd.DataFrame({"prompt": rows})["prompt"]
    for prompts in (column, np.array(rows, dtype=object), pd.Series([np.array(r) for r in rows])):
        assert [o.token_ids for o in spec.generate_batch(prompts, max_new_tokens=6)] == want
    with pytest.raises(NgspecError, match=r"for one prompt of token ids, call generate or pass \[ids\]"):
        spec.generate_batch(pd.Series(rows[0]))
    with pytest.raises(NgspecError, match=r"not a table \(DataFrame\): pass the column that holds the prompts \(df\['prompt'\]\)"):
        spec.generate_batch(pd.DataFrame({"prompt": rows}))


class Odd:
    """A value of no type an argument takes."""

    def __repr__(self) -> str:
        return "Odd()"


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda s: s.generate([1, 2], max_new_tokens="5"), r"max_new_tokens must be an integer \(got '5'\)"),
        (lambda s: s.generate([1, 2], max_new_tokens=2.5), r"max_new_tokens must be an integer \(got 2.5\)"),
        (lambda s: s.generate([1, 2], max_new_tokens=None), r"max_new_tokens must be an integer \(got None\)"),
        (lambda s: s.generate([1, 2], max_new_tokens=True), r"max_new_tokens must be an integer \(got True\)"),
        (lambda s: s.generate([1, 2], temperature="0.5"), r"temperature must be a number \(got '0.5'\)"),
        (lambda s: s.generate([1, 2], top_p=None), r"top_p must be a number \(got None\)"),
        (lambda s: s.generate([1, 2], temperature=1.0, top_k=1.5), r"top_k must be an integer \(got 1.5\)"),
        (lambda s: s.generate([1, 2], temperature=1.0, seed="a"), r"seed must be an integer or None \(got 'a'\)"),
        (lambda s: s.generate([1, 2], temperature=1.0, seed=1.5), r"seed must be an integer or None \(got 1.5\)"),
        (lambda s: s.generate([1, 2], stop=5), r"stop must be a string or a list of strings \(got 5\)"),
        (lambda s: s.generate([1, 2], stop={"a" * 50: 1}), r"stop must be a string or a list of strings \(got a dict\)"),
        (lambda s: s.generate([1, 2], on_text=5), r"on_text must be a function or None \(got 5\)"),
        (lambda s: s.generate([1, 2], raw="no"), r"raw must be True or False \(got 'no'\)"),
        (lambda s: s.generate([1, 2], check="no"), r"check must be True or False \(got 'no'\)"),
        (lambda s: s.generate_batch([[1, 2]], raw=1), r"raw must be True or False \(got 1\)"),
        (lambda s: s.generate(torch.ones(2, 2, dtype=torch.long)), r"token ids must be one row \(got a Tensor of shape \(2, 2\)\); for several prompts call generate_batch"),
        (lambda s: s.generate(torch.tensor([1.0, 2.0])), r"token ids must be integers \(got a tensor or array of torch.float32\)"),
        (lambda s: s.generate([1, Odd()]), r"a prompt is a str.* \(got a list holding Odd\(\)\)"),
        (lambda s: s.generate_batch([[1, 2]], batch_size=2.5), r"batch_size must be an integer \(got 2.5\)"),
        (lambda s: s.generate_batch([[1, 2]], batch_size="2"), r"batch_size must be an integer \(got '2'\)"),
        (lambda s: s.generate_batch([[1, 2]], rearrange_every=1.5), r"rearrange_every must be an integer or None \(got 1.5\)"),
        (lambda s: s.generate_batch([[1, 2]], rearrange_min_share="x"), r"rearrange_min_share must be a number or None \(got 'x'\)"),
        (lambda s: s.generate_batch([[1, 2]], prefill_tokens=1.5), r"prefill_tokens must be an integer or None \(got 1.5\)"),
        (lambda s: s.generate_batch([[1, 2]], on_output=5), r"on_output must be a function or None \(got 5\)"),
        (lambda s: s.generate_batch(None), r"generate_batch takes a list of prompts \(got None\)"),
        (lambda s: s.generate_batch({"a": 1}), r"generate_batch takes a list of prompts \(got a dict\)"),
        (lambda s: s.generate_batch(torch.ones(2, 3, dtype=torch.long)), r"not a 2-D Tensor: pass one prompt per row without its padding"),
        (lambda s: s.generate_batch(torch.ones(3, dtype=torch.long)), r"for one prompt of token ids, call generate or pass \[ids\]"),
    ],
)
def test_arguments_of_the_wrong_type_raise_one_clear_error_before_anything_runs(tiny, call, message):
    """Each names the argument, what it takes and what it got, before any token is generated (an
    ``on_output`` that cannot be called would otherwise fail after the whole batch ran)."""
    spec = Speculator.from_model(tiny, drafter="trie")
    ran = []
    spec.run, spec.run_batch = (lambda *a, **k: ran.append(a)), (lambda *a, **k: ran.append(a))
    with pytest.raises(NgspecError, match=message):
        call(spec)
    assert ran == []


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_draft": None}, r"num_draft must be an integer \(got None\)"),
        ({"num_draft": 4.0}, r"num_draft must be an integer \(got 4.0\)"),
        ({"trie_update": "no"}, r"trie_update must be True or False \(got 'no'\)"),
        ({"drafter": "search", "datastore": 5}, r"datastore must be a path or None \(got 5\)"),
        ({"drafter": "eagle", "eagle_head": Odd()}, r"eagle_head must be a path or None \(got Odd\(\)\)"),
        ({"drafter": "eagle+search", "tree_depth": "5"}, r"tree_depth must be an integer or None \(got '5'\)"),
        ({"drafter": ["trie"]}, r"unknown drafter \['trie'\]; choose one of"),
        ({"target_graphs": "no"}, r"target_graphs must be True or False \(got 'no'\)"),
    ],
)
def test_drafter_options_of_the_wrong_type_are_refused_by_name(tiny, kwargs, message):
    kwargs = {"drafter": "trie", **kwargs}
    with pytest.raises(NgspecError, match=message):
        Speculator.from_model(tiny, **kwargs)
    with pytest.raises(NgspecError, match=message):
        Speculator.load("no/such/model", **kwargs)  # before any model loads


def test_a_tokenizer_of_another_model_is_refused_as_the_speculator_is_made(tiny):
    from ngspec.models import load_tokenizer

    with pytest.raises(NgspecError, match=r"has 49152 tokens but the model has embeddings for 96: they belong to different models"):
        Speculator.from_model(tiny, load_tokenizer())


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda tiny: Speculator.from_model(None), r"from_model takes a loaded model \(a torch.nn.Module; got None\)$"),
        (lambda tiny: Speculator.from_model("default"), r"got 'default'\): to load a model by name or path, use Speculator.load\('default'\)"),
        (lambda tiny: Speculator.from_model(torch.nn.Linear(2, 2)), r"takes a transformers causal language model \(.*; got a Linear\)$"),
        (lambda tiny: Speculator.from_model(torch.nn.Module()), r"takes a transformers causal language model \(.*; got a Module\)$"),
        (lambda tiny: Speculator.from_model(tiny, name=["a"]), r"name must be a string or None \(got \['a'\]\)$"),
        (lambda tiny: Speculator.load(None), r"model must be a name or a path \(got None\)"),
        (lambda tiny: Speculator.load(5), r"model must be a name or a path \(got 5\)"),
        (lambda tiny: Speculator.load("default", profile=5), r"profile must be a path or None \(got 5\)"),
        (lambda tiny: Speculator.load("default", trust_remote_code="yes"), r"trust_remote_code must be True or False \(got 'yes'\)"),
        (lambda tiny: Speculator.from_model(tiny, "default"), r"tokenizer must be a loaded tokenizer \(.*\) or None \(got 'default'\)$"),
    ],
)
def test_a_model_of_the_wrong_kind_is_refused_with_what_to_call(tiny, call, message):
    with pytest.raises(NgspecError, match=message):
        call(tiny)


def test_sampling_is_checked_against_plain_sampling_and_a_seed_replays_it(tiny, prompts_and_expected):
    """``check`` replays a sampled run with its seed (given, or drawn and reported in
    ``Output.seed``); the same seed gives the same tokens alone, in a batch and with any drafter."""
    prompts, _ = prompts_and_expected
    trie, search = Speculator.from_model(tiny, drafter="trie"), Speculator.from_model(tiny, drafter="search")
    out = trie.generate(prompts[0], max_new_tokens=24, temperature=0.7, top_p=0.9, check=True)
    assert out.greedy_check["exact_match"] and out.seed is not None
    again = search.generate(prompts[0], max_new_tokens=24, temperature=0.7, top_p=0.9, seed=out.seed)
    assert again.token_ids == out.token_ids and again.seed == out.seed
    outs = trie.generate_batch(prompts, max_new_tokens=24, batch_size=3, temperature=0.7, seed=4, check=True)
    assert all(o.greedy_check["exact_match"] and o.seed == 4 for o in outs)
    assert [o.token_ids for o in outs] == [search.generate(p, max_new_tokens=24, temperature=0.7, seed=4).token_ids for p in prompts]
    assert outs[0].token_ids != trie.generate(prompts[0], max_new_tokens=24, temperature=0.7, seed=5).token_ids


def test_requests_fed_to_a_running_batch_give_their_plain_greedy_tokens(tiny, prompts_and_expected):
    """`request` + `run_batch(feed=)`, the path `ngspec serve` batches by: each request its own
    budget, numpy's integers taken as the others are."""
    import numpy as np

    from ngspec.batch import BatchConfig
    from ngspec.decode import DecodeConfig

    prompts, expected = prompts_and_expected
    spec = Speculator.from_model(tiny, drafter="trie")
    queue = [spec.request(np.int64(i), p, np.int64(24 - 4 * i)) for i, p in enumerate(prompts[:3])]
    results, _ = spec.run_batch([], DecodeConfig(), BatchConfig(2), feed=lambda: [queue.pop(0)] if queue else [])
    assert [r.index for r in results] == [0, 1, 2]
    assert [r.generation.token_ids for r in results] == [e[: 24 - 4 * i] for i, e in enumerate(expected[:3])]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"index": "a"}, r"^index must be an integer \(got 'a'\)$"),  # results are ordered by index
        ({"on_text": 5}, r"^on_text must be a function or None \(got 5\)$"),  # was a TypeError mid-batch
        ({"cancelled": True}, r"^cancelled must be a function or None \(got True\)$"),
        # raw=True with chat messages was ignored (they went through the template); the CLI refuses --raw with chat records
        ({"prompt": [{"role": "user", "content": "hi"}], "raw": True}, r"^chat messages go through the chat template; raw=True takes text prompts$"),
    ],
)
def test_a_request_of_the_wrong_kind_is_refused_as_it_is_made(tiny, kwargs, message):
    spec = Speculator.from_model(tiny)
    with pytest.raises(NgspecError, match=message):
        spec.request(**{"index": 0, "prompt": [1, 2, 3], **kwargs})


def _fed_once(*arrivals):
    """A feed that hands back ``arrivals`` one per question, then [] (its first opens the batch)."""
    queue = list(arrivals)
    return lambda: queue.pop(0) if queue else []


@pytest.mark.parametrize(
    "feed, message",
    [  # api_fuzz --feed: each was a TypeError or AttributeError from inside the batch
        (lambda r: _fed_once([r(0)], None), r"^feed must return a list of requests \(made by Speculator.request\), \[\] when none arrived; got None$"),
        (lambda r: _fed_once([r(0)], r(1)), r"; got a Request$"),
        (lambda r: _fed_once([r(0)], ["a prompt"]), r"; got a list holding a str$"),
        (lambda r: [r(0)], r"^feed must be a function or None \(got a list\)$"),
        # results are keyed by index: the second request under one took the first one's result
        (lambda r: _fed_once([r(0)], [r(0)]), r"^feed gave a request with index 0, which this batch already has: give every request an index of its own$"),
        (lambda r: _fed_once([r(2), r(2)]), r"index 2, which this batch already has"),
    ],
)
def test_a_feed_that_hands_back_something_else_than_new_requests_is_refused(tiny, feed, message):
    from ngspec.batch import BatchConfig
    from ngspec.decode import DecodeConfig

    spec = Speculator.from_model(tiny)
    with pytest.raises(NgspecError, match=message):
        spec.run_batch([], DecodeConfig(), BatchConfig(2), feed=feed(lambda i: spec.request(i, [1, 2, 3, 1, 2], 6)))


def test_a_fed_request_may_not_take_the_index_of_a_prompt_given_at_the_start(tiny):
    from ngspec.batch import BatchConfig
    from ngspec.decode import DecodeConfig

    spec = Speculator.from_model(tiny)
    with pytest.raises(NgspecError, match="index 1, which this batch already has"):
        spec.run_batch([[4, 5, 6], [7, 8]], DecodeConfig(max_new_tokens=4), BatchConfig(1), feed=_fed_once([spec.request(1, [1, 2], 4)]))
    results, _ = spec.run_batch([[4, 5, 6], [7, 8]], DecodeConfig(max_new_tokens=4), BatchConfig(1), feed=_fed_once([spec.request(2, [1, 2], 4)]))
    assert [r.index for r in results] == [0, 1, 2] and all(len(r.generation.token_ids) == 4 for r in results)


def test_prompts_given_at_the_start_of_a_run_batch_are_taken_as_generate_batch_takes_them(tiny, prompts_and_expected):
    """Token ids in any of `generate_batch`'s forms, decoded by the `DecodeConfig` given, then a
    request fed under the next index."""
    import numpy as np

    from ngspec.batch import BatchConfig
    from ngspec.decode import DecodeConfig

    prompts, expected = prompts_and_expected
    spec = Speculator.from_model(tiny, drafter="trie")
    starts = (np.array(prompts[0]), tuple(prompts[1]), torch.tensor(prompts[2]))
    results, _ = spec.run_batch(starts, DecodeConfig(max_new_tokens=24), BatchConfig(2), feed=_fed_once([spec.request(3, prompts[3], 24)]))
    assert [r.generation.token_ids for r in results] == expected[:4]


@pytest.mark.parametrize(
    "call, message",
    [  # api_fuzz --feed: each was a TypeError, AttributeError or IndexError from inside the batch
        (lambda s, d, b: s.run_batch("a prompt", d(), b(2)), r"^run_batch takes a list of prompts; for one text prompt, pass \[prompt\]$"),
        (lambda s, d, b: s.run_batch(None, d(), b(2)), r"^run_batch takes a list of prompts \(got None\)$"),
        (lambda s, d, b: s.run_batch([[1, 2], [3, 10**6]], d(), b(2)), r"^prompt 1: token id 1000000 is outside the model's vocabulary \(0\.\.\d+\)$"),
        (lambda s, d, b: s.run_batch([[1, 2], "a prompt"], d(), b(2)), r"^prompt 1: text prompts need a tokenizer"),
        (lambda s, d, b: s.run_batch([], None, b(2)), r"^run_batch's cfg must be a DecodeConfig \(from ngspec.decode; got None\)$"),
        (lambda s, d, b: s.run_batch([], {"max_new_tokens": 8}, b(2)), r"^run_batch's cfg must be a DecodeConfig \(from ngspec.decode; got \{'max_new_tokens': 8\}\)$"),
        (lambda s, d, b: s.run_batch([], d(), 4), r"^run_batch's batch must be a BatchConfig \(from ngspec.batch; got 4\)$"),
        (lambda s, d, b: s.run_batch([], b(4), d()), r"^run_batch's cfg must be a DecodeConfig \(from ngspec.decode; got a BatchConfig\)$"),
    ],
)
def test_run_batch_refuses_its_prompts_and_settings_of_the_wrong_kind_before_any_row_runs(tiny, call, message):
    from ngspec.batch import BatchConfig
    from ngspec.decode import DecodeConfig

    spec = Speculator.from_model(tiny)
    with pytest.raises(NgspecError, match=message):
        call(spec, DecodeConfig, BatchConfig)


def test_output_makes_a_run_batch_result_an_output_a_failed_one_too(tiny, prompts_and_expected):
    """``spec.output(result, prompt_tokens)`` in an ``on_finish``: a prompt that could not run
    gives finish reason "error" (``result.generation`` is None; passing it raised AttributeError)."""
    from ngspec.batch import BatchConfig
    from ngspec.decode import DecodeConfig

    prompts, expected = prompts_and_expected
    spec = Speculator.from_model(tiny)
    too_long = [1, 2] * tiny.config.max_position_embeddings
    results, _ = spec.run_batch([prompts[0], too_long], DecodeConfig(max_new_tokens=24), BatchConfig(2))
    ran, failed = (spec.output(r, len(p)) for r, p in zip(results, [prompts[0], too_long]))
    assert ran.token_ids == expected[0] and ran.prompt_tokens == len(prompts[0]) and ran == spec.output(results[0].generation, len(prompts[0]))
    assert failed.finish_reason == "error" and failed.error == results[1].error and failed.prompt_tokens == len(too_long) and failed.token_ids == []
    with pytest.raises(NgspecError, match=r"^output takes a Generation or a BatchResult \(got None\)$"):
        spec.output(results[1].generation, len(too_long))
    with pytest.raises(NgspecError, match=r"^prompt_tokens must be an integer \(got \[1, 2\]\)$"):
        spec.output(results[0], [1, 2])


def test_an_empty_batch_gives_no_outputs(tiny):
    spec = Speculator.from_model(tiny)
    assert spec.generate_batch([]) == []
    with pytest.raises(NgspecError, match="raw must be True or False"):  # its arguments are checked all the same
        spec.generate_batch([], raw=None)


def test_importing_ngspec_loads_neither_torch_nor_transformers():
    code = "import sys, ngspec; ngspec.__version__; assert 'torch' not in sys.modules and 'transformers' not in sys.modules; ngspec.NgspecError"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.slow
def test_the_default_model_from_text_messages_and_stream_matches_plain_greedy():
    spec = Speculator.load("default", drafter="trie")
    pieces: list[str] = []
    out = spec.generate("Repeat exactly: the cat sat on the mat, the cat sat on the mat.", max_new_tokens=24, on_text=pieces.append, check=True)
    assert out.greedy_check["exact_match"] is True
    assert "".join(pieces) == out.text and out.text
    chat = [{"role": "system", "content": "Answer in one sentence."}, {"role": "user", "content": "What does a trie store?"}]
    outs = spec.generate_batch([chat, "Count from one to five."], max_new_tokens=16, batch_size=2, check=True)
    assert [o.greedy_check["exact_match"] for o in outs] == [True, True]
    # a message list goes through the chat template, system turn included
    ids = spec.encode(chat)
    assert spec.engine.detokenize(ids).count("Answer in one sentence.") == 1
    with pytest.raises(NgspecError, match="needs a 'role' and a 'content'"):
        spec.encode([{"role": "user"}])
    # content as a list of text parts, as OpenAI's clients send it (ngspec serve took them; the API refused them)
    parts = [chat[0], {"role": "user", "content": [{"type": "text", "text": "What does a "}, {"type": "text", "text": "trie store?"}]}]
    assert spec.encode(parts) == ids
    with pytest.raises(NgspecError, match=r"^only text content parts"):
        spec.encode([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
    record = out.as_dict()
    assert json.loads(json.dumps(record))["token_ids"] == out.token_ids and "error" not in record


def test_one_stop_string_is_a_string_not_its_characters(default_model):
    """``stop="the mat"`` stops at "the mat" (it stopped at any of its characters, read as a list
    of one-character strings); an empty stop string is refused."""
    spec = Speculator.from_model(default_model.model, default_model.tokenizer, "trie")
    prompt = "Repeat exactly: the cat sat on the mat, the cat sat on the mat."
    whole = spec.generate(prompt, max_new_tokens=24).text
    assert "the mat" in whole and whole.index("the mat") > whole.index("t")
    out = spec.generate(prompt, max_new_tokens=24, stop="the mat")
    assert out.finish_reason == "stop" and out.text == whole[: whole.index("the mat") + len("the mat")]
    assert spec.generate(prompt, max_new_tokens=24, stop=["the mat"]).text == out.text
    with pytest.raises(NgspecError, match="^stop takes non-empty strings"):
        spec.generate(prompt, max_new_tokens=4, stop=[""])


@pytest.mark.slow
def test_text_and_chat_messages_given_at_the_start_of_a_run_batch_go_through_the_chat_template(default_model):
    """api_fuzz --feed: a text prompt given at the start was read as its characters (a TypeError
    from inside the batch)."""
    from ngspec.batch import BatchConfig
    from ngspec.decode import DecodeConfig

    spec = Speculator.from_model(default_model.model, default_model.tokenizer, "trie")
    prompts = ["Name three colours.", [{"role": "user", "content": "Count to five."}]]
    results, _ = spec.run_batch(prompts, DecodeConfig(max_new_tokens=8), BatchConfig(2))
    assert [r.generation.token_ids for r in results] == [spec.generate(p, max_new_tokens=8).token_ids for p in prompts]


@pytest.mark.slow
def test_eagle_search_with_a_head_and_a_datastore_on_disk(tmp_path, default_model):
    """The path options (eagle_head=, datastore=) are read from disk, and the output is exact."""
    from ngspec.datastore.build import BuildOptions, build_datastore
    from ngspec.eagle.head import save_head

    save_head(started_head(default_model.model), tmp_path / "head")
    prompt = "Explain in two sentences what a suffix array is."
    plain = Speculator.from_model(default_model.model, default_model.tokenizer, "vanilla").generate(prompt, max_new_tokens=20)
    corpus = tmp_path / "c.jsonl"  # the model's own answer: only the datastore holds it
    corpus.write_text(json.dumps({"instruction": "Say hi", "response": plain.text}) + "\n")
    build_datastore(str(corpus), default_model.tokenizer, "smol", tmp_path / "ds", BuildOptions())
    spec = Speculator.from_model(
        default_model.model, default_model.tokenizer, "eagle+search",
        eagle_head=str(tmp_path / "head"), datastore=tmp_path / "ds", deepen=True, search_depth=8,
    )
    out = spec.generate(prompt, max_new_tokens=20)
    assert out.token_ids == plain.token_ids
    assert out.drafter_stats["search_branch_from"]["datastore"] > 0


def test_output_as_dict_leaves_out_what_is_absent():
    out = Output.failed("too long", 7)
    assert out.as_dict()["error"] == "too long" and "greedy_check" not in out.as_dict() and out.as_dict()["text"] is None


def test_a_cpu_speculator_run_from_another_thread_warns_once(tiny):
    spec = Speculator.from_model(tiny)
    results = []
    thread = threading.Thread(target=lambda: results.append(spec.generate([1, 2, 3], max_new_tokens=2)))
    with pytest.warns(RuntimeWarning, match="runs on a thread other than the one that loaded it"):
        thread.start()
        thread.join()
    assert len(results) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spec.generate([1, 2, 3], max_new_tokens=2)  # once only


@pytest.mark.parametrize("drafter", ["trie", "search"])
def test_threads_sharing_one_speculator_take_turns_and_each_gets_its_plain_greedy_tokens(tiny, prompts_and_expected, drafter):
    """A web framework's thread pool calls one Speculator from several threads at once: the
    model's cache is one, so the calls take turns (generate, generate_batch with its check,
    transformers' own generate in bench), each answer its plain greedy decoding. Before, the
    threads shared the cache: `RuntimeError: The size of tensor a (52) must match ...`, or
    wrong tokens."""
    spec = Speculator.from_model(tiny, drafter=drafter)
    prompts, expected = prompts_and_expected
    got, failed = {}, []
    start = threading.Barrier(len(prompts) + 1)

    def one(i):
        start.wait()
        try:
            got[i] = spec.generate(prompts[i], max_new_tokens=24).token_ids
        except Exception as error:  # noqa: BLE001 - reported below
            failed.append(repr(error))

    def batch():
        start.wait()
        try:
            outs = spec.generate_batch(prompts, max_new_tokens=24, batch_size=2, check=True)
            got["batch"] = [o.token_ids for o in outs] if all(o.greedy_check["exact_match"] for o in outs) else "check failed"
        except Exception as error:  # noqa: BLE001
            failed.append(repr(error))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))] + [threading.Thread(target=batch)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "runs on a thread other than ..."
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
    assert not failed, failed
    assert [got[i] for i in range(len(prompts))] == expected and got["batch"] == expected


@pytest.mark.parametrize("callback", ["on_tokens", "on_output"])
def test_a_callback_that_generates_on_the_same_model_is_refused_and_the_speculator_still_works(tiny, prompts_and_expected, callback):
    """A callback runs inside the decoding loop, which holds the model's cache: a generation
    started from it decoded into that cache, and the outer generation's tokens were no longer
    its plain greedy ones (without a word). It is refused by name, from the same Speculator or
    another on the same model, and the Speculator decodes as before after."""
    spec = Speculator.from_model(tiny, drafter="trie")
    other = Speculator.from_model(tiny, drafter="vanilla")  # another Speculator, the same model
    prompts, expected = prompts_and_expected

    def nested(*_):
        (spec if callback == "on_tokens" else other).generate(prompts[1], max_new_tokens=4)

    with pytest.raises(NgspecError, match="started from inside another's callback"):
        if callback == "on_tokens":  # what generate's on_text is called from
            from ngspec.decode import DecodeConfig

            spec.run(prompts[0], DecodeConfig(max_new_tokens=24), nested)
        else:
            spec.generate_batch(prompts[:2], max_new_tokens=24, on_output=nested)
    assert [spec.generate(p, max_new_tokens=24).token_ids for p in prompts] == expected


def _bytes_detokenize(ids: list[int]) -> str:
    """A byte-level tokenizer's decoding: each id is one byte (a multi-byte character spans ids)."""
    return bytes(ids).decode("utf-8", errors="replace")


def test_streamed_text_sends_complete_characters_at_once_and_the_rest_at_the_end():
    """Text streams up to the last complete character as tokens arrive (an incomplete one at the
    end waits for its other bytes, the characters before it do not), and `flush` sends what is
    left once generation ends, so the pieces always add up to the output's text, even one that
    ends mid-character."""
    from ngspec.api import TextDeltas

    cat = list("🐱".encode())  # 4 bytes
    pieces: list[str] = []
    stream = TextDeltas(_bytes_detokenize, pieces.append)
    stream([ord("a")] + cat[:2])  # 'a' complete, the cat half there
    assert pieces == ["a"]
    stream(cat[2:] + [ord("b")] + cat[:1])
    assert pieces == ["a", "🐱b"]
    stream(cat[1:3])  # still incomplete: nothing new
    assert pieces == ["a", "🐱b"]
    stream.flush()  # generation ended mid-character: the replacement character, as the output's text has it
    assert "".join(pieces) == _bytes_detokenize([ord("a")] + cat + [ord("b")] + cat[:3])
    stream.flush()  # nothing twice
    assert "".join(pieces).count("\ufffd") == 1


def test_streamed_text_adds_up_to_the_text_whatever_the_budget(tiny):
    """Through `generate`: ``on_text``'s pieces join to ``Output.text`` at every budget, with a
    byte-level tokenizer whose outputs break characters."""
    def to_bytes(ids: list[int]) -> str:  # ids under 32 are ASCII letters, the rest bytes 0xA0-0xFF
        return _bytes_detokenize([ord("a") + i if i < 32 else 0xA0 + i - 32 for i in ids])

    class ByteTokenizer:
        def decode(self, ids, skip_special_tokens=False):
            return to_bytes(ids)

    spec = Speculator.from_model(tiny, ByteTokenizer(), drafter="trie")
    spec.engine.detokenize = to_bytes
    rng = random.Random(0)
    prompt = repetitive_prompt(rng, VOCAB, 40)
    broken = 0
    for budget in range(1, 40):
        pieces: list[str] = []
        out = spec.generate(prompt, max_new_tokens=budget, on_text=pieces.append)
        assert "".join(pieces) == out.text, budget
        broken += out.text.endswith("\ufffd")
    assert broken  # some budgets end mid-character


def test_the_cli_text_stream_prints_the_held_back_end_when_it_finishes(capsys):
    """`generate` prints what the output's text ends with, even a character cut off by the budget."""
    from ngspec.cli.render import TextStream

    stream = TextStream(_bytes_detokenize)
    stream([ord("a")] + list("🐱".encode())[:2])
    assert capsys.readouterr().out == "a"
    stream.finish()
    assert capsys.readouterr().out == _bytes_detokenize([ord("a")] + list("🐱".encode())[:2])[1:] + "\n"


def test_a_model_passed_in_times_its_cpu_kernels_under_a_bar_the_first_time_only(tmp_path, monkeypatch, quiet_machine):
    """`from_model` on a CPU float32 model: the first time, the kernel timing (about a minute for
    the default model) shows a bar on a terminal, as the CLI's does; the plan, once cached, shows
    none. Before, the Python API sat silent through it."""
    import io

    from rich.console import Console

    from ngspec import cpu_linear
    from ngspec.cli import render
    from ngspec.models import tiny_model

    def measure(model, rounds=cpu_linear.PLAN_ROUNDS, progress=None, large_rounds=cpu_linear.LARGE_ROUNDS):
        for done in range(rounds + 2):
            progress(done, rounds + 1)
        return cpu_linear.KernelPlan.uniform("transposed"), {}

    monkeypatch.setenv("NGSPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(cpu_linear, "MIN_TUNED_BYTES", 0)  # the tiny model's layers are tuned too
    monkeypatch.setattr(cpu_linear, "measure_plan", measure)
    shown = io.StringIO()
    monkeypatch.setattr(render, "err_console", Console(file=shown, force_terminal=True, width=100))
    first = tiny_model("llama", seed=0)
    spec = Speculator.from_model(first, drafter="trie")
    assert "timing matrix kernels (rounds)" in shown.getvalue()
    assert cpu_linear.current_plan(first).kernels == ("transposed",) * len(cpu_linear.ROW_LADDER)
    prompt = [5, 6, 7, 5, 6]
    assert spec.generate(prompt, max_new_tokens=8).token_ids == hf_greedy(first, prompt, 8, first.generation_config.eos_token_id)
    shown.truncate(0)
    shown.seek(0)
    again = tiny_model("llama", seed=0)
    Speculator.from_model(again, drafter="trie")
    assert shown.getvalue() == "" and cpu_linear.current_plan(again) is not None


def test_the_own_server_example_answers_every_prompt_as_plain_decoding_does(tiny_saved, tmp_path):
    """examples/own_server.py, the README's pattern for a server of one's own: requests that
    arrive from another thread while the batch runs, one JSON line per answer (a prompt that
    cannot be one answered with its error), each the tokens plain decoding gives it alone."""
    prompts = ["Summarise: the cat sat on the mat.", "List three primes.", "Say hello.", "Count to ten, please.", "Why is the sky blue?"]
    lines = [json.dumps({"prompt": p}) for p in prompts] + [json.dumps({"prompt": [10**9]})]
    (tmp_path / "prompts.jsonl").write_text("\n".join(lines) + "\n")
    args = ["--model", str(tiny_saved), "--batch-size", "2", "--max-new-tokens", "12", "--every", "0.02", "--prompts", str(tmp_path / "prompts.jsonl")]
    script = Path(__file__).parent.parent / "examples" / "own_server.py"
    run = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300, check=True)
    answers = {a["index"]: a for a in map(json.loads, run.stdout.splitlines())}
    assert sorted(answers) == list(range(len(prompts) + 1))
    assert answers[len(prompts)]["error"].startswith("token id 1000000000 is outside the model's vocabulary")
    plain = Speculator.load(str(tiny_saved), drafter="vanilla")
    assert [answers[i]["token_ids"] for i in range(len(prompts))] == [plain.generate(p, max_new_tokens=12).token_ids for p in prompts]


def test_the_readmes_api_example_reads_its_prompt_file_as_generate_does(monkeypatch):
    """The README's first API example read examples/rag_ngspec.txt with its final newline, which
    `generate --prompt-file` drops: a different prompt, so the two gave different answers (76 and
    96 tokens on the default model) for what reads as the same request."""
    import re

    from ngspec.prompts import load_prompts

    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text()
    call = re.search(r'spec\.generate\((open\("examples/rag_ngspec\.txt"\)[^,]*),', readme)
    assert call is not None, "the README's API example no longer reads examples/rag_ngspec.txt"
    monkeypatch.chdir(root)
    as_the_readme_reads_it = eval(call.group(1))  # the README's own expression
    assert as_the_readme_reads_it == load_prompts(root / "examples" / "rag_ngspec.txt")[0].text
