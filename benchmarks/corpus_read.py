"""Reading a JSON corpus: `datasets` 5.2's streaming JSON reader against ngspec's
(`ngspec.datastore.corpus.iter_records`, Python's `json`), on the same synthetic Magpie file,
side by side in one process. ``--layout lines`` writes JSON lines (``corpus.jsonl``), ``--layout
array`` one JSON array of the same records (``corpus.json``).

The file holds ``--records`` Magpie records (answers with newlines and quotes) and, at the end, one
record whose ``response`` is a number, then one more with text: a type change past datasets' first
10 MB block. Each reader's records are compared with the ones written; a record that differs
counts as changed. Times are best of ``--repeats``.

    python benchmarks/corpus_read.py --records 60000 --out bench-out/corpus_read
    python benchmarks/corpus_read.py --records 60000 --layout array --out bench-out/corpus_read_array

Why (BENCHMARKS.md 10zzz): datasets typed each later block by the first and, in a block where a
field changed type, returned every string of that field as its JSON text ('"line one\\nline
two"', quotes and escapes included), silently; it also stopped on a blank line in such a block.
It typed a JSON array as one block, so there every string of such a field changed (10zzza).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path


def write_corpus(path: Path, records: int, array: bool = False) -> list[dict]:
    rows = [{"instruction": f"Question {i}?", "response": f'Line one of answer {i}.\nLine two says "quoted" ' + "x" * 120}
            for i in range(records)]
    rows += [{"instruction": "odd", "response": 5}, {"instruction": "last", "response": "plain text"}]
    with path.open("w") as f:
        if array:
            json.dump(rows, f, indent=1)
        else:
            f.writelines(json.dumps(row) + "\n" for row in rows)
    return rows


def read_with_datasets(path: Path) -> list[dict]:
    import datasets

    return list(datasets.load_dataset("json", data_files=[str(path)], split="train", streaming=True))


def read_with_ngspec(path: Path) -> list[dict]:
    from ngspec.datastore.corpus import iter_records

    return list(iter_records(str(path)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=60_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layout", choices=("lines", "array"), default="lines")
    parser.add_argument("--out", type=Path, default=Path("bench-out/corpus_read"))
    ns = parser.parse_args()
    if ns.records < 1 or ns.repeats < 1:
        parser.error("--records and --repeats must be at least 1")
    ns.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ("corpus.json" if ns.layout == "array" else "corpus.jsonl")
        rows = write_corpus(path, ns.records, array=ns.layout == "array")
        result = {"layout": ns.layout, "records": len(rows), "megabytes": round(path.stat().st_size / 2**20, 1)}
        best = {}
        for name, read in (("datasets", read_with_datasets), ("ngspec", read_with_ngspec)):
            seconds = []
            for _ in range(ns.repeats):
                start = time.perf_counter()
                got = read(path)
                seconds.append(time.perf_counter() - start)
            best[name] = min(seconds)
            changed = sum(a != b for a, b in zip(rows, got)) + abs(len(rows) - len(got))
            first = next((i for i, (a, b) in enumerate(zip(rows, got)) if a != b), None)
            result[name] = {"seconds": round(min(seconds), 3), "records": len(got), "changed": changed,
                            "first_changed": None if first is None else {"index": first, "written": rows[first]["response"][:40],
                                                                         "read": str(got[first]["response"])[:40]}}
            print(f"{name:9s} {min(seconds):7.3f} s  {len(got):,} records, {changed:,} changed", flush=True)
    result["speedup"] = round(best["datasets"] / best["ngspec"], 1)
    (ns.out / "corpus_read.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
