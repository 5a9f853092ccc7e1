"""Options shared by several commands, declared once as `Annotated` aliases."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ngspec.drafters import REGISTRY
from ngspec.errors import NgspecError

DRAFTERS = ", ".join(REGISTRY)

ModelOpt = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        help="'default' (bundled SmolLM2-135M-Instruct), a .gguf file, a local model directory or a Hugging Face id.",
    ),
]
DeviceOpt = Annotated[str, typer.Option(help="auto (CUDA when present, else CPU), cpu, cuda or cuda:N.")]
DtypeOpt = Annotated[str, typer.Option(help="auto (float32 on CPU, bfloat16 on GPU), float32, bfloat16 or float16.")]
MaxNewTokensOpt = Annotated[int, typer.Option("--max-new-tokens", "-n", help="Tokens to generate per prompt.")]
RawOpt = Annotated[bool, typer.Option("--raw", help="Feed the prompt as is, without the model's chat template.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout instead of the human view.")]

TemperatureOpt = Annotated[float, typer.Option(help="0 = greedy; > 0 samples, token-identical to plain sampling with the same seed (so lossless in distribution).", rich_help_panel="Sampling")]
TopPOpt = Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass (1.0 = off).", rich_help_panel="Sampling")]
TopKOpt = Annotated[int, typer.Option("--top-k", help="Keep the k most likely tokens (0 = off).", rich_help_panel="Sampling")]
CategoryOpt = Annotated[Optional[str], typer.Option(help="Keep only this category of a .jsonl's records (e.g. rag, summarization).")]
SeedOpt = Annotated[Optional[int], typer.Option(help="Random seed for sampling: with the prompt, it fixes the answer (any drafter, any batch). Default: one drawn and reported (generate: per prompt; bench: one for every arm).", rich_help_panel="Sampling")]
StopOpt = Annotated[Optional[list[str]], typer.Option("--stop", help="Stop string (repeatable): the output ends with the token that completes it (the text keeps it); write \\n for a newline, \\t a tab, \\\\ a backslash; a special token's name (<|im_start|>, <|eot_id|>) stops at that token. EOS always stops.")]

TargetGraphsOpt = Annotated[bool, typer.Option("--target-graphs", help="On a CUDA GPU: verify at fixed shapes (rows, block width and attended cache slots rounded up to powers of two) and replay each verification from a captured CUDA graph, one launch instead of the two thousand or so operations a small model's forward issues from Python. Each shape runs as an ordinary forward the first time it occurs and is captured the second time. Each block width's replay is timed once per machine, and a block runs padded to a wider power of two where this GPU replays that cheaper. Outputs as without it (logits up to float rounding). Not for sliding-window models (nor, in generate, with --batch-layout packed). On an H200 the trie ran 2.64x faster at batch size 1 and 1.08-1.24x at 8-32 rows (BENCHMARKS.md 10zs); the shapes of one row count share one logits buffer (rows x 64 x vocabulary).")]

ProfileOpt = Annotated[Optional[Path], typer.Option("--profile", help="Device profile from `ngspec profile-bound --save-profile`: size drafts from its measured verify costs instead of a quick calibration.")]

VerifyOpt = Annotated[str, typer.Option("--verify", help="tree: one forward over the draft tree under a tree mask; rows: each root-to-leaf path as its own batch row, all sharing the context's KV cache (the paper's layout). Both are lossless.")]

PromptFileArg = Annotated[Path, typer.Option("--prompt-file", "-p", help=".txt (one prompt), .jsonl ({'prompt': ...}, Spec-Bench {'turns': [...]} (every turn, see --turns), or a chat {'messages': [{'role': 'system', ...}, {'role': 'user', ...}]}, one per line) or .json (an array of such records) file; - reads standard input (JSONL when its first line is such a record, JSON when it is all one array of them, else one prompt).")]


def asks_every_turn(turns: str) -> bool:
    """``--turns``: all (a multi-turn question's later turns are asked too) or first."""
    if turns not in ("all", "first"):
        raise NgspecError(f"--turns must be all or first (got {turns!r})")
    return turns == "all"


def counted(questions: int, asked: int) -> str:
    """'12 prompts', or '12 questions, 24 turns' when later turns are asked too."""
    return f"{questions} prompts" if asked == questions else f"{questions} questions, {asked} turns"

TrustRemoteCodeOpt = Annotated[
    bool,
    typer.Option(
        "--trust-remote-code",
        help="Run the Python code a model or tokenizer ships with (an auto_map in its config) as transformers loads it. Read that code first; without this flag such models are refused.",
    ),
]
