"""Options shared by several commands, declared once as `Annotated` aliases."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ngspec.drafters import REGISTRY

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

TemperatureOpt = Annotated[float, typer.Option(help="0 = greedy; > 0 samples (lossless in distribution).", rich_help_panel="Sampling")]
TopPOpt = Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass (1.0 = off).", rich_help_panel="Sampling")]
TopKOpt = Annotated[int, typer.Option("--top-k", help="Keep the k most likely tokens (0 = off).", rich_help_panel="Sampling")]
SeedOpt = Annotated[Optional[int], typer.Option(help="Random seed for sampling.", rich_help_panel="Sampling")]
StopOpt = Annotated[Optional[list[str]], typer.Option("--stop", help="Stop string (repeatable); EOS always stops.")]

NumDraftOpt = Annotated[int, typer.Option("--num-draft", help="trie: most nodes per draft tree; each step keeps as many as pay off under the measured verify cost.", rich_help_panel="Drafter options")]
NgramNOpt = Annotated[int, typer.Option("--ngram-n", help="trie: n-gram window n.", rich_help_panel="Drafter options")]
PrefixLenOpt = Annotated[int, typer.Option("--prefix-len", help="trie: max prefix length L_p (backoff starts here).", rich_help_panel="Drafter options")]
TrieUpdateOpt = Annotated[bool, typer.Option("--trie-update/--no-trie-update", help="trie: also insert generated tokens (measured to help; the paper builds from the prompt only).", rich_help_panel="Drafter options")]
LookupNgramOpt = Annotated[int, typer.Option("--lookup-ngram", help="prompt-lookup: longest n-gram to match.", rich_help_panel="Drafter options")]
LookupTokensOpt = Annotated[int, typer.Option("--lookup-tokens", help="prompt-lookup: tokens copied per draft.", rich_help_panel="Drafter options")]

ProfileOpt = Annotated[Optional[Path], typer.Option("--profile", help="Device profile from `ngspec profile-bound --save-profile`: size drafts from its measured verify costs instead of a quick calibration.")]

KOpt = Annotated[Optional[int], typer.Option("--k", help="Row drafters (context-ngram, unigram, bigram, mixed): draft rows per step (default: from --profile, else 2 on CPU and 10 on GPU).", rich_help_panel="Drafter options")]
WOpt = Annotated[Optional[int], typer.Option("--w", help="Row drafters: tokens per row (default: from --profile, else 1 on CPU and 10 on GPU).", rich_help_panel="Drafter options")]
NgramQOpt = Annotated[int, typer.Option("--ngram-q", help="context-ngram, mixed: match the last q tokens.", rich_help_panel="Drafter options")]
VerifyOpt = Annotated[str, typer.Option("--verify", help="tree: one forward over the draft tree under a tree mask; rows: each root-to-leaf path as its own batch row, all sharing the context's KV cache (the paper's layout). Both are lossless.")]
BigramTableOpt = Annotated[Optional[Path], typer.Option("--bigram-table", help="unigram/bigram/mixed: table file from `ngspec build-bigram --out` (default: built once per model and cached).", rich_help_panel="Drafter options")]

EagleHeadOpt = Annotated[Optional[Path], typer.Option("--eagle-head", help="eagle: an EAGLE-1 head directory (public layout; `ngspec train-eagle` makes one).", rich_help_panel="EAGLE options")]
TreeOpt = Annotated[str, typer.Option("--tree", help="eagle: dynamic (EAGLE-2: expand the best nodes per depth, keep the best --total-tokens) or static (EAGLE-1 choices).", rich_help_panel="EAGLE options")]
TreeTopKOpt = Annotated[int, typer.Option("--tree-top-k", help="eagle dynamic: nodes expanded per depth and children per node.", rich_help_panel="EAGLE options")]
TreeDepthOpt = Annotated[int, typer.Option("--tree-depth", help="eagle dynamic: draft depth.", rich_help_panel="EAGLE options")]
TotalTokensOpt = Annotated[int, typer.Option("--total-tokens", help="eagle dynamic: draft nodes kept per step.", rich_help_panel="EAGLE options")]
TreeChoicesOpt = Annotated[Optional[Path], typer.Option("--tree-choices", help="eagle static: JSON list of paths of child ranks, e.g. [[0],[1],[0,0]] (default: a 17-node tree).", rich_help_panel="EAGLE options")]

PromptFileArg = Annotated[Path, typer.Option("--prompt-file", "-p", help=".txt (one prompt) or .jsonl ({'prompt': ...} or Spec-Bench {'turns': [...]}) file.")]
