"""ngspec.perf.phases.wrapped: methods wrapped inside a block, themselves again after it."""

import pytest

from ngspec.perf.phases import wrapped


class Owner:
    def step(self, x):
        return x + 1

    def other(self, x):
        return x * 2


def test_methods_are_wrapped_inside_the_block_and_restored_after_it_even_on_error():
    calls = []

    def wrap(name, f):
        def run(*args):
            calls.append(name)
            return f(*args)
        return run

    owner, step, other = Owner(), Owner.step, Owner.other
    with wrapped({"a": (Owner, "step"), "b": (Owner, "other")}, wrap):
        assert owner.step(1) == 2 and owner.other(3) == 6
    assert calls == ["a", "b"]
    assert Owner.step is step and Owner.other is other
    with pytest.raises(RuntimeError), wrapped({"a": (Owner, "step")}, wrap):
        raise RuntimeError("a benchmark failed mid-run")
    assert Owner.step is step
    owner.step(1)
    assert calls == ["a", "b"]  # no longer counted
