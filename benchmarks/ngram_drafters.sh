#!/bin/bash
# Learning-free n-gram drafters (BENCHMARKS.md section 7): exact match, tokens per call and
# speedup on MT-bench, GSM8K and MT-bench coding at (k, w) = (10, 10) in both layouts, then a
# (k, w) sweep of mixed. Run from the repository root on an otherwise idle machine (about an hour on 2 CPU cores).
set -x
N=${N:-96}
B=".venv/bin/ngspec bench"
D="-d prompt-lookup -d trie -d context-ngram -d unigram -d bigram -d mixed --k 10 --w 10 --verify both"
O=${OUT:-bench-out/ngram}; mkdir -p $O
$B -q ../shared/data/mt_bench/question.jsonl --per-category 1 -n $N $D --markdown $O/mt.md --json-out $O/mt.json > $O/mt.txt 2>&1
$B -q ../shared/data/gsm8k/question.jsonl --limit 8 -n $N $D --markdown $O/gsm.md --json-out $O/gsm.json > $O/gsm.txt 2>&1
$B -q ../shared/data/mt_bench/question.jsonl --category coding --limit 5 -n $N $D --markdown $O/code.md --json-out $O/code.json > $O/code.txt 2>&1
$B -q ../shared/data/mt_bench/question.jsonl --per-category 1 -n 64 -d mixed --k 1,2,4 --w 1,2,4 --plots $O --markdown $O/sweep.md --json-out $O/sweep.json > $O/sweep.txt 2>&1
