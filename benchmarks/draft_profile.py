"""Where a batch's drafting time goes, by function: the step and drafting times of one batched run
with the rows' head runs and top-k requests answered together and one answering them row by row,
and a cProfile of the drafting phase (`propose_together`) of the first (``--whole-step``: of the
whole batched loop, verification and commits included, e.g. for ``--drafter trie``, whose steps at
batch size 32 cost 2.2x a plain batched step on the H100 with trivial arithmetic: host work).

On a GPU a 135M model is host-bound, so the host's time per call is what a step costs; this is how
BENCHMARKS.md section 10c found that the head's per-row attention, not its LM-head product, is the
largest piece of batched EAGLE's drafting there (the same profile on a CPU had pointed at the
product: a CPU mixes dispatch and arithmetic). cProfile inflates Python's share somewhat.

    python benchmarks/draft_profile.py --questions ../shared/data/spec_bench/question.jsonl \\
        --eagle-head heads/amd-v9 -b 8 -n 48
    # the default model's shape with random weights (timing only: its config and tokenizer suffice)
    python benchmarks/draft_profile.py --questions question.jsonl --eagle-head head --model gpu/rand --random-weights

``--drafter whole-tree`` (default) drafts EAGLE's whole tree every step, the same work whatever the
acceptance (and so also on random weights); ``eagle+search`` the whole method (with
``--datastore``); ``trie`` and ``vanilla`` need no head. No verify-cost calibration: trees are used
whole, or, with ``--cost-slope S``, sized under the cost 1 + S*n for n nodes, as on a GPU whose
costs were measured (the cost-sized drafters' own Python then runs as it does there).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

import ngspec.batch as batch_module
from ngspec.batch import BatchConfig
from ngspec.datastore.index import Datastore
from ngspec.decode import DecodeConfig
from ngspec.drafters import DrafterOptions, make_drafter
from ngspec.drafters.eagle import EagleOptions, eagle_factory, read_choices
from ngspec.eagle.head import load_draft_vocab, load_head
from ngspec.engine import Engine
from ngspec.models import default_model_dir, load_model
from ngspec.prompts import encode, load_prompts

OURS = "batched.py|vocab.py|eagle.py|search.py|kv.py|trie.py|index.py"  # ngspec's own drafting code


def profile_batch(engine: Engine, ids: list[list[int]], new_drafter, cfg: DecodeConfig, batch_size: int, top: int = 30, whole_step: bool = False, store=None) -> dict:
    """Times of the run with rows together and row by row, their outputs, and the profile text (of
    the drafting phase, or with ``whole_step`` of the whole loop, prefills included). ``store``,
    the drafters' datastore, is read cold by each run."""
    engine.run_batch(ids, new_drafter, DecodeConfig(max_new_tokens=8, max_draft_nodes=cfg.max_draft_nodes), BatchConfig(batch_size))  # warm-up
    out: dict = {}
    for together in (True, False):
        prof = cProfile.Profile()
        original = batch_module.propose_together

        def profiled(*args):
            prof.enable()
            try:
                return original(*args)
            finally:
                prof.disable()

        if not whole_step:
            batch_module.propose_together = profiled
        if store is not None:
            store.forget()
        try:
            t0 = time.perf_counter()
            if whole_step:
                prof.enable()
            results, report = engine.run_batch(ids, new_drafter, cfg, BatchConfig(batch_size, heads_together=together))
            prof.disable()
            wall = time.perf_counter() - t0
        finally:
            batch_module.propose_together = original
        drafting = sum(r.generation.stats.draft_seconds for r in results)  # each row holds its share of each phase
        key = "together" if together else "row_by_row"
        out[key] = {
            "steps": report.steps, "new_tokens": report.new_tokens, "seconds": wall,
            "ms_per_step": 1000 * wall / max(report.steps, 1), "drafting_ms_per_step": 1000 * drafting / max(report.steps, 1),
            "drafting_share": drafting / wall, "tokens": [r.generation.token_ids for r in results],
        }
        if together:
            text = io.StringIO()
            stats = pstats.Stats(prof, stream=text)
            stats.sort_stats("tottime").print_stats(top)
            stats.sort_stats("cumulative").print_stats(OURS, top)
            out["profile"] = text.getvalue()
    return out


def random_copy(model_dir: str | Path, seed: int = 0) -> Path:
    """A model of ``model_dir``'s config with random weights, and its tokenizer, in a new folder."""
    import transformers

    torch.manual_seed(seed)
    where = Path(tempfile.mkdtemp(prefix="ngspec-random-"))
    transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(model_dir)).save_pretrained(where)
    transformers.AutoTokenizer.from_pretrained(model_dir).save_pretrained(where)
    return where


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", required=True)
    ap.add_argument("--category", default="rag")
    ap.add_argument("--model", default="default")
    ap.add_argument("--random-weights", action="store_true", help="the model's config and tokenizer with random weights (timing only)")
    ap.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--eagle-head", help="the EAGLE head (for whole-tree and eagle+search)")
    ap.add_argument("--drafter", default="whole-tree", choices=["whole-tree", "eagle+search", "trie", "vanilla"])
    ap.add_argument("--whole-step", action="store_true", help="profile the whole batched loop (verification, commits, prefills), not only drafting")
    ap.add_argument("--datastore", help="for eagle+search")
    ap.add_argument("-b", "--batch-size", type=int, default=8)
    ap.add_argument("-n", "--max-new-tokens", type=int, default=48)
    ap.add_argument("--top", type=int, default=30, help="functions listed per ordering")
    ap.add_argument("--cost-slope", type=float, help="hand the drafters the verify cost 1 + S*n for n nodes (0.004: about the H100's for the default model, BENCHMARKS.md 10c), so that they draft as on a GPU with measured costs: gated head, local trie tree merged in, trees sized jointly (default: no cost, trees whole)")
    ap.add_argument("--tuned", help="tune-tree output: the head's static tree, in float32 (as on a GPU; default: a dynamic tree of 16)")
    ap.add_argument("--head-graphs", action="store_true", help="the head's runs at fixed shapes (`--head-graphs`; uncaptured on a CPU)")
    ap.add_argument("--deepen", action="store_true", help="eagle+search with tree deepening")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    if args.drafter not in ("trie", "vanilla") and not args.eagle_head:
        ap.error(f"--drafter {args.drafter} needs --eagle-head")

    model = args.model
    if args.random_weights:
        model = str(random_copy(default_model_dir() if model == "default" else model))
    loaded = load_model(model, args.device, args.dtype)
    engine = Engine(loaded, calibrate=False, max_draft_nodes=96, cost_slope=args.cost_slope)
    store = None
    if args.drafter in ("trie", "vanilla"):
        new_drafter = lambda: make_drafter(args.drafter)  # noqa: E731
    else:
        head = load_head(Path(args.eagle_head), loaded.model)
        opts = EagleOptions("static", choices=read_choices(Path(args.tuned)), head_int8=False) if args.tuned else EagleOptions("dynamic", 4, 4, 16)
        factory = eagle_factory(loaded.model, head, replace(opts, head_graphs=args.head_graphs), load_draft_vocab(Path(args.eagle_head)))
        if args.drafter == "whole-tree":
            new_drafter = factory
        else:
            store = Datastore.open(args.datastore, loaded.tokenizer) if args.datastore else None
            new_drafter = lambda: make_drafter("eagle+search", DrafterOptions(search_depth=16, deepen=args.deepen), None, factory, store)  # noqa: E731
    ids = [encode(loaded.tokenizer, p.text) for p in load_prompts(Path(args.questions), args.category, args.batch_size)]
    cfg = DecodeConfig(max_new_tokens=args.max_new_tokens, max_draft_nodes=96)  # the slope stands (`Engine.cost_slope`)
    res = profile_batch(engine, ids, new_drafter, cfg, args.batch_size, args.top, args.whole_step, store)
    for key in ("together", "row_by_row"):
        r = res[key]
        print(f"{key}: {r['steps']} steps, {r['new_tokens']} tokens, {r['ms_per_step']:.1f} ms a step (prefills included), "
              f"drafting {r['drafting_ms_per_step']:.1f} ms a step ({r['drafting_share']:.0%})")
    print(f"same outputs together and row by row: {res['together']['tokens'] == res['row_by_row']['tokens']}")
    print(res["profile"])
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({k: ({kk: vv for kk, vv in v.items() if kk != "tokens"} if isinstance(v, dict) else v) for k, v in res.items()}, indent=1))


if __name__ == "__main__":
    main()
