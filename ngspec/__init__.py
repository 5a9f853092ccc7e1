"""ngspec: lossless speculative decoding with cheap drafters.

The Python API (`ngspec.api`): ``Speculator.load(...)`` or ``Speculator.from_model(model,
tokenizer)``, then ``.generate(prompt)`` / ``.generate_batch(prompts)``, each giving an `Output`.
Errors are `NgspecError`. The names load torch and transformers on first use, not on import.
"""

__version__ = "0.1.0"

__all__ = ["NgspecError", "Output", "Speculator"]


def __getattr__(name: str):
    if name in ("Output", "Speculator"):
        from ngspec import api

        return getattr(api, name)
    if name == "NgspecError":
        from ngspec.errors import NgspecError

        return NgspecError
    raise AttributeError(f"module 'ngspec' has no attribute {name!r}")
