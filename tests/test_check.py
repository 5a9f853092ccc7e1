import torch

from ngspec.check import check_against_greedy
from ngspec.decode import DecodeConfig
from ngspec.drafters import make_drafter
from ngspec.engine import Engine
from ngspec.models import LoadedModel


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
