"""Helpers the command modules share: building configs from options and loading the engine."""

from __future__ import annotations

from ngspec.decode import DecodeConfig
from ngspec.engine import Engine
from ngspec.errors import NgspecError
from ngspec.models import load_model
from ngspec.verify import SamplingConfig


def sampling_config(temperature: float, top_p: float, top_k: int, seed: int | None) -> SamplingConfig:
    try:
        return SamplingConfig(temperature, top_p, top_k, seed)
    except ValueError as exc:
        raise NgspecError(str(exc)) from exc


def decode_config(max_new_tokens: int, sampling: SamplingConfig, stop: list[str] | None) -> DecodeConfig:
    return DecodeConfig(max_new_tokens=max_new_tokens, sampling=sampling, stop_strings=tuple(stop or ()))


def load_engine(model: str, device: str, dtype: str) -> Engine:
    from ngspec.cli.render import info

    info(f"loading model {model} ...")
    return Engine(load_model(model, device, dtype))
