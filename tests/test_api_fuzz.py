"""`benchmarks/api_fuzz.py`: its judge tells ngspec's own refusals from Python's words and from
exceptions it did not mean to raise, and its output check catches outputs that do not hold
together or differ from plain decoding."""

import random
from dataclasses import replace
from types import SimpleNamespace

import pytest

from conftest import benchmark_script
from ngspec import NgspecError, Speculator
from ngspec.models import tiny_model

api_fuzz = benchmark_script("api_fuzz")


@pytest.mark.parametrize(
    ("exc", "verdict"),
    [
        (NgspecError("batch_size must be at least 1 (got 0)"), "refused"),
        (NgspecError("could not load model 'm': 'int' object has no attribute 'items'"), "FINDING"),  # Python's words
        (NgspecError("first line\nsecond line"), "FINDING"),
        (NgspecError(""), "FINDING"),
        (TypeError("unhashable type: 'list'"), "FINDING"),
        (api_fuzz.Boom("ours"), "propagated"),
    ],
)
def test_the_judge_of_an_exception(exc, verdict):
    assert api_fuzz.judge_error(exc)[0] == verdict


@pytest.fixture(scope="module")
def spec():
    return Speculator.from_model(tiny_model("llama", seed=0), drafter="trie")


def test_the_output_check_passes_a_true_output_and_catches_a_changed_one(spec):
    prompt, kwargs = [5, 6, 7, 5, 6, 7, 5, 6], {"max_new_tokens": 8}
    out = spec.generate(prompt, **kwargs)
    assert api_fuzz.check_outputs(spec, "generate", [prompt], kwargs, out)[0] == "ok"
    wrong = [(out.token_ids[0] + 1) % 96, *out.token_ids[1:]]
    for bad in (replace(out, token_ids=wrong), replace(out, new_tokens=7), replace(out, finish_reason="length", token_ids=out.token_ids[:3], new_tokens=3),
                replace(out, prompt_tokens=3), replace(out, finish_reason="stop")):
        assert api_fuzz.check_outputs(spec, "generate", [prompt], kwargs, bad)[0] == "FINDING", bad
    assert api_fuzz.check_outputs(spec, "generate_batch", [prompt, prompt], kwargs, [out])[0] == "FINDING"  # one output for two prompts
    calls = api_fuzz.Calls(False)
    calls(0, replace(out, token_ids=wrong))  # on_output handed other tokens than the output returned
    assert api_fuzz.check_outputs(spec, "generate_batch", [prompt], {**kwargs, "on_output": calls}, [out])[0] == "FINDING"


def test_valid_draws_of_drafter_options_pass_the_checks_made_before_a_model_loads(tmp_path):
    """A run without a fault draws options its drafter reads, in range: otherwise the search would
    spend its valid runs on refusals."""
    from ngspec.api import check_choice, drafting_options

    fx = SimpleNamespace(model=tmp_path / "m", datastore=tmp_path / "d", table=tmp_path / "t.npz", corpus=tmp_path / "c.jsonl")
    (fx.model / "head").mkdir(parents=True)
    fx.datastore.mkdir()
    fx.table.write_bytes(b"")
    for drafter in api_fuzz.READS:
        for n in range(30):
            opts = api_fuzz.drafter_options(random.Random(n), fx, drafter, tmp_path)
            check_choice(drafter, drafting_options(opts))


def test_the_check_of_fed_requests_passes_a_true_batch_and_catches_a_wrong_one(spec):
    """`--feed` runs: one result per request, handed to on_finish once, as `generate` gives it; a
    cancelled one a start of plain decoding."""
    from ngspec.batch import BatchConfig
    from ngspec.decode import DecodeConfig

    prompts = [[5, 6, 7, 5, 6, 7], [9, 8, 9, 8]]
    settings = [{"max_new_tokens": 8}, {"max_new_tokens": 16, "cancelled": api_fuzz.Cancel(3)}]
    queue = [spec.request(i, p, **kw) for i, (p, kw) in enumerate(zip(prompts, settings))]
    finished = []
    spec.run_batch([], DecodeConfig(), BatchConfig(2), finished.append, feed=lambda: [queue.pop(0)] if queue else [])
    results = {r.index: r for r in finished}
    assert results[1].generation.finish_reason == "cancelled" and 0 < len(results[1].generation.token_ids) < 16
    assert api_fuzz.check_fed(spec, prompts, settings, results, finished)[0] == "ok"
    assert api_fuzz.check_fed(spec, prompts, settings, {0: results[0]}, finished[:1])[0] == "FINDING"  # a request without a result
    assert api_fuzz.check_fed(spec, prompts, settings, results, finished + finished[:1])[0] == "FINDING"  # on_finish twice
    cut = replace(results[1], generation=replace(results[1].generation, token_ids=[(t + 1) % 96 for t in results[1].generation.token_ids]))
    assert api_fuzz.check_fed(spec, prompts, settings, {0: results[0], 1: cut}, [results[0], cut])[0] == "FINDING"  # not plain decoding's start
    assert api_fuzz.check_fed(spec, prompts, [settings[0], {"max_new_tokens": 16}], results, finished)[0] == "FINDING"  # cancelled unasked
