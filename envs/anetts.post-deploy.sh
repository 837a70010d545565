#!/usr/bin/env bash
# Run by `snakemake --sdm conda` inside envs/anetts.yaml once it is created: the Fish references,
# and the codec's layers, installed --no-deps as the Makefile does (FISH_SPEECH_SPEC, DAC_SPEC,
# MLX_AUDIO_SPEC; see there for why).
set -euo pipefail
python -m pip install --no-deps "fish-speech==0.1.0" "descript-audio-codec==1.0.0" "mlx-audio==0.6.2"
