"""Aggregates bench records per arm and renders them as rows, Markdown and JSON.

Throughput is total tokens / total seconds over all prompts (never a mean of per-prompt rates);
the median of per-prompt speedups is reported beside it, and the speedup's 95% interval with the
prompts resampled in pairs (`ngspec.bench.interval`): an arm is faster than hf-greedy on these
prompts when the interval's lower end is above 1.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from ngspec.bench.interval import ratio_interval, throughput_ratio
from ngspec.bench.runner import BenchRecord, baseline
from ngspec.check import GreedyCheck, margin_text
from ngspec.cpu_linear import cpu_name
from ngspec.drafters.eagle import head_graphs_report
from ngspec.perf.device_profile import device_name
from ngspec.perf.measured import busy_warning
from ngspec.static_verify import batches_static
from ngspec.versions import versions


@dataclass
class ArmSummary:
    arm: str
    tokens: int
    seconds: float
    tokens_per_second: float
    speedup: float  # total-throughput ratio vs hf-greedy
    median_speedup: float  # median over prompts of the per-prompt ratio vs hf-greedy
    tokens_per_call: float | None  # tokens per target forward, bonus included, prefill counted
    acceptance_histogram: dict[int, int]  # tokens emitted by a call -> number of calls
    draft_share: float
    prefill_share: float | None  # the prompts' forwards, which no drafter shortens (None: transformers' arms)
    exact_match: float | None  # share of prompts whose tokens equal hf-greedy's (sampled: vanilla's; None: transformers' sampling)
    ceiling_ratio: float | None  # tokens_per_call / token-weighted self-repetition of hf-greedy outputs
    median_ceiling_ratio: float | None  # median over prompts of that ratio per prompt
    largest_tie_margin: float | None = None  # over mismatched prompts: hf-greedy's top-2 logit margin where they split
    largest_tie_steps: float | None = None  # and the widest split in rounding steps of the model's dtype (check.rounding_step)
    speedup_interval: tuple[float, float] | None = None  # 95% paired bootstrap interval of speedup (None: one prompt)


def exact_share(records: list[BenchRecord], arm: str) -> float | None:
    """The share of ``arm``'s outputs equal to their reference (hf-greedy's; sampled, vanilla's);
    None when its outputs were not checked (transformers' sampling draws its own numbers)."""
    checks = [r.runs[arm].vs_reference for r in records]
    return None if any(c is None for c in checks) else sum(c.exact_match for c in checks) / len(checks)


def mismatches(records: list[BenchRecord], arm: str) -> list[tuple[str, int, GreedyCheck]]:
    """(prompt id, first differing position, the check with the reference's top-2 margin there)
    for every prompt whose ``arm`` output differs from its reference's (hf-greedy's; sampled,
    vanilla's)."""
    return [
        (r.prompt.label, c.first_mismatch, c)
        for r in records
        if (c := r.runs[arm].vs_reference) is not None and not c.exact_match
    ]


def ceiling_of(records: list[BenchRecord], with_datastore: bool = False) -> float:
    """Token-weighted self-repetition of the hf-greedy outputs: total tokens / total steps, the
    same aggregation as tokens per call (a mean of per-prompt values is dominated by the few
    outputs that loop). ``with_datastore``: the ceiling when the datastore is searched too."""
    values = [r.with_datastore if with_datastore else r.self_repetition for r in records]
    values = [v for v in values if v is not None]
    steps = sum(v.steps for v in values)
    return sum(v.tokens for v in values) / steps if steps else 0.0


def runs_of(records: list[BenchRecord], arm: str) -> list[tuple[int, float]]:
    """``arm``'s (tokens, seconds) on every prompt and round, in record order: pairs with any other arm's."""
    return [(len(r.runs[arm].token_ids), r.runs[arm].seconds) for r in records]


def prompts_of(records: list[BenchRecord]) -> list[str]:
    """Each record's question: a question's rounds and turns are resampled together
    (`ratio_interval`'s keys; a second turn repeats much of the first's answer, so it is no new
    question)."""
    return [r.prompt.id for r in records]


def reference_arm(records: list[BenchRecord]) -> str:
    """The arm every speedup is against: the first of every record's runs (hf-greedy, or hf-sample)."""
    return next(iter(records[0].runs))


def summarise(records: list[BenchRecord], arms: list[str]) -> list[ArmSummary]:
    ref = reference_arm(records)
    ceiling = ceiling_of(records)
    out = []
    for arm in arms:
        runs = [r.runs[arm] for r in records]
        tokens = sum(len(x.token_ids) for x in runs)
        seconds = sum(x.seconds for x in runs)
        ref_tps = sum(len(r.runs[ref].token_ids) for r in records) / sum(r.runs[ref].seconds for r in records)
        per_prompt = [
            (len(r.runs[arm].token_ids) / r.runs[arm].seconds)
            / (len(r.runs[ref].token_ids) / r.runs[ref].seconds)
            for r in records
        ]
        known = all(x.verify_calls for x in runs)
        calls = sum(x.verify_calls or 0 for x in runs)
        tpc = tokens / calls if known and calls else None
        hist = Counter(a for x in runs for a in x.accepted)
        splits = [c for _, _, c in mismatches(records, arm)]
        out.append(
            ArmSummary(
                arm=arm,
                tokens=tokens,
                seconds=seconds,
                tokens_per_second=tokens / seconds,
                speedup=(tokens / seconds) / ref_tps,
                median_speedup=statistics.median(per_prompt),
                tokens_per_call=tpc,
                acceptance_histogram=dict(sorted(hist.items())) if known else {},
                draft_share=sum(x.draft_seconds for x in runs) / seconds,
                prefill_share=sum(x.prefill_seconds for x in runs) / seconds if all(x.prefill_seconds is not None for x in runs) else None,
                exact_match=exact_share(records, arm),
                ceiling_ratio=tpc / ceiling if tpc is not None and ceiling else None,
                median_ceiling_ratio=statistics.median(
                    len(r.runs[arm].token_ids) / r.runs[arm].verify_calls / r.self_repetition.value
                    for r in records
                ) if known and all(r.self_repetition.steps for r in records) else None,
                largest_tie_margin=max((c.margin for c in splits), default=None),
                largest_tie_steps=max((c.steps for c in splits if c.steps is not None), default=None),
                speedup_interval=ratio_interval(runs_of(records, arm), runs_of(records, ref), keys=prompts_of(records)),
            )
        )
    return out


def split(records: list[BenchRecord], arms: list[str], key: Callable[[BenchRecord], object]) -> dict[object, list[ArmSummary]]:
    """`summarise` of each group of records with the same ``key`` (in the order first seen); empty
    when there is one group."""
    groups = list(dict.fromkeys(key(r) for r in records))
    if len(groups) < 2:
        return {}
    return {g: summarise([r for r in records if key(r) == g], arms) for g in groups}


def turn_of(r: BenchRecord) -> int:
    return r.prompt.turn


def category_of(r: BenchRecord) -> str:
    return r.prompt.category or "-"


def split_columns(name: str) -> list[str]:
    return ["arm", name, "prompts", "speedup", "tokens/call", "ceiling", "vs ceiling"]


def split_rows(groups: dict[object, list[ArmSummary]], records: list[BenchRecord], key: Callable[[BenchRecord], object]) -> list[list[str]]:
    """One row per arm and group; the ceiling is the group's self-repetition (token-weighted);
    prompts counts questions."""
    out = []
    for arm in [s.arm for s in next(iter(groups.values()))]:
        for i, (group, summaries) in enumerate(groups.items()):
            of_group = [r for r in records if key(r) == group]
            s = next(x for x in summaries if x.arm == arm)
            out.append([arm if i == 0 else "", str(group), str(len({r.prompt.id for r in of_group})), f"{s.speedup:.2f}x",
                        _fmt(s.tokens_per_call, ".2f"), f"{ceiling_of(of_group):.2f}", _fmt(s.ceiling_ratio, ".2f")])
    return out


def split_tables(records: list[BenchRecord], arms: list[str]) -> list[tuple[str, list[str], list[list[str]], dict]]:
    """The report's splits (title, columns, rows, JSON) by category and by turn, where there are
    several of either."""
    out = []
    for what, title, key in (("category", "by category", category_of),
                             ("turn", "by turn (a later turn is asked after the conversation so far)", turn_of)):
        groups = split(records, arms, key)
        if groups:
            out.append((title, split_columns(what), split_rows(groups, records, key), {str(g): [asdict(x) for x in v] for g, v in groups.items()}))
    return out


def versus(records: list[BenchRecord], arms: list[str], base: str) -> list[dict]:
    """Every other arm against ``base`` (e.g. the whole READER method against ``trie``): its
    total-throughput ratio and that ratio's 95% interval, each prompt's two runs in a round a
    pair, a question's rounds and turns resampled together."""
    theirs, out = runs_of(records, base), []
    for arm in arms:
        if arm != base:
            ours = runs_of(records, arm)
            out.append({"arm": arm, "versus": base, "ratio": throughput_ratio(ours, theirs), "interval": ratio_interval(ours, theirs, keys=prompts_of(records))})
    return out


SAMPLED_NOTE = ("Every arm sampled with one seed: the engine's arms draw plain sampling's tokens, so their exact match is "
                "against vanilla (the same seed samples the same tokens whatever the drafts, ngspec.verify.Draws); transformers' "
                "arms draw their own random numbers (-).")

COLUMNS = ["arm", "tok/s", "speedup", "95% interval", "median speedup", "tokens/call", "vs ceiling", "median vs ceiling", "draft share", "prefill share", "exact match", "acceptance histogram"]


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def interval_text(interval: tuple[float, float] | None, spec: str) -> str:
    return "-" if interval is None else f"{interval[0]:{spec}}-{interval[1]:{spec}}x"


def rows(summaries: list[ArmSummary]) -> list[list[str]]:
    return [
        [
            s.arm,
            f"{s.tokens_per_second:.1f}",
            f"{s.speedup:.2f}x",
            interval_text(s.speedup_interval, ".2f"),
            f"{s.median_speedup:.2f}x",
            _fmt(s.tokens_per_call, ".2f"),
            _fmt(s.ceiling_ratio, ".2f"),
            _fmt(s.median_ceiling_ratio, ".2f"),
            f"{100 * s.draft_share:.1f}%",
            "-" if s.prefill_share is None else f"{100 * s.prefill_share:.1f}%",
            "-" if s.exact_match is None else f"{100 * s.exact_match:.0f}%",
            " ".join(f"{k}:{v}" for k, v in s.acceptance_histogram.items()) or "-",
        ]
        for s in summaries
    ]


def environment(engine, settings: dict, eagle=None) -> dict:
    """The run's machine, model and settings; ``eagle``, the run's EAGLE drafter factory, if any."""
    device = engine.target.device
    return {
        "model": engine.loaded.name,
        "device": device_name(device),  # as `profile-bound` names it: the GPU, or the CPU and its threads (it said "cpu (x86_64)")
        "cpu": cpu_name(),  # the host's, on a GPU too: it issues the host work
        "torch_threads": torch.get_num_threads(),
        "dtype": str(engine.target.dtype).removeprefix("torch."),
        **versions(),  # ngspec (and its commit), torch, transformers, Python
        **({"cudnn_attention": torch.backends.cuda.cudnn_sdp_enabled()} if device.type == "cuda" else {}),
        # `--target-graphs`: one prompt at a time, and in batches
        **({"target_graphs": engine.target.static.report()} if engine.target.static is not None else {}),
        **({"batch_target_graphs": batched.report()} if (batched := batches_static(engine.loaded.model)) is not None else {}),
        **({"head_graphs": head} if (head := head_graphs_report(eagle)) is not None else {}),  # `--head-graphs`
        **settings,
    }


ARMS = "the arms"  # what a bench run times, as its busy warning names it


def busy_text(env: dict) -> str | None:
    """The warning for a run whose arms were timed while other processes kept the CPUs busy
    (`environment`'s ``others_cpu_share``), else None."""
    return busy_warning(env.get("others_cpu_share"), ARMS)


def setup_text(env: dict) -> str:
    """A report's setup as one line: ``key: value``, a nested record's keys inline."""
    def value(v):
        return "(" + ", ".join(f"{k} {value(x)}" for k, x in v.items()) + ")" if isinstance(v, dict) else str(v)

    return ", ".join(f"{k}: {value(v)}" for k, v in env.items())


def table_lines(columns: list[str], cells: list[list[str]]) -> list[str]:
    """A Markdown table."""
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)] + ["| " + " | ".join(r) + " |" for r in cells]


def markdown(
    summaries: list[ArmSummary], env: dict, ceiling: float, ceiling_with_datastore: float | None = None, records: list[BenchRecord] = (),
    pairs: list[dict] = (),
) -> str:
    lines = table_lines(COLUMNS, rows(summaries))
    for title, columns, cells, _ in split_tables(list(records), [s.arm for s in summaries]):
        lines += ["", f"{title[0].upper()}{title[1:]}:", ""] + table_lines(columns, cells)
    if pairs:  # `versus`
        base = pairs[0]["versus"]
        lines += [""] + table_lines(["arm", f"throughput vs {base}", "95% interval"], [[p["arm"], f"{p['ratio']:.3f}x", interval_text(p["interval"], ".3f")] for p in pairs])
    meta = setup_text(env) + (f"\n\n**Warning:** {busy}" if (busy := busy_text(env)) else "")
    ref = reference_arm(list(records)) if records else baseline(False)
    return (
        f"{meta}\n\nSelf-repetition ceiling of the {ref} outputs (token-weighted): {ceiling:.2f}"
        + (f"; with the datastore: {ceiling_with_datastore:.2f}" if ceiling_with_datastore is not None else "")
        + "\n\n"
        f"Speedup is total-throughput vs {ref}, with its 95% interval over the prompts (paired bootstrap, a question's rounds and turns resampled together); "
        "tokens/call counts the bonus token and the prefill."
        + (f" {SAMPLED_NOTE}" if ref == baseline(True) else "")
        + "\n\n"
        + "\n".join(lines)
        + "\n"
        + mismatch_notes(records, summaries)
    )


def mismatch_notes(records: list[BenchRecord], summaries: list[ArmSummary]) -> str:
    """Markdown lines for every output that differs from its reference (hf-greedy's; sampled,
    vanilla's): where, and the reference's top-2 margin there (a near-tie in low precision, or a
    bug when the margin is large)."""
    ref = "vanilla" if reference_arm(records) == baseline(True) else reference_arm(records)
    lines = list(dict.fromkeys(  # once per prompt and place, however many rounds repeat it
        f"- {s.arm}, prompt {pid}: first differs at token {pos}, {ref}'s top-2 margin there {margin_text(check.as_dict())}"
        for s in summaries
        for pid, pos, check in mismatches(records, s.arm)
    ))
    return f"\nMismatches vs {ref}:\n" + "\n".join(lines) + "\n" if lines else ""


def to_json(records: list[BenchRecord], summaries: list[ArmSummary], env: dict) -> dict:
    return {
        "environment": env,
        "tokens_per_call_definition": "tokens emitted per target forward pass, bonus token included, prefill counted as the first call",
        "self_repetition_token_weighted": ceiling_of(records),
        "self_repetition_mean": statistics.fmean(r.self_repetition.value for r in records),
        **({"self_repetition_token_weighted_with_datastore": ceiling_of(records, True)} if records and records[0].with_datastore else {}),
        "arms": [asdict(s) for s in summaries],
        "prompts": [
            {
                "id": r.prompt.id,
                "turn": r.prompt.turn,
                "round": r.round,
                "category": r.prompt.category,
                "prompt_tokens": r.prompt_tokens,
                "self_repetition": r.self_repetition.value,
                "runs": {
                    arm: {
                        "new_tokens": len(x.token_ids),
                        "seconds": x.seconds,
                        "verify_calls": x.verify_calls,
                        "draft_seconds": x.draft_seconds,
                        "prefill_seconds": x.prefill_seconds,
                        "exact_match": None if x.vs_reference is None else x.vs_reference.exact_match,
                        **({"first_mismatch": x.vs_reference.first_mismatch, "near_tie_margin": x.vs_reference.margin,
                            "near_tie_steps": x.vs_reference.steps, "near_tie_dtype": x.vs_reference.dtype}
                           if x.vs_reference is not None and not x.vs_reference.exact_match else {}),
                    }
                    for arm, x in r.runs.items()
                },
            }
            for r in records
        ],
    }
