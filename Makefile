# Two entry points: `make build` (the main job) and `make test`. Both create .venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
CORES ?= 2
# The CPU build of torch; an unpinned `torch` resolves to a multi-GB CUDA build on Linux.
TORCH_SPEC ?= torch==2.13.0
# olah (a Hub mirror the publish tests download through) in its own venv: it needs huggingface_hub 2.x,
# the project (transformers < 5) needs 0.x.
OLAH_VENV ?= .venv-olah
OLAH_SPEC ?= olah==0.5.4

.PHONY: setup build test clean olah

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test]"
	touch $@

olah: $(OLAH_VENV)/bin/olah-cli

$(OLAH_VENV)/bin/olah-cli:
	python3 -m venv $(OLAH_VENV)
	$(OLAH_VENV)/bin/python -m pip install -q "$(OLAH_SPEC)"

build: setup
	$(VENV)/bin/snakemake all --cores $(CORES)

test: setup olah
	ANETTS_OLAH_CLI=$(abspath $(OLAH_VENV))/bin/olah-cli $(VENV)/bin/pytest -q

clean:
	rm -rf artifacts .snakemake
