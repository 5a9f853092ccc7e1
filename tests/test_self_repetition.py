import random

from ngspec.metrics.self_repetition import self_repetition


def brute_force(inp, resp, docs=()):
    """The definition, literally: at each pointer the longest run found in the history (or a doc)."""
    steps, p = 0, 0
    while p < len(resp):
        sources = [list(inp) + list(resp[:p]), *docs]
        best = 0
        for length in range(1, len(resp) - p + 1):
            piece = list(resp[p : p + length])
            if any(src[s : s + length] == piece for src in sources for s in range(len(src) - length + 1)):
                best = length
        p += max(best, 1)
        steps += 1
    return len(resp) / steps if steps else 0.0


def test_matches_brute_force_on_random_cases():
    rng = random.Random(0)
    for _ in range(3000):
        vocab = rng.randrange(1, 6)
        inp = [rng.randrange(vocab) for _ in range(rng.randrange(0, 12))]
        resp = [rng.randrange(vocab) for _ in range(rng.randrange(0, 12))]
        assert abs(self_repetition(inp, resp).value - brute_force(inp, resp)) < 1e-12


def test_hand_worked():
    # X = a b c, Y = a b c a b: step 1 copies "a b c" (3), step 2 copies "a b" from the history
    assert self_repetition([1, 2, 3], [1, 2, 3, 1, 2]).match_lengths == (3, 2)
    # the match must lie inside the history before the pointer: Y = "a a a a" after X = "a" copies
    # "a" (history "a"), then "a a" (history "a a"), then the last "a"
    assert self_repetition([1], [1, 1, 1, 1]).match_lengths == (1, 2, 1)
    assert self_repetition([], [5, 6]).value == 1.0
    assert self_repetition([1], []).value == 0.0


def test_with_datastore_matches_brute_force():
    from ngspec.datastore.index import Datastore

    rng = random.Random(1)
    for _ in range(500):
        docs = [[rng.randrange(4) for _ in range(rng.randrange(0, 10))] for _ in range(rng.randrange(1, 4))]
        store = Datastore.from_documents(docs, vocab_size=8)
        inp = [rng.randrange(4) for _ in range(rng.randrange(0, 8))]
        resp = [rng.randrange(4) for _ in range(rng.randrange(0, 12))]
        assert abs(self_repetition(inp, resp, store).value - brute_force(inp, resp, docs)) < 1e-12


def test_matches_brute_force_on_real_records(default_model):
    """Real tokenised MT-bench answers (prefixes, to keep the brute force affordable)."""
    import json
    from pathlib import Path

    answers = Path(__file__).resolve().parents[2] / "shared" / "data" / "mt_bench_answers" / "rest_vicuna-7b-v1.5" / "baseline-vicuna-7b-v1.5-temperature-0.0-top_p-0.jsonl"
    if answers.is_file():
        texts = [json.loads(line)["choices"][0]["turns"] for line in answers.read_text().splitlines()[:6]]
    else:  # still real text: this project's examples
        examples = Path(__file__).resolve().parents[1] / "examples"
        texts = [[p.read_text(), p.read_text()[::-1]] for p in sorted(examples.glob("*.txt"))]
    tok = default_model.tokenizer
    for first, second in texts:
        inp = tok(first, add_special_tokens=False)["input_ids"][:150]
        resp = tok(second, add_special_tokens=False)["input_ids"][:60] + inp[10:40]
        assert abs(self_repetition(inp, resp).value - brute_force(inp, resp)) < 1e-12
