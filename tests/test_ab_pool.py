"""benchmarks/ab_pool.py: reader_ab and bench -b results pooled over files, each prompt or group counted once, or
every round."""

import json
import math
import re

import pytest

from conftest import benchmark_script

from ngspec.bench.interval import ratio_interval, rounds_interval

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


def bench_result(category, groups_by_arm, batch_size=8):
    """An `ngspec bench -b B --interleave-batches K --json-out` result: per arm, each round's groups."""
    return {
        "environment": {"category": category, "batch_size": batch_size},
        "arms": [{"arm": arm, "group_runs": rounds} for arm, rounds in groups_by_arm.items()],
    }


def test_bench_batch_files_pool_their_groups_each_once(tmp_path, capsys):
    """A bench -b file's groups are its units: two rounds of one group count as one group, the same
    groups in a second file once, another category's apart, as bench's own interval counts them."""
    rag = {"eagle+search": [[[500, 5.0], [480, 5.5]], [[500, 5.2], [480, 5.1]]],
           "trie": [[[500, 5.5], [480, 5.4]], [[500, 5.6], [480, 5.9]]]}
    summ = {"eagle+search": [[[400, 4.0], [420, 4.4], [410, 4.1]]], "trie": [[[400, 4.2], [420, 4.3], [410, 4.5]]]}
    files = [write(tmp_path / "rag.json", bench_result("rag", rag)), write(tmp_path / "summ.json", bench_result("summarization", summ)),
             write(tmp_path / "rag-again.json", bench_result("rag", rag))]
    pool.main([str(f) for f in files] + ["--arm", "eagle+search", "--versus", "trie"])
    lines = capsys.readouterr().out.splitlines()
    assert "over 2 prompts or groups (4 pairs)" in lines[0] and "over 3 prompts or groups (3 pairs)" in lines[1]
    assert "pooled" in lines[3] and "over 5 prompts or groups (11 pairs)" in lines[3]
    keys = ["rag:b8:group 0", "rag:b8:group 1"] * 2
    mine = [tuple(g) for rnd in rag["eagle+search"] for g in rnd]
    theirs = [tuple(g) for rnd in rag["trie"] for g in rnd]
    low, high = ratio_interval(mine, theirs, keys=keys)
    assert f"{low:.3f}-{high:.3f}x" in lines[0]


def rounds_result(category, speedups_by_arm):
    """An `ngspec bench -b B --rounds R --json-out` result without groups: each arm's round-by-round
    throughput against vanilla's."""
    return {"environment": {"category": category, "batch_size": 8},
            "arms": [{"arm": arm, "round_speedups": rounds} for arm, rounds in speedups_by_arm.items()]}


def test_bench_batch_files_without_groups_pool_their_rounds(tmp_path, capsys):
    """Each round is one ratio (both arms against the round's vanilla run); files pool every round,
    geometric mean and Student's t over them, as bench prints for one file."""
    three = {"vanilla": [1.0, 1.0, 1.0], "eagle+search": [1.10, 1.12, 1.09], "trie": [1.08, 1.09, 1.10]}
    five = {"vanilla": [1.0] * 5, "eagle+search": [1.11, 1.10, 1.12, 1.09, 1.13], "trie": [1.10, 1.09, 1.10, 1.10, 1.10]}
    files = [write(tmp_path / "three.json", rounds_result("rag", three)), write(tmp_path / "five.json", rounds_result("rag", five))]
    pool.main([str(f) for f in files] + ["--arm", "eagle+search", "--versus", "trie"])
    lines = capsys.readouterr().out.splitlines()
    ratios = [a / b for a, b in zip(three["eagle+search"] + five["eagle+search"], three["trie"] + five["trie"])]
    assert "over 3 rounds (2 above 1)" in lines[0] and "over 5 rounds (4 above 1)" in lines[1]
    mean = math.exp(sum(map(math.log, ratios)) / len(ratios))
    low, high = rounds_interval(ratios)
    assert "pooled" in lines[2] and f"{mean:.3f}x over 8 rounds (6 above 1), 95% interval {low:.3f}-{high:.3f}x" in lines[2]
    assert low < mean < high


def test_bench_files_of_both_kinds_or_without_rounds_are_refused_with_the_reason(tmp_path):
    grouped = bench_result("rag", {"eagle+search": [[[500, 5.0], [480, 5.5]]], "trie": [[[500, 5.5], [480, 5.4]]]})
    rounds = rounds_result("rag", {"eagle+search": [1.1, 1.0], "trie": [1.0, 1.0]})
    with pytest.raises(SystemExit, match="pool each kind on its own"):
        pool.main([str(write(tmp_path / "g.json", grouped)), str(write(tmp_path / "r.json", rounds)), "--arm", "eagle+search", "--versus", "trie"])
    data = {"environment": {}, "arms": [{"arm": "eagle+search"}, {"arm": "trie"}]}
    with pytest.raises(SystemExit, match="no rounds of 'eagle\\+search' and 'trie' to pair"):
        pool.main([str(write(tmp_path / "b.json", data)), "--arm", "eagle+search", "--versus", "trie"])
    with pytest.raises(SystemExit, match="no arm 'whole'"):
        pool.main([str(write(tmp_path / "b.json", data)), "--arm", "whole", "--versus", "trie"])


def setup_result(speedups_by_arm, **env):
    """A rounds result whose environment records a setup, as `ngspec bench` writes it."""
    data = rounds_result("rag", speedups_by_arm)
    data["environment"].update({"model": "SmolLM2-135M-Instruct", "cpu": "AMD EPYC", "dtype": "float32",
                                "drafting": {"eagle_head": "heads/a", "datastore": "datastores/shipped", "deepen": True}}, **env)
    return data


def test_bench_files_of_different_setups_are_refused_naming_the_difference_unless_mixed(tmp_path, capsys):
    speedups = {"vanilla": [1.0, 1.0], "eagle+search": [1.1, 1.0], "trie": [1.0, 1.0]}
    a = setup_result(speedups, transformers="5.25.0")
    b = setup_result(speedups, transformers="5.25.0")
    b["environment"]["drafting"]["eagle_head"] = "heads/b"
    c = setup_result(speedups, cpu="Intel Xeon", category="summarization", rounds=9, transformers="5.26.0")  # another host; category and rounds may differ
    files = [str(write(tmp_path / n, d)) for n, d in (("a.json", a), ("b.json", b), ("c.json", c))]
    with pytest.raises(SystemExit, match="different setups") as refused:
        pool.main(files + ["--arm", "eagle+search", "--versus", "trie"])
    message = str(refused.value)
    assert re.search(r"drafting.eagle_head heads/a \(.*a.json\) against heads/b \(.*b.json\)", message)
    assert re.search(r"cpu AMD EPYC \(.*a.json\) against Intel Xeon \(.*c.json\)", message) and "category" not in message
    assert re.search(r"transformers 5.25.0 \(.*a.json\) against 5.26.0 \(.*c.json\)", message)
    pool.main(files + ["--arm", "eagle+search", "--versus", "trie", "--mixed"])
    out = capsys.readouterr().out
    assert "note: pooled across different setups (--mixed): cpu AMD EPYC" in out and "drafting.eagle_head heads/a" in out and "over 6 rounds" in out
    # the same setup pools; a file that records no setup (written before bench did) is not compared
    same = [str(write(tmp_path / "a2.json", setup_result(speedups, category="summarization"))), str(write(tmp_path / "old.json", rounds_result("rag", speedups)))]
    pool.main([files[0]] + same + ["--arm", "eagle+search", "--versus", "trie"])
    out = capsys.readouterr().out
    assert "different setups" not in out and re.search(r"note: \S*old.json record no drafting setup", out) and "a2.json record" not in out
    # a file without a record first: the others are still compared with each other
    with pytest.raises(SystemExit, match=r"drafting.eagle_head heads/a \(.*a.json\) against heads/b"):
        pool.main([same[1]] + files[:2] + ["--arm", "eagle+search", "--versus", "trie"])
