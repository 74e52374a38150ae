#!/usr/bin/env bash
# Run HERE (a machine with the package index and ../shared/data), from the repository root:
# fills .gpu/ (git-ignored through .git/info/exclude) with what the GPU machine lacks, so that
# benchmarks/gpu/setup.sh can install everything there offline. About 30 MB.
#   .gpu/whl/  wheels for Python 3.12 (hydra-core, omegaconf, bitarray, tensorboardX; accelerate and psutil for
#              transformers.Trainer in benchmarks/gpu/update_cost.sh)
#   .gpu/src/  sdists built there (fairseq-fixed against the machine's CUDA torch; antlr4 runtime)
#   .gpu/novels8/          8 LitBank novels, BERT uncased WordPiece, prepared by spanbert-prepare
#   .gpu/novels8_roberta/  the same binaries with a fairseq dictionary of the same size (for roberta + masked_lm)
#   .gpu/squad/dev-v1.1.json  the SQuAD 1.1 dev set (QA step time)
#   .gpu/glue/SST-2/       GLUE SST-2 (update cost)
set -euo pipefail
cd "$(dirname "$0")/../.."
SHARED=${SPANBERT_SHARED_DATA:-../shared/data}
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo '/.gpu/' >> .git/info/exclude; }
mkdir -p .gpu/whl .gpu/src .gpu/squad
PIP=".venv/bin/pip"
$PIP download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .gpu/whl bitarray hydra-core==1.3.2 omegaconf==2.3.0 tensorboardX accelerate==1.15.0 psutil
# sdists: pip prepares their metadata with this venv's torch/numpy/cython (no build isolation)
$PIP download -q --no-deps --no-binary :all: --no-build-isolation -d .gpu/src fairseq-fixed==0.12.3.1 antlr4-python3-runtime==4.9.3
cp "$SHARED/squad/dev-v1.1.json" .gpu/squad/
mkdir -p .gpu/glue && cp -r "$SHARED/glue/SST-2" .gpu/glue/  # benchmarks/gpu/update_cost.sh
if [ ! -d .gpu/novels8 ]; then
    # the 8 largest novels: long documents, so nearly every 512-token block is full
    novels=$(ls -S "$SHARED"/litbank/novels/*.txt.gz | head -8)
    .venv/bin/spanbert-prepare --train $novels --join-wrapped-lines --wordpiece-vocab "$SHARED/bert_uncased_vocab/vocab.txt" \
        --lowercase --workers 2 --destdir .gpu/novels8
fi
if [ ! -d .gpu/novels8_roberta ]; then
    mkdir -p .gpu/novels8_roberta
    cp .gpu/novels8/{train,valid}.{bin,idx} .gpu/novels8_roberta/
    # fairseq's Dictionary adds <s> <pad> </s> <unk> before these and masked_lm appends <mask>:
    # the same 30,522 embeddings as the WordPiece model (token ids are only used as ids here)
    vocab=$(wc -l < .gpu/novels8/dict.txt)
    .venv/bin/python -c "import sys; n = int(sys.argv[1]) - 5; open('.gpu/novels8_roberta/dict.txt', 'w').write(''.join(f'w{i} 1\n' for i in range(n)))" "$vocab"
fi
du -sh .gpu
