"""Fish S2 Pro's declaration: what the workflow needs to know without importing torch or fish-speech."""
from __future__ import annotations

from anetts.family import FamilyDecl, StageDecl

_F = "models/fish"
# every stage wrapper is built on these (config, per-layer loading, the shared transformer block)
_SHARED = (f"{_F}/config.py", f"{_F}/loader.py", f"{_F}/weights.py", f"{_F}/stages/layers.py", f"{_F}/impl.py")
_WEIGHTS_COMMON = ("weights.py", f"{_F}/weights.py", f"{_F}/config.py", f"{_F}/tokenizer.py", f"{_F}/codec.py")

# The Fish Audio Research License: research and non-commercial use only;
# redistributing converted packages needs the agreement, a NOTICE and "Built with Fish Audio".
LICENCE = ("Fish Audio Research License (research and non-commercial use only). This model is licensed "
           "under the Fish Audio Research License, Copyright © 39 AI, INC. All Rights Reserved. "
           "Modified by ane-tts: converted to Core ML (fp16, layer chunks, restricted LM head). "
           "Built with Fish Audio.")

DECLARATION = FamilyDecl(
    name="fish",
    stages={
        "slow_chunk": StageDecl("slow_chunk", "context", (f"{_F}/stages/slow_chunk.py", f"{_F}/stages/lm_head.py", *_SHARED),
                                uses_reference=True, bundle=False, repeat="chunks",
                                description="slow-AR layers [a, b) with prefill + decode and an fp16 KV state; the "
                                            "last also the tied head over the semantic ids + <|im_end|>"),
        "fast_ar": StageDecl("fast_ar", "context", (f"{_F}/stages/fast_ar.py", *_SHARED), uses_reference=True,
                             bundle=False, description="fast AR: one call per codebook, a 10-slot KV state"),
        "codec": StageDecl("codec", "frames", (f"{_F}/stages/codec.py", f"{_F}/codec.py"),
                           description="modded DAC decoder: 10 codes per frame -> 2048 samples at 44.1 kHz"),
    },
    implementation="anetts.models.fish.impl",
    runtime="anetts.models.fish.runtime:FishRuntime",
    bench="anetts.models.fish.bench",
    licence=LICENCE,
    upstream=("fish-speech", "transformers", "descript-audio-codec"),
    job_imports=("fish_speech.models.text2semantic.llama",),
    weights_code={
        "synthetic": (*_WEIGHTS_COMMON, f"{_F}/presets.py"),
        "hf": _WEIGHTS_COMMON,
        "local": _WEIGHTS_COMMON,
    },
    reference_code=(f"{_F}/reference.py", f"{_F}/prompt.py", f"{_F}/tokenizer.py", f"{_F}/impl.py"),
    reference_params=("scenario_frames",),
    assets_code=(f"{_F}/assets.py",),
    # the chain check drives the runtime's decode loop (runtime.py) greedily (greedy.py) and sampled
    # (sampling.py: the host's draws, and the noise the fused fast AR draws on)
    chain_code=(f"{_F}/chain_check.py", f"{_F}/greedy.py", f"{_F}/runtime.py", f"{_F}/sampling.py", f"{_F}/assets.py"),
    # the runtime end to end over the compiled packages vs upstream greedy generation (rule end_to_end)
    end_to_end_code=(f"{_F}/end_to_end.py", f"{_F}/greedy.py", f"{_F}/runtime.py", f"{_F}/reference.py",
                     f"{_F}/codec.py", f"{_F}/prompt.py", f"{_F}/sampling.py", f"{_F}/assets.py"),
    frame_cost="anetts.models.fish.frame_cost:variant_frame_cost",
    frame_cost_code=(f"{_F}/frame_cost.py", f"{_F}/config.py"),
    file_bytes="anetts.models.fish.frame_cost:stage_file_bytes",
    audio=("codec", "audio", 44100),
)
