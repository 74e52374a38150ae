#!/usr/bin/env bash
# Run HERE (where pip reaches a package index), from the repository root: wheels for the GPU machine's Python, so
# that its set-up only installs files (seconds) instead of compiling fairseq there (3 minutes).
#   bash benchmarks/gpu/build_wheels.sh [PYTHON_VERSION]      # default 3.12, the machine's (its python3)
# Writes .gpu/wheels/ (git-ignored):
#   fairseq_fixed-0.12.3.1-cpXY-*.whl  built with that Python from the sdist WITHOUT fairseq's torch C++ extensions
#       (libbase, libnat, the alignment bindings: models this plugin does not use), so it depends on the machine's
#       numpy >= 2 but not on its torch version; its Cython extensions are built here. The examples' images and
#       audio samples are left out (3.7 MB instead of 12.5).
#   hydra-core 1.3.2, omegaconf 2.3.0, antlr4-python3-runtime 4.9.3, bitarray, tensorboardX: what the machine's
#       image lacks (torch, numpy, scipy, tokenizers, transformers, sacrebleu and regex are there).
# When the machine's Python changes, pass its version; when its numpy drops below 2, build with numpy<2 here.
# Needs that Python here (pyenv's is found).
set -euo pipefail
VERSION=${1:-3.12}
PYTHON=
for candidate in "python$VERSION" $(ls -d "$(pyenv root 2>/dev/null)/versions/$VERSION"*/bin/python$VERSION 2>/dev/null); do
    "$candidate" -V >/dev/null 2>&1 && { PYTHON=$candidate; break; }  # a pyenv shim may name a Python it cannot run
done
[ -n "$PYTHON" ] || { echo "build_wheels: no python$VERSION here (pyenv install $VERSION)"; exit 1; }
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo '/.gpu/' >> .git/info/exclude; }
OUTDIR=$PWD/.gpu/wheels BUILD=$(mktemp -d)
mkdir -p "$OUTDIR"
"$PYTHON" -m venv "$BUILD/venv"
"$BUILD/venv/bin/pip" install -q "numpy>=2" cython setuptools wheel
# the sdist's metadata is prepared with this checkout's venv (its setup.py imports torch: make install first)
.venv/bin/pip download -q --no-deps --no-binary :all: --no-build-isolation -d "$BUILD" fairseq-fixed==0.12.3.1
tar xzf "$BUILD"/fairseq_fixed-0.12.3.1.tar.gz -C "$BUILD"
SRC=$BUILD/fairseq_fixed-0.12.3.1
# setup.py without torch: the NumPy/Cython extensions only
"$BUILD/venv/bin/python" - "$SRC/setup.py" <<'PYCODE'
import sys
path = sys.argv[1]
text = open(path).read().replace("from torch.utils import cpp_extension\n", "")
start = text.index("extensions.extend(\n    [\n        cpp_extension.CppExtension(")
end = text.index('if "READTHEDOCS" in os.environ:')
open(path, "w").write(text[:start] + "cmdclass = {}\n\n" + text[end:])
PYCODE
find "$SRC/examples" "$SRC/fairseq/examples" -type f \( -name '*.npy' -o -name '*.png' -o -name '*.ipynb' -o -name '*.flac' \
    -o -name '*.jpg' -o -name '*.wav' -o -name '*.gif' -o -name '*.pdf' -o -name '*.tsv' \) -delete
(cd "$SRC" && env -u CUDA_HOME "$BUILD/venv/bin/pip" wheel -q --no-cache-dir --no-deps --no-build-isolation -w "$OUTDIR" .)
"$BUILD/venv/bin/pip" download -q --no-deps --only-binary=:all: --python-version "$VERSION" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$OUTDIR" bitarray hydra-core==1.3.2 omegaconf==2.3.0 tensorboardX
"$BUILD/venv/bin/pip" wheel -q --no-deps --no-cache-dir -w "$OUTDIR" antlr4-python3-runtime==4.9.3
rm -rf "$BUILD"
ls -la "$OUTDIR"
