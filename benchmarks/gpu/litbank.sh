#!/usr/bin/env bash
# LitBank coreference (benchmarks/coreference/coref_litbank.py) on one GPU in one device call: one invocation per fold and seed,
# all side by side on the GPU, each in its own --work folder, then their summary over every fold and seed.
#
# What it runs, from the environment:
#   FOLDS=0 SEEDS=1,2,3 EPOCHS=20   the folds and fine-tuning seeds (comma-separated), epochs per run
#   LITBANK_ARGS=""                 more coref_litbank.py options; its defaults are the recipe's (FFNN 3,000, head lr
#                                   2e-4, fp32), e.g. "--ffnn-size 150 --head-lr 1e-4" for the CPU's setting
#   STAGE=.gpu/lit BUDGET_S=500     the staged encoder and data; every invocation stops by BUDGET_S
#   OUT, LITBANK_GPU_WORK           where the returned files and the runs go (default /tmp/litbank_gpu_out, /tmp/litbank_gpu)
#   INSTALLED=1                     the staged wheels are installed already (PY set): two settings side by side, e.g.
#       STAGED=.gpu/lit source benchmarks/gpu/install_staged.sh && export INSTALLED=1 PY
#       OUT=$OUT/a LITBANK_GPU_WORK=/tmp/a FOLDS=0 bash benchmarks/gpu/litbank.sh &
#       OUT=$OUT/b LITBANK_GPU_WORK=/tmp/b FOLDS=7,8,9 SEEDS=1 LITBANK_ARGS="--ffnn-size 150" bash benchmarks/gpu/litbank.sh
#       wait
# On an H200, three 20-epoch runs side by side took about 19 s per epoch each with FFNN 3,000 (about 400 s in all);
# six (three FFNN 3,000, three FFNN 150; bf16 autocast) about 24 and 20 s per epoch, and the test predictions a minute
# more: about 580 s and 470 s from the start (benchmarks/gpu/logs/litbank_h200_folds7-9_ffnn3000).
#
# Before the call, here (.gpu/ is git-ignored; about 45 MiB with the tracked files):
#   python benchmarks/gpu/stage_continued_pretraining.py pack --imported ENCODER_FOLDER --stage .gpu/lit \
#       --wheels .gpu/wheels/*.whl      # no --work: LitBank only; ENCODER_FOLDER: spanbert-import-hf's or join's
# The call (carry .gpu/lit):
#   bash benchmarks/gpu/litbank.sh            # litbank.tgz (every run's record, logs and test scores) and gpu_use.csv
#   bash benchmarks/gpu/litbank.sh --dry-run  # here, on the CPU: every run at a smoke size, one at a time
# litbank.tgz is written again every 30 s, so a call stopped at the device's limit still returns each run's dev
# curve. Afterwards, here: tar xzf litbank.tgz -C WORK; WORK/summary/ holds coref_litbank.py's results of the
# finished runs (results.csv, summary.md, folds.png); rerun its last command there to rebuild it.
set -uo pipefail
DRY=0; [ "${1:-}" = "--dry-run" ] && DRY=1
START=$SECONDS STAGE=${STAGE:-.gpu/lit}
OUT=${OUT:-/tmp/litbank_gpu_out} W=${LITBANK_GPU_WORK:-/tmp/litbank_gpu}
FOLDS=${FOLDS:-0} SEEDS=${SEEDS:-1,2,3} EPOCHS=${EPOCHS:-20}
mkdir -p "$OUT" "$W/logs"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1 SPANBERT_SHARED_DATA=$W/shared
if [ $DRY = 1 ]; then
    PY=${PY:-.venv/bin/python} SIZE=(--cpu --epochs 1 --train-docs 2 --eval-docs 1 --ffnn-size 20)
    BUDGET_S=${BUDGET_S:-3600}
else
    SIZE=(--epochs "$EPOCHS") BUDGET_S=${BUDGET_S:-500}  # install_staged.sh sets PY
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 5 > "$OUT/gpu_use.csv" 2>&1 & SAMPLER=$!
    if [ -z "${INSTALLED:-}" ]; then STAGED=$STAGE source benchmarks/gpu/install_staged.sh || exit 1; fi
fi
echo "set-up: $((SECONDS - START)) s"
[ -f "$W/imported/model.pt" ] || $PY benchmarks/gpu/stage_continued_pretraining.py unpack --stage "$STAGE" --to "$W" || exit 1

# shellcheck disable=SC2206  # LITBANK_ARGS is a list of options
COMMON=(--checkpoint "$W/imported/model.pt" --singleton-thresholds 0.1,0.15,0.2,0.25,0.3,0.4,0.5 "${SIZE[@]}"
        ${LITBANK_ARGS:-})
invocation() {  # FOLD SEED
    local name="fold$1_seed$2" left=$((BUDGET_S - (SECONDS - START) - 30))
    if [ $left -le 0 ]; then echo "$(date +%T) $name not started: the budget is spent"; return; fi
    echo "$(date +%T) start $name ($left s left)"
    timeout $left $PY benchmarks/coreference/coref_litbank.py "${COMMON[@]}" --folds "$1" --seeds "$2" --work "$W/$name" \
        --out "$W/$name/summary" > "$W/logs/$name.log" 2>&1
    local rc=$?
    echo "$(date +%T) $name exit $rc: $(grep -m1 -A2 '^| arm' "$W/logs/$name.log" | tail -1)"
}
for fold in ${FOLDS//,/ }; do
    for seed in ${SEEDS//,/ }; do
        if [ $DRY = 1 ]; then invocation "$fold" "$seed"; else invocation "$fold" "$seed" & fi
    done
done
snapshot() {  # the runs' records, training logs, commands and test scores; not the checkpoints
    (cd "$W" && find . \( -path ./shared -o -path ./imported -o -name '*_seg*_n*' \) -prune -o \( -name '*.json' \
        -o -name '*.log' -o -name '*.txt' -o -name '*.jsonl' -o -name '*.md' -o -name '*.csv' -o -name '*.png' \
        -o -name '*.yaml' \) -type f -print | tar czf "$OUT/litbank.part" -T - 2>/dev/null) \
        && mv "$OUT/litbank.part" "$OUT/litbank.tgz"
}
while [ -n "$(jobs -rp | grep -vx "${SAMPLER:-none}")" ]; do  # progress: each run's newest epoch
    sleep 30
    snapshot
    echo "$(date +%T) $((SECONDS - START)) s: epochs $(for log in "$W"/fold*/runs/*/hydra/hydra_train.log; do
        grep -c '"valid_conll_f1"' "$log" 2>/dev/null; done | tr '\n' ' ')"
done
[ -n "${SAMPLER:-}" ] && kill "$SAMPLER"
wait
# every finished run in one summary: a work folder that links each invocation's runs and prepared folds
mkdir -p "$W/all/runs"
for run in "$W"/fold*_seed*/runs/*; do ln -sfn "$run" "$W/all/runs/$(basename "$run")"; done
for data in "$W"/fold*_seed*/fold*_seg*_n*; do ln -sfn "$data" "$W/all/$(basename "$data")"; done
finished=$(cd "$W/all/runs" && ls fold*_seed*.json 2>/dev/null)
if [ -n "$finished" ]; then
    folds=$(echo "$finished" | sed 's/^fold\([0-9]*\)_.*/\1/' | sort -un | paste -sd,)
    seeds=$(echo "$finished" | sed 's/.*_seed\([0-9]*\)\.json/\1/' | sort -un | paste -sd,)
    # only complete folds x seeds: coref_litbank.py would start training a missing one
    if [ "$(echo "$finished" | wc -l)" = $(( $(echo "${folds//,/ }" | wc -w) * $(echo "${seeds//,/ }" | wc -w) )) ]; then
        $PY benchmarks/coreference/coref_litbank.py "${COMMON[@]}" --folds "$folds" --seeds "$seeds" --work "$W/all" \
            --out "$W/summary" > "$W/logs/summary.log" 2>&1
        echo "summary: exit $?"
    else
        echo "summary: left out, not every fold x seed finished: $(echo $finished)"
    fi
fi
nvidia-smi > "$W/logs/nvidia_smi.txt" 2>&1
snapshot
cat "$W/summary/summary.md" 2>/dev/null
echo "done in $((SECONDS - START)) s"
