# Project-local set-up in .venv; every target installs what it needs first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# GPU hosts: install a CUDA build of torch 2.13.0 into .venv first (see README);
# pip then keeps it because it satisfies this pin.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed
# bash with pipefail: a pip whose output goes through PIP_FILTER still fails the recipe when it fails.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
# After every install pip re-checks the environment and prints "ERROR: pip's dependency
# resolver ..." / "fairseq-fixed 0.12.3.1 requires torchaudio ...": torchaudio is left out on
# purpose (unused here, and pip would replace the pinned torch with the build it wants), so
# that one report is dropped. Every other line, other conflicts included, is shown.
PIP_FILTER := 2>&1 | awk '/dependency resolver does not currently take into account/ { held = $$0; next } \
	/^fairseq-fixed .* requires torchaudio/ { next } \
	held != "" { print held; held = "" } { print }'

.PHONY: install demo test bench clean

install: $(STAMP)

$(STAMP): setup.py requirements.txt Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/pip install --quiet "$(TORCH_SPEC)" "numpy>=1.24" "cython>=3"
	# fairseq compiles Cython extensions against the torch/numpy above; its
	# declared dependencies include torchaudio, so they are listed by hand.
	$(BIN)/pip install --quiet --no-build-isolation --no-deps fairseq-fixed==0.12.3.1
	@echo "note: fairseq-fixed declares torchaudio, left out on purpose (unused; it would replace the pinned torch): pip's report about it is not shown"
	$(BIN)/pip install --quiet -r requirements.txt $(PIP_FILTER)
	$(BIN)/pip install --quiet --no-build-isolation --no-deps -e .
	# the recipes say user_dir: user_dir; run from another folder, fairseq looks for it beside its own package.
	# Hydra finds plugins by walking the folders of hydra_plugins, which an editable install does not give it: the
	# plugin's (fairseq-hydra-train loads it before it sets up the distributed world) is linked there too
	purelib="$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" && \
	ln -sfn "$(CURDIR)/user_dir" "$$purelib/user_dir" && mkdir -p "$$purelib/hydra_plugins" && \
	ln -sfn "$(CURDIR)/hydra_plugins/spanbert_plugin" "$$purelib/hydra_plugins/spanbert_plugin"
	$(BIN)/python -c "import torch, fairseq, spanbert_plugin; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python scripts/demo.py --out demo_out

# the [linguistic] extra (spaCy and its English pipeline): the named-entity and noun-phrase masking tests need it
LINGUISTIC := $(VENV)/.linguistic

$(LINGUISTIC): $(STAMP) setup.py
	$(BIN)/pip install --quiet --no-build-isolation -e ".[linguistic]" $(PIP_FILTER)
	touch $(LINGUISTIC)

test: $(STAMP) $(LINGUISTIC)
	$(BIN)/lint-imports
	$(BIN)/ruff check .
	# two workers: the machine's two cores (every child process runs on one thread); an idle worker takes
	# tests queued on the busy one, so a long test near the end does not leave a core idle; the 15 slowest are listed
	$(BIN)/python -m pytest -q -n 2 --dist worksteal --durations=15 tests

bench: $(STAMP)
	$(BIN)/python benchmarks/cpu_speed/masking_throughput.py

clean:  # demo_out goes only when it holds the demo's files alone (the demo's own manifest says which)
	@if [ -d demo_out ]; then \
	    if [ -x $(BIN)/python ]; then $(BIN)/python scripts/demo.py --clean --out demo_out || true; \
	    else echo "demo_out kept (no $(VENV) to check it): remove it yourself"; fi; fi
	rm -rf $(VENV) build *.egg-info
