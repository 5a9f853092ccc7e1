"""Sliding-window layers at long contexts, one sequence: the cache that drops the entries no later
query can see (``drop``, what `TargetModel` does) against one that keeps every layer's whole
history (``keep``, what it did before), side by side in one process, with transformers' own greedy
`generate` (whose sliding layers keep only the window) beside them.

Random weights in a real family's layout at SmolLM2-135M's sizes (no download): ``mistral`` (every
layer slides) or ``gemma3`` (five sliding layers to one full one, as Gemma 3 has). Plain decoding
through the engine (the ``vanilla`` drafter: one token per forward), after a prompt of random
tokens. Reports decoding tokens per second (the prefill excluded: it is the same forward for
all), the bytes the cache holds at the end, and whether the three arms' tokens are identical.

    python benchmarks/sliding_cache.py --family mistral --window 512 --context 4096 -n 64 --rounds 3

With ``--batch-size B`` (> 1) B prompts of that length (different random tokens) are decoded
together by `generate_batch`, without compaction in either arm, and transformers' arm is left out
(its batches pad prompts, a different computation).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from ngspec.batch import BatchConfig, generate_batch
from ngspec.batch_target import BatchTarget
from ngspec.decode import DecodeConfig, Stopper, generate
from ngspec.drafters import make_drafter
from ngspec.target import TargetModel

SIZES = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
             vocab_size=49152, max_position_embeddings=32768, tie_word_embeddings=True)


def build(family: str, window: int) -> torch.nn.Module:
    if family == "mistral":
        config = AutoConfig.for_model("mistral", sliding_window=window, **SIZES)
    else:
        layers = SIZES["num_hidden_layers"]
        types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(layers)]
        config = AutoConfig.for_model("gemma3_text", sliding_window=window, head_dim=64, layer_types=types, **SIZES)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def cache_bytes(layers) -> int:
    """Bytes of the buffers behind each layer's keys and values (what the cache holds)."""
    total = 0
    for layer in layers:
        for t in (getattr(layer, "_keys", None), getattr(layer, "_values", None)) if hasattr(layer, "_keys") else (layer.keys, layer.values):
            total += 0 if t is None else t.numel() * t.element_size()
    return total


def run_ngspec(target: TargetModel, prompt: list[int], n: int, keep_all: bool) -> tuple[list[int], float, int]:
    drop = TargetModel._drop_unseen
    if keep_all:
        TargetModel._drop_unseen = lambda self: None  # the cache as it was: every entry kept
    try:
        gen = generate(target, make_drafter("vanilla"), prompt, DecodeConfig(max_new_tokens=n))
    finally:
        TargetModel._drop_unseen = drop
    rate = (len(gen.token_ids) - 1) / (gen.seconds - gen.stats.prefill_seconds)
    return gen.token_ids, rate, cache_bytes(target.cache.layers)


def run_batch(model, prompts: list[list[int]], n: int, keep_all: bool) -> tuple[list[list[int]], float, int]:
    """The batch's decoding tokens per second (all rows' tokens after their first, over the time
    after the prefills) and the bytes its cache holds at the end."""
    drop, commit = BatchTarget._drop_unseen, BatchTarget.commit
    held = []

    def commit_and_weigh(self, paths):
        commit(self, paths)
        held[:] = [cache_bytes(self.cache.layers)]

    if keep_all:
        BatchTarget._drop_unseen = lambda self: None
    BatchTarget.commit = commit_and_weigh
    try:
        t0 = time.perf_counter()
        results, report = generate_batch(model, prompts, lambda: make_drafter("vanilla"), DecodeConfig(max_new_tokens=n),
                                         BatchConfig(len(prompts), 0), lambda: Stopper(frozenset()))
        seconds = time.perf_counter() - t0
    finally:
        BatchTarget._drop_unseen, BatchTarget.commit = drop, commit
    tokens = [r.generation.token_ids for r in results]
    return tokens, sum(len(t) - 1 for t in tokens) / (seconds - report.prefill_seconds), held[0]


@torch.inference_mode()
def run_transformers(model, prompt: list[int], n: int) -> tuple[list[int], float, int]:
    ids = torch.tensor([prompt])
    t0 = time.perf_counter()
    model.generate(ids, max_new_tokens=1, do_sample=False, pad_token_id=0)
    prefill = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=0, return_dict_in_generate=True)
    seconds = time.perf_counter() - t0
    return out.sequences[0, len(prompt):].tolist(), (n - 1) / (seconds - prefill), cache_bytes(out.cache.layers)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", choices=["mistral", "gemma3"], default="mistral")
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--context", type=int, default=4096, help="prompt tokens")
    ap.add_argument("-n", "--max-new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-b", "--batch-size", type=int, default=1, help="rows decoded together (> 1: no transformers arm)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = build(args.family, args.window)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, SIZES["vocab_size"], (args.context,), generator=gen).tolist() for _ in range(args.batch_size)]
    if args.batch_size > 1:
        arms = {"keep": lambda: run_batch(model, prompts, args.max_new_tokens, True),
                "drop": lambda: run_batch(model, prompts, args.max_new_tokens, False)}
    else:
        target = TargetModel(model)
        arms = {"keep": lambda: run_ngspec(target, prompts[0], args.max_new_tokens, True),
                "drop": lambda: run_ngspec(target, prompts[0], args.max_new_tokens, False),
                "transformers": lambda: run_transformers(model, prompts[0], args.max_new_tokens)}
    rates: dict[str, list[float]] = {a: [] for a in arms}
    tokens, held = {}, {}
    arms["drop"]()  # warm-up
    for r in range(args.rounds):
        for arm in (list(arms) if r % 2 == 0 else list(reversed(arms))):
            tokens[arm], rate, held[arm] = arms[arm]()
            rates[arm].append(rate)
    report = {
        "family": args.family, "window": args.window, "context": args.context, "new_tokens": args.max_new_tokens,
        "batch_size": args.batch_size, "rounds": args.rounds, "threads": torch.get_num_threads(),
        "tokens_per_second": {a: round(statistics.median(v), 2) for a, v in rates.items()},
        "drop_over_keep": round(statistics.median(d / k for d, k in zip(rates["drop"], rates["keep"])), 3),
        **({"drop_over_transformers": round(statistics.median(d / t for d, t in zip(rates["drop"], rates["transformers"])), 3)} if "transformers" in rates else {}),
        "cache_mib": {a: round(b / 2**20, 3) for a, b in held.items()},
        "identical": all(t == tokens["drop"] for t in tokens.values()),
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
