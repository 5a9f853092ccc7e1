"""A device profile: what verification costs on one device for one model, saved by
`profile-bound --save-profile` and loaded by `generate`/`bench --profile`.

Per context length it keeps the relative cost of verifying a tree of n nodes (from the ``tree``
layout; the ``rows`` layout's token counts stand in when only rows were measured), the rows grid,
and the token budget that stays within the chosen slowdown. Drafters size their trees from the
cost table (see `DraftContext.cost`); row drafters take the largest (k, w) within budget.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from ngspec import staging
from ngspec.errors import NgspecError
from ngspec.perf.report import CellReport

FORMAT = "ngspec-device-profile"
VERSION = 1


def build_profile(meta: dict, reports: list[CellReport], max_slowdown: float) -> dict:
    contexts: dict[str, dict] = {}
    for context in sorted({r.context for r in reports}):
        ok = [r for r in reports if r.context == context and r.slowdown is not None]
        trees = [r for r in ok if r.layout == "tree"]
        by_nodes: dict[int, list[float]] = {}
        for r in trees or [r for r in ok if r.layout == "rows"]:
            by_nodes.setdefault(r.tokens - 1, []).append(r.slowdown)
        rows = [r for r in ok if r.layout == "rows"]
        within = [r for r in rows if r.slowdown <= max_slowdown]
        best = max(within, key=lambda r: (r.k * r.w, r.w), default=None)
        budget = max((r.tokens for r in ok if r.slowdown <= max_slowdown), default=1)
        contexts[str(context)] = {
            "budget_tokens": budget,
            "best_rows": [best.k, best.w] if best else [1, 0],
            "tree_cost": [[n, round(statistics.median(v), 4)] for n, v in sorted(by_nodes.items())],
            "rows_cost": [[r.k, r.w, round(r.slowdown, 4)] for r in rows],
        }
    return {"format": FORMAT, "version": VERSION, **meta, "max_slowdown": max_slowdown, "contexts": contexts}


def device_name(device) -> str:
    """What a profile says it was measured on: the GPU's name, or the CPU's with torch's thread
    count (a profile timed on two threads does not hold for sixteen)."""
    import torch

    from ngspec.cpu_linear import cpu_name

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    threads = torch.get_num_threads()
    return f"{cpu_name()}, {threads} thread{'s' if threads != 1 else ''}"


def save_profile(path: Path, profile: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staging.write_text(path, json.dumps(profile, indent=1))


@dataclass(frozen=True)
class DeviceProfile:
    model: str
    device: str | None  # what it was measured on (`device_name`; absent in a file that does not say)
    max_slowdown: float
    contexts: dict[int, dict]
    target_graphs: bool = False  # measured replayed from CUDA graphs (`profile-bound --target-graphs`)
    model_shape: str | None = None  # `ngspec.perf.costs.model_shape` of the model measured (absent in older files)
    dtype: str | None = None  # the dtype measured ("float32"; absent in older files)

    def _nearest(self, context: int) -> dict:
        """The largest profiled context not above ``context`` (else the smallest)."""
        below = [c for c in self.contexts if c <= context]
        return self.contexts[max(below) if below else min(self.contexts)]

    def verify_cost(self, context: int, max_nodes: int) -> tuple[float, ...]:
        """Relative cost of verifying 0..max_nodes tree nodes at ``context``: measured points
        interpolated, extrapolated along the last measured slope, never decreasing."""
        from ngspec.perf.costs import cost_table

        return cost_table({int(n): float(s) for n, s in self._nearest(context)["tree_cost"]}, max_nodes)

    def cost_tables(self, max_nodes: int) -> dict[int, tuple[float, ...]]:
        return {c: self.verify_cost(c, max_nodes) for c in self.contexts}

    def check_model(self, model: str, path: Path, shape: str | None = None) -> None:
        """Refuse a profile measured for another model: by the model's shape where both are known
        (what a forward costs depends on: a profile of `profile-bound --shape smollm2-135m`'s
        random weights serves the real model, and one model given by name or by path is one
        model), else by the name it was given."""
        if self.model_shape is not None and shape is not None:
            if self.model_shape != shape:
                raise NgspecError(
                    f"{path} was measured for model {self.model!r}, whose shape differs from that of {model!r} "
                    f"({_first_difference(self.model_shape, shape)}); profile this model with "
                    f"`ngspec profile-bound --model ... --save-profile PATH`"
                )
            return
        if self.model != model:
            raise NgspecError(
                f"{path} was measured for model {self.model!r}, not {model!r}; profile this model with "
                f"`ngspec profile-bound --model ... --save-profile PATH`"
            )

    def elsewhere(self, path: Path, device: str, dtype: str) -> list[str]:
        """Why this profile's costs may not hold for a run on ``device`` (`device_name`) in
        ``dtype``: one line for each that differs from what it was measured on (none when it
        matches, or when the file does not say). Costs depend on both; a profile from another
        machine still sizes drafts, only less well, so these are warnings."""
        lines = []
        for what, measured, here in (("on", self.device, device), ("in", self.dtype, dtype)):
            if measured is not None and measured != here:
                lines.append(f"{path} was measured {what} {measured} and this run is {what} {here}: its costs may size drafts wrongly "
                             f"(measure one here: `ngspec profile-bound --save-profile ...`)")
        return lines

    def best_rows(self, context: int) -> tuple[int, int]:
        k, w = self._nearest(context)["best_rows"]
        return int(k), int(w)


def _first_difference(ours: str, theirs: str) -> str:
    """The first field of two `model_shape` strings that differs: "vocab_size=49152 against 96"."""
    for a, b in zip(ours.split(","), theirs.split(",")):
        if a != b:
            return f"{a} against {b.split('=')[-1]}"
    return "another architecture"


def load_profile(path: Path, model: str | None = None, shape: str | None = None) -> DeviceProfile:
    """Read a profile; refuse a file that is not one, or (given ``model``) one measured for
    another model (by ``shape`` where both are known, see `DeviceProfile.check_model`)."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise NgspecError(f"no device profile at {path}: make one with `ngspec profile-bound --save-profile {path}`") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise NgspecError(f"{path} is not a readable device profile ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise NgspecError(f"{path} is not an ngspec device profile")
    if data.get("version") != VERSION:
        raise NgspecError(f"{path} has profile version {data.get('version')}; this ngspec reads version {VERSION}")
    try:
        contexts = {int(c): v for c, v in data["contexts"].items()}
        for v in contexts.values():
            [(int(n), float(s)) for n, s in v["tree_cost"]]
            int(v["budget_tokens"])
        if not contexts:
            raise ValueError("no contexts")
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise NgspecError(f"{path} is a damaged device profile ({exc})") from None
    said = {k: data[k] if isinstance(data.get(k), str) else None for k in ("device", "model_shape", "dtype")}
    profile = DeviceProfile(str(data.get("model")), said["device"], float(data.get("max_slowdown", 1.1)), contexts,
                            data.get("target_graphs") is True, said["model_shape"], said["dtype"])
    if model is not None:
        profile.check_model(model, path, shape)
    return profile
