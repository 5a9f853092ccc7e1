"""Host work of admitting a batch's prompts one prefill forward each against together
(`BatchTarget.admit_many` under ``--prefill-tokens``): aten operations counted on the default model
with the GPU's plain layers (``NGSPEC_CPU_KERNELS=linear``), and wall time on a hollow copy of it
(its 30 layers, vocabulary and tokenizer at hidden size 64). On a host-bound GPU a prefill's
cost follows its operations; on a CPU, even the hollow model's long prefill tensors make the time
memory traffic, so the counts are the claim (BENCHMARKS.md 10zp).

    python benchmarks/prefill_host.py --questions ../shared/data/spec_bench/question.jsonl --rows 8
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from torch.utils._python_dispatch import TorchDispatchMode


class Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", required=True)
    ap.add_argument("--category", default="rag")
    ap.add_argument("--rows", type=int, default=8, help="prompts admitted at once")
    ap.add_argument("--caps", default="0,8192,32768", help="--prefill-tokens values compared")
    args = ap.parse_args()
    os.environ["NGSPEC_CPU_KERNELS"] = "linear"
    import torch
    import transformers

    from ngspec.batch_target import BatchTarget
    from ngspec.models import load_model
    from ngspec.prompts import encode, load_prompts

    loaded = load_model("default", "cpu", "float32")
    ids = [encode(loaded.tokenizer, p.text) for p in load_prompts(Path(args.questions), args.category, args.rows)]
    narrow = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32}
    torch.manual_seed(0)
    hollow = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**{**loaded.model.config.to_dict(), **narrow})).eval()

    def admit(model, cap: int) -> float:
        target = BatchTarget(model, rows_wanted=len(ids))
        target.prefill_tokens = cap
        t0 = time.perf_counter()
        target.admit_many(ids, [None] * len(ids))
        return time.perf_counter() - t0

    print(f"{len(ids)} {args.category} prompts, {sum(map(len, ids))} tokens")
    for cap in map(int, args.caps.split(",")):
        count = Count()
        with count:
            admit(loaded.model, cap)
        admit(hollow, cap)  # warm-up
        best = min(admit(hollow, cap) for _ in range(5))
        print(f"--prefill-tokens {cap:5d}: {count.n} operations; hollow model {1000 * best:.1f} ms (best of 5)")


if __name__ == "__main__":
    main()
