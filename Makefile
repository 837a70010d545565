# Two entry points: `make build` (the main job) and `make test`. Both create .venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
CORES ?= 2
# The CPU build of torch; an unpinned `torch` resolves to a multi-GB CUDA build on Linux.
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup build test clean browser

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test]"
	touch $@

build: setup
	$(VENV)/bin/snakemake all --cores $(CORES)

# The report's browser test needs a Chromium: Debian's package (root, as in CI), unless one is on PATH.
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || command -v google-chrome >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

test: setup browser
	$(VENV)/bin/pytest -q

clean:
	rm -rf artifacts .snakemake
