"""benchmarks/step_trace.py: profiler events are tallied into the phase whose range holds them,
per decoding step, and a traced batch leaves the batch loop's methods as they were."""

import random
from types import SimpleNamespace

from conftest import benchmark_script, repetitive_prompt

from ngspec.batch import BatchConfig
from ngspec.batch_target import BatchTarget
from ngspec.decode import DecodeConfig
from ngspec.drafters import make_drafter
from ngspec.engine import Engine
from ngspec.models import LoadedModel, tiny_model

trace = benchmark_script("step_trace")


def event(name, parent=None, us=0.0, kernels=()):
    return SimpleNamespace(name=name, cpu_parent=parent, cpu_time_total=us, kernels=[SimpleNamespace(duration=d) for d in kernels])


def test_events_are_tallied_by_the_phase_around_them_per_step():
    drafting = event("ngspec:drafting", us=4000)
    op = event("aten::copy_", drafting, us=900)
    verify = event("ngspec:verify", us=10000)
    mm = event("aten::mm", verify, us=100)
    prefill = event("ngspec:prefill", us=6000)
    loose = event("aten::add", None, us=50)
    events = [
        drafting, op, event("cudaMemcpyAsync", op, us=800), event("cudaStreamSynchronize", op, us=700),
        verify, mm, event("cudaLaunchKernel", mm, us=20, kernels=[300]), event("cudaLaunchKernel", mm, us=20, kernels=[100]),
        prefill, event("cudaLaunchKernel", event("aten::mm", prefill), us=10, kernels=[5000]),
        loose, event("cudaLaunchKernel", loose, us=8, kernels=[2]), event("cudaGetDevice", loose, us=1),
    ]
    t = trace.tally(events, steps=2)
    assert t["drafting"] == {"host_ms": 2.0, "copy_calls": 0.5, "copy_ms": 0.4, "sync_calls": 0.5, "sync_ms": 0.35}
    assert t["verify"] == {"host_ms": 5.0, "launch_calls": 1.0, "launch_ms": 0.02, "gpu_ms": 0.2}
    # prefills in total, not per step
    assert t["prefill"] == {"host_ms": 6.0, "launch_calls": 1.0, "launch_ms": 0.01, "gpu_ms": 5.0}
    assert t["rest"] == {"launch_calls": 0.5, "launch_ms": 0.004, "gpu_ms": 0.001, "other_calls": 0.5, "other_ms": 0.0005}


def test_runtime_calls_are_told_apart_from_tensor_operations():
    assert trace.runtime_kind("cudaLaunchKernel") == "launch"
    assert trace.runtime_kind("cudaMemcpyAsync") == "copy"
    assert trace.runtime_kind("cudaStreamSynchronize") == "sync"
    assert trace.runtime_kind("cudaEventRecord") == "other"
    assert trace.runtime_kind("aten::copy_") is None
    assert trace.runtime_kind("ngspec:verify") is None


def test_a_traced_batch_reports_every_phase_and_restores_the_loop():
    model = tiny_model("llama", seed=3)
    engine = Engine(LoadedModel(model, None, "tiny"), calibrate=False)
    rng = random.Random(5)
    ids = [repetitive_prompt(rng, 96, n) for n in (20, 33, 12)]
    before = (BatchTarget.verify, BatchTarget.commit, BatchTarget.admit_many)
    res = trace.trace_arm(engine, ids, lambda: make_drafter("trie"), DecodeConfig(max_new_tokens=10), BatchConfig(2), cuda=False)
    assert (BatchTarget.verify, BatchTarget.commit, BatchTarget.admit_many) == before
    assert res["steps"] > 0 and res["traced_steps"] == res["steps"]  # the same decoding, traced
    assert res["new_tokens"] > 0 and res["tokens_per_row_step"] > 1
    phases = res["phases"]
    assert {"drafting", "verify", "commit", "prefill", "rest"} <= set(phases)
    assert phases["verify"]["host_ms"] > 0 and phases["prefill"]["host_ms"] > 0
    assert "launch_calls" not in phases["verify"]  # no CUDA on this machine: nothing to count
