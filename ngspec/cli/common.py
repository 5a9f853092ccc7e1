"""Helpers the command modules share: building configs from options and loading the engine."""

from __future__ import annotations

from pathlib import Path

from ngspec.decode import DecodeConfig
from ngspec.engine import Engine
from ngspec.errors import NgspecError
from ngspec.models import load_model
from ngspec.perf.device_profile import load_profile
from ngspec.verify import SamplingConfig


def sampling_config(temperature: float, top_p: float, top_k: int, seed: int | None) -> SamplingConfig:
    try:
        return SamplingConfig(temperature, top_p, top_k, seed)
    except ValueError as exc:
        raise NgspecError(str(exc)) from exc


def decode_config(max_new_tokens: int, sampling: SamplingConfig, stop: list[str] | None) -> DecodeConfig:
    return DecodeConfig(max_new_tokens=max_new_tokens, sampling=sampling, stop_strings=tuple(stop or ()))


def load_engine(model: str, device: str, dtype: str, profile: Path | None = None) -> Engine:
    """The engine for ``model``; ``profile`` (from `profile-bound --save-profile`) replaces the
    built-in calibration of verify costs."""
    from ngspec.cli.render import info

    device_profile = load_profile(profile) if profile is not None else None  # bad files fail first
    info(f"loading model {model} ...")
    loaded = load_model(model, device, dtype)
    if device_profile is not None:
        device_profile.check_model(loaded.name, profile)
    return Engine(loaded, profile=device_profile)
