"""Which model families keep ngspec lossless: every causal-LM type transformers ships, as a tiny
random model built from one small config, decoded by the engine and by transformers' greedy
`generate`; batch 1 with the oracle drafter's noisy trees, and a batch of 3 with compaction. Each
family prints "b1 3/3 | b3 3/3" (rows identical to transformers'), its one-line refusal, or the
error it raised, or that it was skipped as too large to build (BENCHMARKS.md sections 10x and 10y).

    python benchmarks/family_sweep.py                  # every type (about 12 minutes on two cores)
    python benchmarks/family_sweep.py llama gemma3_text bloom
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import warnings
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
from transformers.utils import logging

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import OracleDrafter, hf_greedy  # noqa: E402 (the tests' oracle)

from ngspec.batch import BatchConfig, generate_batch  # noqa: E402
from ngspec.decode import DecodeConfig, Stopper, generate  # noqa: E402
from ngspec.errors import NgspecError  # noqa: E402
from ngspec.target import TargetModel  # noqa: E402

VOCAB = 96
CONFIG = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=512, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2, head_dim=16, sliding_window=8)


class _Timeout(Exception):
    pass


def _alarm(*_):
    raise _Timeout()


MAX_PARAMETERS = 500_000_000  # what the small config leaves at its defaults (a multimodal model's towers) can be billions


class TooBig(Exception):
    pass


def build(model_type: str):
    """The family's tiny model and 3 prompts with transformers' greedy continuations, or None when
    it does not build or generate from the small config (not ours to judge). Raises `TooBig` when
    the config's own defaults (its vision tower, a nested text config) keep it large: counted on
    the meta device first, as building some took over 20 GiB."""
    try:
        config = AutoConfig.for_model(model_type, **CONFIG)
    except Exception:
        return None
    try:
        with torch.device("meta"):
            size = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    except Exception:
        size = 0
    if size > MAX_PARAMETERS:
        raise TooBig(f"{size / 1e6:,.0f}M parameters from its default sub-configs")
    try:
        torch.manual_seed(1)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(8.0)  # sharp logits: few near-ties
        rng = random.Random(3)
        prompts = [[rng.randrange(3, VOCAB) for _ in range(rng.randrange(12, 40))] for _ in range(3)]
        return model, prompts, [hf_greedy(model, p, 20) for p in prompts]
    except _Timeout:
        raise
    except Exception:
        return None


def check(model, prompts, expected) -> str:
    try:
        target = TargetModel(model)
        single = sum(generate(target, OracleDrafter(e, VOCAB, seed=i), p, DecodeConfig(max_new_tokens=20)).token_ids == e for i, (p, e) in enumerate(zip(prompts, expected)))
        rows, _ = generate_batch(model, prompts, lambda: OracleDrafter(expected[0], VOCAB), DecodeConfig(max_new_tokens=20), BatchConfig(3, 2, 0.0), lambda: Stopper(frozenset()))
        batched = sum(r.generation is not None and r.generation.token_ids == e for r, e in zip(rows, expected))
        return f"b1 {single}/3 | b3 {batched}/3"
    except NgspecError as exc:
        return f"REFUSED: {exc}"
    except _Timeout:
        raise
    except Exception as exc:
        return f"ERROR {type(exc).__name__}: {str(exc)[:140]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("types", nargs="*", help="model types to check (default: every causal-LM type)")
    parser.add_argument("--seconds", type=int, default=60, help="give up on a family after this long")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.set_verbosity_error()
    signal.signal(signal.SIGALRM, _alarm)
    for model_type in args.types or sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        signal.alarm(args.seconds)
        try:
            built = build(model_type)
            if built is not None:
                print(f"{model_type:24s} {check(*built)}", flush=True)
        except _Timeout:
            print(f"{model_type:24s} TIMEOUT", flush=True)
        except TooBig as exc:
            print(f"{model_type:24s} SKIPPED: {exc}", flush=True)
        finally:
            signal.alarm(0)


if __name__ == "__main__":
    main()
