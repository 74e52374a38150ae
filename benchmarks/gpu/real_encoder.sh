#!/usr/bin/env bash
# ON THE GPU MACHINE, from the repository root: all-MiniLM-L6-v2 fine-tuned with the paper's recipes on one
# GPU, ours (fairseq-train) against transformers (the same weights, data, hyper-parameters and seeds), and
# from random initialisation of the same shape; LitBank fold-0 coreference with configs/finetune/coref.yaml.
#
#   bash benchmarks/gpu/real_encoder.sh stage      # call 1: set-up, keeps the first part of the weights
#   bash benchmarks/gpu/real_encoder.sh accuracy   # call 2: the fine-tuning runs, several at once on the GPU
#   bash benchmarks/gpu/real_encoder.sh timing     # call 3: one epoch per side, alone on the GPU (wall time)
#
# Carried (git-ignored, filled here by benchmarks/gpu/fetch.sh and the lines below): .gpu/whl, .gpu/src and
# .gpu/built (set-up); .gpu/minilm_a (call 1) and .gpu/minilm_b, .gpu/data_xz (call 2). model.safetensors
# (90.9 MB) is over one call's 64 MiB, so it travels in parts over two calls of one warm machine:
#   split -b 39000000 benchmarks/against_transformers/cache/all-MiniLM-L6-v2/model.safetensors /tmp/part-
#   .gpu/minilm_a/model.safetensors.part-aa; .gpu/minilm_b/model.safetensors.part-a{b,c} and folder.tar (the
#   folder's other files); .gpu/data_xz/data.tar.xz: glue/SST-2, glue/RTE, squad, litbank/{coref,splits}.
# The runs of "accuracy" share the GPU, so their seconds are not timings; "timing" runs one at a time.
# Results (side_by_side.py's runs.jsonl / summary.md / commands.md per setting, coreference eval.json,
# logs) come back as $OUT/real_encoder_gpu.tar.gz; rerun side_by_side.py --report-only here to rewrite a summary.
set -uo pipefail
GROUP=${1:?stage, accuracy or timing}
source benchmarks/gpu/setup.sh || exit 1
PARTS=/tmp/minilm_parts WORK=/tmp/real_encoder RES=/tmp/gpu_results LOGS=/tmp/gpu_results/logs
mkdir -p $PARTS $WORK $LOGS
if [ "$GROUP" = stage ]; then
    cp .gpu/minilm_a/model.safetensors.part-* $PARTS/ && ls -la $PARTS && nvidia-smi -L
    exit
fi

# ---- inputs: the weights' folder where fetch_minilm.py finds it, and ../shared/data (never overwritten)
HF=benchmarks/against_transformers/cache/all-MiniLM-L6-v2
if [ ! -f $HF/.sha256 ]; then
    mkdir -p $HF && tar xf .gpu/minilm_b/folder.tar -C $HF
    cat $PARTS/model.safetensors.part-* .gpu/minilm_b/model.safetensors.part-* > $HF/model.safetensors
fi
echo "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db  $HF/model.safetensors" | sha256sum -c || exit 1
if [ ! -d ../shared/data ]; then
    mkdir -p ../shared/data && xz -dc .gpu/data_xz/data.tar.xz | tar xf - -C ../shared/data
fi

SBS="python benchmarks/against_transformers/side_by_side.py --device cuda --threads 1 --work $WORK"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1
# the import and every task's data once, before runs start side by side (--padding-only prepares and stops)
for prep in "--task sst2 --max-epoch 3" "--task rte --max-epoch 10" "--task squad --max-epoch 2" \
            "--task squad --max-epoch 4 --max-seq-length 512"; do
    $SBS $prep --padding-only > $LOGS/prepare.log 2>&1 || { tail -20 $LOGS/prepare.log; exit 1; }
done
LITBANK=../shared/data/litbank/splits/fold0 COREF_DATA=$WORK/data/litbank_fold0_384
[ -d $COREF_DATA ] || spanbert-prepare-coref --train $LITBANK/train.txt --valid $LITBANK/dev.txt --test $LITBANK/test.txt \
    --tokenizer-from $WORK/imported --destdir $COREF_DATA --max-segment-length 384 > $LOGS/prepare_coref.log 2>&1 \
    || { tail -20 $LOGS/prepare_coref.log; exit 1; }

# one line per run: NAME COMMAND...; a finished run leaves $RES/done/NAME and is not run again by a later call
jobs_file=$(mktemp)
job() { echo "$*" >> "$jobs_file"; }
coref() {  # arm seed: LitBank fold 0, the coreference recipe with LitBank's schedule (80 documents x 20 epochs)
    local arm=$1 seed=$2 save=$WORK/runs/coref-$1-$2
    local init="checkpoint.finetune_from_model=$WORK/imported/model.pt"
    # the recipe names no sizes (they come from the checkpoint), so the random-init arm adds them with '+'
    [ "$arm" = random-init ] && init="+model.encoder_layers=6 +model.encoder_embed_dim=384 +model.encoder_ffn_embed_dim=1536 +model.encoder_attention_heads=12 +model.max_positions=512"
    job "coref-$arm-$seed fairseq-hydra-train --config-dir configs/finetune --config-name coref task.data=$COREF_DATA" \
        "checkpoint.save_dir=$save common.seed=$seed common.log_format=json common.log_interval=20 dataset.num_workers=0" \
        "optimizer.groups.default.lr_scheduler.warmup_updates=160 optimizer.groups.default.lr_scheduler.total_num_update=1600" \
        "optimizer.groups.coref_head.lr_scheduler.total_num_update=1600 $init &&" \
        "spanbert-predict-coref --checkpoint $save/checkpoint_best.pt --split test --out $RES/coref_litbank_fold0/$arm-$seed"
}
accuracy_jobs() {
    for seed in 1 2 3; do
        for side in ours transformers; do
            job "sst2-$side-$seed $SBS --task sst2 --sides $side --seeds $seed --max-epoch 3 --out $RES/sst2_full_3epochs"
            job "squad-$side-$seed $SBS --task squad --sides $side --seeds $seed --max-epoch 2 --lr 5e-5 --out $RES/squad_38articles_2epochs"
        done
        coref ours $seed
    done
    for seed in 1 2 3; do
        for side in ours transformers; do
            job "rte-$side-$seed $SBS --task rte --sides $side --seeds $seed --max-epoch 10 --out $RES/rte_10epochs"
            job "squad512-$side-$seed $SBS --task squad --sides $side --seeds $seed --max-epoch 4 --max-seq-length 512 --out $RES/squad_38articles_4epochs_512"
        done
        job "sst2-random-init-$seed $SBS --task sst2 --sides random-init --seeds $seed --max-epoch 3 --out $RES/sst2_full_3epochs"
        job "squad-random-init-$seed $SBS --task squad --sides random-init --seeds $seed --max-epoch 2 --lr 5e-5 --out $RES/squad_38articles_2epochs"
        coref random-init $seed
    done
}
timing_jobs() {
    job "time-sst2 $SBS --task sst2 --sides ours transformers --seeds 1 --max-epoch 1 --out $RES/sst2_1epoch_alone"
    job "time-sst2-fused $SBS --task sst2 --sides ours --optimizer torch_adamw --seeds 1 --max-epoch 1 --out $RES/sst2_1epoch_alone"
    job "time-squad-fused $SBS --task squad --sides ours --optimizer torch_adamw --seeds 1 --max-epoch 1 --lr 5e-5 --out $RES/squad_38articles_1epoch_alone"
    job "time-sst2-gbl $SBS --task sst2 --sides transformers --group-by-length --seeds 1 --max-epoch 1 --out $RES/sst2_1epoch_alone"
    job "time-squad $SBS --task squad --sides ours transformers --seeds 1 --max-epoch 1 --lr 5e-5 --out $RES/squad_38articles_1epoch_alone"
    job "time-squad-gbl $SBS --task squad --sides transformers --group-by-length --seeds 1 --max-epoch 1 --lr 5e-5 --out $RES/squad_38articles_1epoch_alone"
}

mkdir -p $RES/done
run_job() {
    local name=$1; shift
    [ -f $RES/done/$name ] && return 0
    local t0=$SECONDS
    if bash -c "$*" > $LOGS/$name.log 2>&1; then touch $RES/done/$name; echo "done $name in $((SECONDS - t0)) s"
    else echo "FAILED $name after $((SECONDS - t0)) s: $(tail -3 $LOGS/$name.log | tr '\n' ' ')"; fi
}
export -f run_job; export RES LOGS
run_list() {  # LIST PARALLEL SECONDS: the list's runs not done yet, PARALLEL at a time, stopped after SECONDS
    local start=$SECONDS
    : > "$jobs_file"; $1
    timeout $3 xargs -P $2 -L 1 bash -c 'run_job "$@"' _ < "$jobs_file"
    echo "$1: $((SECONDS - start)) s; not done:"
    while read -r name _; do [ -f $RES/done/$name ] || echo "  $name"; done < "$jobs_file"
}
BUDGET=${BUDGET:-560}  # seconds for the runs; the call's 600 s hold the set-up and the tar too
if [ "$GROUP" = accuracy ]; then
    run_list accuracy_jobs ${PARALLEL:-6} $((BUDGET - SECONDS))
else  # timing alone first, then what an earlier call left of the accuracy runs
    run_list timing_jobs 1 $((BUDGET - SECONDS))
    [ $((BUDGET - SECONDS)) -gt 30 ] && run_list accuracy_jobs ${PARALLEL:-6} $((BUDGET - SECONDS))
fi
nvidia-smi --query-gpu=name,memory.used --format=csv
tar czf $OUT/real_encoder_gpu.tar.gz -C /tmp gpu_results && ls -la $OUT
