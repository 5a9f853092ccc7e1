"""Decoding speed with PyTorch's cuDNN attention on and off, in one process, interleaved per prompt.

The first H100 run (BENCHMARKS.md section 10) found unmasked bf16 decoding steps about 2.8x slower
than float32 ones; the suspect is cuDNN's per-shape plan builds as the key length grows. ngspec now
turns cuDNN attention off on GPUs (`ngspec.target.decode_attention`); this script measures what that
is worth for vanilla, trie and transformers' `generate`, and checks the outputs agree.

    python benchmarks/sdpa_backends.py --questions ../shared/data/spec_bench/question.jsonl --category rag --limit 5
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from ngspec.decode import DecodeConfig
from ngspec.drafters import make_drafter
from ngspec.engine import Engine
from ngspec.models import load_model
from ngspec.prompts import encode, load_prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", required=True)
    ap.add_argument("--category")
    ap.add_argument("--limit", type=int, default=5)
    ap.add_argument("-n", "--max-new-tokens", type=int, default=128)
    ap.add_argument("--model", default="default")
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("this compares GPU attention backends; no CUDA device here")

    loaded = load_model(args.model, "cuda", args.dtype)
    engine = Engine(loaded)
    cfg = DecodeConfig(max_new_tokens=args.max_new_tokens)
    prompts = [encode(loaded.tokenizer, p.text) for p in load_prompts(Path(args.questions), args.category, args.limit)]
    arms = {
        "vanilla": lambda ids: engine.run(ids, make_drafter("vanilla"), cfg).token_ids,
        "trie": lambda ids: engine.run(ids, make_drafter("trie"), cfg).token_ids,
        "hf-greedy": lambda ids: engine.hf_generate(ids, args.max_new_tokens)[0],
    }
    seconds = {(a, c): 0.0 for a in arms for c in (True, False)}
    tokens = dict.fromkeys(seconds, 0)
    same = dict.fromkeys(arms, 0)
    for i, ids in enumerate(prompts):
        outs = {}
        for cudnn in (True, False) if i % 2 == 0 else (False, True):  # alternate which goes first
            torch.backends.cuda.enable_cudnn_sdp(cudnn)
            for name, run in arms.items():
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                outs[name, cudnn] = run(ids)
                torch.cuda.synchronize()
                seconds[name, cudnn] += time.perf_counter() - t0
                tokens[name, cudnn] += len(outs[name, cudnn])
        for name in arms:
            same[name] += outs[name, True] == outs[name, False]
    for name in arms:
        on, off = tokens[name, True] / seconds[name, True], tokens[name, False] / seconds[name, False]
        print(json.dumps({"arm": name, "tokens_per_second_cudnn_on": on, "tokens_per_second_cudnn_off": off,
                          "off_over_on": off / on, "identical_outputs": f"{same[name]}/{len(prompts)}"}))


if __name__ == "__main__":
    main()
