"""Fish S2 Pro's implementation: its stages, weights, the shared reference run.

Every stage is verified against one upstream run (`reference.reference_decode` on the S2 prompt):
its teacher-forced calls take upstream's tensors as inputs, and upstream's tensors at the stage's
boundary are what each call must reproduce. A slow chunk at layers [a, b) gets the residual
stream before layer a and must give the one after layer b-1 (final-normed for the last chunk), at
every prompt position (prefill blocks) and every decode step after it.
"""
from __future__ import annotations

from pathlib import Path

from anetts.models.fish import codec as _codec
from anetts.models.fish import weights as _weights
from anetts.models.fish.assets import write_runtime_assets
from anetts.models.fish.config import CONFIG_NAME
from anetts.models.fish.family import DECLARATION
from anetts.models.fish.stages.codec import CodecStage
from anetts.stage import Family, Stage


def make_stage(name: str, params: dict, weights_dir: Path) -> Stage:
    from anetts.models.fish.stages.fast_ar import FastARStage
    from anetts.models.fish.stages.slow_chunk import SlowChunkStage

    cfg = _weights.read_config(weights_dir)
    lowering = params.get("rms_lowering", "decomposed")
    if name.startswith("slow_chunk"):
        for key in ("chunks", "index", "prefill"):
            if key not in params:
                raise ValueError(f"{name}: stage parameter `{key}` is missing (config families.fish.stages.slow_chunk)")
        return SlowChunkStage(cfg, int(params["index"]), int(params["chunks"]), int(params["prefill"]), lowering)
    if name == "fast_ar":
        return FastARStage(cfg, lowering)
    raise KeyError(f"family fish has no stage {name!r}; stages: slow_chunk<k>, fast_ar")


def _load_reference_model(weights_dir: Path):
    """The upstream reference model (fish-speech 0.1.0 + the S2 adaptation) for the shared reference
    run; imported here so that only that job imports upstream's code."""
    from anetts.models.fish.reference import load_reference_model

    return load_reference_model(weights_dir)


def _make_reference(model, weights_dir: Path, size: int, scenario_frames: int) -> dict:
    """Upstream's greedy decode of the S2 prompt for `scenario_frames` frames (must fit context `size`)."""
    from anetts.models.fish import reference as R
    from anetts.models.fish.tokenizer import TOKENIZER_NAME, load_tokenizer

    upstream, cfg = model
    prompt = R.make_prompt(cfg, load_tokenizer(Path(weights_dir) / TOKENIZER_NAME, cfg))
    T = prompt.shape[1]
    if T + scenario_frames - 1 > size:
        raise ValueError(f"families.fish.scenario_frames: a {T}-token prompt + {scenario_frames} frames needs "
                         f"{T + scenario_frames - 1} KV rows, more than the context bucket ctx{size}")
    return R.reference_decode(upstream, cfg, prompt, scenario_frames)


def _synthesize(out_dir: Path, preset: str, seed: int, scratch: Path) -> dict:
    return _weights.make_synthetic(out_dir, preset, seed)


def _validate(weights_dir: Path, voices: list, scratch: Path):
    if voices:
        raise ValueError(f"fish weights have no voice packs (config names {voices})")
    cfg = _weights.validate_weights_dir(weights_dir)
    try:
        _codec.validate_codec(weights_dir, cfg.num_codebooks, cfg.codebook_size)
    except _codec.CodecError as e:
        raise _weights.WeightsError(str(e)) from e
    return cfg


def _check_chain(packages: dict, assets_dir: Path, reference: Path, gate, stage_params: dict, settings: dict) -> dict:
    from anetts.models.fish.chain_check import FUSED_FRAMES, check_chain

    unknown = sorted(set(settings) - {"fused_frames"})
    if unknown:
        raise ValueError(f"chain check: unknown settings {unknown}; known: fused_frames")
    # the slow chunks: the repeated stage's instances, in the order of their `index`
    chunks = sorted((s for s, p in stage_params.items() if "index" in p), key=lambda s: stage_params[s]["index"])
    prefill = {stage_params[s]["prefill"] for s in chunks}
    if len(prefill) != 1:
        raise ValueError(f"chain: the slow chunks must share one prefill block size, got {sorted(prefill)}")
    return check_chain(packages, chunks, assets_dir, reference, gate, prefill.pop(),
                       fused_frames=int(settings.get("fused_frames", FUSED_FRAMES)))


def _check_end_to_end(tts, weights_dir: Path, params: dict, gate: dict) -> dict:
    from anetts.models.fish.end_to_end import check_end_to_end

    return check_end_to_end(tts, weights_dir, params, gate)


FAMILY = Family(
    name=DECLARATION.name,
    # the codec; the AR's stages are built by `make_stage` from their config parameters
    stages={"codec": CodecStage()},
    load_reference_model=_load_reference_model,
    weights_files=(CONFIG_NAME, _weights.INDEX_NAME, _codec.CODEC_NAME),
    synthesize=_synthesize,
    validate_weights=_validate,
    make_reference=_make_reference,
    write_runtime_assets=write_runtime_assets,
    gather_weights=_weights.gather_shards,
    make_stage=make_stage,
    check_chain=_check_chain,
    check_end_to_end=_check_end_to_end,
)
