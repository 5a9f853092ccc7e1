"""`benchmarks/gpu_session.sh rehearse` runs every stage of a GPU visit here at toy sizes, in a copy
of the script rewritten by `toy_copy`. These tests check the rewrite (no stage keeps a real size or
a path of the GPU machine) and that the rehearsal covers every lane the visit runs; the rehearsal
itself takes minutes and runs by hand before a visit (BENCHMARKS.md 10t)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_session.sh"


def toy_copy(tmp_path: Path) -> str:
    subprocess.run(["bash", str(SCRIPT), "toy_copy", str(tmp_path)], check=True, capture_output=True, text=True)
    return (tmp_path / "session.sh").read_text()


def sizes(text: str, flag: str) -> list[str]:
    return re.findall(rf"(?<!\S){re.escape(flag)} ([0-9][0-9,]*)", text)


def test_toy_copy_parses_and_keeps_every_stage(tmp_path):
    copy = toy_copy(tmp_path)
    subprocess.run(["bash", "-n", str(tmp_path / "session.sh")], check=True)
    original = SCRIPT.read_text()
    assert copy.count("stage ") == original.count("stage ") > 10


def test_toy_copy_runs_every_stage_small_and_here(tmp_path):
    original, copy = SCRIPT.read_text(), toy_copy(tmp_path)
    # the visit's sizes are large (else this test would pass on an unchanged copy)
    assert max(int(n) for n in sizes(original, "--limit")) >= 8
    assert any("," in n for n in sizes(original, "--batch-sizes"))
    assert max(int(n) for n in sizes(original, "-n")) >= 64
    assert max(int(n) for n in sizes(original, "-b")) >= 8
    assert all(int(n) <= 2 for n in sizes(copy, "--limit"))
    assert all(n in ("1", "2") for n in sizes(copy, "--batch-sizes"))
    assert all(int(n) <= 8 for n in sizes(copy, "-n"))
    assert all(int(n) <= 2 for n in sizes(copy, "-b"))
    assert not re.search(r"/tmp/(head|datastore|data)\b", copy)
    assert f"RES={tmp_path}/res" in copy
    assert "NGSPEC_CACHE" not in copy  # the rehearsal uses this machine's model cache
    # tune-tree's large tree is small too (80 nodes ran past a stage's limit on two cores)
    assert copy.count("tune-tree --nodes 8 ") == original.count("tune-tree ") > 0
    # under longer limits: the visit's are for a GPU, and the short lanes share two cores here
    assert 'timeout "$((limit * 4))"' in copy and 'timeout "$limit"' in original


def test_rehearsal_covers_every_lane_of_the_visit():
    """Every lane the script defines runs in the rehearsal, by name or from a lane that does."""
    text = SCRIPT.read_text()
    body = text[text.index("toy_lanes() {") :]
    body = body[: body.index("\n}\n")]
    rehearsed = re.search(r"\$\{LANES:-([a-z ]+)\}", body).group(1).split()
    defined = re.findall(r"^lane_([a-z]+)\(\)", text, re.M)
    assert "short" in defined and "batched" in defined
    called = {lane for lane in defined for caller in rehearsed if re.search(rf"^\s+lane_{lane}\b", lane_body(text, caller), re.M)}
    assert set(defined) <= set(rehearsed) | called


def lane_body(text: str, lane: str) -> str:
    body = text[text.index(f"lane_{lane}() {{") :]
    return body[: body.index("\n}\n")]
