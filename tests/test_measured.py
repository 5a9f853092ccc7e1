"""`ngspec.perf.measured`: a measurement made while other processes kept the CPUs busy is used for
the run that made it but not cached (a cost table timed beside a two-core job read every tree up
to 30 nodes as free, and every later run sized its trees by it: BENCHMARKS.md 10zc)."""

from __future__ import annotations

import json

import pytest

from conftest import next_run
from ngspec.perf import measured


class FakeTicks:
    """/proc/stat and /proc/self/stat as counters the test advances."""

    def __init__(self) -> None:
        self.busy = self.total = self.own = 0

    def spend(self, own: int, others: int, idle: int) -> None:
        self.own += own
        self.busy += own + others
        self.total += own + others + idle


@pytest.fixture
def ticks(monkeypatch, tmp_path):
    fake = FakeTicks()
    monkeypatch.setattr(measured, "_cpu_ticks", lambda: (fake.busy, fake.total))
    monkeypatch.setattr(measured, "_own_ticks", lambda: fake.own)
    monkeypatch.setenv("NGSPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(measured, "_THIS_RUN", {})
    return fake


def measure_with(ticks: FakeTicks, own: int, others: int, idle: int, value: float):
    def measure():
        ticks.spend(own, others, idle)
        return value, {"value": value}
    return measure


def read(entry):
    return entry["value"]


def test_a_quiet_measurement_is_cached_with_what_others_used(ticks, tmp_path):
    assert measured.measured_once("costs", "s", read, measure_with(ticks, 180, 10, 10, 1.5)) == 1.5
    (entry,) = [json.loads(p.read_text()) for p in (tmp_path / "costs").glob("*.json")]
    assert entry["value"] == 1.5 and entry["others_cpu_share"] == pytest.approx(0.05)
    next_run()
    assert measured.measured_once("costs", "s", read, measure_with(ticks, 1, 0, 0, 9.0)) == 1.5  # read back


def test_a_busy_measurement_is_used_once_not_cached_and_said(ticks, tmp_path):
    with pytest.warns(RuntimeWarning, match="50% of the CPUs"):
        assert measured.measured_once("costs", "s", read, measure_with(ticks, 100, 100, 0, 1.0)) == 1.0
    assert not list((tmp_path / "costs").glob("*.json"))
    # the same run does not time it again (a server re-timed it for every burst of requests)
    assert measured.measured_once("costs", "s", read, measure_with(ticks, 1, 0, 0, 9.0)) == 1.0
    # the next run measures again, and a quiet one is kept
    next_run()
    assert measured.measured_once("costs", "s", read, measure_with(ticks, 190, 0, 10, 1.3)) == 1.3
    next_run()
    assert measured.measured_once("costs", "s", read, measure_with(ticks, 1, 0, 0, 9.0)) == 1.3


def test_entries_from_before_the_watch_are_measured_again(ticks, tmp_path):
    path = measured.entry_path("costs", "s")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"setting": "s", "value": 1.0}))  # no record of what others used then
    assert measured.measured_once("costs", "s", read, measure_with(ticks, 100, 0, 0, 1.4)) == 1.4
    assert json.loads(path.read_text())["others_cpu_share"] == 0.0


def test_without_proc_the_measurement_is_cached_unwatched(monkeypatch, tmp_path):
    monkeypatch.setattr(measured, "_cpu_ticks", lambda: None)
    monkeypatch.setenv("NGSPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(measured, "_THIS_RUN", {})
    assert measured.measured_once("costs", "s", read, lambda: (2.0, {"value": 2.0})) == 2.0
    assert json.loads(measured.entry_path("costs", "s").read_text())["others_cpu_share"] is None
    next_run()
    assert measured.measured_once("costs", "s", read, lambda: (3.0, {"value": 3.0})) == 2.0


def test_a_measurement_too_short_to_tell_is_cached_unwatched(ticks, tmp_path):
    # 40 ticks of both CPUs: the counters' sampling could read a few ticks either way
    assert measured.measured_once("costs", "s", read, measure_with(ticks, 20, 20, 0, 1.1)) == 1.1
    assert json.loads(measured.entry_path("costs", "s").read_text())["others_cpu_share"] is None


def test_the_real_counters_read_where_linux_has_them():
    cpu, own = measured._cpu_ticks(), measured._own_ticks()
    if cpu is None:
        pytest.skip("no /proc/stat here")
    busy, total = cpu
    assert 0 <= busy <= total and own is not None and own >= 0


def test_a_cache_that_cannot_be_written_costs_the_caching_not_the_run(ticks, tmp_path):
    """A read-only or full cache, or a file where its directory should be: the measurement is used,
    a warning says the cache was not written (it stopped the run with "File exists" before, after
    a minute of timing), and the next run measures again."""
    (tmp_path / "costs").write_text("in the way")
    with pytest.warns(RuntimeWarning, match=r"cannot write the timing of verification costs to the cache \(.*costs\).*NGSPEC_CACHE"):
        assert measured.measured_once("costs", "s", read, measure_with(ticks, 180, 0, 20, 1.5)) == 1.5
    assert measured.measured_once("costs", "s", read, measure_with(ticks, 180, 0, 20, 1.6)) == 1.5  # once a run
    next_run()
    with pytest.warns(RuntimeWarning, match="next run will redo"):
        assert measured.measured_once("costs", "s", read, measure_with(ticks, 180, 0, 20, 1.7)) == 1.7


def test_n_gram_tables_that_cannot_be_cached_are_still_built_and_used(monkeypatch, tmp_path):
    from ngspec.drafters.ngram_tables import cached_tables
    from ngspec.models import tiny_model

    monkeypatch.setenv("NGSPEC_CACHE", str(tmp_path))
    (tmp_path / "ngram").write_text("in the way")
    model = tiny_model("llama")
    with pytest.warns(RuntimeWarning, match="cannot write the n-gram tables to the cache"):
        tables = cached_tables(model, "tiny")
    assert tables.bigram.shape[0] == model.config.vocab_size


def test_a_default_model_cache_that_cannot_be_written_names_ngspec_cache(monkeypatch, tmp_path):
    from ngspec.errors import NgspecError
    from ngspec.models import default_model_dir

    (tmp_path / "file").write_text("")
    monkeypatch.setenv("NGSPEC_CACHE", str(tmp_path / "file" / "cache"))
    with pytest.raises(NgspecError, match=r"cannot write ngspec's cache .*file/cache, where the default model is converted once .*set NGSPEC_CACHE"):
        default_model_dir()


def test_a_watch_reads_what_others_used_since_it_began(ticks):
    ticks.spend(50, 50, 0)  # before the watch: not counted
    watch = measured.CpuWatch()
    ticks.spend(60, 30, 10)
    assert watch.share() == 0.3
    ticks.spend(100, 0, 0)  # it keeps counting from its start
    assert watch.share() == 0.15


def test_a_watch_too_short_to_tell_or_without_proc_reads_nothing(ticks, monkeypatch):
    watch = measured.CpuWatch()
    ticks.spend(10, 30, 0)
    assert watch.share() is None  # 40 ticks
    monkeypatch.setattr(measured, "_cpu_ticks", lambda: None)
    assert measured.CpuWatch().share() is None


def test_a_busy_timing_is_named_with_its_share_and_what_helps(monkeypatch):
    monkeypatch.setattr(measured, "BUSY_SHARE", 0.2)
    assert measured.busy_warning(None, "the arms") is None and measured.busy_warning(0.2, "the arms") is None
    text = measured.busy_warning(0.48, "the arms")
    assert text.startswith("other processes used 48% of the CPUs while the arms ran: the times are not this machine's alone")
    assert "GOMP_SPINCOUNT=10000 or OMP_WAIT_POLICY=PASSIVE" in text and "BENCHMARKS.md 10zzzh" in text
