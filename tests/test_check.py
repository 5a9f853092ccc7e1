import math

import pytest
import torch

from ngspec.check import check_against_greedy, margin_text, rounding_step
from ngspec.decode import DecodeConfig
from ngspec.drafters import make_drafter
from ngspec.engine import Engine
from ngspec.models import LoadedModel

pytestmark = pytest.mark.tiny_llama_only  # the Qwen2 tiny model runs the lossless matrices (conftest)


def test_check_reports_match_and_mismatch_with_margin(tiny):
    engine = Engine(LoadedModel(tiny, None, "tiny"), calibrate=False)
    prompt = [4, 8, 15, 16, 23, 42]
    cfg = DecodeConfig(max_new_tokens=12)
    good = engine.run(prompt, make_drafter("trie"), cfg).token_ids
    assert check_against_greedy(engine, prompt, good, cfg).exact_match

    bad = list(good)
    bad[5] = (bad[5] + 1) % 96
    result = check_against_greedy(engine, prompt, bad, cfg)
    assert not result.exact_match and result.first_mismatch == 5
    with torch.inference_mode():
        logits = tiny(torch.tensor([prompt + good[:5]])).logits[0, -1]
    top = torch.topk(logits, 2).values
    assert abs(result.margin - float(top[0] - top[1])) < 1e-4
    # and in float32 steps at the top logit's size: a margin of whole logits is thousands of them
    assert result.dtype == "float32" and result.steps == pytest.approx(result.margin / rounding_step(float(top[0]), torch.float32))
    assert result.as_dict()["near_tie_steps"] == result.steps and result.as_dict()["near_tie_dtype"] == "float32"
    assert margin_text(result.as_dict()) == f"{result.margin:.3g} ({result.steps:.3g} float32 rounding steps at that logit size)"


def test_a_rounding_step_is_the_distance_to_the_next_value_of_the_dtype():
    for value in (1.0, 0.7, 5.0, 66.38, -66.38, 1e-3, 3e5):
        x = torch.tensor(2.0 ** math.floor(math.log2(abs(value))))  # the step is even over [2^e, 2^(e+1))
        assert rounding_step(value, torch.float32) == float(torch.nextafter(x, torch.tensor(math.inf)) - x)
    assert rounding_step(66.38, torch.float32) == 2.0 ** -17  # the MiniCPM3 tie of 2.3e-5: 3 steps
    assert rounding_step(20.0, torch.bfloat16) == 0.125 and rounding_step(20.0, torch.float16) == 2.0 ** -6
    assert rounding_step(0.0, torch.float32) > 0  # a zero logit: the smallest normal's step, not a log of zero
    assert margin_text({"near_tie_margin": 0.125, "near_tie_steps": 1.0, "near_tie_dtype": "bfloat16"}) == "0.125 (1 bfloat16 rounding step at that logit size)"


def test_a_sampled_mismatch_counts_its_steps_at_the_logits_over_the_temperature(tiny):
    from ngspec.verify import Draws, SamplingConfig, target_probs

    engine = Engine(LoadedModel(tiny, None, "tiny"), calibrate=False)
    prompt = [4, 8, 15, 16, 23, 42]
    sampling = SamplingConfig(temperature=0.5, seed=7)
    cfg = DecodeConfig(max_new_tokens=10, sampling=sampling)
    good = engine.run(prompt, make_drafter("vanilla"), cfg).token_ids
    bad = good[:4] + [(good[4] + 1) % 96] + good[5:]
    result = check_against_greedy(engine, prompt, bad, cfg, seed=7)
    assert not result.exact_match and result.first_mismatch == 4
    with torch.inference_mode():
        logits = tiny(torch.tensor([prompt + good[:4]])).logits[0, -1]
    top = torch.topk(Draws(7, prompt).scores(target_probs(logits, sampling), 4), 2).values
    assert result.margin == pytest.approx(float(top[0] - top[1]), abs=1e-4)
    assert result.steps == pytest.approx(result.margin / (rounding_step(float(logits.max()), torch.float32) / 0.5))


def test_check_decodes_its_reference_on_the_stock_layers(monkeypatch):
    from ngspec.cpu_linear import KernelPlan, TunedLinear, use_plan
    from ngspec.models import tiny_model

    model = tiny_model("llama", seed=2)
    use_plan(model, KernelPlan.uniform("transposed"))
    engine = Engine(LoadedModel(model, None, "tiny"), calibrate=False)
    prompt = [4, 8, 15, 16, 23, 42]
    cfg = DecodeConfig(max_new_tokens=12)
    generated = engine.run(prompt, make_drafter("trie"), cfg).token_ids  # on the tuned kernels

    def refuse(self, x):
        raise AssertionError("the greedy reference ran on tuned kernels")

    monkeypatch.setattr(TunedLinear, "forward", refuse)
    assert check_against_greedy(engine, prompt, generated, cfg).exact_match
    bad = generated[:3] + [(generated[3] + 1) % 96] + generated[4:]
    assert check_against_greedy(engine, prompt, bad, cfg).margin is not None


def test_bench_reports_where_an_arm_split_from_hf_greedy_with_the_margin(tiny):
    from ngspec.bench.report import markdown, summarise, to_json
    from ngspec.bench.runner import ArmRun, BenchRecord
    from ngspec.check import divergence
    from ngspec.metrics.self_repetition import self_repetition
    from ngspec.prompts import Prompt

    engine = Engine(LoadedModel(tiny, None, "tiny"), calibrate=False)
    prompt = [4, 8, 15, 16, 23, 42]
    ref = engine.run(prompt, make_drafter("vanilla"), DecodeConfig(max_new_tokens=10)).token_ids
    bad = ref[:3] + [(ref[3] + 1) % 96] + ref[4:]
    runs = {
        "hf-greedy": ArmRun("p1", ref, 1.0, len(ref), [1] * len(ref), vs_reference=divergence(engine, prompt, ref, ref)),
        "trie": ArmRun("p1", bad, 0.5, 4, [3, 3, 3, 1], vs_reference=divergence(engine, prompt, ref, bad)),
    }
    records = [BenchRecord(Prompt("p1", "text"), len(prompt), runs, self_repetition(prompt, ref))]
    with torch.inference_mode():
        logits = tiny(torch.tensor([prompt + ref[:3]])).logits[0, -1]
    top = torch.topk(logits, 2).values
    margin = float(top[0] - top[1])

    greedy, trie = summarise(records, ["hf-greedy", "trie"])
    assert greedy.exact_match == 1.0 and greedy.largest_tie_margin is None
    assert trie.exact_match == 0.0 and abs(trie.largest_tie_margin - margin) < 1e-4
    steps = margin / rounding_step(float(top[0]), torch.float32)
    assert greedy.largest_tie_steps is None and trie.largest_tie_steps == pytest.approx(steps, rel=1e-3)
    assert f"trie, prompt p1: first differs at token 3, hf-greedy's top-2 margin there {margin:.3g} ({steps:.3g} float32 rounding steps" in markdown(
        [greedy, trie], {}, 1.0, records=records
    )
    run = to_json(records, [greedy, trie], {})["prompts"][0]["runs"]
    assert run["trie"]["first_mismatch"] == 3 and "first_mismatch" not in run["hf-greedy"]
    # the record's own steps: the forward above keeps every position's logits, divergence's the last
    # only (another product shape), and came out 3 float32 steps off in 2.8 million once (CI, 2026-12-06)
    assert run["trie"]["near_tie_steps"] == runs["trie"].vs_reference.steps == pytest.approx(steps, rel=1e-3)
    assert run["trie"]["near_tie_dtype"] == "float32"


def test_transformers_baseline_is_plain_decoding_whatever_the_models_generation_defaults():
    """A model's generation_config.json may ask for sampling, a repetition penalty or banned
    n-grams (Qwen2.5's instruct models ask for `repetition_penalty` 1.05): `bench`'s hf-greedy arm
    and batched reference then decoded something other than plain greedy, and every row of every
    drafter read as a mismatch. Its greedy and sampled runs are now what they are for a model
    without such defaults, stopping at the model's EOS as before."""
    from ngspec.models import tiny_model
    from ngspec.verify import SamplingConfig

    model = tiny_model("llama", seed=3)
    prompt = [4, 8, 15, 16, 23, 42, 4, 8, 15]
    engine = Engine(LoadedModel(model, None, "tiny"), calibrate=False)
    hot = SamplingConfig(0.8, seed=5)
    plain = engine.run(prompt, make_drafter("vanilla"), DecodeConfig(max_new_tokens=24)).token_ids
    before = engine.hf_generate(prompt, 24)[0], engine.hf_generate(prompt, 24, sampling=hot)[0]
    model.generation_config.update(do_sample=True, temperature=0.3, top_k=3, repetition_penalty=1.5, no_repeat_ngram_size=2,
                                   min_new_tokens=30, output_hidden_states="odd")
    after = engine.hf_generate(prompt, 24)[0], engine.hf_generate(prompt, 24, sampling=hot)[0]
    assert before[0] == plain and after == before and len(set(plain)) < len(plain)  # plain greedy repeats: a penalty would change it


def test_batched_bench_gives_each_split_row_its_margin_once_whatever_the_rounds(tiny):
    """`bench --batch-size` names every row that differs from its reference with the reference's
    top-2 margin there (greedy: transformers'; sampled: vanilla's row of that round, scored with
    the prompt's draws), one model pass per distinct output, in its table, markdown and JSON."""
    from ngspec.bench.batched import BatchRound, markdown, row_splits, summarise_batched, to_json
    from ngspec.verify import Draws, SamplingConfig, target_probs

    engine = Engine(LoadedModel(tiny, None, "tiny"), calibrate=False)
    prompts = [[4, 8, 15, 16, 23, 42], [7, 7, 3, 9]]
    cfg = DecodeConfig(max_new_tokens=10)
    ref = [engine.run(p, make_drafter("vanilla"), cfg).token_ids for p in prompts]
    bad = ref[1][:3] + [(ref[1][3] + 1) % 96] + ref[1][4:]
    rounds = lambda *outputs: [BatchRound(1.0, 20, 20, 0.0, 0.0, list(o)) for o in outputs]
    runs = {"vanilla": rounds(ref, ref, ref), "trie": rounds([ref[0], bad], ref, [ref[0], bad])}
    calls = []
    real = engine.loaded.model.forward
    engine.loaded.model.forward = lambda *a, **k: calls.append(1) or real(*a, **k)
    seen = []
    try:
        (split,) = row_splits(engine, runs, prompts, ref, cfg, lambda done, total: seen.append((done, total)))
    finally:
        engine.loaded.model.forward = real
    assert len(calls) == 1 and seen == [(0, 1), (1, 1)]  # rounds 1 and 3 split alike: measured once, under a bar
    assert row_splits(engine, {"vanilla": runs["vanilla"]}, prompts, ref, cfg, lambda *a: seen.append(a)) == [] and len(seen) == 2  # nothing to measure: no bar
    assert (split.arm, split.row, split.rounds, split.check.first_mismatch) == ("trie", 1, (1, 3), 3)
    with torch.inference_mode():
        logits = tiny(torch.tensor([prompts[1] + ref[1][:3]])).logits[0, -1]
    top = torch.topk(logits, 2).values
    margin = float(top[0] - top[1])
    steps = margin / rounding_step(float(top[0]), torch.float32)
    assert split.check.margin == pytest.approx(margin, abs=1e-4) and split.check.steps == pytest.approx(steps, rel=1e-3)
    vanilla, trie = summarise_batched(runs, ref, splits=[split])
    assert vanilla.largest_tie_margin is None and trie.largest_tie_steps == split.check.steps
    labels = ["q1", "q2"]
    text = markdown([vanilla, trie], {}, (1.0, None), [], splits=[split], labels=labels)
    assert f"- trie, prompt q2 (rounds 1, 3): first differs at token 3, transformers' greedy top-2 margin there {margin_text(split.check.as_dict())}" in text
    report = to_json([vanilla, trie], {}, (1.0, None), [], splits=[split], labels=labels)
    assert report["mismatches"] == [{"arm": "trie", "prompt": "q2", "rounds": [1, 3]} | split.check.as_dict()]
    assert "mismatches" not in to_json([vanilla, trie], {}, (1.0, None), [])

    sampling = SamplingConfig(temperature=0.5, seed=7)
    hot = DecodeConfig(max_new_tokens=10, sampling=sampling)
    good = engine.run(prompts[0], make_drafter("vanilla"), hot).token_ids
    off = good[:4] + [(good[4] + 1) % 96] + good[5:]
    sampled = {"vanilla": rounds([good]), "trie": rounds([off])}
    (split,) = row_splits(engine, sampled, prompts[:1], [[0]], hot)  # the reference: vanilla's row, not ``reference``
    with torch.inference_mode():
        logits = tiny(torch.tensor([prompts[0] + good[:4]])).logits[0, -1]
    top = torch.topk(Draws(7, prompts[0]).scores(target_probs(logits, sampling), 4), 2).values
    assert split.check.first_mismatch == 4 and split.check.margin == pytest.approx(float(top[0] - top[1]), abs=1e-4)
    assert "vanilla's top-2 margin" in markdown(summarise_batched(sampled, [[0]], True, [split]), {}, (1.0, None), [], sampled=True, splits=[split], labels=["q1"])
