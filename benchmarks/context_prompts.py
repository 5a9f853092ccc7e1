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
import json
import random
from pathlib import Path


def _readable(text: str, min_words: int, max_words: int) -> bool:
    """Long enough to summarise, short enough for a prompt, and not one sentence on repeat."""
    words = text.split()
    return min_words <= len(words) <= max_words and len(set(words)) >= 0.45 * len(words)


def passages(paths: list[Path], min_words: int = 60, max_words: int = 260) -> list[tuple[str, str]]:
    """(instruction, response) pairs of the records in files or folders of them (any format
    `build-datastore` reads), keeping responses that read as a passage."""
    from ngspec.datastore.corpus import iter_records
    from ngspec.errors import NgspecError
    from ngspec.metrics.pairs import record_pairs

    out = []
    for path in paths:
        for n, record in enumerate(iter_records(str(path))):
            try:
                pairs = record_pairs(record, str(n), {}, None, None)
            except NgspecError:  # no (instruction, response) fields: nothing to quote
                continue
            out += [(p.input.strip(), p.response.strip()) for p in pairs if p.input.strip() and _readable(p.response, min_words, max_words)]
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
    ap.add_argument("corpus", type=Path, nargs="+", help="corpus files or folders of them, in any format build-datastore reads")
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
