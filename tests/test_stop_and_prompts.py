import json
import random

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


def metaspace_tokenizer():
    """A SentencePiece-style (Llama 2, Mistral) word tokenizer: a word's token alone decodes
    without the leading space it adds in context."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "\u2581the", "\u2581mat", "\u2581on", "\u2581cat", ".", "\u2581sat", "\n"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    backend.decoder = decoders.Metaspace(prepend_scheme="first")
    return PreTrainedTokenizerFast(tokenizer_object=backend)


def test_a_stop_string_stops_at_the_token_that_completes_it_whatever_the_decoder():
    """Against the definition: the first token after which the decoded text holds the stop
    string. Random substrings of random texts, on a SentencePiece-style decoder (whose tokens alone
    drop their leading space), a plain one and a byte-level one (a CJK character or an emoji is 3
    or 4 tokens), fed one token at a time and in random runs."""
    tok = metaspace_tokenizer()
    plain = {i: f"<{i}>" for i in range(8)}
    rng = random.Random(0)
    cases = (
        (lambda ids: tok.decode(ids), lambda: [rng.randint(1, 7) for _ in range(rng.randint(1, 12))]),
        (lambda ids: "".join(plain[i] for i in ids), lambda: [rng.randint(1, 7) for _ in range(rng.randint(1, 12))]),
        (lambda ids: bytes(ids).decode("utf-8", errors="replace"), lambda: list("".join(rng.choices("a 猫🐱", k=rng.randint(1, 12))).encode())),
    )
    for _ in range(300):
        for decode, draw in cases:
            ids = draw()
            text = decode(ids)
            i, j = sorted(rng.sample(range(len(text) + 1), 2))
            stop = text[i:j]
            first = next(n for n in range(1, len(ids) + 1) if stop in decode(ids[:n]))
            stopper, out, reason = Stopper(frozenset(), [stop], decode), [], None
            while reason is None and len(out) < len(ids):
                new, reason = stopper.cut(out, ids[len(out) : len(out) + rng.randint(1, 3)])
                out += new
            assert (out, reason) == (ids[:first], "stop"), (text, stop)


def test_a_stop_string_that_names_a_special_token_stops_at_that_token():
    """The text leaves special tokens out ("<|im_start|>", "<|eot_id|>"), so such a stop string
    could never be found there: the token itself stops generation, as a stop (not EOS), inside a
    run; a stop string spelled in ordinary text still stops where its text completes."""
    from ngspec.decode import special_stop_ids

    tok = metaspace_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|turn|>"]})
    turn = tok.convert_tokens_to_ids("<|turn|>")

    def decode(ids):
        return tok.decode(ids, skip_special_tokens=True)

    assert decode([1, turn, 2]) == "the mat"  # left out of the text
    stops = ["<|turn|>", "mat"]
    assert special_stop_ids(tok, stops, decode) == {turn}
    assert special_stop_ids(tok, ["the"], decode) == frozenset()  # an ordinary token is found in the text
    stopper = Stopper(frozenset(), stops, decode, special_stop_ids(tok, stops, decode))
    assert stopper.cut([1], [4, turn, 2]) == ([4, turn], "stop")
    assert stopper.cut([1], [4, 2, turn]) == ([4, 2], "stop")  # "mat" completes first


def test_decode_config_rejects_non_positive_budget():
    with pytest.raises(NgspecError, match="max-new-tokens"):
        DecodeConfig(max_new_tokens=0)


def test_text_that_is_not_text_is_refused_where_it_would_be_encoded():
    """A lone surrogate (a JSON escape such as "\\ud800" read alone, or `--stop` given a byte that
    is not UTF-8): the tokenizer raised "TextEncodeInput must be Union[...]" (a raw prompt, as
    "TypeError: ..."; through the chat template as a refusal of the messages), and a stop string
    a UnicodeEncodeError."""
    from ngspec.models import load_tokenizer
    from ngspec.prompts import encode, encode_messages

    lone = r"holds a lone surrogate \(\\ud800 at character 2\), half of a UTF-16 pair and not text"
    tok = load_tokenizer()
    for raw in (False, True):
        with pytest.raises(NgspecError, match=f"^the prompt {lone}"):
            encode(tok, "a \ud800", raw)
    with pytest.raises(NgspecError, match=f"^chat message 2's content {lone}"):
        encode_messages(tok, [{"role": "user", "content": "hi"}, {"role": "user", "content": "a \ud800"}])
    with pytest.raises(NgspecError, match=r"^the stop string '\\udcff' holds a lone surrogate \(\\udcff at character 0\)"):
        DecodeConfig(stop_strings=("\udcff",))
    assert encode(tok, "a \U0001f600", True) == encode(tok, json.loads('"a \\ud83d\\ude00"'), True)  # a pair is one character


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



def test_prompt_records_in_the_layouts_corpora_are_read_in(tmp_path):
    """Records a user has as prompts in the layouts ngspec reads corpora in were refused ("needs a
    'prompt' or 'text' string"): an Alpaca or AlpacaEval set (`instruction`, with `input` or
    Dolly's `context` below it), TRL's conversational `prompt` (a list of messages), and chat
    messages whose content is a list of text parts, as OpenAI's clients write them (`serve` took
    those)."""
    path = tmp_path / "q.jsonl"
    rows = [
        {"instruction": "Translate to French.", "input": "Good morning", "output": "Bonjour"},
        {"instruction": "Answer from the passage.", "context": "The sky is blue.", "response": "Blue."},
        {"instruction": "Name a colour.", "input": ""},
        {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "Say "}, {"type": "text", "text": "hi"}]}]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    prompts = load_prompts(path)
    assert [p.text for p in prompts] == ["Translate to French.\nGood morning", "Answer from the passage.\nThe sky is blue.", "Name a colour.", "Hi", "Say hi"]
    assert [p.messages for p in prompts[3:]] == [tuple(rows[3]["prompt"]), ({"role": "user", "content": "Say hi"},)]
    path.write_text(json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]}))
    with pytest.raises(NgspecError, match=r"q.jsonl:1: only text content parts"):
        load_prompts(path)

def test_a_json_file_holds_an_array_of_prompt_records_or_one_record(tmp_path):
    """A .json file was read as one text prompt: the model answered the JSON text itself."""
    array = tmp_path / "q.json"
    array.write_text(json.dumps([{"prompt": "a"}, {"turns": ["b", "c"], "category": "rag", "question_id": 7}, {"text": "d"}], indent=1))
    prompts = load_prompts(array)
    assert [(p.id, p.text, p.turns) for p in prompts] == [("q.json[0]", "a", ()), ("7", "b", ("b", "c")), ("q.json[2]", "d", ())]
    assert [p.id for p in load_prompts(array, category="rag")] == ["7"]
    one = tmp_path / "one.json"
    one.write_text('{"messages": [{"role": "user", "content": "Hi"}]}')
    assert [p.text for p in load_prompts(one)] == ["Hi"]


@pytest.mark.parametrize(("name", "text"), [
    ("q.json", '["Say hi", {"prompt": "Count to three", "id": "c"}, "  Two\\nlines "]'),
    ("q.jsonl", '"Say hi"\n{"prompt": "Count to three", "id": "c"}\n"  Two\\nlines "\n'),  # `jq -R .` writes such lines
])
def test_a_json_string_is_a_prompt_beside_records(tmp_path, name, text):
    """An array of strings (the simplest list of prompts) was refused: "expected a JSON object"."""
    path = tmp_path / name
    path.write_text(text)
    prompts = load_prompts(path)
    assert [p.text for p in prompts] == ["Say hi", "Count to three", "  Two\nlines "] and prompts[1].id == "c"
    one = tmp_path / "one.json"
    one.write_text('"Summarise: a b c"')
    assert [(p.id, p.text) for p in load_prompts(one)] == [("one.json[0]", "Summarise: a b c")]
    (tmp_path / "blank.json").write_text('["a", " "]')
    with pytest.raises(NgspecError, match=r"blank.json\[1\]: the prompt is empty"):
        load_prompts(tmp_path / "blank.json")


@pytest.mark.parametrize(("name", "text", "ids"), [
    ("q.jsonl", '[\n {"prompt": "a"},\n {"prompt": "b"}\n]\n', ["q.jsonl[0]", "q.jsonl[1]"]),  # a pretty array, named .jsonl
    ("q.jsonl", '[{"prompt": "a"}, {"prompt": "b"}]\n', ["q.jsonl[0]", "q.jsonl[1]"]),
    ("q.jsonl", '{"prompt": "a"}\n', ["q.jsonl:1"]),  # one record, one line: JSON lines, as ever
    ("q.json", '{"prompt": "a"}\n\n{"prompt": "b"}\n', ["q.json:1", "q.json:3"]),  # JSON lines, named .json
    ("q.json", '{"prompt": "a"}', ["q.json[0]"]),
])
def test_a_json_or_jsonl_file_is_read_as_it_is_laid_out_whatever_its_suffix(tmp_path, name, text, ids):
    """As corpora are: a pretty-printed array named .jsonl stopped on its first line, '[' (not valid JSON)."""
    path = tmp_path / name
    path.write_text(text)
    assert [p.id for p in load_prompts(path)] == ids


@pytest.mark.parametrize(("name", "ids"), [("Q.JSONL", ["Q.JSONL:1", "Q.JSONL:2"]), ("q.ndjson", ["q.ndjson:1", "q.ndjson:2"]),
                                           ("Q.Json", ["Q.Json:1", "Q.Json:2"])])
def test_a_json_lines_file_named_in_capitals_or_ndjson_is_read_as_records(tmp_path, name, ids):
    """`Q.JSONL` (a Windows tool's name) and `q.ndjson` (JSON lines' other name, which `datasets`
    reads) were read as one text prompt: the model answered the JSON records themselves."""
    (tmp_path / name).write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    prompts = load_prompts(tmp_path / name)
    assert [p.id for p in prompts] == ids and [p.text for p in prompts] == ["a", "b"]
    (tmp_path / "Q.PARQUET").write_bytes(b"PAR1\x00\x00PAR1")
    with pytest.raises(NgspecError, match="is a parquet file"):
        load_prompts(tmp_path / "Q.PARQUET")


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("bad.json", b'[{"prompt": "a"},\n {"prompt": }]', r"bad.json:2:13: not valid JSON \(Expecting value\)"),
        ("bad.json", b'5', r"bad.json: expected a JSON array of prompts \(records or strings\) or one, not 5"),
        ("bad.json", b'[{"prompt": "a"}, 5]', r"bad.json\[1\]: expected a prompt record \(a JSON object\) or a prompt \(a JSON string\), not 5"),
        ("bad.json", b"[]", r"prompt file .*bad.json holds no prompts"),
        ("bad.json", b'[{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}]", r"bad.json: its JSON is nested too deeply to read"),
        ("deep.jsonl", b'{"prompt": "a"}\n{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", r"deep.jsonl:2: its JSON is nested too deeply to read"),
        ("q.parquet", b"PAR1\x00\x00PAR1", r"q.parquet is a parquet file; prompt files are .txt \(one prompt\), .jsonl \(a record per line\) or .json"),
    ],
)
def test_bad_json_prompt_files_are_named_by_where_they_fail(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(NgspecError, match=message):
        load_prompts(path)


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


def test_a_txt_prompt_saved_with_windows_line_ends_is_the_same_prompt(tmp_path):
    """A .txt prompt kept its carriage returns (the file is read as bytes), so a file saved by a
    Windows editor was another prompt than the same file with Unix line ends, with another answer,
    and another than Python's open().read() gives. Line ends read as Python's text mode reads them."""
    text = "Context: a\nb\n\nQuestion?\n"
    for name, ends in (("unix", "\n"), ("windows", "\r\n"), ("old-mac", "\r")):
        (tmp_path / f"{name}.txt").write_bytes(text.replace("\n", ends).encode())
    assert {load_prompts(tmp_path / f"{name}.txt")[0].text for name in ("unix", "windows", "old-mac")} == {"Context: a\nb\n\nQuestion?"}
    assert load_prompts(tmp_path / "windows.txt")[0].text == open(tmp_path / "windows.txt").read().strip("\n")


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


BROKEN_TEMPLATE = "{% for message in messages %}{{ message['content'] }"  # cut short: jinja cannot read it


@pytest.mark.parametrize("use", ["prompt", "synth"])
def test_a_chat_template_jinja_cannot_read_is_named_as_the_model_s_in_one_line(use):
    """A chat_template.jinja cut short: `synth-corpus` ended in an unexpected TemplateSyntaxError,
    and a prompt said the template had refused its messages."""
    from ngspec.datastore.synth import pre_query_template
    from ngspec.models import load_tokenizer
    from ngspec.prompts import encode

    tok = load_tokenizer()
    tok.chat_template = BROKEN_TEMPLATE
    with pytest.raises(NgspecError, match=r"^the model's chat template cannot be read \(jinja: .+\): check its chat_template\.jinja or tokenizer_config\.json$"):
        encode(tok, "Hello") if use == "prompt" else pre_query_template(tok)


def test_a_chat_template_that_refuses_messages_still_says_so():
    from ngspec.models import load_tokenizer
    from ngspec.prompts import encode_messages

    tok = load_tokenizer()
    tok.chat_template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(NgspecError, match=r"^the chat template refused these messages: roles must alternate$"):
        encode_messages(tok, [{"role": "user", "content": "hi"}])


def test_openais_developer_role_is_the_system_prompt_where_the_template_does_not_know_it():
    """Recent OpenAI clients send the system prompt as role "developer": SmolLM2's template then
    added its own default system prompt and a "developer" turn the model never saw. It is the
    system prompt now, unless the template itself handles "developer" (gpt-oss's does)."""
    from ngspec.models import load_tokenizer
    from ngspec.prompts import encode_messages

    tok = load_tokenizer()
    asked = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert encode_messages(tok, asked) == encode_messages(tok, system)
    assert "developer" not in tok.decode(encode_messages(tok, asked)) and "SmolLM" not in tok.decode(encode_messages(tok, asked))
    tok.chat_template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}{# knows: developer #}"
    assert tok.decode(encode_messages(tok, asked)).startswith("[developer] Be brief.")


def test_generate_and_self_repetition_read_a_json_prompt_file(tiny_saved, tmp_path):
    from typer.testing import CliRunner

    from ngspec.cli.app import app

    questions = tmp_path / "q.json"
    questions.write_text(json.dumps([{"question_id": 7, "turns": ["Name a colour."]}, {"prompt": "Count to three."}]))
    result = CliRunner().invoke(app, ["generate", "-p", str(questions), "--model", str(tiny_saved), "-n", "4", "-b", "2", "--json"])
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"id"')]
    assert sorted(r["id"] for r in records) == ["7", "q.json[1]"]
    answers = tmp_path / "out.jsonl"
    answers.write_text(result.stdout)
    result = CliRunner().invoke(app, ["self-repetition", "--dataset", str(answers), "--questions", str(questions), "--model", str(tiny_saved), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["records"] == 2
