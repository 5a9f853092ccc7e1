"""Shared fixtures: tiny seeded random models (no download) and the embedded default model."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path
from typing import Sequence

import pytest
import torch

from ngspec.contracts import DraftContext, DraftTree
from ngspec.cpu_linear import stock_linears
from ngspec.models import load_model, tiny_model


@pytest.fixture
def quiet_machine(monkeypatch):
    """Measurements count as made on a quiet machine, however busy it is: tests of what is cached
    must not depend on what else runs beside the suite (a busy one's measurements are not kept;
    tests/test_measured.py tests that)."""
    from ngspec.perf import measured

    monkeypatch.setattr(measured, "BUSY_SHARE", float("inf"))
    monkeypatch.setattr(measured, "_THIS_RUN", {})


def next_run() -> None:
    """Forget what this process has measured, as a new run starts (`ngspec.perf.measured`)."""
    from ngspec.perf import measured

    measured._THIS_RUN.clear()


@pytest.fixture(scope="session", params=["llama", "qwen2"])
def tiny(request):
    return tiny_model(request.param, seed=0)


def pytest_collection_modifyitems(config, items):
    """Files marked `tiny_llama_only` run their tests of the `tiny` fixture on the Llama model
    alone: Qwen2 differs in its attention's biases, which the drafter matrices of test_lossless,
    test_batch, test_static_verify, test_kv, test_rows and the random search of
    test_fuzz_lossless still cross with every drafter (and test_families with other families).
    Running every file on both doubled the tiny models' half of the suite, which a slow CI host
    could not finish in its 90 minutes (BENCHMARKS.md 10zzn). pytest reports them as deselected."""
    dropped = [item for item in items if item.get_closest_marker("tiny_llama_only")
               and getattr(item, "callspec", None) is not None and item.callspec.params.get("tiny") == "qwen2"]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        gone = {id(item) for item in dropped}
        items[:] = [item for item in items if id(item) not in gone]


@pytest.fixture(scope="session")
def default_model():
    return load_model("default", device="cpu")


def hf_greedy(model, prompt: Sequence[int], max_new_tokens: int, eos: int | None = None) -> list[int]:
    """The oracle: transformers' plain greedy generate, on the stock linear layers even where the
    engine has given the model tuned CPU kernels."""
    ids = torch.tensor([list(prompt)])
    with torch.inference_mode(), stock_linears(model):
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos if eos is not None else 0,
        )
    return out[0, ids.shape[1] :].tolist()


def repetitive_prompt(rng: random.Random, vocab: int, length: int) -> list[int]:
    """Random tokens with repeated spans, so that search drafters find matches."""
    base = [rng.randrange(vocab) for _ in range(length // 2)]
    out = list(base)
    while len(out) < length:
        start = rng.randrange(len(base))
        out.extend(base[start : start + rng.randrange(2, 10)])
    return out[:length]


class OracleDrafter:
    """Knows the true output (continuation[i] is the i-th generated token) and proposes noisy trees
    around it: exercises deep acceptance, accepted paths
    through later siblings, and rejected branches."""

    name = "oracle"

    def __init__(self, continuation: Sequence[int], vocab: int, seed: int = 0) -> None:
        self.continuation = list(continuation)
        self.vocab = vocab
        self.rng = random.Random(seed)
        self.done = 0

    def start(self, prompt: Sequence[int]) -> None:
        self.done = 0

    def propose(self, ctx: DraftContext) -> DraftTree:
        truth = self.continuation[self.done : self.done + self.rng.randrange(0, 10)]
        paths = []
        for _ in range(self.rng.randrange(0, 3)):
            noisy = [t if self.rng.random() < 0.8 else self.rng.randrange(self.vocab) for t in truth]
            paths.append(noisy[: self.rng.randrange(1, 6)])
        paths.insert(self.rng.randrange(len(paths) + 1), truth)
        return DraftTree.from_paths([p for p in paths if p])

    def observe(self, new_tokens: Sequence[int]) -> None:
        self.done += len(new_tokens)


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def started_head(model, seed: int = 0):
    """An untrained EAGLE-1 head for ``model``, started from its last layer as train-eagle starts
    (seeded), in eval mode."""
    from ngspec.eagle.head import EagleHead, head_config_for, init_from_target

    torch.manual_seed(seed)
    head = EagleHead(head_config_for(model))
    init_from_target(head, model)
    return head.eval()


def benchmark_script(name: str):
    """A script under benchmarks/ loaded as a module (they are not a package), with benchmarks/ on
    the import path as when the script runs, so it can import the scripts beside it."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.append(str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # as an import would: a dataclass in it looks its module up there
    spec.loader.exec_module(module)
    return module


def tensor_ops(run) -> int:
    """How many tensor (aten) operations ``run()`` dispatches: on a GPU a small model's batched step
    is host work, paid per operation, so tests check that it does not grow with rows or nodes."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += 1
            return func(*args, **(kwargs or {}))

    with Count() as counter:
        run()
    return counter.ops


@pytest.fixture(scope="session")
def tiny_saved(tmp_path_factory):
    """A tiny random Llama with the default tokenizer saved to disk, and an untrained EAGLE head
    for it under head/: a model directory the CLI loads in under a second."""
    from ngspec import models
    from ngspec.eagle.head import save_head

    where = tmp_path_factory.mktemp("tiny")
    tok = models.load_tokenizer()
    model = models.tiny_model("llama", seed=0, vocab_size=len(tok))
    model.save_pretrained(where)
    tok.save_pretrained(where)
    save_head(started_head(model), where / "head")
    return where
