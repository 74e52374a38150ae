# Project-local set-up in .venv; every target installs what it needs first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# GPU hosts: install a CUDA build of torch 2.13.0 into .venv first (see README);
# pip then keeps it because it satisfies this pin.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: install demo test bench clean

install: $(STAMP)

$(STAMP): setup.py requirements.txt Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/pip install --quiet "$(TORCH_SPEC)" "numpy>=1.24" "cython>=3"
	# fairseq compiles Cython extensions against the torch/numpy above; its
	# declared dependencies include torchaudio, so they are listed by hand.
	$(BIN)/pip install --quiet --no-build-isolation --no-deps fairseq-fixed==0.12.3.1
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-build-isolation --no-deps -e .
	$(BIN)/python -c "import torch, fairseq, spanbert_plugin; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python scripts/demo.py --out demo_out

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

bench: $(STAMP)
	$(BIN)/python benchmarks/masking_throughput.py

clean:
	rm -rf $(VENV) demo_out build *.egg-info
