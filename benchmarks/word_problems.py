"""Seeded grade-school arithmetic word problems, as prompts for `ngspec synth-corpus --prompts`.

    python benchmarks/word_problems.py --n 400 --seed 0 --out bench-out/word-problems.jsonl
    ngspec synth-corpus --prompts bench-out/word-problems.jsonl --out corpus/word-answers.jsonl

Why: an EAGLE head learns to draft what its training data shows it. The default model's
self-written corpus holds almost no arithmetic (a 135M model does not write word problems even
when asked to), so a head trained on it drafts GSM8K answers poorly. These problems are made from
templates with random names, objects and numbers (no benchmark question is used); the model's own
answers to them are the training data. Each line is ``{"prompt": ...}``.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Callable

NAMES = ["Maria", "James", "Aisha", "Tom", "Lena", "Carlos", "Mei", "Omar", "Sofia", "Ben",
         "Priya", "Lucas", "Hana", "Noah", "Zoe", "Ivan", "Grace", "Diego", "Emma", "Kofi"]
ITEMS = ["apples", "stickers", "marbles", "cookies", "pencils", "books", "cards", "stamps",
         "eggs", "balloons", "shells", "candies"]
GOODS = [("notebook", "notebooks"), ("pen", "pens"), ("shirt", "shirts"), ("ticket", "tickets"),
         ("sandwich", "sandwiches"), ("toy car", "toy cars"), ("plant", "plants"), ("mug", "mugs")]


def _buy_and_give(r: random.Random) -> str:
    n, item = r.choice(NAMES), r.choice(ITEMS)
    return (f"{n} has {r.randint(5, 40)} {item}. {n} buys {r.randint(2, 6)} packs with {r.randint(3, 12)} "
            f"{item} in each pack, then gives {r.randint(2, 15)} {item} to a friend. "
            f"How many {item} does {n} have now?")


def _wage(r: random.Random) -> str:
    n = r.choice(NAMES)
    return (f"{n} earns ${r.randint(8, 30)} an hour and works {r.randint(10, 40)} hours a week. "
            f"After {r.randint(2, 8)} weeks, {n} spends ${r.randint(50, 400)} on a bike. "
            "How much money is left?")


def _change(r: random.Random) -> str:
    n = r.choice(NAMES)
    (a, a_pl), (b, b_pl) = r.sample(GOODS, 2)
    return (f"{n} buys {r.randint(2, 9)} {a_pl} at ${r.randint(2, 15)} each and {r.randint(2, 9)} "
            f"{b_pl} at ${r.randint(1, 8)} each. {n} pays with a ${r.choice([50, 100, 200])} bill. "
            "How much change does " + n + " get?")


def _percent_left(r: random.Random) -> str:
    _, goods = r.choice(GOODS)
    return (f"A store has {r.randint(4, 30) * 10} {goods}. It sells {r.choice([10, 20, 25, 30, 40, 50])}% "
            f"of them on Monday and half of the rest on Tuesday. How many {goods} are left?")


def _ages(r: random.Random) -> str:
    a, b = r.sample(NAMES, 2)
    return (f"{a} is {r.randint(2, 12)} years older than {b}. In {r.randint(2, 10)} years, {b} will be "
            f"{r.randint(15, 40)} years old. How old is {a} now?")


def _distance(r: random.Random) -> str:
    vehicle = r.choice(["A train", "A car", "A bus", "A cyclist"])
    return (f"{vehicle} travels at {r.randint(10, 80)} miles per hour for {r.randint(2, 5)} hours, then at "
            f"{r.randint(10, 80)} miles per hour for {r.randint(1, 4)} more hours. "
            "How far does it travel in total?")


def _pages(r: random.Random) -> str:
    n = r.choice(NAMES)
    return (f"{n} read {r.randint(10, 40)} pages on Monday, twice as many on Tuesday, and {r.randint(3, 9)} "
            "fewer pages on Wednesday than on Tuesday. How many pages did " + n + " read in the three days?")


def _sharing(r: random.Random) -> str:
    kids, each = r.randint(3, 9), r.randint(4, 12)
    item = r.choice(ITEMS)
    return (f"{kids * each} {item} are shared equally among {kids} children. Each child then gives away "
            f"{r.randint(1, each - 1)} of them. How many {item} do the children have left in all?")


def _harvest(r: random.Random) -> str:
    n = r.choice(NAMES)
    crop = r.choice(["tomato", "pepper", "bean", "strawberry"])
    return (f"{n} plants {r.randint(3, 12)} rows of {r.randint(4, 15)} {crop} plants. Each plant gives "
            f"{r.randint(2, 9)} {crop}s, and {n} sells them in bags of {r.choice([4, 5, 6, 10])}. "
            "How many full bags can " + n + " sell?")


def _savings(r: random.Random) -> str:
    n = r.choice(NAMES)
    goal, weekly, start = r.randint(10, 60) * 10, r.randint(5, 25), r.randint(0, 80)
    return (f"{n} wants a ${goal} game console and already has ${start}. {n} saves ${weekly} every week. "
            "How many weeks will it take to have enough money?")


def _discount(r: random.Random) -> str:
    _, goods = r.choice(GOODS)
    return (f"A shop sells {goods} for ${r.randint(5, 60)} each. This week they are {r.choice([10, 15, 20, 25, 50])}% "
            f"off. How much do {r.randint(2, 8)} {goods} cost this week?")


def _more_than(r: random.Random) -> str:
    a, b = r.sample(NAMES, 2)
    item = r.choice(ITEMS)
    return (f"{a} collected {r.randint(20, 90)} {item}. {b} collected {r.randint(2, 5)} times as many as {a}, "
            f"minus {r.randint(3, 15)}. How many more {item} did {b} collect than {a}?")


def _time(r: random.Random) -> str:
    n = r.choice(NAMES)
    tasks = r.randint(3, 6)
    return (f"{n} has {tasks} chores. Each takes {r.randint(10, 35)} minutes, and {n} rests "
            f"{r.randint(5, 15)} minutes between chores. If {n} starts at {r.randint(8, 11)}:00 am, "
            "at what time does " + n + " finish?")


def _area(r: random.Random) -> str:
    w, l = r.randint(4, 30), r.randint(4, 30)
    return (f"A rectangular garden is {w} meters wide and {l} meters long. A fence costs ${r.randint(3, 12)} "
            "per meter. How much does it cost to fence the whole garden?")


def _average(r: random.Random) -> str:
    n = r.choice(NAMES)
    scores = [r.randint(60, 100) for _ in range(r.randint(3, 5))]
    return (f"{n} scored {', '.join(map(str, scores[:-1]))} and {scores[-1]} on {len(scores)} tests. "
            f"What is {n}'s average score?")


def _recipe(r: random.Random) -> str:
    serves, want = r.choice([2, 4, 6]), r.choice([8, 12, 18, 24])
    return (f"A recipe that serves {serves} people needs {r.randint(1, 4)} cups of flour and "
            f"{r.randint(2, 4)} eggs. How much flour and how many eggs are needed for {want} people?")


TEMPLATES: tuple[Callable[[random.Random], str], ...] = (
    _buy_and_give, _wage, _change, _percent_left, _ages, _distance, _pages, _sharing, _harvest,
    _savings, _discount, _more_than, _time, _area, _average, _recipe)


def word_problems(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct problems, cycling through the templates in a seeded order."""
    r = random.Random(seed)
    seen: set[str] = set()
    problems: list[str] = []
    while len(problems) < n:
        text = TEMPLATES[len(problems) % len(TEMPLATES)](r)
        if text not in seen:
            seen.add(text)
            problems.append(text)
    return problems


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f:
        for text in word_problems(args.n, args.seed):
            f.write(json.dumps({"prompt": text}) + "\n")
    print(f"{args.n} problems -> {args.out}")


if __name__ == "__main__":
    main()
