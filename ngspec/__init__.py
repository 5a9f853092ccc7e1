"""ngspec: lossless speculative decoding with cheap drafters."""

__version__ = "0.1.0"
