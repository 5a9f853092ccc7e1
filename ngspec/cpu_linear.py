"""The fastest float32 matrix product for each row count, measured on this CPU.

A CPU forward pass is mostly linear layers, and which product is fastest for them depends on the
CPU, the BLAS build and how many rows (tokens) go through at once. Four kernels compute the
same product (up to float32 rounding):

- ``linear``: ``torch.nn.functional.linear``, ``x @ W.T`` (what transformers runs);
- ``transposed``: ``(W @ x.T).T``, one row padded to two and three to four; on the team's AMD
  EPYC (MKL) it is 2.3-3.9x faster than ``linear`` for 1 to 4 rows and 1.4x at 8 (MKL's
  matrix-vector and small-matrix paths are slow there), about as fast from 12 rows on, and
  costs no memory;
- ``packed``: MKL's product with the weight packed once at load time
  (``torch.ops.mkl._mkl_linear``); on the Intel Xeon of earlier sessions, 4 to 32 rows cost
  1.3-1.8x a single row with it instead of 1.6-2.6x. It holds a second copy of the weights;
- ``onednn``: oneDNN's product (``torch.ops.mkldnn._linear_pointwise``, what torch.compile's
  CPU backend runs) on the same weights; on the AMD EPYC it is 1.4x faster than ``transposed``
  at 8 rows and 2.1x faster than ``linear`` from 128 rows on (a prefill), where MKL takes a
  slow path on AMD CPUs;
- ``blocked``: the same oneDNN product on a copy of the weights reordered once, at load time,
  into oneDNN's blocked layout (``torch.ops.mkldnn._reorder_linear_weight``, as torch.compile's
  weight freezing does). On the AMD EPYC it is the fastest at every row count: the default
  model's timed layers take 8.3 ms for one row (``transposed``: 11.1), 9.5 ms for five (19.1
  with the best of the others) and 11.2 ms for eight, so a tree of 7 nodes costs 1.35 one-token
  steps' worth of products instead of 1.6-2.4 (BENCHMARKS.md section 10b, "The blocked
  kernel"). It holds a second copy of the weights, as ``packed`` does, made again when the
  weights change in place (training, ``load_state_dict``).

A plan uses at most one of the kernels that run on a copy (``packed``, ``blocked``), so the
weights are held at most twice.

`tune_linears` times each kernel on the model's own linear layers at a ladder of row counts
(once per machine setting, then cached under ``$NGSPEC_CACHE/kernels``), and every layer then
runs, for ``n`` rows, the kernel chosen at the largest measured row count ``<= n``. Models
with under 32 MB of linear weights are left alone (the choice is noise there), as are non-CPU
and non-float32 models. ``NGSPEC_CPU_KERNELS`` forces one kernel for every row count
(``linear`` turns the tuning off). Results: BENCHMARKS.md section 1 and, for ``onednn``,
section 10b ("oneDNN").
"""

from __future__ import annotations

import os
import platform
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import torch
from torch import nn

KERNELS = ("linear", "transposed", "packed", "onednn", "blocked")
COPIED = ("packed", "blocked")  # kernels that run on a copy of the weights made at load time
ROW_LADDER = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64, 128, 512)
MIN_TUNED_BYTES = 32 << 20  # smaller models: every kernel is as fast, leave them alone
MEASURE_BYTES = 256 << 20  # how much of a model's weights a measurement reads per pass
COPY_MARGIN = 0.05  # a copy doubles the weights' memory: only for a clear gain
BLOCKED_ROWS = 32  # the row count oneDNN lays the blocked copy out for (8 to 128 time the same)
STOCK_MARGIN = 0.03  # within this of the fastest, keep transformers' own product
PLAN_ROUNDS = 7  # timed rounds per kernel and row count (the fastest counts)
LARGE_ROWS, LARGE_ROUNDS = 48, 3  # from 48 rows on a pass is long and compute-bound: fewer rounds


class KernelPlan:
    """Which kernel runs for each row count: ``kernels[i]`` from ``ROW_LADDER[i]`` rows on."""

    def __init__(self, kernels: tuple[str, ...]) -> None:
        if len(kernels) != len(ROW_LADDER) or any(k not in KERNELS for k in kernels):
            raise ValueError(f"a kernel plan names one of {KERNELS} per row count in {ROW_LADDER}")
        if len(set(kernels) & set(COPIED)) > 1:
            raise ValueError(f"a kernel plan uses at most one of {COPIED} (each holds a copy of the weights)")
        self.kernels = kernels
        self._by_rows = [kernels[max(i for i, r in enumerate(ROW_LADDER) if r <= n)] for n in range(1, ROW_LADDER[-1] + 1)]

    @classmethod
    def uniform(cls, kernel: str) -> "KernelPlan":
        return cls((kernel,) * len(ROW_LADDER))

    def for_rows(self, rows: int) -> str:
        return self._by_rows[min(max(rows, 1), len(self._by_rows)) - 1]

    @property
    def copy_kernel(self) -> str | None:
        """The kernel of the plan that runs on a copy of the weights (`COPIED`), if any."""
        return next((k for k in self.kernels if k in COPIED), None)

    def describe(self) -> str:
        """``1-3 transposed, 4-512+ linear``: the plan as runs of row counts."""
        parts, start = [], 0
        for i in range(1, len(ROW_LADDER) + 1):
            if i == len(ROW_LADDER) or self.kernels[i] != self.kernels[start]:
                end = f"{ROW_LADDER[i] - 1}" if i < len(ROW_LADDER) else f"{ROW_LADDER[-1]}+"
                parts.append(f"{ROW_LADDER[start]}-{end} {self.kernels[start]}")
                start = i
        return ", ".join(parts)


def _transposed(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    rows = x.shape[0]
    if rows in (1, 3):  # one row would take the matrix-vector path, slow again (and so would a
        # stride-0 ``expand``: only a real extra row keeps the fast one); three rows take a path
        # slower than four on the AMD EPYC (the default model's layers: 22.8 ms against 19.6
        # padded to four)
        return torch.mm(weight, torch.cat([x, x[-1:]]).t())[:, :rows].t().contiguous()
    return torch.mm(weight, x.t()).t().contiguous()


def weight_copy(kernel: str | None, weight: torch.Tensor) -> torch.Tensor | None:
    """The copy of ``weight`` that ``kernel`` runs on (`COPIED`), None for the others."""
    if kernel == "packed":
        return torch.ops.mkl._mkl_reorder_linear_weight(weight.detach(), 64)
    if kernel == "blocked":
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), BLOCKED_ROWS)
    return None


def run_kernel(kernel: str, x: torch.Tensor, weight: torch.Tensor, copy: torch.Tensor | None) -> torch.Tensor:
    """``x @ weight.T`` for a 2D ``x`` with ``kernel`` (no bias); ``copy`` is ``weight_copy(kernel,
    weight)`` for the kernels that need one."""
    if kernel == "transposed":
        return _transposed(x, weight)
    if kernel == "packed":
        return torch.ops.mkl._mkl_linear(x, copy, weight, None, x.shape[0])
    if kernel in ("onednn", "blocked"):
        return torch.ops.mkldnn._linear_pointwise(x, copy if kernel == "blocked" else weight, None, "none", [], "")
    return torch.nn.functional.linear(x, weight)


class TunedLinear(nn.Linear):
    """An `nn.Linear` (same parameters, same state dict) that runs, in inference, the kernel its
    plan names for the number of rows; training and other dtypes use the ordinary product."""

    plan: KernelPlan
    copy: torch.Tensor | None  # the weights as the plan's `copy_kernel` reads them
    copy_version: int  # the weight's version when the copy was made

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        kernel = self.plan.for_rows(rows) if rows else "linear"
        if kernel == "linear" or x.dtype != torch.float32 or (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)):
            return super().forward(x)
        if kernel in COPIED and _version(self.weight) != self.copy_version:  # changed in place since
            self.copy, self.copy_version = weight_copy(kernel, self.weight), _version(self.weight)
        out = run_kernel(kernel, x.reshape(rows, x.shape[-1]), self.weight, self.copy)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], out.shape[-1])


def _version(weight: torch.Tensor) -> int:
    """How often ``weight`` changed in place (-1 for tensors made in inference mode, which do not
    count)."""
    try:
        return weight._version
    except RuntimeError:
        return -1


def _linears(model: nn.Module) -> list[nn.Linear]:
    return [m for m in model.modules() if isinstance(m, nn.Linear) and m.weight.dtype == torch.float32]


def _copy_fits(model: nn.Module) -> bool:
    """A second copy of the weights takes under a quarter of the memory."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return False
    return 2 * sum(m.weight.numel() * 4 for m in _linears(model)) < memory // 4


def _onednn_works() -> bool:
    """oneDNN's linear (x86 builds of torch) is there and runs."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        run_kernel("onednn", torch.ones(2, 4), torch.ones(3, 4), None)
    except (RuntimeError, AttributeError):
        return False
    return True


def _blocked_works() -> bool:
    """oneDNN can also reorder a weight into its blocked layout and run on it."""
    if not _onednn_works():
        return False
    try:
        weight = torch.ones(3, 4)
        run_kernel("blocked", torch.ones(2, 4), weight, weight_copy("blocked", weight))
    except (RuntimeError, AttributeError):
        return False
    return True


def runnable(kernel: str) -> bool:
    """Whether this torch build has ``kernel``: ``packed`` needs MKL, ``onednn`` and ``blocked``
    oneDNN."""
    if kernel == "packed":
        return torch.backends.mkl.is_available()
    if kernel == "onednn":
        return _onednn_works()
    if kernel == "blocked":
        return _blocked_works()
    return True


def timed_layers(model: nn.Module, budget: int = MEASURE_BYTES) -> list[nn.Linear]:
    """The layers a measurement times: the model's linear layers in order until their weights
    pass ``budget`` bytes (far more than any CPU cache, so weights stream from memory as in a
    real forward pass, yet a large model is not read hundreds of times), plus one layer of every
    shape not yet among them (the LM head)."""
    chosen, total = [], 0
    for layer in _linears(model):
        if total < budget:
            chosen.append(layer)
            total += layer.weight.numel() * 4
    shapes = {tuple(m.weight.shape) for m in chosen}
    for layer in _linears(model):
        if tuple(layer.weight.shape) not in shapes:
            chosen.append(layer)
            shapes.add(tuple(layer.weight.shape))
    return chosen


@torch.inference_mode()
def measure_plan(
    model: nn.Module, rounds: int = PLAN_ROUNDS, progress: Callable[[int, int], None] | None = None, large_rounds: int = LARGE_ROUNDS,
) -> tuple[KernelPlan, dict[int, dict[str, float]]]:
    """Time every kernel on ``model``'s linear layers (`timed_layers`) at each row count of
    ``ROW_LADDER`` (interleaved rounds, the fastest of each) and keep the fastest (`choose_plan`);
    also returns the seconds measured. ``progress(done, total)`` hears of the start and of each
    finished round (the default model's first four take about 10 s each on two cores of the AMD
    EPYC, the later ones, without the large row counts, about 4 s).

    The fastest round rather than the median, as for the verify cost tables: other work on the
    machine only ever adds time, and one plan is cached for good. On the AMD VM the median of 3
    once timed ``blocked`` at 16 rows 4x slower than at 12 or 24 rows, so batch 8's one-node
    steps (16 rows) ran ``transposed`` at 1.95 plain steps instead of 1.24 (BENCHMARKS.md 10m).
    From ``LARGE_ROWS`` rows on only the first ``large_rounds`` rounds are timed: a pass there
    takes 0.1-0.9 s for the default model, so a burst of other work spoils a smaller share of
    it, and those rows were 60% of the timing (BENCHMARKS.md 10zze)."""
    layers = timed_layers(model)
    kernels = [k for k in KERNELS if runnable(k) and (k not in COPIED or _copy_fits(model))]
    copies = {k: [weight_copy(k, m.weight) for m in layers] for k in kernels}
    gen = torch.Generator().manual_seed(0)
    inputs = {rows: {m.in_features: torch.randn(rows, m.in_features, generator=gen) for m in layers} for rows in ROW_LADDER}
    samples: dict[int, dict[str, list[float]]] = {rows: {k: [] for k in kernels} for rows in ROW_LADDER}
    if progress is not None:
        progress(0, rounds + 1)
    for round_ in range(rounds + 1):  # round 0 warms up
        for rows in ROW_LADDER:
            if rows >= LARGE_ROWS and round_ > large_rounds:
                continue
            for kernel in kernels:
                start = time.perf_counter()
                for layer, copy in zip(layers, copies[kernel]):
                    run_kernel(kernel, inputs[rows][layer.in_features], layer.weight, copy)
                if round_:
                    samples[rows][kernel].append(time.perf_counter() - start)
        if progress is not None:
            progress(round_ + 1, rounds + 1)
    seconds = {rows: {k: min(v) for k, v in by.items()} for rows, by in samples.items()}
    return choose_plan(seconds), seconds


def choose_plan(seconds: dict[int, dict[str, float]]) -> KernelPlan:
    """The plan from each row count's kernel times (`choose` per row count), with at most one of
    the kernels that hold a copy of the weights: of those measured, the one fastest over the
    whole ladder."""
    copied = [k for k in COPIED if all(k in by for by in seconds.values())]
    keep = min(copied, key=lambda k: sum(by[k] for by in seconds.values()), default=None)
    return KernelPlan(tuple(
        choose({k: t for k, t in seconds[rows].items() if k not in COPIED or k == keep}) for rows in ROW_LADDER
    ))


def choose(seconds: dict[str, float]) -> str:
    """The kernel to run given each kernel's time: the fastest, except that a second copy of the
    weights (`COPIED`) must buy at least ``COPY_MARGIN``, and the stock product (``linear``) is
    kept when within ``STOCK_MARGIN`` of the choice (closer than the noise of a measurement)."""
    plain = {k: t for k, t in seconds.items() if k not in COPIED}
    best = min(plain, key=plain.get)
    copied = {k: t for k, t in seconds.items() if k in COPIED}
    fastest_copy = min(copied, key=copied.get, default=None)
    if fastest_copy is not None and copied[fastest_copy] * (1 + COPY_MARGIN) < plain[best]:
        best = fastest_copy
    if "linear" in seconds and seconds["linear"] <= seconds[best] * (1 + STOCK_MARGIN):
        return "linear"
    return best


def cpu_name() -> str:
    """The CPU's model name (for cache keys: measurements made on one CPU do not hold on another)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), platform.machine())
    except OSError:
        return platform.processor() or platform.machine()


def _setting(model: nn.Module) -> str:
    layers = _linears(model)
    shapes = sorted({tuple(m.weight.shape) for m in layers})
    count = len(layers)
    rule = f"{KERNELS}|{MEASURE_BYTES}|{COPY_MARGIN}|{BLOCKED_ROWS}|{STOCK_MARGIN}|fastest of {PLAN_ROUNDS}, {LARGE_ROUNDS} from {LARGE_ROWS} rows"  # a changed rule measures again
    return f"{cpu_name()}|{torch.get_num_threads()}|{torch.__version__}|mkl={torch.backends.mkl.is_available()}|{count}x{shapes}|{ROW_LADDER}|{rule}"


def cached_plan(
    model: nn.Module, notify: Callable[[str], None] | None = None, progress: Callable[[int, int], None] | None = None,
) -> KernelPlan:
    """`measure_plan`'s choice, measured once per machine setting and model shape, then cached;
    ``notify`` hears about a measurement before it starts, ``progress`` of its rounds."""
    from ngspec.perf.measured import measured_once

    def measure() -> tuple[KernelPlan, dict]:
        if notify is not None:
            notify("first run of this model on this CPU: timing matrix kernels and verify costs (about a minute on two cores, once)")
        plan, seconds = measure_plan(model, progress=progress)
        return plan, {"kernels": plan.kernels, "seconds": {str(r): s for r, s in seconds.items()}}

    return measured_once("kernels", _setting(model), lambda entry: KernelPlan(tuple(entry["kernels"])), measure)


def use_plan(model: nn.Module, plan: KernelPlan) -> int:
    """Make every float32 linear layer of ``model`` a `TunedLinear` running ``plan`` (with a copy
    of its weights where the plan uses a kernel that runs on one); returns how many layers it
    covers."""
    layers = _linears(model)
    for layer in layers:
        layer.__class__ = TunedLinear
        layer.plan, layer.copy, layer.copy_version = plan, weight_copy(plan.copy_kernel, layer.weight), _version(layer.weight)
    return len(layers)


def current_plan(model: nn.Module) -> KernelPlan | None:
    """The plan ``model``'s layers run, or None when they are ordinary layers."""
    return next((m.plan for m in model.modules() if isinstance(m, TunedLinear)), None)


def tune_linears(
    model: nn.Module, notify: Callable[[str], None] | None = None, progress: Callable[[int, int], None] | None = None,
) -> KernelPlan | None:
    """Give a CPU float32 ``model`` the fastest kernel per row count (see the module docstring);
    idempotent. Returns the plan in use, or None where the model keeps ordinary layers.
    ``notify`` and ``progress``: see `cached_plan`."""
    plan = current_plan(model)
    if plan is not None:
        return plan
    param = next(model.parameters())
    if param.device.type != "cpu" or param.dtype != torch.float32:
        return None
    forced = os.environ.get("NGSPEC_CPU_KERNELS", "").strip() or "auto"
    if forced == "linear":
        return None
    if forced != "auto":
        if forced not in KERNELS:
            from ngspec.errors import NgspecError

            raise NgspecError(f"NGSPEC_CPU_KERNELS must be auto or one of {', '.join(KERNELS)} (got {forced!r})")
        if not runnable(forced):
            return None
        plan = KernelPlan.uniform(forced)
    elif sum(m.weight.numel() * 4 for m in _linears(model)) < MIN_TUNED_BYTES:
        return None
    else:
        plan = cached_plan(model, notify, progress)
    use_plan(model, plan)
    return plan


def share_plan(model: nn.Module, other: nn.Module) -> KernelPlan | None:
    """Give ``other``, a small module run between ``model``'s forwards (an EAGLE head), ``model``'s
    plan; returns it. Tuning ``other`` alone would leave it untouched (under ``MIN_TUNED_BYTES``)
    or time it with its weights in cache, but each target forward evicts them, so it reads them
    from memory as the target does: on the AMD EPYC the default model's head layers take 0.97 ms
    for one row with ``transposed`` against 1.52 ms with ``linear`` (BENCHMARKS.md section 9)."""
    plan = tune_linears(model)
    if plan is not None and current_plan(other) is None:
        use_plan(other, plan)
    return plan


def planned_product(x: torch.Tensor, weight: torch.Tensor, plan: KernelPlan | None) -> torch.Tensor:
    """``x @ weight.T`` (any leading dimensions) with the kernel ``plan`` names for its rows, for a
    weight made on the fly (rows picked from a layer, per prompt), which has no copy: where the
    plan names ``blocked``, oneDNN's product on the weight as it is (reordering 20 MB of an EAGLE
    head's draft vocabulary takes 5-15 ms, more than a prompt's head runs would save); where it
    names ``packed``, and without a plan, the ordinary product."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    kernel = plan.for_rows(rows) if plan is not None and rows else "linear"
    kernel = {"blocked": "onednn", "packed": "linear"}.get(kernel, kernel)
    if kernel == "linear" or x.dtype != torch.float32:
        return x @ weight.T
    return run_kernel(kernel, x.reshape(rows, x.shape[-1]), weight, None).reshape(*x.shape[:-1], weight.shape[0])


@contextmanager
def stock_linears(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` with its tuned layers working as plain `nn.Linear` inside the block (the plan and
    copies of the weights are kept and back in use after it): how transformers itself would run the
    model, for the ecosystem baselines of `ngspec bench` and the tests' greedy oracle."""
    tuned = [m for m in model.modules() if type(m) is TunedLinear]
    for module in tuned:
        module.__class__ = nn.Linear
    try:
        yield model
    finally:
        for module in tuned:
            module.__class__ = TunedLinear
