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

import itertools
import json
import operator
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch

from ngspec.errors import NgspecError, check_text, short
from ngspec.staging import followed, is_stream, refuse_replacing, staged_file
from ngspec.models import LoadedModel, generation_defaults_aside
from ngspec.prompts import apply_template
from ngspec.cpu_linear import tune_linears
from ngspec.decode import check_prompt, most_new_tokens
from ngspec.target import context_window

MARKER = "\u2063NGSPEC_QUERY\u2063"
AT_WINDOW = "stopped_at_context_window"  # a record's key, only where its response filled the window


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
        if not 0 <= self.seed < 2**64:  # it is the upper half of each record's uuid
            raise NgspecError(f"--seed must be from 0 to 2^64 - 1, not {self.seed}")


def pre_query_template(tokenizer) -> str:
    """The chat template's text before a user message's content."""
    if not getattr(tokenizer, "chat_template", None):
        raise NgspecError("self-synthesis needs an instruct model with a chat template")
    text = apply_template(tokenizer, [{"role": "user", "content": MARKER}], tokenize=False)
    return text[: text.index(MARKER)]


@torch.inference_mode()
def _generate(loaded: LoadedModel, prompts: list[str], max_new: int, temperature: float, top_p: float, eos: list[int]) -> list[tuple[str, bool]]:
    """Each prompt's completion, and whether it stopped because the model's context window was
    full. Every prompt must fit the window (`decode.check_prompt`). An answer that would run past
    the window stops there, as `generate` stops (transformers would go on past it): those rows
    are generated on their own, since a batch's rows share one budget of new tokens."""
    window = context_window(loaded.model)
    budgets = []
    for prompt in prompts:
        ids = loaded.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        check_prompt(ids, window)
        budgets.append(min(max_new, most_new_tokens(len(ids), window)))
    done: dict[int, tuple[str, bool]] = {}
    whole = [i for i, budget in enumerate(budgets) if budget == max_new]
    for group in [whole] + [[i] for i, budget in enumerate(budgets) if budget < max_new]:
        if group:
            texts = _generate_batch(loaded, [prompts[i] for i in group], budgets[group[0]], temperature, top_p, eos)
            done.update((i, (text, ran_out and budgets[i] < max_new)) for i, (text, ran_out) in zip(group, texts))
    return [done[i] for i in range(len(prompts))]


def _generate_batch(loaded: LoadedModel, prompts: list[str], max_new: int, temperature: float, top_p: float, eos: list[int]) -> list[tuple[str, bool]]:
    """transformers' batched `generate` over ``prompts``: each completion, and whether it used
    all ``max_new`` tokens (no end-of-sequence token)."""
    tok = loaded.tokenizer
    tok.padding_side = "left"
    if tok.pad_token_id is None:  # padded places are masked out: any token will do, the end token by choice
        tok.pad_token = tok.eos_token if tok.eos_token is not None else tok.convert_ids_to_tokens(eos[0] if eos else 0)
    batch = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(loaded.device)
    sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p} if temperature > 0 else {"do_sample": False}
    with generation_defaults_aside(loaded.model):  # greedy answers are the model's plain greedy ones
        out = loaded.model.generate(**batch, max_new_tokens=max_new, eos_token_id=eos, pad_token_id=tok.pad_token_id, **sampling)
    new = out[:, batch["input_ids"].shape[1] :]
    ran_out = [new.shape[1] == max_new and not any(t in eos for t in row.tolist()) for row in new]
    return [(text.strip(), full) for text, full in zip(tok.batch_decode(new, skip_special_tokens=True), ran_out)]


def answer_prompt(tokenizer, instruction: str) -> str:
    """The text the model answers ``instruction`` from: the instruction in its chat template."""
    return apply_template(tokenizer, [{"role": "user", "content": instruction}], tokenize=False, add_generation_prompt=True)


def check_given(loaded: LoadedModel, given: Sequence[str], start: int = 0) -> None:
    """Refuse, before anything is generated, a given instruction the model cannot answer: it is not
    text (`check_text`), or its prompt fills the context window. ``start``: how many instructions
    come before ``given``."""
    window = context_window(loaded.model)
    for number, instruction in enumerate(given, start + 1):
        check_text(instruction, f"prompt {number} of --prompts")
        ids = loaded.tokenizer(answer_prompt(loaded.tokenizer, instruction), add_special_tokens=False)["input_ids"]
        try:
            check_prompt(ids, window)
        except NgspecError as exc:
            raise NgspecError(f"prompt {number} of --prompts: {exc}; shorten or drop it") from None


def record_uuid(seed: int, number: int) -> str:
    """The ``uuid`` of a run's ``number``-th record (from 1): the seed and the count, so a resumed
    run's records continue the numbering and two seeds' records never collide."""
    return str(uuid.UUID(int=(seed << 64) + number))


def input_configs(opts: SynthOptions, pre_query: str, given: Sequence[str] | None) -> dict:
    """How the instructions came about, as each record's ``gen_input_configs`` says."""
    if given is not None:
        return {"source": "given"}
    return {"temperature": opts.instruction_temperature, "top_p": opts.instruction_top_p, "pre_query_template": pre_query}


def response_configs(opts: SynthOptions) -> dict:
    """How the responses were generated, as each record's ``gen_response_configs`` says."""
    return {"temperature": opts.response_temperature, "max_tokens": opts.max_new_tokens}


def records_asked(opts: SynthOptions, given: Sequence[str] | None) -> int:
    """How many records a run writes: ``opts.n``, or fewer when fewer instructions are given."""
    return opts.n if given is None else min(opts.n, len(given))


def synthesize(
    loaded: LoadedModel,
    opts: SynthOptions,
    on_record: Callable[[], None] | None = None,
    given: Sequence[str] | None = None,
    start: int = 0,
) -> Iterator[dict]:
    """Yield Magpie-format records (``instruction``, ``response``, generation settings). With
    ``given`` instructions, answer the first ``opts.n`` of them instead of writing new ones.
    ``start`` records are already written (an interrupted run's, `resumable`): the given
    instructions continue after them, and self-written ones come from a seed of (``opts.seed``,
    ``start``), so they do not repeat the instructions the first run wrote."""
    tok = loaded.tokenizer
    pre_query = pre_query_template(tok)
    tune_linears(loaded.model)  # a batch of rows per step: the fastest CPU product for it
    eos = sorted({i for i in (tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")) if isinstance(i, int) and i >= 0})
    torch.manual_seed(opts.seed if start == 0 else hash((opts.seed, start)) & (2**63 - 1))  # ints hash the same in every process
    total = records_asked(opts, given)
    if given is not None:
        check_given(loaded, given[start:total], start)
    configs = input_configs(opts, pre_query, given)
    made = start
    while made < total:
        size = min(opts.batch_size, total - made)
        if given is not None:
            instructions = list(given[made : made + size])
        else:
            written = _generate(loaded, [pre_query] * size, opts.max_instruction_tokens, opts.instruction_temperature, opts.instruction_top_p, eos)
            instructions = [text for text, _ in written if len(text) >= 8]
        if not instructions:
            continue
        prompts = [answer_prompt(tok, i) for i in instructions]
        responses = _generate(loaded, prompts, opts.max_new_tokens, opts.response_temperature, 1.0, eos)
        for instruction, (response, at_window) in zip(instructions, responses):
            if made >= total:
                break
            made += 1
            if on_record:
                on_record()
            record = {
                "uuid": record_uuid(opts.seed, made),
                "instruction": instruction,
                "response": response,
                "gen_input_configs": configs,
                "gen_response_configs": response_configs(opts),
                "model": loaded.name,
            }
            yield {**record, AT_WINDOW: True} if at_window else record


def partial_path(out: Path) -> Path:
    """Where an interrupted run keeps the records it finished: ``NAME.partial.jsonl`` beside the
    file ``out`` writes (through a link: the file it names)."""
    out = followed(out)
    return out.with_name(f"{out.stem}.partial{out.suffix or '.jsonl'}")


def resumable(path: Path, loaded: LoadedModel, opts: SynthOptions, given: Sequence[str] | None) -> list[dict]:
    """The records an interrupted run left in ``path`` (`partial_path`), checked to be what this
    run would have written first: the same model, generation settings and seed, and with
    ``given`` instructions, the same instructions in the same order. More than this run asks
    for are cut to its count. Anything else is an error that names the difference."""
    again = "give the options that run had to continue it, or --force to start afresh (which replaces the file)"
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise NgspecError(f"cannot read {path}, an interrupted run's records: {exc}") from None
    expected = {
        "model": loaded.name,
        "gen_input_configs": input_configs(opts, pre_query_template(loaded.tokenizer), given),
        "gen_response_configs": response_configs(opts),
    }
    records = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict) or not isinstance(record.get("instruction"), str) or not isinstance(record.get("response"), str):
            raise NgspecError(f"{path}:{number}: not a record synth-corpus writes; delete the file or use --force to start afresh")
        for key, want in {**expected, "uuid": record_uuid(opts.seed, number)}.items():
            if not (same_model if key == "model" else operator.eq)(record.get(key), want):
                raise NgspecError(f"{path} holds records of another run (record {number}'s {key} is {short(record.get(key), None)}, this run's would be {short(want, None)}): {again}")
        if given is not None and number <= len(given) and record["instruction"] != given[number - 1]:
            raise NgspecError(f"{path} record {number} answers another instruction than prompt {number} of --prompts: {again}")
        records.append({**record, "model": loaded.name})  # one spelling of the model in the whole file
    return records[: records_asked(opts, given)]


def same_model(recorded: object, name: str) -> bool:
    """Whether a record's ``model`` names the model ``name`` does: the same name, or two spellings
    of one local directory or file (``./m``, ``m/``, an absolute path)."""
    if recorded == name:
        return True
    if not isinstance(recorded, str) or not recorded:
        return False
    a, b = Path(recorded).expanduser(), Path(name).expanduser()
    return a.exists() and b.exists() and a.resolve() == b.resolve()


def write_jsonl(records: Iterator[dict], out: Path, force: bool, carried: Sequence[dict] = ()) -> int:
    """Write the ``carried`` records (an interrupted run's, `resumable`) and then ``records`` to
    ``out``, through a temporary file of this call's own (`staging.staged_file`) renamed at the
    end, which also removes `partial_path`. When interrupted (Ctrl-C, SIGTERM) the finished
    records are not thrown away: they go to `partial_path` (complete records only; ``out`` itself
    is never half-written), and the error says that the same command continues from there. The
    same when the disk fills (a record written in part is cut off)."""
    refuse_replacing(Path(out), force)
    out.parent.mkdir(parents=True, exist_ok=True)
    count = whole = 0  # records and bytes written whole
    with staged_file(out) as tmp:
        try:
            with tmp.open("wb") as f:
                for record in itertools.chain(carried, records):
                    line = (json.dumps(record, ensure_ascii=False) + "\n").encode()
                    f.write(line)
                    f.flush()
                    count, whole = count + 1, whole + len(line)
        except (KeyboardInterrupt, OSError) as exc:
            if not count or is_stream(out):  # nothing finished, or it went out as it was written
                raise
            os.truncate(tmp, whole)
            tmp.replace(partial_path(out))
            why, then = ("interrupted", "Run") if isinstance(exc, KeyboardInterrupt) else (f"stopped ({exc.strerror or exc}, writing {out})", "Mend that and run")
            raise NgspecError(
                f"{why} after {count} record{'s' if count > 1 else ''}; {'they are' if count > 1 else 'it is'} in {partial_path(out)} (complete records only; "
                f"{out} was not written). {then} the same command again to continue from there."
            ) from None
    partial_path(out).unlink(missing_ok=True)
    return count
