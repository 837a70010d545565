"""Kokoro's declaration: what the workflow needs to know without importing torch or kokoro."""
from __future__ import annotations

from anetts.family import FamilyDecl, HubCard, StageDecl

_K = "models/kokoro"
# every stage wrapper imports these (masking, geometry, shared stage base)
_SHARED = (f"{_K}/stages/base.py", f"{_K}/masked.py", f"{_K}/dsp.py")
# stages that build their own examples (not from the shared reference run) use reference.py
_OWN_EXAMPLES = (f"{_K}/reference.py", f"{_K}/data/example_phonemes.txt")
_WEIGHTS_COMMON = ("weights.py", f"{_K}/weights.py")

DECLARATION = FamilyDecl(
    name="kokoro",
    stages={
        "duration": StageDecl("duration", "tokens", (f"{_K}/stages/duration.py", *_SHARED, *_OWN_EXAMPLES),
                              description="ALBERT + text encoder + duration predictor: token ids -> durations"),
        "f0ntrain": StageDecl("f0ntrain", "seconds", (f"{_K}/stages/f0ntrain.py", *_SHARED), uses_reference=True,
                              description="prosody LSTM: aligned features -> F0 and energy curves"),
        "decoder_pre": StageDecl("decoder_pre", "seconds", (f"{_K}/stages/decoder_pre.py", *_SHARED),
                                 uses_reference=True, description="decoder encode/decode blocks before the vocoder"),
        "generator": StageDecl("generator", "seconds", (f"{_K}/stages/generator.py", f"{_K}/fold.py", f"{_K}/subpixel.py",
                                                        *_SHARED), uses_reference=True,
                               description="iSTFTNet vocoder up to the spectrogram and phase"),
    },
    implementation="anetts.models.kokoro.impl",
    runtime="anetts.models.kokoro.runtime:KokoroRuntime",
    bench="anetts.models.kokoro.bench",
    licence="Apache-2.0 (Kokoro-82M weights by hexgrad)",
    # Kokoro-82M is Apache-2.0 (its model card and the kokoro package's licence)
    hub=HubCard(license="apache-2.0", files={"LICENSE": "Apache-2.0.txt"}, base_model="hexgrad/Kokoro-82M",
                tags=("kokoro", "styletts2")),
    upstream=("kokoro", "transformers"),
    # the model's modules without kokoro's __init__ (its text pipeline): anetts.imports.submodules
    job_imports=("kokoro:model",),
    weights_code={
        "synthetic": (*_WEIGHTS_COMMON, f"{_K}/synthetic.py", f"{_K}/presets.py", f"{_K}/data/weight_stats.json",
                      f"{_K}/reference.py", f"{_K}/data/example_phonemes.txt"),
        "hf": _WEIGHTS_COMMON,
        "local": _WEIGHTS_COMMON,
        # the converter, the validation it shares and the config it writes; not the synthetic code
        "onnx": (*_WEIGHTS_COMMON, f"{_K}/onnx_weights.py", f"{_K}/data/kokoro-82m.config.json"),
    },
    reference_code=(f"{_K}/reference.py", f"{_K}/dsp.py", f"{_K}/data/example_phonemes.txt"),
    assets_code=(f"{_K}/assets.py", f"{_K}/weights.py"),
    audio=("generator", "waveform", 24000),
    # seconds of audio per bucket, for the manifest's ANE-eligible share
    audio_seconds="anetts.models.kokoro.share:audio_seconds",
    audio_seconds_code=(f"{_K}/share.py", f"{_K}/dsp.py", f"{_K}/runtime.py"),
    # the runtime end to end over the compiled packages vs upstream KModel (rule end_to_end)
    end_to_end_code=(f"{_K}/end_to_end.py", f"{_K}/runtime.py", f"{_K}/text.py", f"{_K}/dsp.py", f"{_K}/fold.py",
                     f"{_K}/weights.py"),
    # the corpus through upstream and the build, judged by the listener models (rule listen)
    listen="anetts.models.kokoro.listen:check_listen",
    listen_code=(f"{_K}/listen.py", f"{_K}/runtime.py", f"{_K}/fold.py", f"{_K}/frontend.py", f"{_K}/text.py", f"{_K}/weights.py",
                 "listen/__init__.py", "listen/toolkit.py", "listen/metrics.py", "listen/corpus.py", "listen/gate.py",
                 "listen/corpus/en.txt", "listen/corpus/ja.txt"),
)
