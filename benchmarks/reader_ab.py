"""Side-by-side A/B of the whole READER method against the trie at batch 1, in one process: the
arms run on every prompt in turn (order reversed every other prompt and round), so the noise of a
shared machine hits them alike. Besides `trie` and the whole method (`eagle+search`, deepening,
a tuned static tree), two arms re-create earlier versions of it by overriding one method each:

* ``branch only``: no local-trie tree merged in where nodes cost (before `_add_local_tree`);
* ``old gate``: the head's top-guess rate from its drafted guesses only, and no probe steps
  (before `EagleDrafter.caught_up` and `PROBE_EVERY`);
* ``no head``: the same drafter with a head that never runs (the search branch and, where nodes
  cost, the local trie's tree): what the head is worth, net of its cost;
* ``no carry`` and ``trie no carry``: each prompt's drafter calibrates from scratch (before
  `Calibration.next_prompt`; every other arm carries its calibration from prompt to prompt within
  a round, as `generate` and `bench` do);
* ``whole local 8``: the local trie's 8 best nodes always merged in (before the local tree was
  sized like the trie drafter's tree: its best nodes, up to 32, that pay under the verify cost);
* ``whole table`` and ``trie table``: trees sized by the cost table as measured, not rescaled by
  the run's own step times (before `ngspec.perf.online.StepTimes`);
* ``whole alt`` and ``no head alt``: ``whole`` and ``no head`` searching ``--alt-datastore``
  instead of ``--datastore`` (which datastore pays);
* ``vanilla``: plain decoding (one token a call), the floor a batch on a busy device may not beat;
* ``eagle``: EAGLE alone, its tree sized by the verify cost;
* ``whole dv`` and ``eagle dv``: ``whole`` and ``eagle`` drafting over ``--alt-draft-vocab``
  tokens instead of 8,192;
* ``whole ah`` and ``eagle ah``: ``whole`` and ``eagle`` with the head ``--alt-eagle-head``
  (which head pays, e.g. one fine-tuned with ``train-eagle --loss-on all``; same tuned shape);
* ``whole f32`` and ``eagle f32``: ``whole`` and ``eagle`` with the head's products in float32
  (before `EagleOptions.head_int8`, `ngspec.eagle.int8`, on a CPU);
* ``whole at``: ``whole`` with the static tree of ``--alt-tuned`` (which tuned shape pays);
* ``whole batch probes``: ``whole`` probing its head every `search.PROBE_EVERY`-th skipped step
  even where the batch verified none of the row's last tree (before that exception);
* ``trie packed`` and ``whole packed``: at batch size B > 1, the rows' blocks back to back and
  sized row by row (``--batch-layout packed``, `tree.packed_sizes`) instead of padded to one
  width (`tree.joint_width`);
* ``trie prefill alone``: at batch size B > 1, the trie with each admitted prompt prefilled in a
  forward of its own (``--prefill-tokens 0``), against the default that prefills the prompts a
  batch admits at once together on a GPU (BENCHMARKS.md 10zp);
* ``trie unfolded`` and ``whole unfolded``: tree steps' grouped-query attention by PyTorch's
  ``enable_gqa`` (``NGSPEC_FOLD_GQA=0``) instead of folded into the queries
  (`batch_target.folded_gqa_attention`, the default on a CPU);
* ``whole hcX`` (e.g. ``whole hc1``): ``whole`` with the gate weighing the head's measured cost X
  times (``whole`` weighs it `search.HEAD_COST_WEIGHT` = 0.5 times);
* ``whole graphs`` and ``eagle graphs``: ``whole`` and ``eagle`` with the head's runs at fixed
  shapes, replayed from captured CUDA graphs on a GPU (`EagleOptions.head_graphs`,
  `ngspec.eagle.graphs`; off a GPU the same shapes run uncaptured); the graphs made, replayed and
  any reason capturing stopped are printed after the arms; ``whole graphs no deepen``: the
  same without deepening (whether its searches pay their host time, BENCHMARKS.md 10zg);
  ``whole no deepen``: ``whole`` without deepening, head run as usual (beside ``whole graphs no
  deepen`` it isolates the graphs; at batch 8 on the sixth visit deepening cost 10%, 10zn);
* ``whole cover``: ``whole`` with the gate weighing the head against the draft it would make
  without it (branch and local tree, sized), crediting its top guess only with the chance that
  none of that draft's first nodes is right (`CoverGate`);
* ``whole cal``: ``whole`` with the gate's credit scaled by what the head's first level added
  where it ran (`CalibratedCredit`);
* ``whole sure``: ``whole`` with the head run where the search branch is fairly sure of its first
  token or the local trie matched two tokens or more (`SureBranch`, a rule for GPUs); these gate
  arms also come with `` graphs``, `` no deepen`` and `` tg``, e.g. ``whole graphs no deepen cal tg``;
* ``vanilla tg``, ``trie tg``, ``whole tg``, ``whole graphs tg`` and ``whole graphs no deepen tg``:
  the arm with the target's verification at fixed shapes, replayed from captured CUDA graphs on a
  GPU (``--target-graphs``, `ngspec.static_verify`; its own engine, whose verify costs are
  calibrated with it); the graphs made and replayed are printed after the arms;
* ``trie tg natural`` and ``whole graphs no deepen tg natural``: the ``tg`` arm with every block
  at its own width bucket and its trees sized by those buckets' costs (`Engine.pad_wider` off;
  its own engine), against the ``tg`` arms' blocks padded to a wider bucket where this device
  replays that cheaper (`ngspec.static_verify.plan_widths`).

    python benchmarks/reader_ab.py --category rag --rounds 2 --eagle-head heads/amd-v9 \\
        --datastore datastores/shipped --tuned shapes/amd-v9-cpu-b1.json

A multi-turn question file (MT-bench's) asks each question's later turns too (``--turns all``, the
default, as `ngspec bench` asks them: turn 2 after turn 1 and plain greedy's answer to it), and a
question's turns resample together in the interval; ``--category`` may then be left out:

    python benchmarks/reader_ab.py --questions ngspec/data/mt_bench.jsonl -n 256 --eagle-head heads/amd-v41 \\
        --datastore datastores/shipped --tuned shapes/a.json --alt-tuned shapes/b.json --arms "trie,whole,whole at"

With ``--batch-size B`` (B > 1) each arm runs all prompts as one batch of B rows per round
(`Engine.run_batch`, arm order reversed every other round; the rows of an arm share its
calibration, as in `generate --batch-size`), and speed is the batch's wall time; with
``--interleave-batches K`` every arm runs in turn on each group of K*B prompts instead (order
reversed every other group), so that a machine whose load drifts during a run hits every arm
alike, and each group is a pair for the 95% interval (each group is a batch run of its own: at
K = 1 a row that finishes leaves its slot empty until its group ends, a drained tail that one
run over all prompts fills with the next prompt):

    python benchmarks/reader_ab.py --category summarization --batch-size 8 --limit 16 \\
        --rounds 2 --eagle-head heads/amd-v9 --datastore datastores/shipped \\
        --tuned shapes/amd-v9-cpu-b1.json --arms "vanilla,trie,whole,no head"

Prints per arm: tokens per verify call (prefill excluded), speed against the first arm per round
and in total, at batch size 1 (and with --interleave-batches) the 95% interval of that total
(`ngspec.bench.interval`: each prompt's runs in one round are a pair, and prompts are resampled
with all their rounds' pairs together), drafting share, exact match against plain greedy, steps
without the head, the head's top guesses right / scored, and the nodes only its first level offered
that were accepted / the gate's credit for those runs. ``--json-out`` keeps every arm's paired
runs with their prompts (``runs``, ``keys``); `benchmarks/ab_pool.py` pools such files. A row
that differs from plain greedy is printed after the arms with where it splits and plain greedy's
top-2 margin there, in rounding steps too (`split_lines`; JSON: each arm's ``splits``), so that a
GPU's near-tie can be told from a bug without decoding the prompt again.
Each prompt's reference (plain greedy decoding, one prompt at a time, untimed) is decoded before
the arms; ``--reference-cache PATH`` keeps those answers in a JSON file for the next stage that
asks the same prompts at the same length, dtype and device (on a GPU visit the batch-16 and -32
stages ask batch 8's prompts and more, and each prompt's plain decoding costs a second or two).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
from dataclasses import replace
from functools import partial
from pathlib import Path

import ngspec.drafters.search as search
from ngspec.bench.interval import ratio_interval
from ngspec.batch import BatchConfig
from ngspec.bench.batched import RowSplit, batch_groups
from ngspec.check import divergence
from ngspec.contracts import DraftTree
from ngspec.datastore.index import Datastore
from ngspec.decode import DecodeConfig
from ngspec.drafters import make_drafter
from ngspec.drafters.trie import Calibration
from ngspec.drafters.eagle import EagleOptions, eagle_factory, read_choices
from ngspec.eagle.batched import HOST_WORK
from ngspec.eagle.head import load_draft_vocab, load_head
from ngspec.engine import Engine
from ngspec.models import load_model
from ngspec.prompts import load_prompts
from ngspec.static_verify import batches_static
from ngspec.tree import root_to_leaf_paths
from ngspec.turns import Conversations

from head_signals import sure  # benchmarks/, beside this script


class BranchOnly(search.EagleSearchDrafter):
    def _add_local_tree(self, draft, ctx, node) -> None:
        pass


class Local8(search.EagleSearchDrafter):
    def _add_local_tree(self, draft, ctx, node) -> None:
        if node is None:
            return
        trie = self.search.trie
        tree, reach = trie.top_subtree(node, 8, search.SMOOTHING * self.search.prefix_len)
        key = ("local", trie.depth(node))
        for path in root_to_leaf_paths(tree):
            probs = [reach[i] for i in path]
            draft.add(-1, [tree.tokens[i] for i in path], [p / q for p, q in zip(probs, [1.0] + probs[:-1])], key, merge=True)


class OldGate(search.EagleSearchDrafter):
    def _top1_rate(self) -> float:
        return (1 + self._top1[0]) / (2 + self._top1[1])

    def drafting(self, ctx):
        self._since_head = -(10**9)  # never probes
        return (yield from super().drafting(ctx))


class BatchProbes(search.EagleSearchDrafter):
    def drafting(self, ctx):
        self._unverified = False  # probes even when the batch verified none of the row's last tree
        return (yield from super().drafting(ctx))


class Serial(search.EagleSearchDrafter):
    """``... serial``: a row whose head stays off assembles its tree at once, not while the batch's
    head forwards run (as before `HOST_WORK`): what the overlap saves on a GPU."""

    def drafting(self, ctx):
        inner, out = super().drafting(ctx), None
        while True:
            try:
                call = inner.send(out)
            except StopIteration as done:
                return done.value
            out = None if call is HOST_WORK else (yield call)


class HeadCostAt(search.EagleSearchDrafter):
    """``whole hcX``: the gate weighing the head's measured cost X times (``whole`` weighs it
    `search.HEAD_COST_WEIGHT` times)."""

    def __init__(self, *args, weight: float = 1.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.weight = weight

    def _head_cost(self, ctx) -> float:
        return self.weight / search.HEAD_COST_WEIGHT * super()._head_cost(ctx)


class CoverGate(search.EagleSearchDrafter):
    """``whole cover``: the gate weighs the head against the whole draft it would make without it
    (the search branch and, where nodes cost, the local trie's tree merged in, sized), not the
    branch alone, and credits the head's top guess only with the chance that none of that draft's
    first nodes is right: on a near-flat verify cost the local tree offers many first tokens."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        find = self.search.search

        def remembered(*a, **k):
            self._found = find(*a, **k)
            return self._found

        self.search.search = remembered

    def _head_pays(self, conditionals, key, ctx) -> bool:
        draft = search._Draft(DraftTree(), [], self.calibration)
        draft.add(-1, self._found[1], self._found[2], key, merge=True)
        self._add_local_tree(draft, ctx, self.search.last_node)  # the root search's match
        keep = search._most_likely(draft.probs, ctx)
        n, expected = len(keep), 1.0 + sum(draft.probs[i] for i in keep)
        cover = min(1.0, sum(draft.probs[i] for i in keep if draft.tree.parents[i] == -1))
        gain = self._top1_rate() * (1.0 - cover)
        head = search.HEAD_COST_WEIGHT * self._head_cost(ctx)
        return (expected + gain) / (ctx.cost(n + 1) + head) > expected / ctx.cost(n)


class CalibratedCredit(search.EagleSearchDrafter):
    """``whole cal``: the gate weighs the head's credit scaled by what the head's first level added
    where it ran (a node only that level offered, accepted: `search.HEAD_CREDIT`'s record in the
    run's calibration, carried from prompt to prompt), as the drafter's other estimates are
    scaled by their records; ``whole`` weighs it as credited."""

    def _weighed_credit(self, credit: float) -> float:
        return self.calibration.scaled(search.HEAD_CREDIT, [credit])[0]


class SureBranch(search.EagleSearchDrafter):
    """``whole sure``: the head runs where the search branch is fairly sure of its first token (its
    chance, as the gate sizes the branch, from 0.2 to below 0.8) or the local trie matched two
    tokens or more, and nowhere else (probes as the gate's). There `head_worth.py`'s replay at the
    H200's replayed sizing found the head's runs paying, and the gate's credit, which grows as the
    branch grows unsure, sends it elsewhere (BENCHMARKS.md 10zzr: in sample, 1.010x and 1.049x
    never running it on rag and summarization, where the gate gave 0.971x and 1.002x; 10zzs, out of
    sample on qa: 1.033x, the gate 1.001x; at this CPU's sizing the rule loses to the gate). A rule
    for GPUs, to be measured there. Its bounds are `head_signals.py`'s, which replays it offline."""

    def _credited_gain(self, reach: list[float], n: int) -> float:
        self._reach0 = reach[0] if n else 0.0
        return super()._credited_gain(reach, n)

    def _head_pays(self, conditionals, key, ctx) -> bool:
        super()._head_pays(conditionals, key, ctx)  # sizes the branch (and keeps the credit, recorded as usual)
        node = self.search.trie.match(ctx.tokens)
        local_depth = self.search.trie.depth(node) if node is not None else 0
        return sure({"reach0": self._reach0, "local_depth": local_depth})


class _Headless:
    """Stands in for the EAGLE drafter: drafts nothing and runs nothing."""

    head_cost = 0.0
    feature_layers = None

    def start(self, prompt) -> None:
        pass

    def defer(self, ctx) -> None:
        pass

    def observe(self, new_tokens) -> None:
        pass

    def drafting(self, ctx, deeper=None):
        self.last_scores = []
        return DraftTree()
        yield  # a generator (`EagleDrafter.drafting`) that asks for no head run


class NoHead(search.EagleSearchDrafter):
    def __init__(self, eagle=None, *args, **kwargs) -> None:  # ``eagle`` is ignored: no head runs
        super().__init__(_Headless(), *args, **kwargs)


def reference_key(ids: list[int], max_new_tokens: int, dtype: str, device: str) -> str:
    """A plain greedy answer's key in a ``--reference-cache`` file: the prompt's tokens, the length
    asked, and the model's dtype and device (e.g. "torch.float32", "cuda:0")."""
    return hashlib.sha1(json.dumps([ids, max_new_tokens, dtype, device]).encode()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--questions", default="../shared/data/spec_bench/question.jsonl")
    ap.add_argument("--category", help="one category of --questions (default: every question)")
    ap.add_argument("--turns", choices=["all", "first"], default="all",
                    help="all: a question's later turns are prompts too, each after the conversation so far with plain greedy's "
                    "answers, as `ngspec bench` asks them; first: first turns only")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("-n", "--max-new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=1, help="above 1: every arm runs the prompts as one batch of this many rows")
    ap.add_argument("--eagle-head", required=True)
    ap.add_argument("--datastore")
    ap.add_argument("--alt-datastore", help="the datastore of the '... alt' arms")
    ap.add_argument("--alt-draft-vocab", type=int, default=4096, help="the draft vocabulary of the '... dv' arms")
    ap.add_argument("--alt-eagle-head", help="the head of the '... ah' arms")
    ap.add_argument("--tuned", required=True, help="tune-tree output for the whole method's static tree")
    ap.add_argument("--alt-tuned", help="the tune-tree output of the 'whole at' arm")
    ap.add_argument("--arms", default="trie,whole,branch only,old gate")
    ap.add_argument("--interleave-batches", type=int, default=0, metavar="K",
                    help="above batch size 1: every arm in turn on each group of K batches' worth of prompts (order reversed every "
                    "other group), not one arm after another over all of them; each group is a pair for the 95%% interval")
    ap.add_argument("--json-out", help="the raw results, rewritten after every prompt (batch size 1) or batch run: a run cut short "
                    "by a time limit still leaves each arm's paired runs so far")
    ap.add_argument("--reference-cache", metavar="PATH",
                    help="a JSON file of plain greedy decoding's answers, read and extended here: stages of one visit that ask "
                    "the same prompts (e.g. batch sizes 8, 16 and 32 on a category's first prompts) decode each reference once")
    ap.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda")
    ap.add_argument("--dtype", default="auto", help="auto (float32 on CPU, bfloat16 on GPU), float32, bfloat16, float16")
    args = ap.parse_args()
    if args.batch_size < 1:
        ap.error("--batch-size must be at least 1")
    if args.interleave_batches < 0:
        ap.error("--interleave-batches must be 0 or more")

    carried: dict[str, Calibration] = {}  # each arm's estimates, from prompt to prompt of a round
    # the arms, checked before anything loads; each makes its drafter from what main loads below
    every = {
        "vanilla": lambda: make_drafter("vanilla"),
        "trie": lambda: make_drafter("trie", calibration=carried.get("trie")),
        "search": lambda: make_drafter("search", datastore=store, calibration=carried.get("search")),
        "whole": lambda: search.EagleSearchDrafter(factory(), store, deepen=True, calibration=carried.get("whole")),
        "branch only": lambda: BranchOnly(factory(), store, deepen=True, calibration=carried.get("branch only")),
        "old gate": lambda: OldGate(factory(), store, deepen=True, calibration=carried.get("old gate")),
        "no carry": lambda: search.EagleSearchDrafter(factory(), store, deepen=True),
        "trie no carry": lambda: make_drafter("trie"),
        "no head": lambda: NoHead(None, store, deepen=True, calibration=carried.get("no head")),
        "whole local 8": lambda: Local8(factory(), store, deepen=True, calibration=carried.get("whole local 8")),
        "trie table": lambda: make_drafter("trie", calibration=carried.get("trie table")),
        "whole table": lambda: search.EagleSearchDrafter(factory(), store, deepen=True, calibration=carried.get("whole table")),
        "eagle": lambda: make_drafter("eagle", eagle=factory, calibration=carried.get("eagle")),
        "whole dv": lambda: search.EagleSearchDrafter(factory_dv(), store, deepen=True, calibration=carried.get("whole dv")),
        "eagle dv": lambda: make_drafter("eagle", eagle=factory_dv, calibration=carried.get("eagle dv")),
        "whole ah": lambda: search.EagleSearchDrafter(factory_ah(), store, deepen=True, calibration=carried.get("whole ah")),
        "eagle ah": lambda: make_drafter("eagle", eagle=factory_ah, calibration=carried.get("eagle ah")),
        "whole f32": lambda: search.EagleSearchDrafter(factory_f32(), store, deepen=True, calibration=carried.get("whole f32")),
        "eagle f32": lambda: make_drafter("eagle", eagle=factory_f32, calibration=carried.get("eagle f32")),
        "whole at": lambda: search.EagleSearchDrafter(factory_at(), store, deepen=True, calibration=carried.get("whole at")),
        "whole batch probes": lambda: BatchProbes(factory(), store, deepen=True, calibration=carried.get("whole batch probes")),
        "whole graphs": lambda: search.EagleSearchDrafter(factory_graphs(), store, deepen=True, calibration=carried.get("whole graphs")),
        "eagle graphs": lambda: make_drafter("eagle", eagle=factory_graphs, calibration=carried.get("eagle graphs")),
        "whole graphs no deepen": lambda: search.EagleSearchDrafter(factory_graphs(), store, calibration=carried.get("whole graphs no deepen")),
        "whole no deepen": lambda: search.EagleSearchDrafter(factory(), store, calibration=carried.get("whole no deepen")),
        "whole cover": lambda: CoverGate(factory(), store, deepen=True, calibration=carried.get("whole cover")),
        "whole alt": lambda: search.EagleSearchDrafter(factory(), alt, deepen=True, calibration=carried.get("whole alt")),
        "no head alt": lambda: NoHead(None, alt, deepen=True, calibration=carried.get("no head alt")),
        "trie packed": lambda: make_drafter("trie", calibration=carried.get("trie packed")),
        "whole packed": lambda: search.EagleSearchDrafter(factory(), store, deepen=True, calibration=carried.get("whole packed")),
        "trie unfolded": lambda: make_drafter("trie", calibration=carried.get("trie unfolded")),
        "trie prefill alone": lambda: make_drafter("trie", calibration=carried.get("trie prefill alone")),
        "whole unfolded": lambda: search.EagleSearchDrafter(factory(), store, deepen=True, calibration=carried.get("whole unfolded")),
        "vanilla tg": lambda: make_drafter("vanilla"),
        "trie tg": lambda: make_drafter("trie", calibration=carried.get("trie tg")),
        "whole tg": lambda: search.EagleSearchDrafter(factory(), store, deepen=True, calibration=carried.get("whole tg")),
        "whole graphs tg": lambda: search.EagleSearchDrafter(factory_graphs(), store, deepen=True, calibration=carried.get("whole graphs tg")),
        "whole graphs no deepen tg": lambda: search.EagleSearchDrafter(factory_graphs(), store, calibration=carried.get("whole graphs no deepen tg")),
        "whole graphs no deepen serial tg": lambda: Serial(factory_graphs(), store, calibration=carried.get("whole graphs no deepen serial tg")),
        "no head tg": lambda: NoHead(None, store, calibration=carried.get("no head tg")),
        "trie tg natural": lambda: make_drafter("trie", calibration=carried.get("trie tg natural")),
        "whole graphs no deepen tg natural": lambda: search.EagleSearchDrafter(factory_graphs(), store, calibration=carried.get("whole graphs no deepen tg natural")),
    }

    def gate_variant(name: str, graphs: bool, deepen: bool, gate: str):
        head = factory_graphs() if graphs else factory()
        if gate == "cover":
            return CoverGate(head, store, deepen=deepen, calibration=carried.get(name))
        if gate == "cal":
            return CalibratedCredit(head, store, deepen=deepen, calibration=carried.get(name))
        if gate == "sure":
            return SureBranch(head, store, deepen=deepen, calibration=carried.get(name))
        return HeadCostAt(head, store, deepen=deepen, calibration=carried.get(name), weight=float(gate.removeprefix("hc")))

    for name in args.arms.split(","):
        # "whole hc1", "whole hc2.5", ...: the head's measured cost weighed that many times; "whole
        # cover", "whole cal", "whole sure": those gates; "whole graphs hc1 tg", "whole graphs no deepen cal tg":
        # that gate with the head's runs (and the target's verification) replayed from graphs, as
        # on a GPU the trie's "tg" arm verifies, with or without deepening
        variant = re.fullmatch(r"whole( graphs)?( no deepen)? (hc[0-9]+(?:\.[0-9]+)?|cover|cal|sure)( tg)?", name)
        if variant and name not in every:
            every[name] = partial(gate_variant, name, bool(variant.group(1)), not variant.group(2), variant.group(3))

    unknown = [a for a in args.arms.split(",") if a not in every]
    if unknown:
        ap.error(f"unknown arms: {unknown}")
    arms = {name: every[name] for name in args.arms.split(",")}

    loaded = load_model(device=args.device, dtype=args.dtype)
    engine = Engine(loaded)
    # the '... tg' arms' engine: the target's verification at fixed shapes, replayed from CUDA
    # graphs on a GPU (`--target-graphs`); its verify costs calibrated as it runs
    engine_tg = Engine(loaded, target_graphs=True) if any(a.endswith(" tg") for a in args.arms.split(",")) else None
    # the '... tg natural' arms' engine: the same, each block at its own width bucket
    natural = any(a.endswith(" tg natural") for a in args.arms.split(","))
    engine_natural = Engine(loaded, target_graphs=True, pad_wider=False) if natural else None

    def engine_of(a: str) -> Engine:
        return engine_natural if a.endswith(" tg natural") else engine_tg if a.endswith(" tg") else engine
    head_dir = Path(args.eagle_head)
    store = Datastore.open(args.datastore, loaded.tokenizer) if args.datastore else None
    alt = Datastore.open(args.alt_datastore, loaded.tokenizer) if args.alt_datastore else None
    tuned = EagleOptions("static", choices=read_choices(Path(args.tuned)), draft_vocab=8192)
    factory = eagle_factory(loaded.model, load_head(head_dir, loaded.model), tuned, load_draft_vocab(head_dir))
    factory_dv = None  # the '... dv' arms' head, loaded only for them
    if any(a.endswith(" dv") for a in args.arms.split(",")):
        factory_dv = eagle_factory(loaded.model, load_head(head_dir, loaded.model), replace(tuned, draft_vocab=args.alt_draft_vocab), load_draft_vocab(head_dir))
    factory_ah = None  # the '... ah' arms' head
    if any(a.endswith(" ah") for a in args.arms.split(",")):
        if not args.alt_eagle_head:
            ap.error("the '... ah' arms need --alt-eagle-head")
        alt_dir = Path(args.alt_eagle_head)
        factory_ah = eagle_factory(loaded.model, load_head(alt_dir, loaded.model), tuned, load_draft_vocab(alt_dir))
    factory_at = None  # the 'whole at' arm's head: the same head, the other static tree
    if "whole at" in args.arms.split(","):
        if not args.alt_tuned:
            ap.error("the 'whole at' arm needs --alt-tuned")
        factory_at = eagle_factory(loaded.model, load_head(head_dir, loaded.model), replace(tuned, choices=read_choices(Path(args.alt_tuned))), load_draft_vocab(head_dir))
    factory_f32 = None  # the '... f32' arms' head: the same head, its products in float32
    if any(a.endswith(" f32") for a in args.arms.split(",")):
        factory_f32 = eagle_factory(loaded.model, load_head(head_dir, loaded.model), replace(tuned, head_int8=False), load_draft_vocab(head_dir))
    factory_graphs = None  # the '... graphs' arms' head: the same head, its runs replayed from CUDA graphs
    if any(" graphs" in a for a in args.arms.split(",")):
        factory_graphs = eagle_factory(loaded.model, load_head(head_dir, loaded.model), replace(tuned, head_graphs=True), load_draft_vocab(head_dir))
    prompts = load_prompts(Path(args.questions), args.category, args.limit)
    cfg = DecodeConfig(max_new_tokens=args.max_new_tokens, max_draft_nodes=96)
    # one prompt per turn asked; plain greedy decoding's answers (the reference every arm must
    # reproduce) make the later turns' prompts
    asked = Conversations(loaded.tokenizer, prompts, args.turns == "all", max_length=engine.target.max_length)
    cache_path = Path(args.reference_cache) if args.reference_cache else None
    cache = json.loads(cache_path.read_text()) if cache_path is not None and cache_path.exists() else {}
    ids, reference = [], []
    for i in range(len(asked.units)):
        ids.append(asked.ids(i))
        key = reference_key(ids[-1], args.max_new_tokens, str(loaded.dtype), str(loaded.device))
        if key not in cache:
            cache[key] = engine.run(ids[-1], make_drafter("vanilla"), cfg).token_ids
        reference.append(cache[key])
        asked.answered(i, reference[-1])
    if cache_path is not None:
        cache_path.write_text(json.dumps(cache))
    # each run's question, so that a question's rounds (and turns) resample together
    names = [f"{u.category or args.category}:{u.id}" for u in asked.units]
    # the "... table" arms size trees by the cost table as measured (before `StepTimes`)
    configs = {a: replace(cfg, learn_costs=not a.endswith(" table")) for a in arms}
    batches = {
        a: BatchConfig(args.batch_size, layout="packed" if a.endswith(" packed") else "padded", prefill_tokens=0 if a.endswith(" prefill alone") else None)
        for a in arms
    }

    def folding(a: str) -> None:  # read by each batch's `BatchTarget`
        os.environ["NGSPEC_FOLD_GQA"] = "0" if a.endswith(" unfolded") else "1"

    def forget() -> None:  # every timed run reads the datastores cold: arms and rounds repeat the same prompts
        for s in (store, alt):
            if s is not None:
                s.forget()

    for a, new in arms.items():  # warm-up, untimed
        engine_of(a).run(ids[0], new(), DecodeConfig(max_new_tokens=16, max_draft_nodes=96))
        if args.batch_size > 1:
            folding(a)
            engine_of(a).run_batch(ids[: args.batch_size], new, DecodeConfig(max_new_tokens=16, max_draft_nodes=96), batches[a])
    res = {a: {"tokens": 0, "calls": 0, "seconds": [0.0] * args.rounds, "draft": 0.0, "exact": 0, "skipped": 0, "top_guess": [0, 0], "first_level": [0, 0.0], "runs": [], "keys": [],
               "capture_seconds": 0.0, "cold_runs": 0, "cold_seconds": 0.0, "splits": []} for a in arms}
    differing: dict[tuple, list[int]] = {}  # (arm, prompt index, output) -> the rounds (from 1) that decoded it

    def capturing() -> dict[str, float]:
        """Seconds spent capturing CUDA graphs so far, runs at a new fixed shape and their seconds,
        over every owner of graphs (`ngspec.cuda_graphs.Graphs`): the timed runs' share of them is
        each arm's."""
        owners = [engine_tg.target.static if engine_tg is not None else None, batches_static(loaded.model),
                  factory_graphs.pool.static_runs if factory_graphs is not None else None]
        graphs = [o.graphs for o in owners if o is not None]
        return {"capture_seconds": sum(g.capture_seconds for g in graphs), "cold_runs": sum(g.cold for g in graphs),
                "cold_seconds": sum(g.cold_seconds for g in graphs)}

    def timed(a: str, run):
        """``run()``, its captures and cold runs counted to arm ``a``."""
        before = capturing()
        out = run()
        for key, value in capturing().items():
            res[a][key] += value - before[key]
        return out

    def record(a: str, r: int, gen, i: int, seconds: float, key: str = "") -> None:
        """Arm ``a``'s run of prompt ``i`` in round ``r``."""
        s = res[a]
        expected = reference[i]
        s["seconds"][r] += seconds
        s["tokens"] += len(gen.token_ids)
        s["calls"] += len(gen.stats.steps) - 1  # the first step is the prefill
        s["draft"] += gen.stats.draft_seconds
        s["exact"] += gen.token_ids == expected
        if gen.token_ids != expected:
            differing.setdefault((a, i, tuple(gen.token_ids)), []).append(r + 1)
        stats = gen.drafter_stats or {}
        s["skipped"] += stats.get("head_skipped", 0)
        s["top_guess"] = [a_ + b_ for a_, b_ in zip(s["top_guess"], stats.get("head_top_guess", (0, 0)))]
        s["first_level"] = [a_ + b_ for a_, b_ in zip(s["first_level"], stats.get("head_first_level", (0, 0.0)))]
        if seconds:  # batch size 1: each prompt's run, paired with the other arms' runs of it
            s["runs"].append((len(gen.token_ids), seconds))
            s["keys"].append(key)

    def save() -> None:
        if args.json_out:
            part = Path(args.json_out + ".part")
            part.write_text(json.dumps(res))
            part.replace(args.json_out)

    for r in range(args.rounds):
        carried.update({a: Calibration() for a in arms})  # not the warm-up's, nor the last round's
        if args.batch_size > 1:
            start = 0
            for g, group in enumerate(batch_groups(ids, args.batch_size, args.interleave_batches)):
                first = start
                start += len(group)
                for a in list(arms) if (r + g) % 2 == 0 else list(arms)[::-1]:
                    folding(a)
                    forget()
                    out, report = timed(a, lambda: engine_of(a).run_batch(group, arms[a], configs[a], batches[a]))
                    res[a]["seconds"][r] += report.seconds
                    for j, o in enumerate(out):
                        record(a, r, o.generation, first + j, 0.0)
                    if args.interleave_batches:  # each group a pair with the other arms' runs of it
                        res[a]["runs"].append((sum(len(o.generation.token_ids) for o in out), report.seconds))
                        res[a]["keys"].append("+".join(names[start - len(group) : start]))
                    save()
            continue
        for i, x in enumerate(ids):
            for a in list(arms) if (r + i) % 2 == 0 else list(arms)[::-1]:
                forget()
                gen = timed(a, lambda: engine_of(a).run(x, arms[a](), configs[a]))
                record(a, r, gen, i, gen.seconds, names[i])
            save()
    base = res[next(iter(arms))]["seconds"]
    for a, s in res.items():
        # the 95% interval of the speed ratio: prompts (or groups) resampled, each with its rounds' pairs
        interval = ratio_interval(s["runs"], res[next(iter(arms))]["runs"], keys=s["keys"]) if s["runs"] else None
        print(
            f"{args.category or 'all'} b{args.batch_size} {a:12s} tokens/call {s['tokens'] / s['calls']:.3f}  vs {next(iter(arms))} per round "
            f"{[round(b / t, 3) for b, t in zip(base, s['seconds'])]}  total {sum(base) / sum(s['seconds']):.3f}x  "
            f"95% interval {'-' if interval is None else f'{interval[0]:.3f}-{interval[1]:.3f}'}  "
            f"drafting {s['draft'] / sum(s['seconds']):.3f}  exact {s['exact']}/{len(ids) * args.rounds}  "
            f"head skipped {s['skipped']}  top guess {s['top_guess']}  first level added/credited {s['first_level'][0]}/{s['first_level'][1]:.1f}"
            + (f"  captures {s['capture_seconds']:.2f} s, {s['cold_runs']} runs at new shapes {s['cold_seconds']:.2f} s "
               f"({s['cold_seconds'] / sum(s['seconds']):.3f} of the arm's time)" if s["cold_runs"] else ""),
            flush=True,
        )
    for line in split_lines(engine, differing, ids, reference, names, res):
        print(line, flush=True)
    if factory_graphs is not None:
        print(f"head graphs: {factory_graphs.pool.static_runs.report()}", flush=True)
    if engine_tg is not None:
        together = batches_static(loaded.model)
        print(f"target graphs: one prompt at a time {engine_tg.target.static.report()}"
              + (f"; batches {together.report()}" if together is not None else ""), flush=True)
    print(json.dumps(res))


def split_lines(engine: Engine, differing: dict[tuple, list[int]], ids: list[list[int]], reference: list[list[int]], names: list[str],
                res: dict) -> list[str]:
    """A line for every distinct output that differs from plain greedy (``differing``: (arm,
    prompt index, output) -> its rounds), with where it splits and plain greedy's top-2 margin
    there (`ngspec.check.divergence`, one forward each), each also added to its arm's ``splits``
    in ``res``."""
    lines = []
    for (a, i, got), rounds in differing.items():
        split = RowSplit(a, i, tuple(rounds), divergence(engine, ids[i], reference[i], list(got)))
        res[a]["splits"].append(split.as_dict(names))
        lines.append(f"split: {a}, " + split.describe(names[i], "plain greedy's"))
    return lines


if __name__ == "__main__":
    main()
