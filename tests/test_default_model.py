"""Lossless on the real embedded default model (SmolLM2-135M-Instruct, float32 CPU)."""

import json
from pathlib import Path

import pytest

from conftest import hf_greedy
from ngspec.decode import DecodeConfig, generate
from ngspec.drafters import REGISTRY, DrafterOptions, make_drafter
from ngspec.engine import eos_ids
from ngspec.prompts import encode
from ngspec.target import TargetModel

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "spec_bench" / "question.jsonl"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def real_prompts() -> list[str]:
    prompts = [(EXAMPLES / "rag_ngspec.txt").read_text(), (EXAMPLES / "code_edit.txt").read_text()]
    if DATA.is_file():  # the shared Spec-Bench questions, when the checkout has them beside it
        rows = [json.loads(line) for line in DATA.read_text().splitlines()]
        for cat in ("rag", "summarization"):
            prompts.append(next(r for r in rows if r["category"] == cat)["turns"][0])
    return prompts


@pytest.mark.slow
@pytest.mark.parametrize("drafter", list(REGISTRY))
def test_default_model_lossless(default_model, drafter):
    target = TargetModel(default_model.model)
    eos = eos_ids(default_model)
    opts = DrafterOptions(trie_update=True)
    for text in real_prompts():
        ids = encode(default_model.tokenizer, text)
        expected = hf_greedy(default_model.model, ids, 64, eos=min(eos))
        got = generate(target, make_drafter(drafter, opts), ids, DecodeConfig(max_new_tokens=64, eos_ids=eos))
        assert got.token_ids == expected
