"""Helpers the command modules share: building configs from options and loading the engine."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from ngspec.drafters import NEEDS_TABLES, ROW_DRAFTERS, DrafterOptions
from ngspec.errors import NgspecError, shown

if TYPE_CHECKING:  # torch and transformers load when a command runs, not for --help
    from ngspec.decode import DecodeConfig
    from ngspec.drafters.ngram_tables import NgramTables
    from ngspec.engine import Engine
    from ngspec.perf.device_profile import DeviceProfile
    from ngspec.verify import SamplingConfig


def sampling_config(temperature: float, top_p: float, top_k: int, seed: int | None) -> SamplingConfig:
    from ngspec.verify import SamplingConfig

    try:
        return SamplingConfig(temperature, top_p, top_k, seed)
    except ValueError as exc:
        raise NgspecError(str(exc)) from exc


STOP_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}


def stop_strings(values: list[str] | None) -> list[str] | None:
    """``--stop``'s values with ``\\n``, ``\\t``, ``\\r`` and ``\\\\`` read as a newline, a tab, a
    carriage return and a backslash: a shell passes ``--stop '\\n'`` as a backslash and an n, which
    no answer holds. Any other backslash stays as typed."""
    if values is None:
        return None
    return [re.sub(r"\\([ntr\\])", lambda m: STOP_ESCAPES[m.group(1)], value) for value in values]


def decode_config(max_new_tokens: int, sampling: SamplingConfig, stop: str | Sequence[str] | None, verify: str = "tree") -> DecodeConfig:
    """``stop``: one stop string or several (a string is one, not its characters); each is
    checked to be a non-empty string by `DecodeConfig`."""
    from ngspec.decode import DecodeConfig

    if stop is not None and not isinstance(stop, str) and (not isinstance(stop, Iterable) or isinstance(stop, Mapping)):
        raise NgspecError(f"stop must be a string or a list of strings (got {shown(stop)})")
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    return DecodeConfig(max_new_tokens=max_new_tokens, sampling=sampling, stop_strings=stops, verify=verify)


def fit_rows(cfg: DecodeConfig, drafter: str, opts: DrafterOptions) -> DecodeConfig:
    """Raise the draft-node cap to k·w for a row drafter, so its rows are never cut."""
    if drafter not in ROW_DRAFTERS:
        return cfg
    return replace(cfg, max_draft_nodes=max(cfg.max_draft_nodes, opts.k * opts.w))


def load_tables(engine: Engine, drafters: list[str], path: Path | None) -> NgramTables | None:
    """The model's n-gram tables when a drafter needs them (built under a `timing_bar` the first
    time, then read from the cache with none)."""
    from ngspec.cli.render import info

    if not NEEDS_TABLES & set(drafters):
        return None
    with timing_bar("building bigram table (once per model)") as built:
        return engine.ngram_tables(path, built, info)


def load_eagle(engine: Engine, head: Path | None, opts):
    """The eagle drafter factory for ``engine``'s model, or None without a head."""
    if head is None:
        return None
    from ngspec.drafters.eagle import eagle_factory
    from ngspec.eagle.head import load_draft_vocab, load_head

    device = next(engine.loaded.model.parameters()).device
    if opts.head_graphs and device.type != "cuda":
        raise NgspecError(f"--head-graphs needs a CUDA GPU (the model runs on {device.type}); leave it out to run the head as usual")
    return eagle_factory(engine.loaded.model, load_head(head, engine.loaded.model), opts, load_draft_vocab(head))


# (k, w) for row drafters when neither --k/--w nor --profile says: measured best by wall time on
# two CPU cores (BENCHMARKS.md section 7), and the paper's setting for GPUs
DEFAULT_ROWS = {"cpu": (2, 1), "cuda": (10, 10)}


def rows_options(
    opts: DrafterOptions, k: int | None, w: int | None, profile: DeviceProfile | None, context: int, device: str = "cpu"
) -> DrafterOptions:
    """Fill --k/--w left unset: from the device profile (largest (k, w) within its slowdown budget
    at this context length), else the measured default for the device type."""
    if profile is not None:
        best_k, best_w = profile.best_rows(context)
    else:
        best_k, best_w = DEFAULT_ROWS.get(device, DEFAULT_ROWS["cuda"])
    k = best_k if k is None else k
    w = max(best_w, 1) if w is None else w
    return replace(opts, k=k, w=w)


def load_engine(
    model: str, device: str, dtype: str, profile: Path | None = None, trust_remote_code: bool = False, quiet: bool = False,
    target_graphs: bool = False,
) -> Engine:
    """The engine for ``model``; ``profile`` (from `profile-bound --save-profile`) replaces the
    built-in calibration of verify costs; ``quiet``: no progress lines on stderr (the Python
    API; a bar for one-time work still shows on a terminal, as transformers' loading bars do);
    ``target_graphs``: `--target-graphs` (a CUDA GPU only)."""
    from ngspec.cli.render import info, warning
    from ngspec.engine import Engine
    from ngspec.models import load_model, pick_device
    from ngspec.perf.device_profile import device_name, load_profile

    notify = None if quiet else info
    where = pick_device(device)
    if target_graphs and where.type != "cuda":  # before the model loads
        raise NgspecError(f"--target-graphs needs a CUDA GPU (the model would run on {where.type}); leave it out to verify as usual")
    device_profile = load_profile(profile) if profile is not None else None  # bad files fail first
    if notify:
        notify(f"loading model {model} ...")
    loaded = load_model(model, device, dtype, trust_remote_code)
    if device_profile is not None:
        from ngspec.perf.costs import model_shape

        device_profile.check_model(loaded.name, profile, model_shape(loaded.model))
        messages = device_profile.elsewhere(profile, device_name(where), str(loaded.model.dtype).removeprefix("torch."))
        if device_profile.target_graphs != target_graphs:
            # a replay costs about the same whatever the tree's size; the plain forward does not
            with_, without = ("with", "without") if device_profile.target_graphs else ("without", "with")
            messages.append(f"{profile} was measured {with_} --target-graphs and this run verifies {without}: its costs may size drafts "
                            f"wrongly (measure one to match: `ngspec profile-bound{' --target-graphs' if target_graphs else ''} --save-profile ...`)")
        for message in messages:
            if quiet:  # the Python API: a warning the caller can filter
                warnings.warn(message, stacklevel=3)
            else:
                warning(message)
    tune_cpu_kernels(loaded.model, notify)
    return Engine(loaded, profile=device_profile, target_graphs=target_graphs, bar=timing_bar)


def timing_bar(description: str):
    """A bar on a terminal for work done once per machine or model and then cached (a
    measurement, a table), shown only while it runs (`progress_when_called`): for the commands
    and the Python API alike."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn

    from ngspec.cli.render import progress_when_called

    return progress_when_called(description, TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())


def tune_cpu_kernels(model, notify: Callable[[str], None] | None = None) -> None:
    """`tune_linears` before the `Engine` would do it silently: a model's first run on a CPU
    times its kernels (about a minute on two cores) under a `timing_bar`. The `Engine`'s verify
    costs (about 9 s, and 34 s the first time at batch 8) get theirs from its ``bar``."""
    from ngspec.cpu_linear import tune_linears

    with timing_bar("timing matrix kernels (rounds)") as rounds:
        tune_linears(model, notify=notify, progress=rounds)


def warn_if_busy(share: float | None, what: str) -> None:
    """Say so when other processes kept the CPUs busy (``share`` of their time, from a
    `ngspec.perf.measured.CpuWatch`) while ``what`` was timed: its times are off."""
    from ngspec.cli.render import warning
    from ngspec.perf.measured import busy_warning

    if (text := busy_warning(share, what)) is not None:
        warning(text)
