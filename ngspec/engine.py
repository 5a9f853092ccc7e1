"""Engine: a loaded model ready to generate from prompt text with any drafter.

Glues together the tokenizer (chat template, EOS, stop strings), the `TargetModel` and the decode
loop, so that `generate` and `bench` run exactly the same code path.
"""

from __future__ import annotations

import gc
import threading
import time
import weakref
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from typing import Callable, Iterator

import torch

from ngspec.batch import BatchConfig, generate_batch
from ngspec.contracts import Drafter
from ngspec.errors import NgspecError
from ngspec.drafters.ngram_tables import NgramTables, cached_tables, table_anchor
from ngspec.decode import DecodeConfig, Generation, Stopper, generate, most_new_tokens, special_stop_ids
from ngspec.models import LoadedModel, generation_defaults_aside
from ngspec.cpu_linear import stock_linears
from ngspec.perf.costs import TimingBar, cached_verify_costs
from ngspec.perf.device_profile import DeviceProfile
from ngspec.static_verify import unpadded
from ngspec.target import TargetModel
from ngspec.verify import SamplingConfig


def eos_ids(loaded: LoadedModel) -> frozenset[int]:
    """EOS ids from the generation config and the tokenizer."""
    ids: set[int] = set()
    gen_eos = getattr(loaded.model.generation_config, "eos_token_id", None)
    for value in (gen_eos, getattr(loaded.tokenizer, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return frozenset(ids)


@contextmanager
def collector_spared() -> Iterator[None]:
    """For one run: keep what is alive when it starts (the model's modules, the tokenizer, torch,
    transformers and whatever the calling program holds) out of the cyclic collector's full
    passes, which the tries drafters build per prompt (20,000 nodes) set off; each pass scanned it
    all, 20 ms per prompt on the AMD EPYC, 0.7% of eagle+search's time (BENCHMARKS.md, "oneDNN").
    Released when the run ends, so what the program drops afterwards is collected as usual (frozen
    for the process's life, every cycle alive at that moment stayed in memory for good: about
    0.8 MB a `generate` run in a process that ran many, BENCHMARKS.md 10zzd). A program that froze
    its own objects keeps its freeze, and then this does nothing."""
    if gc.get_freeze_count() > _FROZEN_AT_IMPORT:
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class _Turns:
    """Who holds a model's turn: its lock (reentrant, so a check may decode inside its own turn)
    and the thread whose decoding loop is running, if one is."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.decoding: int | None = None


_TURNS: weakref.WeakKeyDictionary[torch.nn.Module, _Turns] = weakref.WeakKeyDictionary()
_TURNS_MADE = threading.Lock()


@contextmanager
def one_at_a_time(model: torch.nn.Module, decoding: bool = True) -> Iterator[None]:
    """Runs on ``model`` take turns: a decoding run holds its cache and may swap its linear
    layers (`stock_linears`) or width plans (`unpadded`), so a second thread's run (a web
    framework's thread pool calling one `Speculator`) waits until the first one ends; shared,
    they failed on tensors of mismatched sizes, or decoded wrong tokens. A run started from a
    callback of a running ``decoding`` loop on the same thread (an ``on_text`` that generates)
    would decode into that loop's cache: refused."""
    with _TURNS_MADE:
        turns = _TURNS.setdefault(model, _Turns())
    if turns.decoding == threading.get_ident():
        raise NgspecError(
            "a generation on this model was started from inside another's callback (on_text, on_output, on_finish or feed), "
            "which runs within that generation's decoding loop; keep what the callback needs and generate after the call returns"
        )
    with turns.lock:  # no loop decodes now: another thread's would hold the lock, this one's was refused
        if decoding:
            turns.decoding = threading.get_ident()
        try:
            yield
        finally:
            turns.decoding = None


# Python 3.12's full collections freeze its immortal objects (375 tuples on 3.12.1; 3.11 and 3.13
# freeze none): a freeze count up to what it was when ngspec was imported is not a program's own
# freeze. (A program that froze its objects before importing ngspec has that freeze released.)
_FROZEN_AT_IMPORT = gc.get_freeze_count()


@dataclass
class Engine:
    """Drafters size their trees from the verify cost by tree size: from ``profile`` (a device
    profile from `profile-bound --save-profile`, one table per context length) when given, else,
    with ``calibrate``, measured once per machine setting (a few seconds on CPU, then cached);
    with neither, drafters assume verification is free. ``cost_slope`` S overrides them all with
    the assumed cost 1 + S*n for n nodes at every batch size and context (a what-if for
    benchmarks: trees sized as on another device, e.g. 0.004, about the H100's for the default
    model; its runs never rescale it by this machine's own step times: ``learn_costs`` is off).
    ``target_graphs``: verify at fixed shapes, replayed from captured CUDA graphs on a GPU
    (`ngspec.static_verify`), one prompt at a time and in batches; set before calibrating, so
    the costs measured are those of the replays, and a block is padded to a wider bucket where
    that replays cheaper on this device (`ngspec.static_verify.plan_widths`) unless not
    ``pad_wider`` (a run to compare against that). ``bar``: shows the rounds of a calibration
    while it is measured (`ngspec.perf.costs.cached_verify_costs`)."""

    loaded: LoadedModel
    calibrate: bool = True
    max_draft_nodes: int = 32
    profile: DeviceProfile | None = None
    cost_slope: float | None = None
    target_graphs: bool = False
    bar: TimingBar | None = None
    pad_wider: bool = True

    def __post_init__(self) -> None:
        self.target = TargetModel(self.loaded.model)
        if self.target_graphs:
            self.target.use_graphs()
        self.eos = eos_ids(self.loaded)
        self._tables: NgramTables | None = None
        if self.cost_slope is not None:
            self.target.cost_tables = {0: tuple(1.0 + self.cost_slope * n for n in range(self.max_draft_nodes + 1))}
        elif self.profile is not None:
            self.target.cost_tables = self.profile.cost_tables(self.max_draft_nodes)
        elif self.calibrate:
            self.target.cost_tables = {0: cached_verify_costs(self.target, self.max_draft_nodes, bar=self.bar, pad_wider=self.pad_wider)}

    def ngram_tables(self, path=None, progress=None, notify=None) -> NgramTables:
        """The model-derived unigram/bigram tables (built once per model and cached on disk;
        ``path`` reads a table file from `build-bigram --out` instead)."""
        if self._tables is None:
            anchor = table_anchor(self.loaded.tokenizer)
            self._tables = cached_tables(self.loaded.model, self.loaded.name, anchor, path, progress, notify)
        return self._tables

    def detokenize(self, ids: list[int]) -> str:
        return self.loaded.tokenizer.decode(ids, skip_special_tokens=True)

    def stopper(self, cfg: DecodeConfig) -> Stopper:
        """EOS (the config's, else the model's) and the config's stop strings; one that names a
        special token stops at that token (`special_stop_ids`)."""
        stop_ids = special_stop_ids(self.loaded.tokenizer, cfg.stop_strings, self.detokenize) if cfg.stop_strings else frozenset()
        return Stopper(cfg.eos_ids or self.eos, cfg.stop_strings, self.detokenize, stop_ids)

    def run(
        self,
        prompt_ids: list[int],
        drafter: Drafter,
        cfg: DecodeConfig,
        on_tokens: Callable[[list[int]], None] | None = None,
    ) -> Generation:
        with one_at_a_time(self.loaded.model), collector_spared(), self._padding():
            return generate(self.target, drafter, prompt_ids, self._config(cfg), self.stopper(cfg), on_tokens)

    def _padding(self):
        """Blocks padded as the model's width plans say, or (not ``pad_wider``) at their own buckets."""
        return nullcontext() if self.pad_wider else unpadded(self.loaded.model)

    def _config(self, cfg: DecodeConfig) -> DecodeConfig:
        """An assumed cost (``cost_slope``) stands as given: not rescaled by the run's step times."""
        return replace(cfg, learn_costs=False) if self.cost_slope is not None else cfg

    def batch_costs(self, batch: int) -> Callable[[int], tuple[float, ...]]:
        """Verify costs by tree size for ``batch`` rows decoded together (measured once per batch
        size and cached, when this engine calibrates; a device profile's single-row tables
        otherwise)."""
        if batch == 1 or not self.calibrate or self.profile is not None or self.cost_slope is not None:
            return self.target.verify_cost
        table = cached_verify_costs(self.target, self.max_draft_nodes, batch, self.bar, self.pad_wider)
        return lambda context: table

    def run_batch(self, prompts: list[list[int]], new_drafter: Callable[[], Drafter], cfg: DecodeConfig, batch: BatchConfig, on_finish=None, feed=None):
        """`generate_batch` on this model: results in prompt order and the batch's cache report.
        Drafters size their trees from verify costs measured at this batch size (the full batch
        size when ``feed`` may bring more prompts)."""
        rows = batch.batch_size if feed is not None else min(batch.batch_size, len(prompts))
        if self.target_graphs:
            batch = replace(batch, target_graphs=True)
        with one_at_a_time(self.loaded.model):
            costs = self.batch_costs(max(rows, 1))  # measured on the model the first time
            with collector_spared(), self._padding():
                return generate_batch(self.loaded.model, prompts, new_drafter, self._config(cfg), batch, lambda: self.stopper(cfg), costs, on_finish, feed)

    @torch.inference_mode()
    def hf_generate(self, prompt_ids: list[int], max_new_tokens: int, lookup: bool = False, sampling: SamplingConfig | None = None) -> tuple[list[int], float]:
        """transformers' own `generate` (optionally with prompt lookup): ids and seconds. Greedy,
        or with ``sampling`` that samples, transformers' sampling at the same temperature, top-p
        and top-k (seeded through torch's global generator when the sampling has a seed). Runs
        on the stock linear layers (not the engine's tuned CPU kernels), as transformers would:
        the baseline a user would otherwise run, but with the model's own generation defaults
        set aside (`generation_defaults_aside`), so that it decodes plainly. Like the engine, it
        stops where the context window is full (transformers would go on past it)."""
        max_new_tokens = min(max_new_tokens, most_new_tokens(len(prompt_ids), self.target.max_length))
        ids = torch.tensor([prompt_ids], device=self.target.device)
        kwargs = {"prompt_lookup_num_tokens": 10} if lookup else {}
        sample = sampling is not None and not sampling.greedy
        if sample:
            kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)  # top_k 0 is off in both
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
        with one_at_a_time(self.loaded.model), stock_linears(self.loaded.model) as model, generation_defaults_aside(model):
            start = time.perf_counter()
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=sample,
                eos_token_id=sorted(self.eos) or None,
                pad_token_id=min(self.eos) if self.eos else None,
                **kwargs,
            )
            tokens = out[0, len(prompt_ids) :].tolist()  # waits for the GPU, if any
            seconds = time.perf_counter() - start
        return tokens, seconds
