"""benchmarks/ab_pool.py: reader_ab results pooled over files, each prompt counted once."""

import json

import pytest

from conftest import benchmark_script

from ngspec.bench.interval import ratio_interval

pool = benchmark_script("ab_pool")


def result(runs_whole, runs_trie, keys=None):
    arms = {"whole": {"runs": runs_whole}, "trie": {"runs": runs_trie}}
    if keys is not None:
        for arm in arms.values():
            arm["keys"] = keys
    return arms


def write(path, data):
    path.write_text(json.dumps(data))
    return path


RAG = ([[96, 1.0], [96, 1.3], [90, 0.8], [96, 1.1]], [[96, 1.1], [96, 1.3], [90, 0.9], [96, 1.2]])
SUMM = ([[96, 2.0], [80, 1.6], [96, 1.9]], [[96, 2.1], [80, 1.5], [96, 2.0]])


def test_pooled_over_files_with_every_prompt_once(tmp_path, capsys):
    rag_keys = [f"rag:{i}" for i in range(4)]
    files = [
        write(tmp_path / "rag.json", result(*RAG, rag_keys)),
        write(tmp_path / "summ.json", result(*SUMM, [f"summarization:{i}" for i in range(3)])),
        write(tmp_path / "rag-again.json", result(*RAG, rag_keys)),  # the same prompts, run again
    ]
    pool.main([str(f) for f in files])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and "over 4 prompts or groups (4 pairs)" in lines[0]
    assert "pooled" in lines[3] and "over 7 prompts or groups (11 pairs)" in lines[3]
    whole = RAG[0] + SUMM[0] + RAG[0]
    trie = RAG[1] + SUMM[1] + RAG[1]
    low, high = ratio_interval(whole, trie, keys=rag_keys + [f"summarization:{i}" for i in range(3)] + rag_keys)
    assert f"{low:.3f}-{high:.3f}x" in lines[3]
    assert "note" not in "\n".join(lines)


def test_files_without_keys_count_each_pair_and_say_so(tmp_path, capsys):
    files = [write(tmp_path / "a.json", result(*RAG)), write(tmp_path / "b.json", result(*RAG))]
    pool.main([str(f) for f in files])
    out = capsys.readouterr().out
    assert "over 8 prompts or groups (8 pairs)" in out and "note:" in out and "a.json" in out


def test_a_missing_arm_or_unpaired_runs_or_a_bad_file_is_one_message(tmp_path):
    good = write(tmp_path / "good.json", result(*RAG))
    with pytest.raises(SystemExit, match="no arm 'eagle'"):
        pool.main([str(good), "--arm", "eagle"])
    batch = write(tmp_path / "batch.json", result([], []))
    with pytest.raises(SystemExit, match="no paired runs"):
        pool.main([str(batch)])
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(SystemExit, match="cannot read"):
        pool.main([str(bad)])
