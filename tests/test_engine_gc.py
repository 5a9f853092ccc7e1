"""The engine keeps the cyclic garbage collector off what lives through a run, and only for the run:
objects a program holds when it builds or runs an engine stay collectable once it drops them."""

import gc
import weakref

import pytest

from ngspec.batch import BatchConfig
from ngspec.decode import DecodeConfig
from ngspec.drafters import make_drafter
from ngspec import engine as engine_module
from ngspec.engine import Engine, collector_spared
from ngspec.models import LoadedModel

pytestmark = pytest.mark.tiny_llama_only  # the Qwen2 tiny model runs the lossless matrices (conftest)


class Cycle:
    def __init__(self) -> None:
        self.me = self  # collectable by the cyclic collector only


@pytest.mark.parametrize("batched", [False, True])
def test_a_cycle_alive_through_an_engines_life_is_collected_once_dropped(tiny, batched):
    held = Cycle()
    dropped = weakref.ref(held)
    engine = Engine(LoadedModel(tiny, None, "tiny"), calibrate=False)
    cfg = DecodeConfig(max_new_tokens=6)
    frozen = []  # during the run: the model's modules and tensors, and the rest, spared
    if batched:
        finished = lambda result: frozen.append(gc.get_freeze_count())  # noqa: E731
        engine.run_batch([[4, 8, 15], [16, 23]], lambda: make_drafter("trie"), cfg, BatchConfig(2), on_finish=finished)
    else:
        engine.run([4, 8, 15], make_drafter("trie"), cfg, on_tokens=lambda tokens: frozen.append(gc.get_freeze_count()))
    assert frozen and min(frozen) > 1000
    assert gc.get_freeze_count() == 0
    del held
    gc.collect()
    assert dropped() is None


def test_what_is_alive_is_spared_during_the_run_and_a_callers_own_freeze_is_kept():
    held = Cycle()
    with collector_spared():
        assert gc.get_freeze_count() > 0  # the run's full passes skip what was alive at its start
    assert gc.get_freeze_count() == 0

    gc.freeze()  # a program that froze its own objects (a server before it forks, say)
    try:
        frozen = gc.get_freeze_count()
        with collector_spared():
            pass
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()
    del held


def test_a_failed_run_releases_the_freeze():
    with pytest.raises(RuntimeError):
        with collector_spared():
            raise RuntimeError("the run failed")
    assert gc.get_freeze_count() == 0


def test_a_freeze_count_up_to_the_one_at_import_is_not_a_programs_own(monkeypatch):
    """Python 3.12's full collections freeze its immortal objects (375 on 3.12.1): the engine took
    them for a program's freeze and never spared the collector there (4 tests here failed on
    3.12.1). A count up to the one at import is the interpreter's (one above it, a program's own
    freeze, is kept: the test above)."""
    gc.freeze()  # stands in for the interpreter's own, frozen when ngspec was imported
    monkeypatch.setattr(engine_module, "_FROZEN_AT_IMPORT", gc.get_freeze_count())
    try:
        at_import = gc.get_freeze_count()
        held = [Cycle() for _ in range(100)]
        with collector_spared():
            assert gc.get_freeze_count() >= at_import + 100  # the run froze what is alive
        assert gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()
    del held
