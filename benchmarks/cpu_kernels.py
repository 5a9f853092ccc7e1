"""Time the CPU float32 kernels of `ngspec.cpu_linear` on a model's linear layers, per row count.

    python benchmarks/cpu_kernels.py [--model default] [--rounds 5]

Prints, for each row count of the ladder, one pass over the model's timed linear layers with
each kernel (fastest of the rounds, milliseconds), and the plan the engine would choose. This is
the measurement `tune_linears` makes (and caches) the first time a model runs on a machine.
"""

from __future__ import annotations

import argparse

from ngspec.cpu_linear import ROW_LADDER, cpu_name, measure_plan, timed_layers
from ngspec.models import load_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    loaded = load_model(args.model, device="cpu", dtype="float32")
    plan, seconds = measure_plan(loaded.model, rounds=args.rounds)
    kernels = list(next(iter(seconds.values())))
    layers = timed_layers(loaded.model)
    megabytes = sum(m.weight.numel() * 4 for m in layers) / 2**20
    print(f"{loaded.name} on {cpu_name()}: one pass over {len(layers)} linear layers ({megabytes:.0f} MB), ms (fastest of {args.rounds})")
    print("| rows | " + " | ".join(kernels) + " | chosen |")
    print("|---" * (len(kernels) + 2) + "|")
    for rows in ROW_LADDER:
        cells = [f"{seconds[rows][k] * 1000:.1f}" for k in kernels]
        print(f"| {rows} | " + " | ".join(cells) + f" | {plan.for_rows(rows)} |")
    print(f"plan: {plan.describe()}")


if __name__ == "__main__":
    main()
