"""profile-bound: cost formulas by hand, the sweep on a tiny model, out-of-memory cells, grids,
device profiles, and the command end to end with bad input."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from typer.testing import CliRunner

from ngspec.cli.app import app
from ngspec.errors import NgspecError
from ngspec.perf.device_profile import build_profile, load_profile, save_profile
from ngspec.perf.report import analyse, csv_text, transitions
from ngspec.perf.roofline import DevicePeaks, cell_cost, forward_cost
from ngspec.perf.shapes import SHAPES, parameter_count, shape_config
from ngspec.perf.sweep import Cell, CellResult, ForwardTimer, grid, parse_values, run_sweep
from ngspec.versions import versions
from ngspec.target import TargetModel

pytestmark = pytest.mark.tiny_llama_only  # the Qwen2 tiny model runs the lossless matrices (conftest)

TINY = dict(model_type="llama", hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, vocab_size=10, tie_word_embeddings=False, max_position_embeddings=64)


def tiny_config(**overrides):
    values = {**TINY, **overrides}
    return AutoConfig.for_model(values.pop("model_type"), **values)


def test_forward_cost_matches_a_hand_count():
    # hidden 8, head_dim 4, 2 query heads, 1 KV head, intermediate 16, 2 layers, vocab 10, untied
    # per layer: q 8x8 + k 8x4 + v 8x4 + o 8x8 = 192, MLP 3 * 8x16 = 384 -> 576 matrix parameters
    # 2 rows of 3 tokens after 5 cached ones: N = 6 tokens
    cost = forward_cost(tiny_config(), rows=2, row_tokens=3, context=5, bytes_per_element=4)
    linear = 2 * 6 * (2 * 576 + 8 * 10)  # every token through every matrix and the LM head
    attention = 4 * 2 * 6 * 2 * 4 * (5 + 3)  # 2 layers, 6 queries, 2 heads x 4 dims, 8 keys each
    assert cost.flops == linear + attention == 17856
    weights = 2 * (576 + 2 * 8) + 8 * 10 + 6 * 8  # layers (+ 2 norms), LM head, 6 embedding rows
    kv = 2 * 2 * 1 * 4 * 5 + 2 * (2 * 2 * 1 * 4) * 6  # context K/V read once; block K/V written + read
    activations = 2 * 6 * (8 * 8 + 3 * 16) + 6 * 10  # per layer and token, plus the logits
    assert cost.bytes == 4 * (weights + kv + activations) == 11952


def test_tree_layout_is_one_row_of_1_plus_kw_tokens_and_tied_heads_read_no_embedding_rows():
    config = tiny_config()
    assert cell_cost(config, "tree", 3, 2, 7, 2) == forward_cost(config, 1, 7, 7, 2)
    assert cell_cost(config, "rows", 3, 2, 7, 2) == forward_cost(config, 3, 3, 7, 2)
    tied = tiny_config(tie_word_embeddings=True)
    assert forward_cost(config, 1, 4, 0, 1).bytes - forward_cost(tied, 1, 4, 0, 1).bytes == 4 * 8


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_parameter_count_matches_the_built_architecture(name):
    _, config = shape_config(name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert parameter_count(config) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("text, says", [
    (b"\x97\xff", "not UTF-8 text: byte 0 is 0x97"),  # was Python's "'utf-8' codec can't decode byte 0x97 in position 0"
    (b"[1, 2]", "not a JSON object"), (b"{}", "no 'model_type'"), (b'{"model_type": "nope"}', "nope"),
    (b"{not json", "not valid JSON: Expecting property name enclosed in double quotes at line 1 column 2"),
])
def test_a_config_file_that_is_not_a_config_is_named_in_one_message(tmp_path, text, says):
    (tmp_path / "config.json").write_bytes(text)
    with pytest.raises(NgspecError, match="cannot read a transformers config from") as refused:
        shape_config(str(tmp_path / "config.json"))
    assert says in str(refused.value)


@pytest.mark.parametrize("edit, message", [
    ({"head_dim": -1}, "its config gives head_dim=-1; a layer size must be a whole number from 1 to 2147483647"),  # was a RuntimeError at build
    ({"hidden_size": 8.5}, "cannot read a transformers config from .*: hidden_size must be a whole number, not 8.5$"),  # was the validator's own class, then its TypeError
    ({"model_type": ["llama"]}, r'cannot read a transformers config from .*: model_type must be a string, not \["llama"\]$'),  # unhashable type: 'list'
    ({"hidden_act": "[/x]"}, r'its config gives hidden_act="\[/x\]", an activation transformers does not know \(silu, '),  # KeyError (input_fuzz run 10511)
])
def test_a_shape_of_impossible_sizes_is_one_message(tmp_path, edit, message):
    (tmp_path / "config.json").write_text(json.dumps(TINY | edit))
    with pytest.raises(NgspecError, match=message):
        shape_config(str(tmp_path / "config.json"))


def test_roofline_prediction_is_the_slower_of_compute_and_memory():
    peaks = DevicePeaks(flops_per_s=100.0, bytes_per_s=10.0)
    from ngspec.perf.roofline import Cost

    assert peaks.predict(Cost(flops=50.0, bytes=20.0)) == 2.0
    assert peaks.bound(Cost(flops=50.0, bytes=20.0)) == "memory"
    assert peaks.predict(Cost(flops=500.0, bytes=20.0)) == 5.0
    assert peaks.bound(Cost(flops=500.0, bytes=20.0)) == "compute"


def test_parse_values():
    assert parse_values("1..4", "k", 1) == [1, 2, 3, 4]
    assert parse_values("0..15:5,2", "w", 0) == [0, 2, 5, 10, 15]
    assert parse_values("8, 1,8", "k", 1) == [1, 8]
    for bad in ("5..2", "", "a", "1..", "0..4:0"):
        with pytest.raises(NgspecError):
            parse_values(bad, "k", 1)
    with pytest.raises(NgspecError, match="at least 1"):
        parse_values("0..3", "k", 1)


def test_sweep_on_a_tiny_model_is_complete_with_unit_reference(tiny):
    cells = grid(["rows", "tree"], [4, 9], [2, 3], [2])
    assert len(cells) == 2 * 2 * 3 * 2  # k 1 and w 0 always join the grid
    timer = ForwardTimer(TargetModel(tiny), max_k=3, max_w=2, repeats=2)
    results = run_sweep(cells, timer)
    assert all(r.status == "ok" and r.seconds > 0 for r in results)
    reports = analyse(results, tiny.config, DevicePeaks(1e9, 1e9), 4)
    assert {(r.layout, r.context, r.k, r.w) for r in reports} == {(c.layout, c.context, c.k, c.w) for c in cells}
    for r in reports:
        if (r.k, r.w) == (1, 0):
            assert r.slowdown == 1.0 and r.predicted_slowdown == 1.0
    assert timer.target.length == 9  # cells never commit anything to the cache
    assert len(csv_text(reports).splitlines()) == 1 + len(cells)


def test_out_of_memory_cells_are_recorded_and_the_sweep_continues(tmp_path):
    cells = grid(["rows"], [10], [1, 2, 4], [0, 3])

    def fake(cell: Cell) -> float:
        if cell.tokens > 8:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return 0.01 * (1 + 0.02 * cell.tokens)

    results = run_sweep(cells, fake)
    assert [r.status for r in results] == ["ok" if c.tokens <= 8 else "oom" for c in cells]
    assert len(results) == len(cells)
    reports = analyse(results, tiny_config(), DevicePeaks(1e9, 1e9), 4)
    oom = [r for r in reports if r.status == "oom"]
    assert oom and all(r.ms is None and r.slowdown is None for r in oom)
    (trans,) = transitions(reports)
    # 4 tokens: 1.08 / 1.02 = 1.06x (free); 8 tokens: 1.16 / 1.02 = 1.14x; ties go to the deeper w
    assert (trans.measured_tokens, trans.measured_kw) == (4, (1, 3))


def test_an_interrupted_sweep_keeps_the_groups_it_timed_whole():
    """Ctrl-C (KeyboardInterrupt) inside a (layout, context) group: the groups before it are kept
    whole, the started one dropped (its slowdowns and largest free block would be of part of it);
    before any group finished, the interrupt goes on as it came."""
    from ngspec.errors import Stopped

    cells = grid(["rows", "tree"], [4, 16], [1, 2], [0, 1])  # four groups of four cells

    def stopping_at(n):
        seen = []

        def measure(cell):
            seen.append(cell)
            if len(seen) == n:
                raise KeyboardInterrupt
            return 0.01
        return measure

    with pytest.raises(Stopped) as stop:
        run_sweep(cells, stopping_at(11))  # the third group's third cell
    assert [r.cell for r in stop.value.measured] == cells[:8]
    with pytest.raises(KeyboardInterrupt):
        run_sweep(cells, stopping_at(4))


def test_other_errors_are_not_mistaken_for_out_of_memory():
    def broken(cell):
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        run_sweep(grid(["rows"], [4], [1], [0]), broken)


def _reports():
    results = []
    for context, per_token in ((16, 0.05), (256, 0.1)):
        for cell in grid(["rows", "tree"], [context], [1, 2, 4], [0, 1, 3]):
            results.append(CellResult(cell, 0.01 * (1 + per_token * (cell.tokens - 1))))
    return analyse(results, tiny_config(), DevicePeaks(1e9, 1e9), 4)


def test_device_profile_round_trip_and_cost_tables(tmp_path):
    profile = build_profile({"model": "tiny", "device": "test"}, _reports(), max_slowdown=1.1)
    path = tmp_path / "p.json"
    save_profile(path, profile)
    loaded = load_profile(path, "tiny")
    assert loaded.contexts[16]["budget_tokens"] == 3  # 1 + 0.05 * 2 = 1.1
    assert loaded.contexts[256]["budget_tokens"] == 2
    short = loaded.verify_cost(20, max_nodes=16)
    assert len(short) == 17 and short[0] == 1.0
    assert short[1] == pytest.approx(1.05) and short[12] == pytest.approx(1.6)  # tree nodes = k*w
    assert short[16] == pytest.approx(1.8)  # beyond the grid: along the last slope
    assert all(a <= b for a, b in zip(short, short[1:]))
    assert loaded.verify_cost(1000, 4)[2] == pytest.approx(1.2)  # the 256 table from 256 up
    assert loaded.verify_cost(3, 4)[2] == pytest.approx(1.1)  # below every context: the smallest
    assert loaded.best_rows(16) == (1, 1)


def test_bad_device_profiles_are_refused(tmp_path):
    path = tmp_path / "p.json"
    save_profile(path, build_profile({"model": "tiny", "device": "test"}, _reports(), 1.1))
    with pytest.raises(NgspecError, match="measured for model 'tiny'"):
        load_profile(path, "other")
    for text, message in (("{", "not a readable"), ("[]", "not an ngspec device profile"),
                          ('{"format": "ngspec-device-profile", "version": 1, "contexts": {"x": 1}}', "damaged")):
        path.write_text(text)
        with pytest.raises(NgspecError, match=message):
            load_profile(path)
    with pytest.raises(NgspecError, match="no device profile"):
        load_profile(tmp_path / "missing.json")


def test_a_profile_that_records_the_models_shape_is_checked_by_it(tmp_path):
    """A profile is what a forward of this shape costs on the device: any model of the shape may
    use it, whatever it was called (`--shape smollm2-135m` for the default model, one model given
    by name and by path); a model of another shape is refused, named and with what differs. A
    profile without a shape (older files) is checked by the name, as before."""
    from ngspec.models import tiny_model
    from ngspec.perf.costs import model_shape

    shape = model_shape(tiny_model())
    path = tmp_path / "p.json"
    save_profile(path, build_profile({"model": "tiny", "model_shape": shape, "device": "test"}, _reports(), 1.1))
    assert load_profile(path, "./checkpoints/tiny", shape).model_shape == shape
    wider = model_shape(tiny_model(vocab_size=160))
    with pytest.raises(NgspecError, match=r"measured for model 'tiny', whose shape differs from that of 'tiny' \(vocab_size=96 against 160\)"):
        load_profile(path, "tiny", wider)
    save_profile(path, build_profile({"model": "tiny", "device": "test"}, _reports(), 1.1))
    assert load_profile(path, "tiny", shape).model_shape is None
    with pytest.raises(NgspecError, match="measured for model 'tiny', not 'other'"):
        load_profile(path, "other", shape)


runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture
def tiny_shape(tmp_path):
    path = tmp_path / "tiny" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps({**TINY, "vocab_size": 96}))
    return path


def test_command_end_to_end_on_a_config_file(tmp_path, tiny_shape):
    out = tmp_path / "out"
    result = invoke("profile-bound", "--shape", tiny_shape, "--k", "1,2", "--w", "0..2", "--context", "4,16",
                    "--repeats", 1, "--out", out, "--save-profile", out / "dev.json", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(report["cells"]) == 2 * 2 * 2 * 3
    assert {t["layout"] for t in report["transitions"]} == {"rows", "tree"}
    assert report["peak_tflops"] > 0 and report["peak_bandwidth_gbs"] > 0
    assert report["target_graphs"] is False and "graphs" not in report
    assert {k: report[k] for k in ("ngspec", "torch", "transformers", "python")} == versions()
    names = sorted(p.name for p in out.iterdir())
    assert names == ["dev.json", "profile-tiny-rows.png", "profile-tiny-tree.png", "profile-tiny.csv", "profile-tiny.json"]
    profile = load_profile(out / "dev.json", "tiny")
    assert set(profile.contexts) == {4, 16}
    from ngspec.perf.costs import model_shape
    from ngspec.perf.shapes import random_model, shape_config

    measured = random_model(shape_config(str(tiny_shape))[1], torch.device("cpu"), torch.float32)
    assert profile.model_shape == report["model_shape"] == model_shape(measured)  # what a model of this shape is checked by


@pytest.mark.parametrize("json_out", [False, True])
def test_a_disk_that_fills_at_the_files_keeps_the_report_and_the_files_written(tmp_path, tiny_shape, monkeypatch, json_out):
    """The files are written after the report is shown (the CSV and JSON were written first, so a
    disk that filled at them lost the tables too), and a failure part way names the files written
    whole before it, which stay (on a 200 KiB tmpfs the tree heatmap failed after the CSV, JSON
    and rows heatmap were written: `benchmarks/full_disk.py`)."""
    import ngspec.perf.plots as plots

    real = plots.save_figure

    def fills_at_the_tree(fig, path):
        if path.name.endswith("-tree.png"):
            raise OSError(28, "No space left on device", str(path))
        return real(fig, path)

    monkeypatch.setattr(plots, "save_figure", fills_at_the_tree)
    out = tmp_path / "out"
    result = invoke("profile-bound", "--shape", tiny_shape, "--k", "1", "--w", "0,1", "--context", "4", "--repeats", 1, "--out", out,
                    *(["--json"] if json_out else []))
    written = [out / name for name in ("profile-tiny.csv", "profile-tiny.json", "profile-tiny-rows.png")]
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert " ".join(result.stderr.split()).endswith(f"... error: No space left on device: {out / 'profile-tiny-tree.png'}; "
                                                                 f"written whole before it: {', '.join(map(str, written))}")
    assert sorted(out.iterdir()) == sorted(written)
    if json_out:
        assert json.loads(result.stdout)["files"] == [*map(str, written), str(out / "profile-tiny-tree.png")]
    else:
        assert "largest block within 10% of (1, 0)" in result.stdout and "wrote" not in result.stdout


def test_an_interrupted_command_reports_and_writes_its_whole_groups_but_no_device_profile(tmp_path, tiny_shape, monkeypatch):
    import ngspec.perf.sweep as sweep

    real, calls = sweep.ForwardTimer.__call__, []

    def timed(self, cell):
        calls.append(cell)
        if len(calls) == 6 + 2:  # grid: context 4's rows group (6 cells), then 2 of its tree group
            raise KeyboardInterrupt
        return real(self, cell)

    monkeypatch.setattr(sweep.ForwardTimer, "__call__", timed)
    out = tmp_path / "out"
    args = ["profile-bound", "--shape", tiny_shape, "--k", "1,2", "--w", "0..2", "--context", "4,16", "--repeats", 1, "--out", out,
            "--save-profile", out / "dev.json"]
    result = invoke(*args, "--json")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"interrupted after 1 of 4 (layout, context) groups; the report and the files in {out} cover only those" in result.stderr
    assert "dev.json was not written (a device profile needs every context)" in result.stderr
    report = json.loads(result.stdout)
    assert report["interrupted"] == "after 1 of 4 (layout, context) groups"
    assert {(c["layout"], c["context"]) for c in report["cells"]} == {("rows", 4)} and len(report["cells"]) == 6
    assert sorted(p.name for p in out.iterdir()) == ["profile-tiny-rows.png", "profile-tiny.csv", "profile-tiny.json"]
    assert json.loads((out / "profile-tiny.json").read_text())["interrupted"] == report["interrupted"]
    calls.clear()
    result = invoke(*args[:-2])  # the tables
    assert result.exit_code == 1 and "(interrupted after 1 of 4 (layout, context) groups)" in result.stdout
    assert "rows, context 4" in result.stdout and "tree, context 4" not in result.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--k", "4..1"], "inverted range"),
        (["--k", "0,1"], "at least 1"),
        (["--w", "-1"], "expected numbers"),
        (["--context", ""], "expected numbers"),
        (["--context", "60"], "exceeds the model's window"),
        (["--layout", "grid"], "--layout"),
        (["--max-slowdown", "0.5"], "--max-slowdown must be at least 1.0 (got 0.5)"),
        (["--max-slowdown", "nan"], "--max-slowdown must be at least 1.0 (got nan)"),
    ],
)
def test_bad_grids_fail_before_timing(tmp_path, tiny_shape, args, message):
    result = invoke("profile-bound", "--shape", tiny_shape, "--out", tmp_path / "o", "--k", "1,2", "--w", "0,3", *args)
    assert result.exit_code == 1
    assert message in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "o" / "profile-tiny.csv").exists()


def test_unknown_shape_and_unwritable_output(tmp_path):
    result = invoke("profile-bound", "--shape", "llama-70b-typo", "--out", tmp_path / "o")
    assert result.exit_code == 1 and "unknown shape" in result.output and "llama-7b" in result.output
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = invoke("profile-bound", "--shape", "smollm2-135m", "--out", blocker / "sub")
    assert result.exit_code == 1 and f"cannot write {blocker / 'sub'}: {blocker} is a file, not a directory" in result.output


@pytest.mark.parametrize("where", ["a directory", "under a file"])
def test_a_save_profile_path_that_cannot_be_written_fails_before_timing(tmp_path, tiny_shape, where):
    """A directory given as --save-profile was found only after the whole sweep (a bare "Is a
    directory"), and a path under a file was blamed on --out."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    target = tmp_path if where == "a directory" else blocker / "p.json"
    result = invoke("profile-bound", "--shape", tiny_shape, "--out", tmp_path / "o", "--k", "1", "--w", "0,1", "--context", "25", "--save-profile", target)
    message = f"--save-profile {tmp_path} is a directory; give the path of a file to write" if where == "a directory" else f"cannot write {target}: {blocker} is a file"
    assert result.exit_code == 1 and message in result.output and "--out" not in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "o" / "profile-tiny.csv").exists()


def test_engine_sizes_drafts_from_a_profile_per_context(tmp_path, tiny):
    from ngspec.decode import DecodeConfig
    from ngspec.drafters import make_drafter
    from ngspec.engine import Engine
    from ngspec.models import LoadedModel

    from conftest import hf_greedy

    path = tmp_path / "p.json"
    save_profile(path, build_profile({"model": "tiny", "device": "test"}, _reports(), 1.1))
    profile = load_profile(path, "tiny")
    engine = Engine(LoadedModel(tiny, None, "tiny"), profile=profile, max_draft_nodes=8)
    assert engine.target.verify_cost(40) == profile.verify_cost(16, 8)
    assert engine.target.verify_cost(300) == profile.verify_cost(256, 8)
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7]
    out = engine.run(prompt, make_drafter("trie"), DecodeConfig(max_new_tokens=20)).token_ids
    assert out == hf_greedy(tiny, prompt, 20)


def test_a_sliding_window_model_is_timed_as_trees(tmp_path):
    """Rows share one prefix cache, which sliding-window layers cannot: the default (both layouts)
    times trees only and says so; asking for rows is one clear line."""
    path = tmp_path / "slide" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps({**TINY, "model_type": "mistral", "sliding_window": 4, "vocab_size": 96}))
    grid = ["--k", "1,2", "--w", "0,1", "--context", "8", "--repeats", 1]
    result = invoke("profile-bound", "--shape", path, *grid, "--out", tmp_path / "o", "--json")
    assert result.exit_code == 0, result.output
    assert {t["layout"] for t in json.loads(result.stdout.strip().splitlines()[-1])["transitions"]} == {"tree"}
    assert "timing the tree layout only" in result.stderr
    rows = invoke("profile-bound", "--shape", path, *grid, "--layout", "rows", "--out", tmp_path / "r")
    assert rows.exit_code == 1 and "use --layout tree" in rows.stderr


def test_the_tree_sweep_at_fixed_shapes_replays_one_capture_per_shape(tiny, monkeypatch):
    """`--target-graphs`: every cell's forward runs at its bucketed shape from a captured graph
    (the CPU stand-in), each shape captured once (at its second run) over both contexts, every
    later run a replay, and the cache left as the cells found it."""
    from graph_standin import StandInGraphs

    StandInGraphs(monkeypatch)
    target = TargetModel(tiny)
    static = target.use_graphs(capture=True)
    cells = grid(["tree"], [4, 9], [1, 2, 3], [0, 1, 2])
    results = run_sweep(cells, ForwardTimer(target, max_k=3, max_w=2, warmup=2, repeats=2))
    assert all(r.status == "ok" and r.seconds > 0 for r in results)
    widths = {c.tokens for c in cells}
    assert widths == {1, 2, 3, 4, 5, 7}  # rounded up to blocks 1, 2, 4 and 8 wide
    assert static.graphs.captures == static.made == 4
    # every run a replay but each shape's first (eager) and second (its capture, then a replay)
    assert static.graphs.replays == len(cells) * 4 - 4 and static.graphs.cold == 8
    assert target.length == 9


def test_target_graphs_need_a_gpu_and_time_trees(tmp_path, tiny_shape):
    """Refused here in one line before anything is built or written."""
    grid_args = ["--k", "1,2", "--w", "0,1", "--context", "8", "--repeats", 1]
    result = invoke("profile-bound", "--shape", tiny_shape, *grid_args, "--target-graphs", "--out", tmp_path / "o")
    assert result.exit_code == 1 and "--target-graphs needs a CUDA GPU" in result.stderr
    assert "Traceback" not in result.output and not (tmp_path / "o" / "profile-tiny.csv").exists()
    rows = invoke("profile-bound", "--shape", tiny_shape, *grid_args, "--target-graphs", "--layout", "rows", "--out", tmp_path / "r")
    assert rows.exit_code == 1 and "use --layout tree" in rows.stderr


def test_a_profile_says_whether_it_was_measured_from_graphs_and_a_mismatch_warns(tmp_path, default_model, monkeypatch):
    from ngspec import models
    from ngspec.cli.common import load_engine

    path = tmp_path / "p.json"
    save_profile(path, build_profile({"model": "tiny", "device": "test"}, _reports(), 1.1))  # written before the field existed
    assert load_profile(path).target_graphs is False
    save_profile(path, build_profile({"model": default_model.name, "target_graphs": True}, _reports(), 1.1))
    assert load_profile(path).target_graphs is True
    monkeypatch.setattr(models, "load_model", lambda *args, **kwargs: default_model)
    with pytest.warns(UserWarning, match="measured with --target-graphs and this run verifies without"):
        engine = load_engine("default", "cpu", "float32", path, quiet=True)
    assert engine.target.cost_tables == load_profile(path).cost_tables(engine.max_draft_nodes)


def test_a_profile_from_another_device_or_dtype_warns_and_one_from_here_does_not(tmp_path, default_model, monkeypatch):
    """Costs depend on the device (a CPU's with its thread count) and the dtype: a profile measured
    elsewhere still sizes drafts, with a warning that says where it was measured; one measured
    here in this dtype says nothing. Files that do not say (older ones) are not doubted."""
    import warnings

    import torch

    from ngspec import models
    from ngspec.cli.common import load_engine
    from ngspec.perf.costs import model_shape
    from ngspec.perf.device_profile import device_name

    here = device_name(torch.device("cpu"))
    assert str(torch.get_num_threads()) in here
    monkeypatch.setattr(models, "load_model", lambda *args, **kwargs: default_model)
    path = tmp_path / "p.json"
    meta = {"model": default_model.name, "model_shape": model_shape(default_model.model)}
    save_profile(path, build_profile({**meta, "device": "NVIDIA H200", "dtype": "bfloat16"}, _reports(), 1.1))
    with pytest.warns(UserWarning) as caught:
        engine = load_engine("default", "cpu", "float32", path, quiet=True)
    said = [str(w.message) for w in caught]
    assert any(f"measured on NVIDIA H200 and this run is on {here}" in m for m in said)
    assert any("measured in bfloat16 and this run is in float32" in m for m in said)
    assert engine.target.cost_tables == load_profile(path).cost_tables(engine.max_draft_nodes)  # used all the same
    for matching in ({**meta, "device": here, "dtype": "float32"}, meta):  # measured here; an older file that does not say
        save_profile(path, build_profile(matching, _reports(), 1.1))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            load_engine("default", "cpu", "float32", path, quiet=True)


def test_a_heatmap_titled_in_characters_the_font_lacks_warns_nothing(tmp_path):
    """A model directory named "模型" (input_fuzz: "ünïcode 猫"): matplotlib's bundled font has no
    such glyphs and warned, with its source line, on the terminal; the boxes are drawn quietly."""
    import warnings

    from ngspec.perf.plots import heatmap

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        path = heatmap(_reports(), "rows", "模型 猫, float32\ncpu", tmp_path / "h.png")
    assert path.stat().st_size > 0
