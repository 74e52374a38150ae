#!/usr/bin/env bash
# ON THE GPU MACHINE, from the repository root, with .gpu/cp carried (staged as benchmarks/gpu/continued_pretraining.sh
# says): continued pre-training of all-MiniLM-L6-v2 (span+sbo, 32 x 512 tokens per update) in fp32, under fairseq's
# --fp16 (dynamic loss scaling) and under the plugin's --bf16-autocast, one run at a time, UPDATES (200) updates
# each: updates/s and the training loss, in $OUT/precision_{fp32,fp16,bf16_autocast}.log.
#   bash benchmarks/gpu/precision_speed.sh              # on the GPU
#   bash benchmarks/gpu/precision_speed.sh --dry-run    # here, on the CPU: 2 updates of 2 x 128 tokens
set -uo pipefail
START=$SECONDS
OUT=${OUT:-/tmp/precision_out} W=${CP_GPU_WORK:-/tmp/cp_gpu}
mkdir -p "$OUT"
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
if [ "${1:-}" = "--dry-run" ]; then
    BIN=.venv/bin UPDATES=2 SHAPE=(--tokens-per-sample 128 --batch-size 2) DEVICE=(--cpu) LIMIT=300 FP16=--memory-efficient-fp16
else
    source benchmarks/gpu/install_staged.sh || exit 1
    BIN=$(dirname "$($PY -c 'import sys; print(sys.executable)')") UPDATES=${UPDATES:-200}
    SHAPE=(--tokens-per-sample 512 --batch-size 32) DEVICE=() LIMIT=${LIMIT:-55} FP16=--fp16
fi
[ -f "$W/imported/model.pt" ] || $BIN/python benchmarks/gpu/stage_continued_pretraining.py unpack --stage .gpu/cp --to "$W" || exit 1
echo "set-up and unpack: $((SECONDS - START)) s"
for precision in fp32 fp16 bf16_autocast; do
    case $precision in fp32) flag=();; fp16) flag=($FP16);; bf16_autocast) flag=(--bf16-autocast);; esac
    timeout $LIMIT $BIN/fairseq-train "$W/corpus/pretrain_data" --user-dir user_dir --task spanbert_pretraining \
        --criterion span_bert --arch spanbert_base --mask-scheme span --sbo-weight 1.0 "${SHAPE[@]}" \
        --finetune-from-model "$W/imported/model.pt" --optimizer adam --adam-betas '(0.9,0.999)' --adam-eps 1e-8 \
        --weight-decay 0.01 --clip-norm 1.0 --lr 1e-4 --lr-scheduler polynomial_decay --warmup-updates $((UPDATES / 10 + 1)) \
        --total-num-update $UPDATES --max-update $UPDATES --seed 1 --num-workers 2 --disable-validation --no-save \
        --log-format json --log-interval 20 "${DEVICE[@]}" "${flag[@]}" > "$OUT/precision_$precision.log" 2>&1
    echo "$precision: exit $? after $((SECONDS - START)) s: $(grep -o '"train_loss": "[^"]*"\|"train_ups": "[^"]*"\|"train_wall": "[^"]*"' "$OUT/precision_$precision.log" | tail -3 | tr '\n' ' ')"
done
