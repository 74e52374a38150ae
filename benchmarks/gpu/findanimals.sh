#!/usr/bin/env bash
# ON THE GPU MACHINE, after `source benchmarks/gpu/setup.sh`: FINDANIMALS at the paper's n = 300
# (spanbert-findanimals --setting full) on the GPU, one spanbert-findanimals per training size, all at
# once (their runs share the GPU), each stopped at DEADLINE seconds. Settings from the environment:
#   SIZES="200 1000 5000" SEEDS=1,2,3 METHODS=baseline,spandrop,beta_spandrop JOBS=9 MAX_UPDATE=10000 DEADLINE=480
LOGS=/tmp/gpulogs/findanimals; mkdir -p $LOGS
SIZES=${SIZES:-"200 1000 5000"}; SEEDS=${SEEDS:-1,2,3}; METHODS=${METHODS:-baseline,spandrop,beta_spandrop}
JOBS=${JOBS:-9}; MAX_UPDATE=${MAX_UPDATE:-10000}; DEADLINE=${DEADLINE:-480}
# first the extractive_qa fine-tuning step at spanbert_base size, 384 tokens, fp16 autocast, against
# transformers' BertForQuestionAnswering (same weights, same batches)
if [ "${QA_STEP:-1}" = 1 ]; then
    SQUAD_DEV=.gpu/squad/dev-v1.1.json timeout 200 python benchmarks/qa_step_time.py --device cuda --amp \
        --layers 12 --dim 768 --heads 12 --ffn 3072 --batch 32 --seq 384 --steps 40 --warmup 5 \
        --tokenizer-from .gpu/novels8 --no-fairseq-adam > $LOGS/qa_step.log 2>&1
    tail -8 $LOGS/qa_step.log
fi
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader,nounits -l 5 > $LOGS/gpu.csv &
sampler=$!
pids=()
for size in $SIZES; do
    echo "== size $size: spanbert-findanimals --setting full --device cuda --methods $METHODS --sizes $size --seeds $SEEDS --max-update $MAX_UPDATE --jobs $JOBS" | tee -a $LOGS/commands.txt
    timeout $DEADLINE spanbert-findanimals --setting full --device cuda --methods $METHODS --sizes $size \
        --seeds $SEEDS --max-update $MAX_UPDATE --jobs $JOBS --out $LOGS/size$size > $LOGS/size$size.log 2>&1 &
    pids+=($!)
done
wait "${pids[@]}"  # not the sampler, which never ends by itself
kill $sampler 2>/dev/null
for f in $LOGS/size*/results.csv; do [ -f "$f" ] && cp "$f" "$OUT/results_$(basename $(dirname $f)).csv"; done
tar czf $OUT/findanimals.tgz -C /tmp/gpulogs findanimals
tail -n 12 $LOGS/size*.log
