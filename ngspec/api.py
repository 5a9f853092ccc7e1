"""The Python API: a model and a drafter, ready to generate. `ngspec generate` runs through it.

    from ngspec import Speculator

    spec = Speculator.load("default", drafter="trie")          # or Speculator.from_model(model, tokenizer)
    out = spec.generate("Summarise: ...", max_new_tokens=128)  # a str, chat messages or token ids
    print(out.text, out.mean_tokens_per_call, out.tokens_per_second)
    outs = spec.generate_batch(prompts, batch_size=8)          # one Output per prompt, in order

Every output is token-identical to plain greedy decoding of the same model (with ``temperature``
> 0, to plain sampling with the same seed, and so identical in distribution). Drafter options are
the keyword arguments of `generate`'s options, without the dashes: ``--eagle-head DIR`` is
``eagle_head="DIR"``, ``--num-draft 16`` is ``num_draft=16``. Bad input raises `ngspec.errors.NgspecError` with a one-line message.
"""

from __future__ import annotations

import functools
import inspect
import numbers
import os
import re
import threading
import typing
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from difflib import get_close_matches
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence, Union

from ngspec.cli.common import decode_config, fit_rows, load_engine, rows_options, sampling_config, timing_bar, tune_cpu_kernels
from ngspec.cli.drafting import Drafting, single_value
from ngspec.drafters import DrafterOptions, check_drafter, make_drafter
from ngspec.drafters.eagle import head_graphs_report
from ngspec.errors import NgspecError, kind_of, shown

if TYPE_CHECKING:
    from ngspec.batch import BatchConfig, BatchReport, BatchResult, Request
    from ngspec.decode import DecodeConfig, Generation
    from ngspec.engine import Engine

# a prompt: text (wrapped in the model's chat template unless raw), chat messages
# ([{"role": ..., "content": ...}, ...], through the chat template) or token ids (fed as they are)
Prompt = Union[str, Sequence[dict], Sequence[int]]

PROMPT_KINDS = "a prompt is a str, a list of chat messages ({'role': ..., 'content': ...}) or a list of token ids"


# Arguments: Python values checked for their kind, as the CLI's parser checks its text. Ranges are
# checked where the CLI's options are (`DecodeConfig`, `SamplingConfig`, `BatchConfig`, `Drafting`).


# The checks shared with the CLI name its flags ("--batch-size must be at least 1"); the API's
# methods raise them in its own words (`in_api_words`). A flag's argument is the flag without its
# dashes, in snake case, but for these:
FLAG_ARGUMENTS = {"batch-layout": "layout", "head-float32": "head_int8=False", "no-trie-update": "trie_update=False", "no-deepen": "deepen=False"}
FLAG_WITH_CHOICE = re.compile(r"--([a-z][a-z0-9-]*)(?: (static|dynamic|packed|padded|DIR|FILE)\b)?")


def in_api_words(message: str) -> str:
    """A message written for the CLI in the Python API's words: ``--batch-size`` reads
    ``batch_size``, ``--batch-layout packed`` ``layout='packed'``. Commands quoted in backticks
    (```ngspec build-bigram --out```) and flags that are no argument here stay as they are."""
    known = {n for m in (Speculator.load, Speculator.from_model, Speculator.generate_batch) for n in inspect.signature(m).parameters}
    known |= {f.name for f in fields(Drafting)}

    def argument(match: re.Match) -> str:
        flag, value = match.groups()
        name = FLAG_ARGUMENTS.get(flag, flag.replace("-", "_"))
        if name.split("=")[0] not in known:
            return match.group(0)
        return f"{name}={value!r}" if value and not value.isupper() else name  # a placeholder (DIR) says no more than the name

    parts = message.split("`")
    parts[::2] = [FLAG_WITH_CHOICE.sub(argument, part) for part in parts[::2]]
    return "`".join(parts)


def api_errors(method: Callable) -> Callable:
    """``method`` raising its `NgspecError` in the API's words (`in_api_words`)."""

    @functools.wraps(method)
    def wrapped(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except NgspecError as exc:
            exc.args = (in_api_words(str(exc)),)
            raise

    return wrapped


def number(name: str, value: Any, kind: type = int, optional: bool = False) -> int | float | None:
    """``value`` as ``kind``: int takes integers (numpy's too), never a float (``2.5`` tokens is a
    mistake, not a request); float takes any real number. Never a bool."""
    if value is None and optional:
        return None
    abc, what = (numbers.Integral, "an integer") if kind is int else (numbers.Real, "a number")
    if isinstance(value, bool) or not isinstance(value, abc):
        raise NgspecError(f"{name} must be {what}{' or None' if optional else ''} (got {shown(value)})")
    return kind(value)


def flag(name: str, value: Any) -> bool:
    """A switch: True or False only (``raw="no"`` would read as True)."""
    if not isinstance(value, bool):
        raise NgspecError(f"{name} must be True or False (got {shown(value)})")
    return value


def function(name: str, value: Any) -> Any:
    if value is not None and not callable(value):
        raise NgspecError(f"{name} must be a function or None (got {shown(value)})")
    return value


def path(name: str, value: Any, optional: bool = True) -> Path | None:
    if value is None and optional:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise NgspecError(f"{name} must be a path{' or None' if optional else ''} (got {shown(value)})")
    return Path(value).expanduser()


def batch_prompts(prompts: Any, method: str) -> list:
    """``method``'s (`generate_batch`'s, `run_batch`'s) prompts as a list: any sequence or
    iterable of prompts, a 1-D array or pandas column of them too. A 1-D array of numbers is one
    prompt (refused, pointing to ``[ids]``); a 2-D tensor or array is refused: its rows would be
    read whole, padding included."""
    alone = "call generate or " if method == "generate_batch" else ""
    if isinstance(prompts, str):  # its characters would be read as prompts, one each
        raise NgspecError(f"{method} takes a list of prompts; for one text prompt, {alone}pass [prompt]")
    if type(prompts).__name__ == "DataFrame":
        raise NgspecError(f"{method} takes a list of prompts, not a table (DataFrame): pass the column that holds the prompts (df['prompt'])")
    objects = getattr(getattr(prompts, "dtype", None), "kind", None) == "O"  # numpy's and pandas' arrays of texts or rows
    if getattr(prompts, "ndim", None) == 1 and not objects:
        raise NgspecError(f"{method} takes a list of prompts; for one prompt of token ids, {alone}pass [ids]")
    if getattr(prompts, "ndim", None) not in (None, 1):
        raise NgspecError(
            f"{method} takes a list of prompts, not a {prompts.ndim}-D {type(prompts).__name__}: pass one prompt per "
            "row without its padding (list(ids) would read each row whole, pad tokens included)"
        )
    if prompts is None or isinstance(prompts, (Mapping, bytes)) or not isinstance(prompts, Iterable):
        raise NgspecError(f"{method} takes a list of prompts (got {'None' if prompts is None else kind_of(prompts)})")
    return list(prompts)


@dataclass(frozen=True)
class Output:
    """One prompt's generation and how it went (the record `ngspec generate --json` prints)."""

    text: str | None  # None for a model loaded without a tokenizer
    token_ids: list[int]
    prompt_tokens: int
    new_tokens: int
    seconds: float
    tokens_per_second: float
    verify_calls: int
    # tokens emitted per target forward pass, the bonus token included and the prefill counted as
    # the first call (plain decoding gives exactly 1.0)
    mean_tokens_per_call: float
    draft_seconds: float
    draft_share: float
    prefill_seconds: float  # the prompt's forward, which no drafter shortens
    prefill_share: float
    mean_tree_size: float
    finish_reason: str  # eos | stop | length | context | error (| cancelled, for a fed request)
    drafter_stats: dict | None = None  # per drafter: rows per strategy, search branch sources, ...
    # with check=True: whether plain decoding (greedy, or sampling with this run's seed) gives the same
    greedy_check: dict | None = None
    error: str | None = None  # a batch row that could not run (finish_reason "error")
    seed: int | None = None  # sampling's seed (drawn for the run when none was given): replays its tokens
    others_cpu_share: float | None = None  # other processes' share of all CPUs' time meanwhile (None: cannot tell)

    @classmethod
    def of(cls, gen: Generation, prompt_tokens: int, text: str | None) -> Output:
        calls = gen.stats.verify_calls
        steps = gen.stats.steps
        share = (lambda s: s / gen.seconds) if gen.seconds else (lambda s: 0.0)
        return cls(
            text=text,
            token_ids=list(gen.token_ids),
            prompt_tokens=prompt_tokens,
            new_tokens=len(gen.token_ids),
            seconds=gen.seconds,
            tokens_per_second=share(len(gen.token_ids)),
            verify_calls=calls,
            mean_tokens_per_call=sum(s.accepted for s in steps) / calls if calls else 0.0,
            draft_seconds=gen.stats.draft_seconds,
            draft_share=share(gen.stats.draft_seconds),
            prefill_seconds=gen.stats.prefill_seconds,
            prefill_share=share(gen.stats.prefill_seconds),
            mean_tree_size=sum(s.tree_size for s in steps) / calls if calls else 0.0,
            finish_reason=gen.finish_reason,
            drafter_stats=gen.drafter_stats,
            seed=gen.seed,
            others_cpu_share=gen.others_cpu_share,
        )

    @classmethod
    def failed(cls, error: str, prompt_tokens: int) -> Output:
        return cls(None, [], prompt_tokens, 0, 0.0, 0.0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, "error", error=error)

    def as_dict(self) -> dict:
        """The JSON record: every field, leaving out those that are None (no stats, no check, no error)."""
        return {k: v for k, v in asdict(self).items() if v is not None or k == "text"}


class TextDeltas:
    """New text as tokens arrive: the whole run so far is decoded each time (spacing depends on
    neighbours) and sent up to its last complete character (an incomplete multi-byte character
    at the end, decoded as replacement characters, waits for its other bytes; the characters
    before it do not). `flush`, once generation has ended, sends the rest, so the pieces add up to
    the output's text even when it ends mid-character."""

    def __init__(self, detokenize: Callable[[list[int]], str], on_text: Callable[[str], None]) -> None:
        self.detokenize = detokenize
        self.on_text = on_text
        self.tokens: list[int] = []
        self.shown = ""

    def __call__(self, new_tokens: list[int]) -> None:
        self.tokens.extend(new_tokens)
        self._send(self.detokenize(self.tokens).rstrip("\ufffd"))

    def flush(self) -> None:
        self._send(self.detokenize(self.tokens))

    def _send(self, text: str) -> None:
        if len(text) > len(self.shown):
            self.on_text(text[len(self.shown) :])
            self.shown = text


def drafting_options(options: dict[str, Any]) -> Drafting:
    """`Drafting` from keyword arguments named like `generate`'s drafter options."""
    known = sorted(f.name for f in fields(Drafting))
    for name in options:
        if name not in known:
            close = get_close_matches(name, known, n=1)
            hint = f"did you mean {close[0]}?" if close else f"known: {', '.join(known)}"
            raise NgspecError(f"unknown drafter option {name!r}; {hint}")
    hints = typing.get_type_hints(Drafting)
    return Drafting(**{name: drafting_value(name, value, hints[name]) for name, value in options.items()})


def drafting_value(name: str, value: Any, hint: Any) -> Any:
    """One drafter option checked for its kind (its `Drafting` annotation: int, bool, a path or
    text, optional or not)."""
    kinds = typing.get_args(hint) or (hint,)
    optional = type(None) in kinds
    kind = next(k for k in kinds if k is not type(None))
    if kind is Path:
        return path(name, value, optional)
    if kind is int:
        return number(name, value, int, optional)
    if kind is bool:
        return flag(name, value)
    if name in ("k", "w") and value is not None:  # one number, or the text `--k` takes
        return str(value)
    return value


def check_choice(drafter: str, drafting: Drafting) -> None:
    """Refuse a drafter, options or files that cannot work, before any model loads."""
    check_drafter(drafter)
    drafting.check([drafter])
    rows_options(drafting.options(), single_value(drafting.k, "k"), single_value(drafting.w, "w"), None, 0)


class Speculator:
    """A loaded model and one drafter with everything it needs (n-gram tables, an EAGLE head, a
    datastore). The drafters' estimates of what pays are carried from prompt to prompt, as in one
    `ngspec generate` run."""

    def __init__(self, engine: Engine, drafter: str = "trie", drafting: Drafting | None = None) -> None:
        from ngspec.drafters.trie import Calibration

        drafting = drafting or Drafting()
        check_choice(drafter, drafting)
        self.engine = engine
        self.drafter = drafter
        self._k, self._w = single_value(drafting.k, "k"), single_value(drafting.w, "w")
        self._opts = drafting.options()
        self._resources = drafting.resources(engine, [drafter])
        self._calibration = Calibration()
        self._thread = threading.get_ident()  # the thread that loaded it (see `_warn_other_thread`)

    @classmethod
    @api_errors
    def load(
        cls,
        model: str = "default",
        drafter: str = "trie",
        *,
        device: str = "auto",
        dtype: str = "auto",
        profile: str | Path | None = None,
        trust_remote_code: bool = False,
        target_graphs: bool = False,
        **options: Any,
    ) -> Speculator:
        """Load ``model`` ('default': the bundled SmolLM2-135M-Instruct; a .gguf file, a local
        directory or a Hugging Face id) and ready ``drafter``; ``options`` are its drafter options
        (``eagle_head=``, ``datastore=``, ``num_draft=``, ...). ``profile``: a device profile from
        `profile-bound --save-profile`; ``target_graphs``: as ``--target-graphs`` (a CUDA GPU)."""
        if not isinstance(model, (str, os.PathLike)):
            raise NgspecError(f"model must be a name or a path (got {shown(model)})")
        model, profile = os.fspath(model), path("profile", profile)
        trust_remote_code, target_graphs = flag("trust_remote_code", trust_remote_code), flag("target_graphs", target_graphs)
        drafting = drafting_options(options)
        check_choice(drafter, drafting)  # before the model loads
        engine = load_engine(model, device, dtype, profile, trust_remote_code, quiet=True, target_graphs=target_graphs)
        return cls(engine, drafter, drafting)

    @classmethod
    @api_errors
    def from_model(cls, model, tokenizer=None, drafter: str = "trie", *, name: str | None = None, target_graphs: bool = False, **options: Any) -> Speculator:
        """Wrap a transformers causal LM you already loaded (on its device, in its dtype).
        Without a tokenizer, prompts must be token ids and outputs carry no text. ``name`` keys
        the cached verify-cost calibration (default: the model's path, or its type and size).
        On a CPU float32 model, ngspec gives its linear layers the fastest CPU kernels in place.
        ``target_graphs``: as ``--target-graphs`` (a model on a CUDA GPU)."""
        import torch

        from ngspec.engine import Engine
        from ngspec.models import LoadedModel

        if not isinstance(model, torch.nn.Module):
            hint = f": to load a model by name or path, use Speculator.load({str(model)!r})" if isinstance(model, (str, os.PathLike)) else ""
            raise NgspecError(f"from_model takes a loaded model (a torch.nn.Module; got {shown(model)}){hint}")
        if not hasattr(model, "config") or not callable(getattr(model, "get_input_embeddings", None)) or next(model.parameters(), None) is None:
            raise NgspecError(f"from_model takes a transformers causal language model (AutoModelForCausalLM.from_pretrained(...); got {kind_of(model)})")
        if tokenizer is not None and not hasattr(tokenizer, "decode"):  # decode alone serves prompts of token ids
            raise NgspecError(f"tokenizer must be a loaded tokenizer (transformers' AutoTokenizer.from_pretrained(...)) or None (got {shown(tokenizer)})")
        drafting = drafting_options(options)
        where = next(model.parameters()).device
        if flag("target_graphs", target_graphs) and where.type != "cuda":
            raise NgspecError(f"target_graphs needs a model on a CUDA GPU (this one is on {where.type})")
        if name is not None and not isinstance(name, str):
            raise NgspecError(f"name must be a string or None (got {shown(name)})")
        if name is None:
            size = sum(p.numel() for p in model.parameters())
            name = getattr(model, "name_or_path", "") or f"{model.config.model_type}-{size}"
        if tokenizer is not None:
            from ngspec.models import check_tokenizer_fits

            check_tokenizer_fits(model, tokenizer, name)
        tune_cpu_kernels(model)  # under a bar on a terminal the first time (the Engine would tune silently)
        return cls(Engine(LoadedModel(model.eval(), tokenizer, name), target_graphs=target_graphs, bar=timing_bar), drafter, drafting)

    # the engine's level: token ids and configs (what `ngspec generate` calls)

    def options_for(self, context: int) -> DrafterOptions:
        """The drafter options for a prompt of ``context`` tokens (row drafters' (k, w) from the
        device profile or the device's default, where not given)."""
        return rows_options(self._opts, self._k, self._w, self.engine.profile, context, self.engine.target.device.type)

    def head_graphs(self) -> str | None:
        """What the EAGLE head's runs at fixed shapes (``head_graphs``) captured and replayed so
        far, and why capturing stopped if it did; None without them."""
        return head_graphs_report(self._resources.eagle)

    def new_drafter(self, opts: DrafterOptions):
        res = self._resources
        return make_drafter(self.drafter, opts, res.tables, res.eagle, res.datastore, self._calibration)

    def run(self, ids: list[int], cfg: DecodeConfig, on_tokens: Callable[[list[int]], None] | None = None) -> Generation:
        self._warn_other_thread()
        opts = self.options_for(len(ids))
        return self.engine.run(ids, self.new_drafter(opts), fit_rows(cfg, self.drafter, opts), on_tokens)

    def _warn_other_thread(self) -> None:
        """Once: a CPU model run from a thread other than the one that loaded it. torch then keeps
        a second OpenMP team, and with more OpenMP threads than cores libgomp stops letting idle
        workers spin: decoding steps on two cores took 37 ms instead of 24, on every thread
        (BENCHMARKS.md 10z)."""
        if self._thread is None or threading.get_ident() == self._thread:
            return
        self._thread = None
        if self.engine.target.device.type == "cpu":
            warnings.warn(
                "ngspec: this Speculator runs on a thread other than the one that loaded it; on a CPU, torch used "
                "from several threads decodes up to 1.5x slower. Load and generate on one thread (ngspec serve does).",
                RuntimeWarning, stacklevel=3,
            )

    @api_errors
    def run_batch(
        self, prompts: Sequence[Prompt], cfg: DecodeConfig, batch: BatchConfig, on_finish: Callable[[BatchResult], None] | None = None,
        feed: Callable[[], list[Request]] | None = None,
    ) -> tuple[list[BatchResult], BatchReport]:
        """A batch of ``batch.batch_size`` rows: ``prompts`` given at the start (as `generate_batch`
        takes them: text through the chat template, chat messages or token ids; indices 0 on),
        each decoded by ``cfg``, and requests (from `request`) that ``feed`` hands over as they
        arrive, until no row is left."""
        from ngspec.batch import BatchConfig
        from ngspec.decode import DecodeConfig

        for name, value, kind, where in (("cfg", cfg, DecodeConfig, "ngspec.decode"), ("batch", batch, BatchConfig, "ngspec.batch")):
            if not isinstance(value, kind):
                raise NgspecError(f"run_batch's {name} must be a {kind.__name__} (from {where}; got {shown(value)})")
        ids = self._encoded(batch_prompts(prompts, "run_batch"), False)
        return self.run_ids(ids, cfg, batch, function("on_finish", on_finish), function("feed", feed))

    def run_ids(self, ids: list[list[int]], cfg: DecodeConfig, batch: BatchConfig, on_finish=None, feed=None) -> tuple[list[BatchResult], BatchReport]:
        """`run_batch` on token ids and arguments its caller has checked (the CLI's prompts, as
        `run` takes one): a prompt holding an id outside the vocabulary fails alone, in its row."""
        self._warn_other_thread()
        opts = self.options_for(max(map(len, ids), default=0))
        return self.engine.run_batch(ids, lambda: self.new_drafter(opts), fit_rows(cfg, self.drafter, opts), batch, on_finish, feed)

    @api_errors
    def request(
        self, index: int, prompt: Prompt, max_new_tokens: int = 256, *, raw: bool = False, temperature: float = 0.0,
        top_p: float = 1.0, top_k: int = 0, seed: int | None = None, stop: Sequence[str] = (),
        on_text: Callable[[str], None] | None = None, cancelled: Callable[[], bool] | None = None,
    ) -> Request:
        """One prompt with its own settings (as `generate` takes them), for a batch that takes
        prompts as they arrive (``run_batch(..., feed=)``; `ngspec serve` batches so).
        ``cancelled``: asked before each step; True ends it (finish reason "cancelled")."""
        from ngspec.batch import Request

        cfg = self._config(max_new_tokens, temperature, top_p, top_k, seed, stop, False)
        index, cancelled = number("index", index), function("cancelled", cancelled)
        stream = self._text_stream(function("on_text", on_text))
        return Request(
            index, self.encode(prompt, raw), cfg.max_new_tokens, cfg.sampling, self.engine.stopper(cfg), stream, cancelled,
            on_done=stream and stream.flush,
        )

    @api_errors
    def encode(self, prompt: Prompt, raw: bool = False) -> list[int]:
        """Token ids for a prompt: text through the chat template (unless ``raw``), chat messages
        through the chat template, token ids as they are."""
        from ngspec.prompts import encode, encode_messages

        flag("raw", raw)
        if isinstance(prompt, str):
            return encode(self._tokenizer("text prompts"), prompt, raw)
        if hasattr(prompt, "tolist") and getattr(prompt, "ndim", None) is not None:  # a tensor or array of token ids
            if prompt.ndim == 2 and len(prompt) == 1:
                prompt = prompt[0]  # a tokenizer's batch of one (return_tensors="pt")
            if prompt.ndim != 1:
                raise NgspecError(f"token ids must be one row (got {kind_of(prompt)} of shape {tuple(prompt.shape)}); for several prompts call generate_batch")
            dtype, prompt = prompt.dtype, prompt.tolist()
            if not all(isinstance(t, int) for t in prompt):
                raise NgspecError(f"token ids must be integers (got a tensor or array of {dtype})")
        if not isinstance(prompt, (list, tuple)):
            raise NgspecError(f"{PROMPT_KINDS} (got {'None' if prompt is None else kind_of(prompt)})")
        prompt = list(prompt)
        if prompt and all(isinstance(m, dict) for m in prompt):
            if raw:  # as the CLI's --raw with chat records
                raise NgspecError("chat messages go through the chat template; raw=True takes text prompts")
            return encode_messages(self._tokenizer("chat messages"), prompt)
        odd = [t for t in prompt if isinstance(t, bool) or not isinstance(t, numbers.Integral)]
        if odd:
            raise NgspecError(f"{PROMPT_KINDS} (got a list holding {shown(odd[0])})")
        prompt = [int(t) for t in prompt]
        vocab = self.engine.loaded.model.get_input_embeddings().num_embeddings
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise NgspecError(f"token id {bad[0]} is outside the model's vocabulary (0..{vocab - 1})")
        return prompt

    def _encoded(self, prompts: list, raw: bool) -> list[list[int]]:
        """Each of many prompts' token ids; a refusal names which prompt it is."""
        ids = []
        for i, prompt in enumerate(prompts):
            try:
                ids.append(self.encode(prompt, raw))
            except NgspecError as exc:
                raise NgspecError(f"prompt {i}: {exc}") from None
        return ids

    def detokenize(self, ids: list[int]) -> str | None:
        return None if self.engine.loaded.tokenizer is None else self.engine.detokenize(ids)

    @api_errors
    def output(self, result: Generation | BatchResult, prompt_tokens: int) -> Output:
        """The `Output` of a run's `Generation` or of a `BatchResult` from `run_batch` (a prompt
        that could not run: finish reason "error" and its error), with its text when there is a
        tokenizer. ``prompt_tokens``: how many tokens its prompt was."""
        from ngspec.batch import BatchResult
        from ngspec.decode import Generation

        prompt_tokens = number("prompt_tokens", prompt_tokens)
        if isinstance(result, BatchResult):
            if result.generation is None:
                return Output.failed(result.error, prompt_tokens)
            result = result.generation
        if not isinstance(result, Generation):
            raise NgspecError(f"output takes a Generation or a BatchResult (got {shown(result)})")
        return Output.of(result, prompt_tokens, self.detokenize(result.token_ids))

    def _text_stream(self, on_text: Callable[[str], None] | None) -> TextDeltas | None:
        """The token callback that hands ``on_text`` the new text (None without ``on_text``)."""
        if on_text is None:
            return None
        self._tokenizer("streamed text (on_text)")
        return TextDeltas(self.engine.detokenize, on_text)

    def _tokenizer(self, what: str):
        if self.engine.loaded.tokenizer is None:
            raise NgspecError(f"{what} need a tokenizer: pass one to Speculator.from_model, or give token ids")
        return self.engine.loaded.tokenizer

    def _config(self, max_new_tokens, temperature, top_p, top_k, seed, stop, check) -> DecodeConfig:
        """The run's settings, each checked for its kind (``check`` too, though the run reads it later)."""
        flag("check", check)
        sampling = sampling_config(number("temperature", temperature, float), number("top_p", top_p, float), number("top_k", top_k), number("seed", seed, optional=True))
        cfg = decode_config(number("max_new_tokens", max_new_tokens), sampling, stop)
        if cfg.stop_strings:
            self._tokenizer("stop strings")
        return cfg

    def checked(self, out: Output, ids: list[int], cfg: DecodeConfig) -> Output:
        """``out`` with its `greedy_check`: plain decoding of ``ids`` (greedy, or sampling with the
        run's seed) on the model's stock layers, compared token for token (a failed row stays as
        it is)."""
        if out.error is not None:
            return out
        from ngspec.check import check_against_greedy

        return replace(out, greedy_check=check_against_greedy(self.engine, ids, out.token_ids, cfg, out.seed).as_dict())

    # the user's level: prompts and keyword arguments

    @api_errors
    def generate(
        self,
        prompt: Prompt,
        max_new_tokens: int = 256,
        *,
        raw: bool = False,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        stop: Sequence[str] = (),
        on_text: Callable[[str], None] | None = None,
        check: bool = False,
    ) -> Output:
        """Generate for one prompt. ``on_text`` receives the new text as verified tokens arrive
        (streaming); ``check`` also decodes plainly and fills ``Output.greedy_check``."""
        cfg = self._config(max_new_tokens, temperature, top_p, top_k, seed, stop, check)
        ids = self.encode(prompt, raw)
        stream = self._text_stream(function("on_text", on_text))
        out = self.output(self.run(ids, cfg, stream), len(ids))
        if stream is not None:
            stream.flush()
        return self.checked(out, ids, cfg) if check else out

    @api_errors
    def generate_batch(
        self,
        prompts: Sequence[Prompt],
        max_new_tokens: int = 256,
        *,
        batch_size: int = 8,
        raw: bool = False,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        stop: Sequence[str] = (),
        rearrange_every: int | None = None,
        rearrange_min_share: float | None = None,
        layout: str = "padded",
        prefill_tokens: int | None = None,
        check: bool = False,
        on_output: Callable[[int, Output], None] | None = None,
    ) -> list[Output]:
        """Generate for many prompts, ``batch_size`` at a time (a finished prompt's slot goes to
        the next). One Output per prompt, in order; a prompt that cannot run (longer than the
        context window) gets ``finish_reason="error"`` and its ``error``, and the others finish.
        ``on_output(index, output)`` is called as each prompt finishes (before any check), to
        write results as they come. ``rearrange_every`` / ``rearrange_min_share``: as `generate
        --rearrange-every` / ``--rearrange-min-share`` (defaults measured on a CPU);
        ``prefill_tokens``: as ``--prefill-tokens`` (None: 8192 on a GPU, 0 on a CPU)."""
        from ngspec.batch import BatchConfig

        cfg = self._config(max_new_tokens, temperature, top_p, top_k, seed, stop, check)
        rearrange_every, rearrange_min_share = number("rearrange_every", rearrange_every, optional=True), number("rearrange_min_share", rearrange_min_share, float, True)
        batch = BatchConfig(
            number("batch_size", batch_size),
            BatchConfig.rearrange_every if rearrange_every is None else rearrange_every,
            BatchConfig.rearrange_min_share if rearrange_min_share is None else rearrange_min_share,
            layout=layout,
            prefill_tokens=number("prefill_tokens", prefill_tokens, optional=True),
        )
        prompts, on_output, raw = batch_prompts(prompts, "generate_batch"), function("on_output", on_output), flag("raw", raw)
        if not prompts:
            return []
        ids = self._encoded(prompts, raw)
        outs: list[Output | None] = [None] * len(ids)

        def finished(r: BatchResult) -> None:
            outs[r.index] = self.output(r, len(ids[r.index]))
            if on_output is not None:
                on_output(r.index, outs[r.index])

        self.run_ids(ids, cfg, batch, finished)
        return [self.checked(out, x, cfg) for out, x in zip(outs, ids)] if check else outs
