"""In-domain prompts for training a head: each Spec-Bench rag and summarization question outside
the held-out ones asked again with other instructions over the same passages or article, plus the
qa questions, for `ngspec synth-corpus --prompts`.

    python benchmarks/spec_bench_variants.py ../shared/data/spec_bench/question.jsonl --holdout 24 \
        --out bench-out/variant-prompts.jsonl
    ngspec synth-corpus --prompts bench-out/variant-prompts.jsonl -n 128 --out corpus/variant-answers.jsonl

With ``--originals`` it writes the rag and summarization questions after the held-out ones as they
are asked (the prompts `benchmarks/reader_head.sh` trains its first fine-tuned head on).

Why: Spec-Bench holds 80 rag and 80 summarization questions, and a head evaluated on the first 24
of each has 56 + 56 left to learn from. Asking each of those documents three more questions
quadruples the target's answers about text of the kind the benchmark uses (Wikipedia passages and
news articles) without touching a held-out prompt (BENCHMARKS.md section 10v). The same works for
your own traffic: re-ask your documents with the instructions your users send. Each line is
``{"prompt": ...}``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ngspec.prompts import Prompt, load_prompts

RAG_QUESTIONS = (
    "Summarize these passages in a few sentences.",
    "What are the most important facts in these passages?",
    "Write a short paragraph about the main topic of these passages.",
)
ARTICLE_INSTRUCTIONS = (
    "Write a short news summary of this article: ",
    "What are the key points of this article?\n",
    "Explain what happened in this article in simple words: ",
)


def training(questions: list[Prompt], category: str, holdout: int) -> list[str]:
    """The questions of ``category`` after its first ``holdout``, as asked. ``questions`` as
    `load_prompts` reads them, the reader `bench` and `reader_ab.py` pick their evaluation prompts
    with, so the held-out ones are the same prompts."""
    return [q.text for q in questions if q.category == category][holdout:]


def originals(questions: list[Prompt], holdout: int) -> list[str]:
    """The rag, then the summarization questions after the first ``holdout`` of each, as asked."""
    return training(questions, "rag", holdout) + training(questions, "summarization", holdout)


def variants(questions: list[Prompt], holdout: int) -> list[str]:
    """Prompts for every rag and summarization question after the first ``holdout`` of each
    (three per question), then every qa question."""
    out = []
    for prompt in training(questions, "rag", holdout):  # passages, then the question on the last line
        passages = prompt.rsplit("\n", 1)[0]
        out += [passages + "\n" + q for q in RAG_QUESTIONS]
    for prompt in training(questions, "summarization", holdout):
        article = prompt.removeprefix("Summarize: ")
        out += [instruction + article for instruction in ARTICLE_INSTRUCTIONS]
    return out + [q.text for q in questions if q.category == "qa"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("questions", type=Path, help="Spec-Bench question.jsonl")
    ap.add_argument("--holdout", type=int, default=24, help="first rag and summarization questions left out (the evaluation prompts)")
    ap.add_argument("--originals", action="store_true", help="write the questions themselves (after the held-out ones) instead of their variants")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    prompts = (originals if args.originals else variants)(load_prompts(args.questions), args.holdout)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts), encoding="utf-8")
    print(f"{len(prompts)} prompts -> {args.out}")


if __name__ == "__main__":
    main()
