"""How often EAGLE heads' top guess agrees with the target, teacher-forced, on the target's own
greedy answers: each head reads the target's features over prompt + answer in one pass, and at
every answer position its argmax over its draft vocabulary is compared with the target's (both
over the same LM-head rows, as `train-eagle` scores its training top-1). This is the head's
quality free of tree shapes, gates and timing (BENCHMARKS.md section 10d).

    python benchmarks/head_agreement.py --questions ../shared/data/spec_bench/question.jsonl \\
        --categories rag,summarization --limit 8 -n 128 heads/amd-v9 heads/amd-v23-all-e8lr1
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from ngspec.decode import DecodeConfig
from ngspec.drafters import make_drafter
from ngspec.eagle.head import load_draft_vocab, load_head
from ngspec.eagle.train import Example, TrainOptions, example_loss, target_features
from ngspec.engine import Engine
from ngspec.models import load_model
from ngspec.prompts import encode, load_prompts


def answered(engine: Engine, prompts: list[list[int]], max_new_tokens: int) -> list[Example]:
    """Each prompt followed by the target's greedy answer, as a training-style example."""
    out = []
    for ids in prompts:
        answer = engine.run(ids, make_drafter("vanilla"), DecodeConfig(max_new_tokens=max_new_tokens)).token_ids
        out.append(Example(torch.tensor(ids + answer), len(ids), ids))
    return out


@torch.inference_mode()
def agreement(model, head, vocab: list[int] | None, examples: list[Example], features: list[torch.Tensor]) -> tuple[float, int]:
    """The share of answer positions where the head's top guess is the target's, over ``vocab``
    (the head's draft vocabulary; None: the whole LM head), and the number of positions."""
    weight = model.get_output_embeddings().weight
    if vocab:
        weight = weight.index_select(0, torch.tensor(sorted(vocab), device=weight.device))
    right = n = 0
    for ex, f in zip(examples, features):
        _, stats = example_loss(head, model, ex, f, TrainOptions(noise=0.0), weight)
        right += stats["top1"] * stats["tokens"]
        n += stats["tokens"]
    return (right / n if n else 0.0), n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("heads", nargs="+", help="EAGLE-1 head directories")
    ap.add_argument("--questions", required=True)
    ap.add_argument("--categories", default="rag,summarization")
    ap.add_argument("--limit", type=int, default=8, help="first N questions per category")
    ap.add_argument("-n", "--max-new-tokens", type=int, default=128)
    ap.add_argument("--draft-vocab", type=int, default=8192, help="score over each head's N most frequent tokens (0: the whole vocabulary)")
    args = ap.parse_args()

    loaded = load_model("default", "cpu", "float32")
    engine = Engine(loaded)
    data = {}
    for category in args.categories.split(","):
        prompts = [encode(loaded.tokenizer, p.text) for p in load_prompts(Path(args.questions), category, args.limit)]
        examples = answered(engine, prompts, args.max_new_tokens)
        data[category] = (examples, target_features(loaded.model, examples))
    for path in args.heads:
        head = load_head(Path(path), loaded.model).float()
        vocab = load_draft_vocab(Path(path))
        vocab = vocab[: args.draft_vocab] if vocab and args.draft_vocab else None
        cells = [f"{c} {share:.1%} ({n} positions)" for c, (ex, f) in data.items() for share, n in [agreement(loaded.model, head, vocab, ex, f)]]
        print(f"{path}  " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
