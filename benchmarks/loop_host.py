"""The batch loop's own cost per step with a model whose arithmetic is negligible: a random 2-layer,
64-wide llama with a 4,096-token vocabulary (no download), repetitive random prompts, the trie
drafter and a GPU-like verify cost (1 + 0.004 n). What a step costs here is the loop's host work
(drafting, the inputs' layout, acceptance, commits, stopping) and small CPU kernels, by batch
size: on the seventh GPU visit a replayed 32-row trie step took 40-60 ms against 9 ms at batch 1
(BENCHMARKS.md 10zs), and this says how much of that growth a host alone would explain.

    python benchmarks/loop_host.py --batch-sizes 1,8,32 -n 64
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import repetitive_prompt  # noqa: E402 (the tests' prompts, with spans the trie finds)

from ngspec.batch import BatchConfig, generate_batch  # noqa: E402
from ngspec.decode import DecodeConfig, Stopper  # noqa: E402
from ngspec.drafters import DrafterOptions, make_drafter  # noqa: E402

VOCAB = 4096


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch-sizes", default="1,8,32")
    ap.add_argument("-n", "--max-new-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=600)
    args = ap.parse_args()
    torch.set_num_threads(1)
    config = AutoConfig.for_model("llama", vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # sharper logits: greedy paths that are not all near-ties
    cost = tuple(1.0 + 0.004 * n for n in range(97))
    for b in (int(x) for x in args.batch_sizes.split(",")):
        rng = random.Random(0)
        prompts = [repetitive_prompt(rng, VOCAB, args.prompt_tokens) for _ in range(b)]

        def run():
            return generate_batch(model, prompts, lambda: make_drafter("trie", DrafterOptions()), DecodeConfig(max_new_tokens=args.max_new_tokens,
                                  max_draft_nodes=96), BatchConfig(b), lambda: Stopper(frozenset()), verify_cost=lambda context: cost)

        run()  # warm-up
        started = time.perf_counter()
        _, report = run()
        seconds = time.perf_counter() - started
        step = (seconds - report.prefill_seconds) / report.steps
        print(f"batch {b}: {report.steps} steps, {1000 * step:.2f} ms a step without the prefill ({report.prefill_seconds:.2f} s), "
              f"{report.new_tokens / report.steps / b:.2f} tokens a row-step", flush=True)


if __name__ == "__main__":
    main()
