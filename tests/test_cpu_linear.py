import json

import pytest
import torch
from torch import nn

from conftest import next_run
from ngspec import cpu_linear
from ngspec.cpu_linear import (
    KERNELS, ROW_LADDER, KernelPlan, TunedLinear, current_plan, measure_plan, stock_linears, tune_linears, use_plan,
)
from ngspec.errors import NgspecError
from ngspec.models import tiny_model
from ngspec.target import TargetModel

AVAILABLE = [k for k in KERNELS if cpu_linear.runnable(k)]


@pytest.mark.parametrize("kernel", AVAILABLE)
@pytest.mark.parametrize("bias", [False, True])
def test_every_kernel_computes_the_linear_product_at_every_row_count(kernel, bias):
    torch.manual_seed(0)
    layer = nn.Linear(48, 80, bias=bias)
    reference = nn.Linear(48, 80, bias=bias)
    reference.load_state_dict(layer.state_dict())
    assert use_plan(layer, KernelPlan.uniform(kernel)) == 1 and isinstance(layer, TunedLinear)
    for rows in (1, 2, 3, 4, 5, 9, 33, 200, 600):
        # odd counts as they come (padded ones among them), then non-contiguous, leading dims restored
        x = torch.randn(rows, 48) if rows < 10 else torch.randn(2, rows, 48)[:, : rows // 2]
        with torch.inference_mode():
            got, want = layer(x), reference(x)
        exact = x.double() @ reference.weight.double().t() + (reference.bias.double() if bias else 0)
        assert got.shape == want.shape and got.is_contiguous()
        # float32 products of the same numbers: within float32 rounding of the exact one
        assert torch.allclose(got.double(), exact, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("kernel", [k for k in AVAILABLE if k in cpu_linear.COPIED])
def test_a_copy_of_the_weights_follows_them_when_they_change_in_place(kernel):
    torch.manual_seed(0)
    layer = nn.Linear(48, 80, bias=False)
    use_plan(layer, KernelPlan.uniform(kernel))
    x = torch.randn(5, 48)
    with torch.no_grad():
        layer.weight.mul_(2.0)  # an optimizer step, say
    with torch.inference_mode():
        got = layer(x)
    assert torch.allclose(got, x @ layer.weight.detach().t(), atol=1e-4, rtol=1e-5)
    layer.load_state_dict({"weight": torch.ones(80, 48)})
    with torch.inference_mode():
        assert torch.allclose(layer(x), x @ torch.ones(48, 80), atol=1e-4, rtol=1e-5)
    with torch.inference_mode():  # weights made in inference mode keep no version: still usable
        made = nn.Linear(48, 80, bias=False)
        use_plan(made, KernelPlan.uniform(kernel))
        assert torch.allclose(made(x), x @ made.weight.t(), atol=1e-4, rtol=1e-5)


def test_plan_maps_row_counts_to_the_largest_measured_count_below():
    kernels = ("transposed",) * 3 + ("packed",) * 5 + ("linear",) * (len(ROW_LADDER) - 8)
    plan = KernelPlan(kernels)
    assert [plan.for_rows(n) for n in (1, 3, 4, 15, 16, 10_000)] == ["transposed", "transposed", "packed", "packed", "linear", "linear"]
    assert plan.describe() == "1-3 transposed, 4-15 packed, 16-512+ linear"
    assert plan.copy_kernel == "packed" and KernelPlan.uniform("transposed").copy_kernel is None
    with pytest.raises(ValueError):
        KernelPlan(("linear",))
    with pytest.raises(ValueError):  # two copies of the weights
        KernelPlan(("blocked",) * 3 + ("packed",) * (len(ROW_LADDER) - 3))
    with pytest.raises(ValueError):
        KernelPlan(("gpu",) * len(ROW_LADDER))


def test_tuned_layers_keep_parameters_state_dict_and_tying_and_gradients():
    model = tiny_model("llama")
    keys = set(model.state_dict())
    count = use_plan(model, KernelPlan.uniform("transposed"))
    assert count == sum(isinstance(m, nn.Linear) for m in model.modules()) > 0
    assert set(model.state_dict()) == keys
    layer = model.model.layers[0].mlp.up_proj
    x = torch.randn(7, layer.in_features, requires_grad=True)
    layer(x).sum().backward()  # training takes the ordinary product
    assert x.grad is not None and layer.weight.grad is not None


def test_measured_plan_names_an_available_kernel_per_row_count():
    model = tiny_model("qwen2")
    plan, seconds = measure_plan(model, rounds=1)
    assert len(plan.kernels) == len(ROW_LADDER) and set(plan.kernels) <= set(AVAILABLE)
    assert plan.kernels == cpu_linear.choose_plan(seconds).kernels  # the rule below applied to what was measured


def test_choice_takes_the_fastest_but_packs_only_for_a_clear_gain_and_prefers_the_stock_product():
    choose = cpu_linear.choose
    assert choose({"linear": 50.0, "transposed": 30.0, "packed": 45.0}) == "transposed"
    assert choose({"linear": 50.0, "transposed": 40.0, "packed": 30.0}) == "packed"
    assert choose({"linear": 58.0, "transposed": 60.0, "packed": 57.4}) == "linear"  # packing buys 1%
    assert choose({"linear": 60.0, "transposed": 59.0, "packed": 70.0}) == "linear"  # a tie: stock
    assert choose({"linear": 60.0, "transposed": 50.0}) == "transposed"  # no MKL: no packed entry
    assert choose({"linear": 50.0, "onednn": 40.0, "blocked": 38.5}) == "onednn"  # a copy for 4%: no
    assert choose({"linear": 50.0, "onednn": 40.0, "blocked": 30.0, "packed": 35.0}) == "blocked"


def test_a_plan_holds_at_most_one_copy_of_the_weights():
    """Of the kernels that run on a copy, the plan keeps the one fastest over the ladder, even
    where the other is faster at a few row counts."""
    seconds = {rows: {"linear": 50.0, "transposed": 40.0, "packed": 20.0 if rows == 1 else 35.0, "blocked": 30.0} for rows in ROW_LADDER}
    plan = cpu_linear.choose_plan(seconds)
    assert plan.kernels == ("blocked",) * len(ROW_LADDER)
    no_copies = {rows: {"linear": 50.0, "transposed": 40.0} for rows in ROW_LADDER}
    assert cpu_linear.choose_plan(no_copies).kernels == ("transposed",) * len(ROW_LADDER)


def test_small_models_keep_ordinary_layers_unless_a_kernel_is_forced(monkeypatch):
    monkeypatch.delenv("NGSPEC_CPU_KERNELS", raising=False)
    model = tiny_model("qwen2")
    assert tune_linears(model) is None and current_plan(model) is None
    monkeypatch.setenv("NGSPEC_CPU_KERNELS", "transposed")
    TargetModel(model)
    assert current_plan(model).kernels == ("transposed",) * len(ROW_LADDER)
    assert tune_linears(model) is current_plan(model)  # idempotent
    monkeypatch.setenv("NGSPEC_CPU_KERNELS", "linear")
    assert tune_linears(tiny_model("llama")) is None
    assert tune_linears(tiny_model("llama").to(torch.float64)) is None
    monkeypatch.setenv("NGSPEC_CPU_KERNELS", "onednn")
    monkeypatch.setattr(cpu_linear, "_onednn_works", lambda: False)  # a torch built without oneDNN
    assert tune_linears(tiny_model("llama")) is None
    monkeypatch.setenv("NGSPEC_CPU_KERNELS", "fastest")
    with pytest.raises(NgspecError, match="NGSPEC_CPU_KERNELS"):
        tune_linears(tiny_model("llama"))
    monkeypatch.setenv("NGSPEC_CPU_KERNELS", "")  # set but empty: auto, as unset (it was refused as '')
    assert tune_linears(tiny_model("qwen2")) is None


def test_large_models_are_measured_once_and_read_from_the_cache(monkeypatch, tmp_path, quiet_machine):
    monkeypatch.delenv("NGSPEC_CPU_KERNELS", raising=False)
    monkeypatch.setenv("NGSPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(cpu_linear, "MIN_TUNED_BYTES", 0)
    calls = []
    real = cpu_linear.measure_plan

    def counting(model, rounds=3, progress=None):
        calls.append(1)
        return real(model, rounds=1, progress=progress)

    monkeypatch.setattr(cpu_linear, "measure_plan", counting)
    notes, rounds = [], []
    first = tune_linears(tiny_model("llama"), notify=notes.append, progress=lambda *done: rounds.append(done))
    next_run()
    second = tune_linears(tiny_model("llama"), notify=notes.append, progress=lambda *done: rounds.append(done))
    assert len(calls) == 1 and first.kernels == second.kernels
    assert len(notes) == 1 and "once" in notes[0]  # told before measuring, not when read back
    assert rounds == [(0, 2), (1, 2), (2, 2)]  # the start, a warm-up round and the timed one; nothing when read back
    entry = json.loads(next((tmp_path / "kernels").glob("*.json")).read_text())
    assert tuple(entry["kernels"]) == first.kernels and "seconds" in entry
    next((tmp_path / "kernels").glob("*.json")).write_text("{damaged")
    next_run()
    tune_linears(tiny_model("llama"))  # a damaged entry is measured again
    assert len(calls) == 2


def test_stock_linears_runs_plain_layers_inside_and_restores_the_tuned_ones():
    model = tiny_model("llama")
    count = use_plan(model, KernelPlan.uniform("transposed"))
    with pytest.raises(RuntimeError, match="inside"):
        with stock_linears(model):
            assert not any(isinstance(m, TunedLinear) for m in model.modules())
            raise RuntimeError("inside")
    assert sum(isinstance(m, TunedLinear) for m in model.modules()) == count


def test_bench_baseline_generates_with_stock_layers(monkeypatch):
    from ngspec.engine import Engine
    from ngspec.models import LoadedModel

    monkeypatch.setenv("NGSPEC_CPU_KERNELS", "transposed")
    model = tiny_model("qwen2")
    engine = Engine(LoadedModel(model, None, "tiny"), calibrate=False)  # tunes the model
    assert isinstance(model.lm_head, TunedLinear)

    def refuse(self, x):
        raise AssertionError("the transformers baseline ran on tuned kernels")

    monkeypatch.setattr(TunedLinear, "forward", refuse)
    tokens, seconds = engine.hf_generate(list(range(3, 12)), 5, lookup=True)
    assert len(tokens) == 5 and seconds > 0
    assert isinstance(model.lm_head, TunedLinear)


def test_measurement_reads_a_budget_of_layers_and_every_shape():
    model = tiny_model("llama")
    layers = [m for m in model.modules() if isinstance(m, nn.Linear)]
    first = layers[0].weight.numel() * 4
    chosen = cpu_linear.timed_layers(model, budget=first + 1)  # the first two layers pass it
    assert chosen[:2] == layers[:2]
    assert {tuple(m.weight.shape) for m in chosen} == {tuple(m.weight.shape) for m in layers}
    assert len(chosen) < len(layers)
    assert cpu_linear.timed_layers(model, budget=1 << 40) == layers


@pytest.mark.parametrize("kernel", [None, *AVAILABLE])
def test_planned_product_is_the_product_with_the_plans_kernel(kernel):
    from ngspec.cpu_linear import planned_product

    torch.manual_seed(1)
    weight = torch.randn(70, 24)
    plan = KernelPlan.uniform(kernel) if kernel else None
    for shape in ((1, 24), (3, 24), (2, 5, 24), (40, 24)):
        x = torch.randn(shape)
        got = planned_product(x, weight, plan)
        assert got.shape == (*shape[:-1], 70)
        if kernel in ("transposed", "onednn", "blocked"):  # blocked: oneDNN on the weight as it is
            assert torch.allclose(got.double(), x.double() @ weight.double().T, atol=1e-4, rtol=1e-5)
        else:  # no plan, linear, and packed (the weight has no packed copy): the ordinary product
            assert torch.equal(got, x @ weight.T)


def test_an_eagle_head_runs_the_targets_kernel_plan(monkeypatch):
    from ngspec.drafters.eagle import EagleOptions, eagle_factory
    from ngspec.eagle.head import EagleHead, head_config_for, init_from_target

    target = tiny_model("llama", seed=3)
    head = EagleHead(head_config_for(target))
    init_from_target(head, target)
    monkeypatch.delenv("NGSPEC_CPU_KERNELS", raising=False)
    eagle_factory(target, head, EagleOptions())()
    assert current_plan(head) is None  # a tiny target keeps ordinary layers
    monkeypatch.setenv("NGSPEC_CPU_KERNELS", "transposed")
    eagle_factory(target, head, EagleOptions(head_int8=False))()
    assert current_plan(target) is not None and current_plan(head) is current_plan(target)
    assert all(isinstance(m, TunedLinear) for m in head.modules() if isinstance(m, nn.Linear))
    quantized = eagle_factory(target, head, EagleOptions(head_int8=True))().head  # a copy: fc in float32 runs the plan too
    assert isinstance(quantized.fc, TunedLinear) and current_plan(quantized).kernels == current_plan(target).kernels


def test_plan_counts_each_kernels_fastest_round_so_a_burst_of_other_work_cannot_pick_it(monkeypatch):
    # on a shared VM a burst of other work once made a median of 3 rounds time `blocked` at 16
    # rows 4x slower than at 12 or 24, and batch 8's one-node steps ran a kernel twice as slow
    model = tiny_model("qwen2")
    layers = len(cpu_linear.timed_layers(model))
    now, calls = [0.0], {}

    def fake_kernel(kernel, x, weight, copy):
        key = (kernel, x.shape[0])
        passes = calls.get(key, 0) // layers  # pass 0 warms up, then one pass per round
        calls[key] = calls.get(key, 0) + 1
        slowed = kernel == "transposed" and passes in (1, 2)  # two rounds of three under a burst
        now[0] += {"linear": 2.0, "transposed": 1.0}[kernel] * (10 if slowed else 1)

    monkeypatch.setattr(cpu_linear, "runnable", lambda k: k in ("linear", "transposed"))
    monkeypatch.setattr(cpu_linear, "run_kernel", fake_kernel)
    monkeypatch.setattr(cpu_linear.time, "perf_counter", lambda: now[0])
    plan, seconds = measure_plan(model, rounds=3)
    assert set(plan.kernels) == {"transposed"}
    assert seconds[1] == {"linear": 2.0 * layers, "transposed": 1.0 * layers}


def test_large_row_counts_are_timed_in_fewer_rounds(monkeypatch):
    """From ``LARGE_ROWS`` rows on a pass is long (0.1-0.9 s for the default model) and those rows
    were 60% of the timing: they get ``large_rounds`` timed rounds, the rest every round."""
    model = tiny_model("qwen2")
    layers = len(cpu_linear.timed_layers(model))
    passes: dict[int, int] = {}

    def counting_kernel(kernel, x, weight, copy):
        passes[x.shape[0]] = passes.get(x.shape[0], 0) + 1

    monkeypatch.setattr(cpu_linear, "runnable", lambda k: k == "linear")
    monkeypatch.setattr(cpu_linear, "run_kernel", counting_kernel)
    measure_plan(model, rounds=5, large_rounds=2)
    assert {rows: n // layers for rows, n in passes.items()} == {rows: 6 if rows < cpu_linear.LARGE_ROWS else 3 for rows in ROW_LADDER}
