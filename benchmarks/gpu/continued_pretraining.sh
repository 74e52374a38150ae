#!/usr/bin/env bash
# The continued-pre-training experiment (benchmarks/pretraining/masking_ablation.py --from-model) on one GPU in one device call:
# all-MiniLM-L6-v2 pre-trained further on fold 0's training novels under subword, span and span+sbo masking, then
# LitBank fold-0 coreference from each arm and from the encoder as it came (none), 3 seeds each, fp32 (no TF32). The
# invocations run side by side on the one GPU and share one results folder, as they do one per core on a CPU; an
# arm's fine-tuning starts as soon as its pre-training ends.
#
# What it runs, from the environment (defaults: the first GPU call, at the CPU's budget and the lr grid's rates):
#   ARMS="subword:2e-4 span:4e-4 span+sbo:4e-4"  the arms, SCHEME:PEAK_LR[:FREEZE] (an arm at another lr than the
#                                                 experiment's 1e-4 is recorded as SCHEME_lrX; FREEZE, head-only updates
#                                                 other than the experiment's 100, as SCHEME_freezeN), e.g.
#                                                 ARMS="subword:1e-4 subword:1e-4:0 word:1e-4" (the head warm-up, word)
#   UPDATES=2000 BATCH=16                         pre-training updates and sequences of 128 tokens per update
#   NONE_SEEDS="1 2 3"                            the fine-tuning seeds of `none` ("": none, when they ran already)
#   ABLATION_ARGS=""                              more masking_ablation.py options for every invocation, e.g. the
#                                                 recipe's head: "--coref-epochs 20 --coref-ffnn-size 3000
#                                                 --coref-head-lr 2e-4" (about 24 s per epoch, six runs sharing an H200)
#   BUDGET_S=500                                  every invocation stops by then; what finished is in results.tgz
#
# Before the call, here (fills .gpu/cp, about 58 MiB with the tracked files; .gpu/ is git-ignored):
#   python benchmarks/pretraining/masking_ablation.py --from-model IMPORTED --novels 0 --heldout-mlm --tasks coref \
#       --schemes none --seeds --work PREP --results PREP/results         # prepares the corpus, trains nothing
#   python benchmarks/gpu/stage_continued_pretraining.py pack --imported IMPORTED --work PREP \
#       --wheels .gpu/wheels/*.whl              # after bash benchmarks/gpu/build_wheels.sh (docs/install.md#gpu-hosts)
# The call (carry .gpu/cp):
#   bash benchmarks/gpu/continued_pretraining.sh              # results.tgz, logs.tgz, gpu_use.csv, ARM.encoder.part* in $OUT
# (the parts: the arm with the best mean LitBank dev CoNLL F1, for stage_continued_pretraining.py join here)
#   bash benchmarks/gpu/continued_pretraining.sh --dry-run    # here, on the CPU: every step at the smoke budget, one at a time
#                                                             # (BUDGET_S=3600: 852 s for ARMS="subword:1e-4 subword:1e-4:0 word:1e-4")
# results.tgz is written again every 30 s, so a call stopped at the device's limit still returns the finished runs.
set -uo pipefail
DRY=0; [ "${1:-}" = "--dry-run" ] && DRY=1
START=$SECONDS BUDGET_S=${BUDGET_S:-500}
OUT=${OUT:-/tmp/cp_gpu_out} W=${CP_GPU_WORK:-/tmp/cp_gpu}
LOGS=$W/logs RESULTS=$W/results
mkdir -p "$OUT" "$LOGS"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1 SPANBERT_SHARED_DATA=$W/shared
if [ $DRY = 1 ]; then
    PY=${PY:-.venv/bin/python} DEVICE=cpu SIZE=(--smoke --pretrain-updates 4 --pretrain-batch 4)
else
    DEVICE=cuda SIZE=(--pretrain-updates "${UPDATES:-2000}" --pretrain-batch "${BATCH:-16}")  # install_staged.sh sets PY
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 5 > "$OUT/gpu_use.csv" 2>&1 & SAMPLER=$!
    source benchmarks/gpu/install_staged.sh || exit 1
fi
echo "set-up: $((SECONDS - START)) s"
[ -f "$W/imported/model.pt" ] || $PY benchmarks/gpu/stage_continued_pretraining.py unpack --stage .gpu/cp --to "$W" || exit 1

COMMON=(--from-model "$W/imported" --novels 0 --heldout-mlm --freeze-encoder-updates 100 --tasks coref
        --singleton-thresholds 0.1,0.15,0.2,0.25,0.3,0.4,0.5 --threads 1 --device $DEVICE --results "$RESULTS" "${SIZE[@]}"
        ${ABLATION_ARGS:-})  # word splitting intended: a list of options
# one masking_ablation invocation in its own --work folder, which sees the prepared corpus (and an arm's pre-training)
invocation() {  # NAME PRETRAIN_FROM ARGS...
    local name=$1 from=$2; shift 2
    mkdir -p "$W/$name"
    ln -sfn "$W/corpus/pretrain_data" "$W/$name/pretrain_data"
    ln -sfn "$W/corpus/heldout_data" "$W/$name/heldout_data"
    [ -n "$from" ] && ln -sfn "$W/$from/pretrain" "$W/$name/pretrain"
    local left=$((BUDGET_S - (SECONDS - START) - 15))
    echo "$(date +%T) start $name ($left s left): $*"
    timeout $left $PY benchmarks/pretraining/masking_ablation.py "${COMMON[@]}" --work "$W/$name" "$@" > "$LOGS/$name.log" 2>&1
    echo "$(date +%T) $name exit $?: $(grep -- '->' "$LOGS/$name.log" | tail -2 | tr '\n' ' ')"
}
# the experiment's first invocation sets its lr (1e-4): an arm at another lr is SCHEME_lrX, as in the CPU results
invocation settings "" --schemes none --seeds
# side by side on the GPU; one after another in a dry run (13 processes at once need more than a 24 GB machine has)
aside() { if [ $DRY = 1 ]; then "$@"; else "$@" & fi; }
for seed in ${NONE_SEEDS-1 2 3}; do aside invocation "none_seed$seed" "" --schemes none --seeds $seed; done
arm() {  # SCHEME LR FREEZE: pre-train (and score the held-out MLM loss), then the 3 seeds side by side
    local scheme=$1 lr=$2 freeze=$3 name=$1
    [ "$freeze" = 100 ] || name=${scheme}_freeze$freeze
    invocation "pretrain_$name" "" --schemes $scheme --pretrain-lr $lr --freeze-encoder-updates $freeze --seeds
    for seed in 1 2 3; do
        aside invocation "${name}_seed$seed" "pretrain_$name" --schemes $scheme --pretrain-lr $lr \
            --freeze-encoder-updates $freeze --seeds $seed
    done
    wait
}
for spec in ${ARMS:-subword:2e-4 span:4e-4 span+sbo:4e-4}; do
    IFS=: read -r scheme lr freeze <<< "$spec"
    aside arm "$scheme" "$lr" "${freeze:-100}"
done
# what comes back: the results folder, and the logs (pre-training, every LitBank run's training log and record)
snapshot() {
    tar czf "$OUT/results.part" -C "$W" results 2>/dev/null && mv "$OUT/results.part" "$OUT/results.tgz"
    (cd "$W" && find . -path ./corpus -prune -o \( -name '*.log' -o -name 'fold*_seed*.json' -o -name train_command.txt -o -path './logs/*' \) \
        -print | tar czf "$OUT/logs.part" -T - 2>/dev/null) && mv "$OUT/logs.part" "$OUT/logs.tgz"
}
while [ -n "$(jobs -rp | grep -vx "${SAMPLER:-none}")" ]; do  # progress: each run's newest LitBank epoch
    sleep 30
    snapshot
    echo "$(date +%T) $((SECONDS - START)) s: $(grep -ho '"epoch": [0-9]*, "valid_loss"' "$W"/*/coref/*/*/runs/*/hydra/hydra_train.log 2>/dev/null \
        | grep -o '[0-9]*' | sort -n | uniq -c | tr '\n' ' ')"
done
[ -n "${SAMPLER:-}" ] && kill "$SAMPLER"
wait
# the arm with the best mean dev CoNLL F1, back in parts for longer fine-tuning on another machine
$PY benchmarks/gpu/stage_continued_pretraining.py export --results "$RESULTS" --work "$W" --out "$OUT" --choice "$LOGS/export.json"
nvidia-smi > "$LOGS/nvidia_smi.txt" 2>&1
snapshot
cat "$RESULTS/results.csv" 2>/dev/null
echo "done in $((SECONDS - START)) s"
