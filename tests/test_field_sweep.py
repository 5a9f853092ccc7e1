"""`benchmarks/field_sweep.py`: which edits it tries, and a short sweep end to end."""

import json
import sys

from conftest import benchmark_script

field_sweep = benchmark_script("field_sweep")


def test_each_field_gets_each_other_json_type_and_checked_fields_a_file_lacks_are_added(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "h").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"hidden_size": 8, "tie_word_embeddings": false}')
    (tmp_path / "h" / "config.json").write_text('{"rms_norm_eps": 1e-5}')
    edits = list(field_sweep.cases(tmp_path / "m", tmp_path / "h", ["config.json", "tokenizer.json"]))
    assert ("model", "config.json", "hidden_size", "x") in edits
    assert [e[3] for e in edits if e[2] == "hidden_size" and type(e[3]) in (int, float)] == [-1]  # of its own type, only a number no size is
    assert [e[3] for e in edits if e[2] == "tie_word_embeddings"] == [5, 1.5, "x", [1], None, {"a": 1}]
    assert [e[3] for e in edits if e[2] == "id2label"] == [{"0": None}, *field_sweep.VALUES]  # checked by ngspec, absent here
    assert [e[3] for e in edits if e[2] == "added_tokens"] == [[None], *field_sweep.VALUES]  # the file absent
    assert {e[2] for e in edits if e[1] == "tokenizer.json"} == {"version", "added_tokens", "model", "normalizer", "pre_tokenizer", "post_processor", "decoder", "truncation", "padding"}
    assert [e[3] for e in edits if e[2] == "text_config"] == field_sweep.VALUES  # read as a sub-model's config
    assert {e[2] for e in edits if e[0] == "head"} == {"rms_norm_eps"}  # the head's own fields only
    assert ("head", "config.json", "rms_norm_eps", -1) in edits


def test_a_short_sweep_runs_end_to_end(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["field_sweep.py", "--limit", "8", "--out", str(tmp_path)])
    assert field_sweep.main() == 0
    runs = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert [r["run"] for r in runs] == list(range(8)) and {r["verdict"] for r in runs} <= {"ok", "refused"}
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == {v: sum(r["verdict"] == v for r in runs) for v in {r["verdict"] for r in runs}}
