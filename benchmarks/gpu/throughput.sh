#!/usr/bin/env bash
# ON THE GPU MACHINE, after `source benchmarks/gpu/setup.sh`: training throughput of spanbert_base +
# span_bert (MLM + SBO, and MLM only) against fairseq's roberta_base + masked_lm, fp16, batch 8 x 512,
# same data (8 LitBank novels, BERT uncased WordPiece, 30,522 embeddings on both sides), 2 alternating
# rounds; then the data pipelines alone (masking included). Logs: $OUT/throughput.tgz.
LOGS=/tmp/gpulogs/throughput; mkdir -p $LOGS
source benchmarks/gpu/common.sh
COMMON=(--tokens-per-sample 512 --batch-size 8 --num-workers 2 --seed 1 --fp16
        --optimizer adam --adam-betas '(0.9,0.999)' --adam-eps 1e-6 --weight-decay 0.01 --clip-norm 1.0
        --lr 1e-4 --lr-scheduler polynomial_decay --warmup-updates 30 --total-num-update 1000
        --log-format json --log-interval 10 --disable-validation --no-save --max-update 200)
SPAN=(fairseq-train .gpu/novels8 --user-dir user_dir --task spanbert_pretraining --criterion span_bert --arch spanbert_base)
ROBERTA=(fairseq-train .gpu/novels8_roberta --task masked_lm --criterion masked_lm --arch roberta_base)
for round in 1 2; do
    if [ $round = 1 ]; then order="span roberta mlm_only"; else order="mlm_only roberta span"; fi
    for side in $order; do
        case $side in
            span) run span_r$round 150 "${SPAN[@]}" "${COMMON[@]}" --save-dir /tmp/ckpt/s$round ;;
            mlm_only) run mlm_only_r$round 150 "${SPAN[@]}" "${COMMON[@]}" --sbo-weight 0 --save-dir /tmp/ckpt/m$round ;;
            roberta) run roberta_r$round 150 "${ROBERTA[@]}" "${COMMON[@]}" --save-dir /tmp/ckpt/r$round ;;
        esac
    done
done
run loader_span 120 python benchmarks/gpu/loader_speed.py --batches 2000 -- "${SPAN[@]:1}" "${COMMON[@]}"
run loader_roberta 120 python benchmarks/gpu/loader_speed.py --batches 2000 -- "${ROBERTA[@]:1}" "${COMMON[@]}"
tar czf $OUT/throughput.tgz -C /tmp/gpulogs throughput
