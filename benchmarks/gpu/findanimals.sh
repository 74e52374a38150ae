#!/usr/bin/env bash
# FINDANIMALS at the SpanDrop paper's string length (n = 300: spanbert-findanimals --setting full) on one GPU in one
# device call: one spanbert-findanimals per training size and seed, all side by side (their runs share the GPU),
# each stopped by the budget, so a call cut short still returns every finished invocation's results.
#
# What it runs, from the environment:
#   SIZES=200,1000 SEEDS=1,2 METHODS=baseline,spandrop,beta_spandrop   the grid (the full setting has sizes 200-10,000
#                                   and 5 seeds: more than one call holds)
#   MAX_UPDATE=10000 JOBS=3         updates per run (the paper's), runs at once within one invocation
#   STAGE=.gpu/lit BUDGET_S=500     the staged wheels (its whl/); every invocation stops by BUDGET_S
#   INSTALLED=1                     the staged wheels are installed already (PY set), as in litbank.sh
# Before the call, here: the stage of benchmarks/gpu/litbank.sh (stage_continued_pretraining.py pack) carries the
# wheels this needs. The call (carry .gpu/lit):
#   bash benchmarks/gpu/findanimals.sh            # results.csv (every finished run), findanimals.tgz, gpu_use.csv
#   bash benchmarks/gpu/findanimals.sh --dry-run  # here, on the CPU: the same grid at n = 20 and 30 updates
# findanimals.tgz (each invocation's results.csv, plot and log) is written again every 30 s. An earlier call that
# ran the whole full-setting grid as one invocation (18 runs at once) returned nothing: none had finished by 400 s.
set -uo pipefail
DRY=0; [ "${1:-}" = "--dry-run" ] && DRY=1
START=$SECONDS STAGE=${STAGE:-.gpu/lit}
OUT=${OUT:-/tmp/findanimals_gpu_out} W=${FINDANIMALS_GPU_WORK:-/tmp/findanimals_gpu}
SIZES=${SIZES:-200,1000} SEEDS=${SEEDS:-1,2} METHODS=${METHODS:-baseline,spandrop,beta_spandrop}
MAX_UPDATE=${MAX_UPDATE:-10000} JOBS=${JOBS:-3}
mkdir -p "$OUT" "$W"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1
if [ $DRY = 1 ]; then
    PY=${PY:-.venv/bin/python} SIZE=(--device cpu --seq-len 20 --max-update 30 --test-size 200) BUDGET_S=${BUDGET_S:-3600}
else
    SIZE=(--device cuda --max-update "$MAX_UPDATE") BUDGET_S=${BUDGET_S:-500}
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 5 > "$OUT/gpu_use.csv" 2>&1 & SAMPLER=$!
    if [ -z "${INSTALLED:-}" ]; then STAGED=$STAGE source benchmarks/gpu/install_staged.sh || exit 1; fi  # sets PY
fi
echo "set-up: $((SECONDS - START)) s"

invocation() {  # SIZE SEED
    local name="size$1_seed$2" left=$((BUDGET_S - (SECONDS - START) - 20))
    if [ $left -le 0 ]; then echo "$(date +%T) $name not started: the budget is spent"; return; fi
    echo "$(date +%T) start $name ($left s left)"
    timeout $left $PY -m spanbert_plugin.cli.findanimals --setting full "${SIZE[@]}" --methods "$METHODS" --sizes "$1" \
        --seeds "$2" --jobs "$JOBS" --out "$W/$name" > "$W/$name.log" 2>&1
    echo "$(date +%T) $name exit $?"
}
for size in ${SIZES//,/ }; do
    for seed in ${SEEDS//,/ }; do
        if [ $DRY = 1 ]; then invocation "$size" "$seed"; else invocation "$size" "$seed" & fi
    done
done
snapshot() {  # every invocation's results, plot and log; then every finished run in one results.csv
    (cd "$W" && tar czf "$OUT/findanimals.part" -- *) && mv "$OUT/findanimals.part" "$OUT/findanimals.tgz"
    local first=1
    for csv in "$W"/size*_seed*/results.csv; do
        [ -f "$csv" ] || continue
        if [ $first = 1 ]; then cat "$csv"; first=0; else tail -n +2 "$csv"; fi
    done > "$OUT/results.part" && mv "$OUT/results.part" "$OUT/results.csv"
}
while [ -n "$(jobs -rp | grep -vx "${SAMPLER:-none}")" ]; do
    sleep 30
    snapshot
    echo "$(date +%T) $((SECONDS - START)) s: $(ls -d "$W"/size*_seed*/ 2>/dev/null | wc -l) invocations finished"
done
[ -n "${SAMPLER:-}" ] && kill "$SAMPLER"
wait
snapshot
column -s, -t < "$OUT/results.csv" 2>/dev/null || cat "$OUT/results.csv"
echo "done in $((SECONDS - START)) s"
