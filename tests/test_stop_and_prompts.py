import json

import pytest

from ngspec.decode import DecodeConfig, Stopper
from ngspec.errors import NgspecError
from ngspec.prompts import load_prompts


def test_stopper_cuts_at_first_eos_in_run():
    stopper = Stopper(frozenset([2]))
    assert stopper.cut([5], [7, 2, 9, 2]) == ([7, 2], "eos")
    assert stopper.cut([5], [7, 8]) == ([7, 8], None)


def test_stopper_stop_string_completed_inside_run():
    vocab = {1: "Hel", 2: "lo", 3: " wor", 4: "ld", 5: "!"}
    stopper = Stopper(frozenset(), ["world"], lambda ids: "".join(vocab[i] for i in ids))
    assert stopper.cut([1, 2], [3, 4, 5]) == ([3, 4], "stop")
    # a stop string already in the text before does not stop again
    assert stopper.cut([3, 4], [1, 2]) == ([1, 2], None)


def test_decode_config_rejects_non_positive_budget():
    with pytest.raises(NgspecError, match="max-new-tokens"):
        DecodeConfig(max_new_tokens=0)


def test_load_txt_and_jsonl(tmp_path):
    txt = tmp_path / "q.txt"
    txt.write_text("What is 2 + 2?\n")
    assert load_prompts(txt)[0].text == "What is 2 + 2?"
    jl = tmp_path / "q.jsonl"
    rows = [{"prompt": "a"}, {"turns": ["b", "c"], "category": "rag", "question_id": 7}, {"text": "d"}]
    jl.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    prompts = load_prompts(jl)
    assert [p.text for p in prompts] == ["a", "b", "d"]
    assert load_prompts(jl, category="rag")[0].id == "7"
    assert len(load_prompts(jl, limit=2)) == 2


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "empty"),
        (b"\xff\xfe bad", "UTF-8"),
        (b'{"prompt": 1}\n', "needs a 'prompt'"),
        (b"not json\n", "not valid JSON"),
        (b'{"prompt": "  "}\n', "empty"),
    ],
)
def test_bad_prompt_files(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    with pytest.raises(NgspecError, match=message):
        load_prompts(path)


def test_a_byte_order_mark_is_not_part_of_the_first_prompt(tmp_path):
    jl, txt = tmp_path / "bom.jsonl", tmp_path / "bom.txt"
    jl.write_bytes(b'\xef\xbb\xbf{"id": "a", "prompt": "Hi"}\r\n{"id": "b", "prompt": "Yo"}\r\n')
    txt.write_bytes("\ufeffSummarise this.".encode())
    assert [(p.id, p.text) for p in load_prompts(jl)] == [("a", "Hi"), ("b", "Yo")]
    assert load_prompts(txt)[0].text == "Summarise this."


def test_missing_file_and_unknown_category(tmp_path):
    with pytest.raises(NgspecError, match="not found"):
        load_prompts(tmp_path / "nope.txt")
    jl = tmp_path / "q.jsonl"
    jl.write_text('{"turns": ["x"], "category": "qa"}\n')
    with pytest.raises(NgspecError, match="categories: qa"):
        load_prompts(jl, category="rag")


def test_per_category_keeps_the_first_of_each(tmp_path):
    import json as _json

    from ngspec.prompts import load_prompts as _load

    path = tmp_path / "q.jsonl"
    rows = [{"question_id": i, "category": c, "turns": [f"q{i}"]} for i, c in enumerate("aabbbca")]
    path.write_text("\n".join(_json.dumps(r) for r in rows))
    assert [p.id for p in _load(path, per_category=1)] == ["0", "2", "5"]
    assert [p.id for p in _load(path, per_category=2, limit=3)] == ["0", "1", "2"]
