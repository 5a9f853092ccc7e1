"""The EAGLE head's prefill over a prompt: every pair through the whole layer against the pairs
nobody reads the prediction of as keys and values only (`HeadCall.keep_from`, what the drafter
does), with the target's own prefill of the same tokens beside. Random tokens and features; the
fastest of ``--repeats`` per length, in one process.

    python benchmarks/head_prefill.py --eagle-head heads/amd-v9 --lengths 760,2000,4000
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from ngspec.cpu_linear import share_plan
from ngspec.eagle.batched import HeadCall, run_calls
from ngspec.eagle.head import load_head
from ngspec.eagle.pool import HeadPool
from ngspec.engine import Engine
from ngspec.models import load_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--eagle-head", required=True)
    ap.add_argument("--lengths", default="760,2000,4000")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    loaded = load_model()
    engine = Engine(loaded)
    head = load_head(Path(args.eagle_head), loaded.model)
    share_plan(loaded.model, head)  # as `eagle_factory` does
    embed = loaded.model.get_input_embeddings()
    hidden = loaded.model.config.hidden_size
    gen = torch.Generator().manual_seed(0)
    for m in (int(n) for n in args.lengths.split(",")):
        tokens = torch.randint(1, loaded.model.config.vocab_size, (m,), generator=gen).tolist()
        features = torch.randn(m, hidden, generator=gen)
        took = {"every pair": [], "keys and values": []}
        for _ in range(args.repeats):
            for name, keep_from in (("every pair", 0), ("keys and values", m - 1)):
                layer = HeadPool().row()
                start = time.perf_counter()
                with torch.inference_mode():
                    run_calls([HeadCall(head, embed, layer, tokens, features, list(range(m)), 0, None, keep_from)])
                took[name].append(time.perf_counter() - start)
        start = time.perf_counter()
        engine.target.prefill(tokens)
        target = time.perf_counter() - start
        print(
            f"{m} tokens: head, every pair {min(took['every pair']) * 1000:.1f} ms; keys and values only "
            f"{min(took['keys and values']) * 1000:.1f} ms; the target's prefill {target * 1000:.0f} ms",
            flush=True,
        )


if __name__ == "__main__":
    main()
