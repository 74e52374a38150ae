# Sourced ON THE GPU MACHINE from the repository root, with .gpu/cp carried: installs the staged wheels
# (benchmarks/gpu/build_wheels.sh) and the plugin into the machine's Python (python3) in seconds. STAGED: the
# staged folder (default .gpu/cp).
PY=python3
$PY -m pip install -q --no-index --no-deps --no-compile "${STAGED:-.gpu/cp}"/whl/*.whl || return 1
$PY -m pip wheel -q --no-index --no-deps --no-build-isolation -w /tmp/plugin_wheel . || return 1
$PY -m pip install -q --no-index --no-deps /tmp/plugin_wheel/spanbert_plugin*.whl || return 1
# the recipes say user_dir: user_dir; run from another folder, fairseq looks for it beside its own package
ln -sfn "$PWD/user_dir" "$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/user_dir"
nvidia-smi -L
$PY -c "import torch, fairseq, spanbert_plugin.registry; print('torch', torch.__version__, 'fairseq', fairseq.__version__)" || return 1
