# Sourced by the GPU scripts: run NAME SECONDS COMMAND... runs one command with its output in
# $LOGS/NAME.log and the GPU's memory use sampled every 250 ms into $LOGS/NAME.mem.
run() {
    local name=$1 limit=$2; shift 2
    echo "== $name: $*" | tee -a $LOGS/commands.txt
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 250 > $LOGS/$name.mem &
    local sampler=$! t0=$SECONDS
    timeout $limit "$@" > $LOGS/$name.log 2>&1; local rc=$?
    kill $sampler 2>/dev/null
    echo "   exit $rc after $((SECONDS - t0)) s, peak GPU memory $(sort -n $LOGS/$name.mem | tail -1) MiB" | tee -a $LOGS/commands.txt
    tail -2 $LOGS/$name.log
}
