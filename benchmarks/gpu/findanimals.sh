#!/usr/bin/env bash
# ON THE GPU MACHINE, after `source benchmarks/gpu/setup.sh`: FINDANIMALS at the paper's n = 300
# (spanbert-findanimals --setting full) on the GPU, one spanbert-findanimals per training size, all at
# once (their runs share the GPU), each stopped at DEADLINE seconds. Settings from the environment:
#   SIZES="200 1000 5000" SEEDS=1,2,3 METHODS=baseline,spandrop,beta_spandrop JOBS=9 MAX_UPDATE=10000 DEADLINE=480
LOGS=/tmp/gpulogs/findanimals; mkdir -p $LOGS
SIZES=${SIZES:-"200 1000 5000"}; SEEDS=${SEEDS:-1,2,3}; METHODS=${METHODS:-baseline,spandrop,beta_spandrop}
JOBS=${JOBS:-9}; MAX_UPDATE=${MAX_UPDATE:-10000}; DEADLINE=${DEADLINE:-480}
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
