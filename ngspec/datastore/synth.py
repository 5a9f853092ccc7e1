"""Magpie-style self-synthesis: the target model writes its own instructions and responses.

The instruct model is given only the part of its chat template that comes before a user message
(the "pre-query" template), so it completes a plausible user instruction; that instruction is then
wrapped in the full template and answered. Given instructions (``synth-corpus --prompts``, e.g. a
user's own prompt log), the model only answers them: EAGLE's recipe of regenerating a prompt set's
responses with the target itself. Responses are greedy by default (so the corpus holds
what the model itself would generate: the best datastore for drafting). Generation is batched
with transformers' own `generate`.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch

from ngspec.errors import NgspecError
from ngspec.staging import staged_file
from ngspec.models import LoadedModel, generation_defaults_aside
from ngspec.prompts import apply_template
from ngspec.cpu_linear import tune_linears

MARKER = "\u2063NGSPEC_QUERY\u2063"


@dataclass(frozen=True)
class SynthOptions:
    n: int = 100
    max_new_tokens: int = 256  # per response
    max_instruction_tokens: int = 96
    batch_size: int = 8
    seed: int = 0
    instruction_temperature: float = 1.0
    instruction_top_p: float = 0.99
    response_temperature: float = 0.0  # 0 = greedy

    def __post_init__(self) -> None:
        if self.n < 1 or self.batch_size < 1 or self.max_new_tokens < 1:
            raise NgspecError("--n, --batch-size and --max-new-tokens must be at least 1")


def pre_query_template(tokenizer) -> str:
    """The chat template's text before a user message's content."""
    if not getattr(tokenizer, "chat_template", None):
        raise NgspecError("self-synthesis needs an instruct model with a chat template")
    text = apply_template(tokenizer, [{"role": "user", "content": MARKER}], tokenize=False)
    return text[: text.index(MARKER)]


@torch.inference_mode()
def _generate(loaded: LoadedModel, prompts: list[str], max_new: int, temperature: float, top_p: float, eos: list[int]) -> list[str]:
    tok = loaded.tokenizer
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    batch = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(loaded.device)
    sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p} if temperature > 0 else {"do_sample": False}
    with generation_defaults_aside(loaded.model):  # greedy answers are the model's plain greedy ones
        out = loaded.model.generate(**batch, max_new_tokens=max_new, eos_token_id=eos, pad_token_id=tok.pad_token_id, **sampling)
    return [t.strip() for t in tok.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)]


def synthesize(
    loaded: LoadedModel, opts: SynthOptions, on_record: Callable[[], None] | None = None, given: Sequence[str] | None = None
) -> Iterator[dict]:
    """Yield Magpie-format records (``instruction``, ``response``, generation settings). With
    ``given`` instructions, answer the first ``opts.n`` of them instead of writing new ones."""
    tok = loaded.tokenizer
    pre_query = pre_query_template(tok)
    tune_linears(loaded.model)  # a batch of rows per step: the fastest CPU product for it
    eos = sorted({i for i in (tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")) if isinstance(i, int) and i >= 0})
    torch.manual_seed(opts.seed)
    total = opts.n if given is None else min(opts.n, len(given))
    input_configs = (
        {"source": "given"} if given is not None
        else {"temperature": opts.instruction_temperature, "top_p": opts.instruction_top_p, "pre_query_template": pre_query}
    )
    made = 0
    while made < total:
        size = min(opts.batch_size, total - made)
        if given is not None:
            instructions = list(given[made : made + size])
        else:
            instructions = _generate(loaded, [pre_query] * size, opts.max_instruction_tokens, opts.instruction_temperature, opts.instruction_top_p, eos)
            instructions = [i for i in instructions if len(i) >= 8]
        if not instructions:
            continue
        prompts = [apply_template(tok, [{"role": "user", "content": i}], tokenize=False, add_generation_prompt=True) for i in instructions]
        responses = _generate(loaded, prompts, opts.max_new_tokens, opts.response_temperature, 1.0, eos)
        for instruction, response in zip(instructions, responses):
            if made >= total:
                break
            made += 1
            if on_record:
                on_record()
            yield {
                "uuid": str(uuid.UUID(int=(opts.seed << 64) + made)),
                "instruction": instruction,
                "response": response,
                "gen_input_configs": input_configs,
                "gen_response_configs": {"temperature": opts.response_temperature, "max_tokens": opts.max_new_tokens},
                "model": loaded.name,
            }


def partial_path(out: Path) -> Path:
    """Where an interrupted run keeps the records it finished: ``NAME.partial.jsonl``."""
    return out.with_name(f"{out.stem}.partial{out.suffix or '.jsonl'}")


def write_jsonl(records: Iterator[dict], out: Path, force: bool) -> int:
    """Write records to ``out`` through a temporary file of this call's own (`staging.staged_file`)
    renamed at the end. When interrupted (Ctrl-C, SIGTERM) the finished records are not thrown
    away: they go to `partial_path` (complete records only; ``out`` itself is never half-written)
    and the error says so."""
    if out.exists() and not force:
        raise NgspecError(f"{out} already exists (use --force to replace it)")
    out.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with staged_file(out) as tmp:
        try:
            with tmp.open("w") as f:
                for record in records:
                    f.write(json.dumps(record, ensure_ascii=False) + "\n")
                    f.flush()
                    count += 1
        except KeyboardInterrupt:
            if not count:
                raise
            tmp.replace(partial_path(out))
            raise NgspecError(
                f"interrupted after {count} records; they are in {partial_path(out)} (complete records only; "
                f"{out} was not written). Generate more with another --seed and build from a directory holding both files."
            ) from None
    return count
