import pytest
import torch
from torch import nn

from ngspec.models import tiny_model
from ngspec.packed_linear import PACKED_MIN_ROWS, PackedLinear, pack_linears, packing_wanted
from ngspec.target import TargetModel

pytestmark = pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="needs a torch build with MKL")


@pytest.mark.parametrize("bias", [False, True])
def test_packed_matches_ordinary_product_at_every_row_count(bias):
    torch.manual_seed(0)
    layer = nn.Linear(48, 80, bias=bias)
    reference = nn.Linear(48, 80, bias=bias)
    reference.load_state_dict(layer.state_dict())
    assert pack_linears(layer) == 1 and isinstance(layer, PackedLinear)
    for rows in (1, 2, 3, 4, 5, 9, 33, 200):
        x = torch.randn(2, rows, 48)  # leading dimensions are flattened and restored
        with torch.inference_mode():
            got, want = layer(x), reference(x)
        exact = x.double() @ reference.weight.double().t() + (reference.bias.double() if bias else 0)
        assert got.shape == want.shape
        # both are float32 products of the same numbers: within float32 rounding of the exact one
        assert torch.allclose(got.double(), exact, atol=1e-4, rtol=1e-5)


def test_packing_keeps_parameters_state_dict_and_tying_and_is_idempotent():
    model = tiny_model("llama")
    keys = set(model.state_dict())
    count = pack_linears(model)
    assert count == sum(isinstance(m, nn.Linear) for m in model.modules()) > 0
    assert set(model.state_dict()) == keys  # the packed copy is not saved
    first = model.model.layers[0].mlp.up_proj.packed
    assert pack_linears(model) == count and model.model.layers[0].mlp.up_proj.packed is first


def test_gradients_use_the_ordinary_product():
    layer = nn.Linear(16, 8)
    pack_linears(layer)
    x = torch.randn(PACKED_MIN_ROWS + 3, 16, requires_grad=True)
    layer(x).sum().backward()
    assert x.grad is not None and layer.weight.grad is not None


def test_target_packs_cpu_float32_models_unless_turned_off(monkeypatch):
    model = tiny_model("qwen2")
    assert packing_wanted(model)
    TargetModel(model)
    assert isinstance(model.lm_head, PackedLinear)
    monkeypatch.setenv("NGSPEC_CPU_PACK", "0")
    other = tiny_model("qwen2")
    TargetModel(other)
    assert not any(isinstance(m, PackedLinear) for m in other.modules())
    assert not packing_wanted(tiny_model("llama").to(torch.float64))


def test_stock_linears_runs_plain_layers_inside_and_restores_the_packed_ones():
    from ngspec.packed_linear import stock_linears

    model = tiny_model("llama")
    count = pack_linears(model)
    first = model.model.layers[0].mlp.up_proj.packed
    with pytest.raises(RuntimeError, match="inside"):
        with stock_linears(model):
            assert not any(isinstance(m, PackedLinear) for m in model.modules())
            raise RuntimeError("inside")
    assert sum(isinstance(m, PackedLinear) for m in model.modules()) == count
    assert model.model.layers[0].mlp.up_proj.packed is first


def test_bench_baseline_generates_with_stock_layers(monkeypatch):
    from ngspec.engine import Engine
    from ngspec.models import LoadedModel

    model = tiny_model("qwen2")
    engine = Engine(LoadedModel(model, None, "tiny"), calibrate=False)  # packs the model
    assert isinstance(model.lm_head, PackedLinear)

    def refuse(self, x):
        raise AssertionError("the transformers baseline ran on packed weights")

    monkeypatch.setattr(PackedLinear, "forward", refuse)
    tokens, seconds = engine.hf_generate(list(range(3, 12)), 5, lookup=True)  # 9-token prefill: packed rows
    assert len(tokens) == 5 and seconds > 0
    assert isinstance(model.lm_head, PackedLinear)
