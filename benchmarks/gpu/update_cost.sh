#!/usr/bin/env bash
# ON THE GPU MACHINE, from the repository root, with .gpu/ carried (benchmarks/gpu/fetch.sh fills it: the
# wheels, .gpu/novels8 and .gpu/glue/SST-2): the cost of one update, fairseq-train with the plugin against the
# transformers loop, operator by operator with a CUDA profile (GPU busy share, kernels, the longest ones), model
# TFLOP/s and MFU (benchmarks/cpu_speed/update_cost/update_cost.py), random initialisation of each shape:
#   * all-MiniLM-L6-v2's shape: SST-2 (batches of 32) and span + SBO pre-training (32 x 512), in fp16, bf16
#     autocast, fp32 and fp32 with TF32; fairseq's adam beside torch_adamw in fp16; transformers.Trainer itself
#     beside the transformers loop in fp16 and bf16;
#     the half precision once more with --compile beside eager;
#   * spanbert_base's shape: pre-training at 8 x 512 and 32 x 512 (the paper's per-GPU batch on 8 GPUs), fp16
#     and bf16 autocast; at 32 x 512 once more with --compile beside eager (last).
# Each setting writes results.json, table.md (and ops.png where matplotlib is installed) under $OUT/NAME.
#   bash benchmarks/gpu/update_cost.sh              # on the GPU: about 7 minutes after set-up, and the compiling
#   ONLY="minilm_fp16 base_*_fp16" bash benchmarks/gpu/update_cost.sh  # the settings these names or patterns
#                                                     # match (here the goals', which run first anyway)
#   bash benchmarks/gpu/update_cost.sh --dry-run    # here, on the CPU: each setting at 2 x 64 tokens, 1 update, on
#                                                     # a GPU's path (--gpu-path: fp16 with flat master weights too)
set -uo pipefail
START=$SECONDS
OUT=${OUT:-/tmp/update_cost_out} WORK=${UPDATE_COST_WORK:-/tmp/update_cost_work}
mkdir -p "$OUT" "$WORK"
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
if [ "${1:-}" = "--dry-run" ]; then
    PYTHON=.venv/bin/python VOCAB=${VOCAB:?--dry-run: VOCAB=a spanbert-prepare folder (WordPiece)} LIMIT=600
    SIZE=(--device cpu --gpu-path --warmup 1 --timed 1 --profiled 1 --repeats 1) BATCH=2 TOKENS=64 BASE_BATCHES="2"
    PRECISIONS="fp32 bf16 fp16" HALF=bf16
else
    source benchmarks/gpu/setup.sh || exit 1
    PYTHON=$(python3 -c 'import sys; print(sys.executable)') VOCAB=.gpu/novels8 LIMIT=${LIMIT:-150}
    SIZE=(--device cuda --warmup 5 --timed 20 --profiled 3 --repeats 1) BATCH=32 TOKENS=512 BASE_BATCHES="8 32"
    PRECISIONS="fp16 bf16 fp32 tf32" HALF=fp16
    # SST-2 where side_by_side.py's preparation looks for it (never over an existing copy)
    [ -d ../shared/data/glue/SST-2 ] || { mkdir -p ../shared/data/glue && cp -r .gpu/glue/SST-2 ../shared/data/glue/; }
fi
echo "set-up: $((SECONDS - START)) s"
U=("$PYTHON" benchmarks/cpu_speed/update_cost/update_cost.py "${SIZE[@]}" --vocab-from "$VOCAB" --work "$WORK" --force)
setting() {  # NAME ARGS...: one benchmark call, its table's first rows on the console
    local name=$1; shift
    if [ -n "${ONLY:-}" ]; then  # ONLY="minilm_fp16 base_*_fp16": only the settings these names or patterns match
        local only wanted=
        for only in $ONLY; do [[ $name == $only ]] && wanted=1; done
        [ -n "$wanted" ] || return 0
    fi
    timeout $LIMIT "${U[@]}" "$@" --out "$OUT/$name" > "$OUT/$name.log" 2>&1
    echo "$name: exit $? after $((SECONDS - START)) s"
    grep "^| " "$OUT/$name/table.md" 2>/dev/null | tail -n +3 | cut -c1-160
}
minilm() {  # PRECISION: SST-2 and pre-training at MiniLM's shape
    local precision=$1 flags optimizers limit=$LIMIT
    case $precision in tf32) flags=(--precision fp32 --tf32);; *) flags=(--precision $precision);; esac
    optimizers=(torch_adamw); [ $precision = $HALF ] && optimizers=(adam torch_adamw)
    # transformers.Trainer itself beside the loop in the half precisions (one more process each)
    case $precision in $HALF|bf16) flags+=(--hf-trainer); limit=$((LIMIT * 2));; esac
    LIMIT=$limit setting minilm_$precision --encoder minilm-shape --workloads sst2 pretrain --batch-size $BATCH \
        --tokens $TOKENS --optimizers "${optimizers[@]}" "${flags[@]}"
}
base() {  # PRECISION: spanbert_base's shape, pre-training, the largest batch first
    for batch in $(printf "%s\n" $BASE_BATCHES | sort -rn); do
        setting base_${batch}x${TOKENS}_$1 --encoder base-shape --workloads pretrain --batch-size $batch \
            --tokens $TOKENS --optimizers torch_adamw --precision $1
    done
}
# the goals first (a call cut short returns the settings done before): the half precision at both shapes
minilm $HALF
base $HALF
for precision in $PRECISIONS; do
    [ $precision = $HALF ] && continue
    minilm $precision
    [ $precision = bf16 ] && base bf16
done
# --compile beside eager in the half precision (the compiled side compiles in its warm-up updates)
LIMIT=$((LIMIT * 2)) setting minilm_${HALF}_compile --encoder minilm-shape --workloads sst2 pretrain --batch-size $BATCH \
    --tokens $TOKENS --optimizers torch_adamw --compile --precision $HALF
largest=$(printf "%s\n" $BASE_BATCHES | sort -rn | head -1)  # and spanbert_base at the paper's per-GPU batch
LIMIT=$((LIMIT * 2)) setting base_${largest}x${TOKENS}_${HALF}_compile --encoder base-shape --workloads pretrain \
    --batch-size $largest --tokens $TOKENS --optimizers torch_adamw --compile --precision $HALF
echo "done after $((SECONDS - START)) s"
