#!/usr/bin/env bash
# Run ON THE GPU MACHINE, from the repository root, with .gpu/ carried (benchmarks/gpu/fetch.sh fills it):
#   source benchmarks/gpu/setup.sh
# Installs into the machine's own Python 3.12 + CUDA torch environment (the machine is bare at every
# start, so nothing is left behind): the carried wheels, fairseq-fixed built against that torch (or the
# wheel an earlier call built, kept in .gpu/built/), and the plugin. A fairseq wheel it builds is
# returned in parts through $OUT: keep them in .gpu/built/ for the next call.
set -eo pipefail
start=$SECONDS
PY=$(python3 -c 'import sys; print(sys.executable)')
export PATH="$(dirname "$PY"):$PATH"
if ! "$PY" -c "import fairseq, spanbert_plugin" 2>/dev/null; then
    PIP="$PY -m pip"
    $PIP install -q --no-index --no-deps --no-compile .gpu/whl/*.whl
    $PIP install -q --no-index --no-deps --no-build-isolation .gpu/src/antlr4-python3-runtime-*.tar.gz
    mkdir -p /tmp/fairseq_wheel
    if ls .gpu/built/fairseq*.whl.part-* >/dev/null 2>&1; then
        # an earlier call's build, brought back in parts (at most 16 MiB per returned file)
        first=$(ls .gpu/built/fairseq*.whl.part-* | head -1)
        cat .gpu/built/fairseq*.whl.part-* > "/tmp/fairseq_wheel/$(basename "${first%.part-*}")"
    else
        # CPU extensions only (CUDA_HOME unset): the CUDA ones serve models this plugin does not use
        env -u CUDA_HOME MAX_JOBS=16 $PIP wheel -q --no-index --no-deps --no-build-isolation \
            -w /tmp/fairseq_wheel .gpu/src/fairseq_fixed-*.tar.gz
        if [ -n "${OUT:-}" ]; then
            for w in /tmp/fairseq_wheel/fairseq*.whl; do split -b 15000000 "$w" "$OUT/$(basename "$w").part-"; done
        fi
    fi
    $PIP install -q --no-index --no-deps /tmp/fairseq_wheel/fairseq*.whl
    # the plugin as a wheel (console scripts included); an editable install would fetch build tools
    $PIP wheel -q --no-index --no-deps --no-build-isolation -w /tmp/plugin_wheel .
    $PIP install -q --no-index --no-deps /tmp/plugin_wheel/spanbert_plugin*.whl
fi
"$PY" - <<'PYCODE'
import torch, fairseq, hydra, omegaconf, spanbert_plugin.registry  # noqa: F401
from fairseq.data import data_utils_fast, token_block_utils_fast  # noqa: F401  (the Cython extensions)
print(f"gpu env: torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}, "
      f"fairseq {fairseq.__version__}, hydra {hydra.__version__}, omegaconf {omegaconf.__version__}", flush=True)
PYCODE
echo "setup took $((SECONDS - start)) s"
set +e +o pipefail
