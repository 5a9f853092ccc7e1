"""Seeded summarisation and passage-QA prompts built from a corpus, for `ngspec synth-corpus --prompts`.

    python benchmarks/context_prompts.py corpora/ ../shared/data/magpie_sample/example_instructions_5res.json \
        --n 480 --out bench-out/context-prompts.jsonl
    ngspec synth-corpus --prompts bench-out/context-prompts.jsonl -n 160 --out corpus/context-answers.jsonl

Why: in retrieval-augmented generation and summarisation most of an answer is copied or
paraphrased from the prompt, and an EAGLE head drafts that well only if its training data shows
the target doing it. The default model's self-written corpus holds almost no long prompts. These
prompts put the corpus's own responses in the two shapes Spec-Bench uses (no benchmark text is
used): ``Summarize: <passage>``, and a few passages followed by a question that one of them
answers (the passage's own instruction, its answer shuffled in among others). The model's answers
to them are the training data. Each line is ``{"prompt": ...}``.
"""

from __future__ import annotations

import argparse
import ast
import json
import random
from pathlib import Path


def _responses(record: dict) -> list[str]:
    responses = record.get("responses", record.get("response"))
    if isinstance(responses, str) and responses.lstrip().startswith("["):  # a list serialised as text
        try:
            responses = json.loads(responses)
        except json.JSONDecodeError:
            responses = ast.literal_eval(responses)
    return [r for r in (responses if isinstance(responses, list) else [responses]) if isinstance(r, str)]


def _readable(text: str, min_words: int, max_words: int) -> bool:
    """Long enough to summarise, short enough for a prompt, and not one sentence on repeat."""
    words = text.split()
    return min_words <= len(words) <= max_words and len(set(words)) >= 0.45 * len(words)


def passages(paths: list[Path], min_words: int = 60, max_words: int = 260) -> list[tuple[str, str]]:
    """(instruction, response) pairs of Magpie-style records (.jsonl, or .json holding a list) from
    files or folders of them, keeping responses that read as a passage."""
    files = [f for p in paths for f in (sorted(p.glob("*.json*")) if p.is_dir() else [p])]
    out = []
    for f in files:
        text = f.read_text()
        records = json.loads(text) if f.suffix == ".json" else [json.loads(line) for line in text.splitlines() if line.strip()]
        for record in records:
            instruction = record.get("instruction")
            if not isinstance(instruction, str) or not instruction.strip():
                continue
            out += [(instruction.strip(), r.strip()) for r in _responses(record) if _readable(r, min_words, max_words)]
    return out


def context_prompts(pairs: list[tuple[str, str]], n: int, seed: int = 0, passages_per_question: int = 2) -> list[str]:
    """``n`` prompts, alternating ``Summarize: <passage>`` and passages-then-question."""
    if len(pairs) < passages_per_question:
        raise SystemExit(f"need at least {passages_per_question} readable passages, found {len(pairs)}")
    r = random.Random(seed)
    out = []
    for i in range(n):
        if i % 2 == 0:
            out.append("Summarize: " + r.choice(pairs)[1])
            continue
        chosen = r.sample(pairs, passages_per_question)
        question = chosen[0][0].splitlines()[0]
        r.shuffle(chosen)
        out.append("\n".join(p for _, p in chosen) + "\n" + question)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("corpus", type=Path, nargs="+", help="Magpie-style .jsonl/.json files or folders of them")
    ap.add_argument("--n", type=int, default=480)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--passages", type=int, default=2, help="passages before each question")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    pairs = passages(args.corpus)
    prompts = context_prompts(pairs, args.n, args.seed, args.passages)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f:
        for text in prompts:
            f.write(json.dumps({"prompt": text}) + "\n")
    print(f"{len(prompts)} prompts from {len(pairs)} passages -> {args.out}")


if __name__ == "__main__":
    main()
