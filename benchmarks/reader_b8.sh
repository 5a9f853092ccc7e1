#!/usr/bin/env bash
# Issue 7's CPU batch-8 figure (BENCHMARKS.md 10zw, 10zx): the whole method (eagle+search with the
# READER head, the shipped datastore, deepening and the tuned 3-node shape) against the trie, 24
# held-out prompts of one Spec-Bench category, 128 tokens, batches of 8 refilled as rows finish,
# arms in reversed order every other round, then every run of that category so far pooled by
# rounds (`ab_pool.py`).
#
#   bash benchmarks/reader_head.sh amd-v34-q25            # first: the head, datastore and shape
#   bash benchmarks/reader_b8.sh rag 5 [HEAD]             # 5 rounds: about 17 min on the Intel VM, 23 on the AMD one
#
# Each call writes bench-out/b8/HEAD/CATEGORY-<time>.json (HEAD: the head directory's name) and pools
# that head's runs of the category; run nothing else on the cores meanwhile.
set -euo pipefail
if [ $# -lt 2 ] || ! [[ $2 =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: bash benchmarks/reader_b8.sh CATEGORY ROUNDS [HEAD]   (e.g. rag 5 heads/amd-v34-q25)" >&2
    exit 2
fi
cd "$(dirname "$0")/.."
category=$1 rounds=$2 head=${3:-heads/amd-v34-q25}
for need in "$head" datastores/shipped shapes/amd-v23-cpu-b1-3.json; do
    [ -e "$need" ] || { echo "missing $need: run bash benchmarks/reader_head.sh first (its argument amd-v34-q25 builds that head alone)" >&2; exit 1; }
done
dir=bench-out/b8/$(basename "$head")
mkdir -p "$dir"
out=$dir/$category-$(date +%Y%m%d-%H%M%S).json
.venv/bin/ngspec bench -q ../shared/data/spec_bench/question.jsonl --category "$category" --limit 24 -n 128 -b 8 \
    --rounds "$rounds" -d trie -d eagle+search --eagle-head "$head" --tree static \
    --tree-choices shapes/amd-v23-cpu-b1-3.json --draft-vocab 8192 --datastore datastores/shipped --deepen \
    --versus trie --json-out "$out"
.venv/bin/python benchmarks/ab_pool.py "$dir/$category"-*.json --arm eagle+search --versus trie
