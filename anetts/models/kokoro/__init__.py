"""Kokoro-82M (hexgrad/kokoro): four CoreML stages plus host DSP."""
from __future__ import annotations

from pathlib import Path

from anetts.models.kokoro import weights as _weights
from anetts.models.kokoro.stages.decoder_pre import DecoderPreStage
from anetts.models.kokoro.stages.duration import DurationStage
from anetts.models.kokoro.stages.f0ntrain import F0NtrainStage
from anetts.models.kokoro.stages.generator import GeneratorStage
from anetts.stage import Family

_HERE = Path(__file__).parent


def _load_model(weights_dir: Path):
    return _weights.prepare_for_trace(_weights.load_kmodel(weights_dir))


def _make_reference(model, weights_dir: Path, seconds: int) -> dict:
    from anetts.models.kokoro.reference import example_for_seconds
    from anetts.models.kokoro.stages.base import EXAMPLE_VOICE

    return example_for_seconds(model, weights_dir, seconds, EXAMPLE_VOICE)


def _materialize_onnx(source: dict, staging: Path, voices: list, scratch: Path) -> dict:
    from anetts.models.kokoro.onnx_weights import materialize_onnx

    return materialize_onnx(source, staging, voices, scratch)


FAMILY = Family(
    name="kokoro",
    stages={s.name: s for s in (DurationStage(), F0NtrainStage(), DecoderPreStage(), GeneratorStage())},
    load_model=_load_model,
    weights_files=(_weights.CONFIG_NAME, _weights.CHECKPOINT_NAME),
    voice_file=lambda name: f"{_weights.VOICES_DIR}/{name}.pt",
    default_voices=("af_heart",),
    synthetic_voices=_weights.SYNTHETIC_VOICES,
    synthesize=_weights.make_synthetic,
    validate_weights=_weights.validate_weights_dir,
    weights_code=(_HERE / "weights.py", _HERE / "presets.py", _HERE / "reference.py",
                  _HERE / "data" / "weight_stats.json", _HERE / "data" / "example_phonemes.txt"),
    make_reference=_make_reference,
    host_params=_weights.host_dsp_params,
    reference_code=(_HERE / "reference.py", _HERE / "dsp.py", _HERE / "data" / "example_phonemes.txt"),
    convert_onnx=_materialize_onnx,
    # the converter, the validation it shares and the config it writes; not the synthetic code
    source_code={"onnx": (_HERE / "onnx_weights.py", _HERE / "weights.py", _HERE / "data" / "kokoro-82m.config.json")},
)
