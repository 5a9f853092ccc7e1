#!/usr/bin/env bash
# Rebuilds, from tracked code and ../shared/data alone, what issue 7's CPU figures in BENCHMARKS.md
# (sections 10o-10q) and the README's eagle+search advice were measured with:
#
#   heads/amd-v9                    a head trained on the target's answers to context prompts (section 9)
#   heads/amd-v34-q25               amd-v9 fine-tuned on Spec-Bench rag and summarization questions 25-80,
#                                   prompts and the target's answers (--loss-on all); questions 1-24 held out
#   heads/amd-v41                   amd-v9 fine-tuned the same way on those answers plus the target's answers to
#                                   the same passages and articles asked three other ways, and to Spec-Bench qa
#                                   (section 10v: the reference head from then on)
#   datastores/shipped              the shipped self-written corpora as a datastore
#   shapes/amd-v23-cpu-b1-3.json    the 3-node static tree [0], [1], [2] that tune-tree chose (section 10g)
#
#   bash benchmarks/reader_head.sh            # about 115 min on two CPU cores; resumes: a step whose output exists is
#                                             # skipped, and an interrupted synth-corpus or train-eagle continues where it stopped
#   bash benchmarks/reader_head.sh amd-v34-q25   # only that head (the GPU visits'), the datastore and the shape: 50 min on the Intel VM, 79 on the AMD one
#   bash benchmarks/reader_b8.sh rag 5           # then: batch 8, the whole method against the trie, pooled over runs
#
# Then, for example (batch 1, whole method against the trie on the 24 held-out prompts):
#   .venv/bin/python benchmarks/reader_ab.py --questions ../shared/data/spec_bench/question.jsonl --category rag \
#       --limit 24 --rounds 2 --eagle-head heads/amd-v41 --datastore datastores/shipped \
#       --tuned shapes/amd-v23-cpu-b1-3.json --arms "trie,whole"
#
# Generation is greedy and training seeded, so a rebuild gives the same head up to floating-point
# summation order (another CPU, thread count or batch composition can move a few answers' tokens).
# Steps and their times on the team's two-core AMD EPYC VM (BENCHMARKS.md sections 9 and 10o):
# context prompts' answers 24 min, Alpaca answers 2.4 min, amd-v9 30 min, held-out answers 6 min,
# amd-v34-q25 5.6 min, variant answers 23 min, amd-v41 20 min.
set -euo pipefail
case "${1:-}" in
    "" | amd-v34-q25) ;;
    *) echo "usage: bash benchmarks/reader_head.sh [amd-v34-q25]   (got '$1')" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
NG=${NG:-.venv/bin/ngspec}
PY=${PY:-.venv/bin/python}
SPEC=../shared/data/spec_bench/question.jsonl
W=bench-out/reader-head
mkdir -p "$W" heads shapes

step() {  # step OUTPUT COMMAND...: run COMMAND unless OUTPUT (its last file written) exists, timing it
    local out=$1 t=$SECONDS
    shift
    if [ -e "$out" ]; then echo "== $out: exists, skipped"; return; fi
    echo "== $out: $*"
    "$@"
    echo "== $out: done in $((SECONDS - t)) s"
}

# 1. amd-v9: the target's answers to 480 seeded context prompts built from the shipped corpora (no
#    benchmark text), to the 80 Alpaca instructions, and the shipped corpora themselves
step "$W/context-prompts.jsonl" "$PY" benchmarks/context_prompts.py corpora \
    ../shared/data/magpie_sample/example_instructions_5res.json --n 480 --out "$W/context-prompts.jsonl"
mkdir -p corpus-v9
step corpus-v9/context-answers.jsonl "$NG" synth-corpus --prompts "$W/context-prompts.jsonl" -n 160 --batch-size 40 \
    --out corpus-v9/context-answers.jsonl
step corpus-v9/alpaca-answers.jsonl "$NG" synth-corpus --prompts ../shared/data/alpaca/question.jsonl --batch-size 40 \
    --out corpus-v9/alpaca-answers.jsonl
cp corpora/*.jsonl corpus-v9/
step heads/amd-v9/train_report.json "$NG" train-eagle --corpus corpus-v9 --out heads/amd-v9 --epochs 8 --max-len 1024

# 2. amd-v34-q25: Spec-Bench rag and summarization questions 25-80 (questions 1-24 of each are the
#    evaluation prompts and stay out), answered by the target (128 tokens), prompts included in the loss
step "$W/heldout-q25-prompts.jsonl" "$PY" benchmarks/spec_bench_variants.py "$SPEC" --holdout 24 --originals \
    --out "$W/heldout-q25-prompts.jsonl"
mkdir -p corpus-v34
step corpus-v34/specbench-q25-answers.jsonl "$NG" synth-corpus --prompts "$W/heldout-q25-prompts.jsonl" -n 128 \
    --batch-size 36 --out corpus-v34/specbench-q25-answers.jsonl
step heads/amd-v34-q25/train_report.json "$NG" train-eagle --corpus corpus-v34 --init-head heads/amd-v9 --out heads/amd-v34-q25 \
    --epochs 8 --lr 1e-3 --max-len 2048 --loss-on all

# 3. the datastore and the tree shape the figures used
step datastores/shipped "$NG" build-datastore --corpus corpora --out datastores/shipped
[ -e shapes/amd-v23-cpu-b1-3.json ] || echo '[[0], [1], [2]]' >shapes/amd-v23-cpu-b1-3.json
if [ "${1:-}" = amd-v34-q25 ]; then
    echo "== ready: heads/amd-v34-q25, datastores/shipped, shapes/amd-v23-cpu-b1-3.json"
    exit 0
fi

# 4. amd-v41: the documents of step 2 asked three other ways, and Spec-Bench qa, answered by the
#    target; trained with step 2's answers (4 epochs: the corpus is about 4x larger)
step "$W/variant-prompts.jsonl" "$PY" benchmarks/spec_bench_variants.py "$SPEC" --holdout 24 --out "$W/variant-prompts.jsonl"
mkdir -p corpus-v41
step corpus-v41/variant-answers.jsonl "$NG" synth-corpus --prompts "$W/variant-prompts.jsonl" -n 128 \
    --batch-size 36 --out corpus-v41/variant-answers.jsonl
cp corpus-v34/specbench-q25-answers.jsonl corpus-v41/
step heads/amd-v41/train_report.json "$NG" train-eagle --corpus corpus-v41 --init-head heads/amd-v9 --out heads/amd-v41 \
    --epochs 4 --lr 1e-3 --max-len 2048 --loss-on all

echo "== ready: heads/amd-v34-q25, heads/amd-v41, datastores/shipped, shapes/amd-v23-cpu-b1-3.json"
