"""Kokoro's implementation: stage wrappers on upstream modules, weights, the shared reference run."""
from __future__ import annotations

from pathlib import Path

from anetts.models.kokoro import synthetic as _synthetic
from anetts.models.kokoro.assets import write_runtime_assets
from anetts.models.kokoro import weights as _weights
from anetts.models.kokoro.family import DECLARATION
from anetts.models.kokoro.stages.decoder_pre import DecoderPreStage
from anetts.models.kokoro.stages.duration import DurationStage
from anetts.models.kokoro.stages.f0ntrain import F0NtrainStage
from anetts.models.kokoro.stages.generator import GeneratorStage
from anetts.stage import Family, VoicePacks


def _load_reference_model(weights_dir: Path):
    # the shared reference run speaks whole sentences: the whole upstream KModel
    return _weights.prepare_for_trace(_weights.load_kmodel(weights_dir))


def _make_reference(model, weights_dir: Path, seconds: int) -> dict:
    from anetts.models.kokoro.reference import example_for_seconds
    from anetts.models.kokoro.stages.base import EXAMPLE_VOICE

    return example_for_seconds(model, weights_dir, seconds, EXAMPLE_VOICE)


def _materialize_onnx(source: dict, staging: Path, voices: list, scratch: Path) -> dict:
    from anetts.models.kokoro.onnx_weights import materialize_onnx

    return materialize_onnx(source, staging, voices, scratch)


def _check_end_to_end(tts, weights_dir: Path, params: dict, gate: dict) -> dict:
    from anetts.models.kokoro.end_to_end import check_end_to_end

    return check_end_to_end(tts, weights_dir, params, gate)


FAMILY = Family(
    name=DECLARATION.name,
    stages={s.name: s for s in (DurationStage(), F0NtrainStage(), DecoderPreStage(), GeneratorStage())},
    load_reference_model=_load_reference_model,
    weights_files=(_weights.CONFIG_NAME, _weights.CHECKPOINT_NAME),
    voices=VoicePacks(file=lambda name: f"{_weights.VOICES_DIR}/{name}.pt", defaults=("af_heart",),
                      synthetic=_synthetic.SYNTHETIC_VOICES),
    synthesize=_synthetic.make_synthetic,
    validate_weights=_weights.validate_weights_dir,
    make_reference=_make_reference,
    host_params=_weights.host_dsp_params,
    write_runtime_assets=write_runtime_assets,
    convert_onnx=_materialize_onnx,
    check_end_to_end=_check_end_to_end,
)
