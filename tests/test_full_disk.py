"""`benchmarks/full_disk.py`'s judge: it tells one clear line from a library's words, a finished
run from a half one, and what a failed run may leave from what it may not (the mounts themselves
need root, so the script is run by hand: BENCHMARKS.md 10zzzk)."""

import pytest

from conftest import benchmark_script

full_disk = benchmark_script("full_disk")


def case(name):
    return next(c for c in full_disk.cases(full_disk.ROOT, full_disk.ROOT, full_disk.ROOT) if c.name == name)


@pytest.mark.parametrize(
    ("name", "rc", "stderr", "files", "faults"),
    [
        ("build-datastore", 1, "error: No space left on device: D/ds\n", [], []),
        ("build-datastore", 1, "error: tokenisation failed: OSError: 46791 requested and 0 written\n", [],
         ["no line matching", "a library's words"]),
        ("build-datastore", 1, "error: No space left on device: D/ds (set NGSPEC_DEBUG=1 for the traceback)\n", [], ["a library's words"]),
        ("build-datastore", 1, "error: No space left on device: D/ds\n", [".ds.tmp-0badf00d-12-ab"], ["a temporary left behind"]),
        ("build-datastore", 0, "", ["ds", "ds/sa.npy"], []),
        ("build-datastore", 0, "", [], ["exit code 0 and no ds"]),
        ("build-datastore", 1, "error: No space left on device: D/ds\n", ["ds", "ds/sa.npy"], ["left behind: ds", "left behind: ds/sa.npy"]),
        ("profile-bound --out", 1, "error: No space left on device: D/prof/p-tree.png; written whole before it: D/prof/p.csv\n",
         ["prof", "prof/p.csv"], []),
        ("profile-bound --out", 1, "error: No space left on device: D/prof/p-tree.png\n", ["prof", "prof/p.csv"], ["left behind: prof/p.csv"]),
        ("train-eagle", 1, "error: No space left on device: D/head/features/a.pt\n", ["head", "head/features"], []),
        ("a cache that cannot be written", 0, "warning: cannot write the n-gram tables to the cache (No space left on device: D/cache/n)\n", [], []),
        ("a cache that cannot be written", 0, "warning: cannot write the n-gram tables (Permission denied: D/cache/n)\n", [], ["no line matching"]),
        ("a cache that cannot be written", 1, "error: something\n", [], ["exit code 1"]),
    ],
)
def test_the_judge(tmp_path, name, rc, stderr, files, faults):
    for path in files:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        if "." in path.rsplit("/", 1)[-1] and not path.startswith(".ds.tmp"):
            (tmp_path / path).write_text("whole")
        else:
            (tmp_path / path).mkdir(exist_ok=True)
    said = full_disk.judge(case(name), tmp_path, rc, stderr.replace("D/", f"{tmp_path}/"))
    assert len(said) == len(faults) and all(s.startswith(f) for s, f in zip(said, faults)), said


def test_the_judge_on_a_disk_without_inodes_and_on_kept_records(tmp_path):
    datastore = case("build-datastore")
    assert full_disk.judge(datastore, tmp_path, 1, f"error: cannot write {tmp_path}/ds: No space left on device\n", inodes=False) == []
    assert full_disk.judge(datastore, tmp_path, 0, "", inodes=False)[0].startswith("exit code 0, expected 1")
    (tmp_path / "c.partial.jsonl").write_bytes(b'{"instruction": "a", "response": "b"}\n{"instruction": "c", "resp')
    said = f"error: stopped (No space left on device, writing {tmp_path}/c.jsonl) after 1 record; it is in {tmp_path}/c.partial.jsonl"
    assert full_disk.judge(case("synth-corpus"), tmp_path, 1, said) == ["c.partial.jsonl line 2 is not a whole record"]


def test_sizes_and_every_writing_command_has_a_case():
    assert full_disk.sizes("0,32k,1.5k,100") == [0, 32768, 1536, 100] and full_disk.sizes("") == []
    commands = {c.args[0] for c in full_disk.cases(full_disk.ROOT, full_disk.ROOT, full_disk.ROOT)}
    assert commands == {"build-datastore", "build-bigram", "train-eagle", "tune-tree", "synth-corpus", "bench", "profile-bound", "generate"}
