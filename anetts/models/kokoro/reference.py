"""Upstream Kokoro as the reference: every stage boundary tensor from one `KModel` forward.

Example inputs for the export and reference outputs for parity both come from here, captured
with hooks on upstream's own modules, so no stage's example depends on another stage's wrapper.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from anetts.models.kokoro.dsp import KOKORO
from anetts.models.kokoro.presets import DATA_DIR

# Fraction of a bucket that example inputs fill: realistic, and leaves padding to test masks.
FILL = 0.75


def example_phonemes() -> str:
    return (DATA_DIR / "example_phonemes.txt").read_text(encoding="utf-8").strip()


def example_token_ids(vocab: dict[str, int], n_tokens: int) -> list[int]:
    """`n_tokens` ids (including the two 0 pads) cut from a fixed English text's phonemes."""
    ids = [vocab[p] for p in example_phonemes() if p in vocab]
    body = (ids * (1 + n_tokens // max(len(ids), 1)))[: max(n_tokens - 2, 1)]
    return [0, *body, 0]


@torch.no_grad()
def upstream_intermediates(model, input_ids: list[int], ref_s: torch.Tensor, speed: float = 1.0, seed: int = 0) -> dict:
    """Run `KModel.forward_with_tokens` once and capture each stage boundary.

    Returns numpy arrays: pred_dur (T,), en (1,640,F), asr (1,512,F), F0 (1,2F), N (1,2F),
    x_pre (1,512,2F), har (1,22,120F+1), audio (600F,), and s / ref_s.
    """
    captured: dict[str, torch.Tensor] = {}
    dec, gen = model.decoder, model.decoder.generator

    def grab_decoder(_mod, args):
        captured["asr"], captured["F0"], captured["N"], _ = args

    def grab_generator(_mod, args):
        captured["x_pre"] = args[0]

    def grab_har(_mod, args):
        captured.setdefault("har", args[0])

    def grab_en(_mod, args):
        captured["en"] = args[0].transpose(-1, -2)

    hooks = [
        dec.register_forward_pre_hook(grab_decoder),
        gen.register_forward_pre_hook(grab_generator),
        gen.noise_convs[0].register_forward_pre_hook(grab_har),
        model.predictor.shared.register_forward_pre_hook(grab_en),
    ]
    torch.manual_seed(seed)  # the hn-NSF source draws random phases and noise
    try:
        audio, pred_dur = model.forward_with_tokens(torch.tensor([input_ids]), ref_s, speed)
    finally:
        for h in hooks:
            h.remove()
    out = {k: v.detach().float().numpy() for k, v in captured.items()}
    out["pred_dur"] = pred_dur.detach().reshape(-1).numpy().astype(np.int64)
    out["audio"] = audio.detach().float().numpy().reshape(-1)
    out["ref_s"] = ref_s.numpy().astype(np.float32)
    out["s"] = ref_s[:, KOKORO.style_dim:].numpy().astype(np.float32)
    return out


class _FramesKnown(Exception):
    """Stops a forward once its frame count is known."""


@torch.no_grad()
def upstream_frames(model, input_ids: list[int], ref_s: torch.Tensor, speed: float = 1.0) -> int:
    """`pred_dur.sum()` of `KModel.forward_with_tokens` on these ids: the same forward, stopped where
    the F0/N predictor takes the aligned features (`en`, one column per frame), so nothing after the
    durations (F0/N, text encoder, decoder, vocoder) runs."""
    def stop(_mod, args):
        raise _FramesKnown(args[0].shape[-2])  # en transposed: (1, frames, channels)

    hook = model.predictor.shared.register_forward_pre_hook(stop)
    try:
        model.forward_with_tokens(torch.tensor([input_ids]), ref_s, speed)
    except _FramesKnown as known:
        return int(known.args[0])
    finally:
        hook.remove()
    raise RuntimeError("upstream's forward never reached predictor.shared: the search for a bucket's example "
                       "needs the installed kokoro's forward_with_tokens to run its F0/N predictor")


def voice_row(voice: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """Upstream picks `voice[len(phonemes) - 1]`; ids carry two extra 0 pads."""
    return voice[max(n_tokens - 2, 1) - 1]


def example_for_seconds(model, weights_dir: Path, seconds: int, voice_name: str, seed: int = 0) -> dict:
    """Upstream intermediates for an utterance filling about FILL of a `seconds` bucket."""
    from anetts.models.kokoro.weights import list_voices, load_voice

    voice = load_voice(weights_dir, voice_name if voice_name in list_voices(weights_dir) else list_voices(weights_dir)[0])
    capacity = KOKORO.frames(seconds)
    n_tokens = min(510, max(4, int(FILL * capacity / 2.8)))
    while True:  # the longest text that fills at most FILL of the bucket; only durations are needed
        ids = example_token_ids(model.vocab, n_tokens)
        frames = upstream_frames(model, ids, voice_row(voice, len(ids)))
        if frames <= FILL * capacity or n_tokens <= 4:
            break
        n_tokens = max(4, int(n_tokens * FILL * capacity / frames))
    ref = upstream_intermediates(model, ids, voice_row(voice, len(ids)), seed=seed)
    if frames > capacity:
        raise ValueError(f"example for {seconds}s bucket has {frames} frames > capacity {capacity}")
    ref["input_ids"] = np.asarray(ids, dtype=np.int64)
    return ref
