"""The upstream reference: fish-speech 0.1.0's Dual-AR, adapted to run an S2 checkpoint.

fish-speech 0.1.0 (PyPI, Apache-2.0) has S2's inference modules (fused wqkv, QK RMSNorm before
interleaved RoPE with a bf16 table, GQA by repeat_interleave, SwiGLU, KV caches,
`forward_generate` / `forward_generate_fast`) but predates S2's files. This module is the one
place that bridges the gap:
  1. config: nested fish_qwen3_omni -> flat `DualARModelArgs` (scale_codebook_embeddings on);
  2. weights: checkpoint names `text_model.model.X` -> `X`, `audio_decoder.codebook_embeddings`
     -> `codebook_embeddings`, other `audio_decoder.X` -> `fast_X`;
  3. the fast AR takes the *final-normed* slow hidden state (S2's norm_fastlayer_input);
     0.1.0 passes the pre-norm one, which leaves slow logits right and every code wrong;
  4. semantic ids come from config.json (0.1.0 reads them from its tiktoken tokenizer);
  5. the decode step is S2's (logit bias to the semantic ids and <|im_end|>, codebook 0 from the
     semantic token, 9 fast passes over all codebook_size logits), not 0.1.0's
     decode_one_token_ar (which cuts fast logits to 1024 and applies a repetition penalty).
The codec (the sixth adaptation, its import shims) belongs to the codec stage.
"""
from __future__ import annotations

import dataclasses
import math
import os
import tempfile
import weakref
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch.nn.utils import parametrize

from anetts.models.fish import tokenizer as tok
from anetts.models.fish.config import FishConfig
from anetts.models.fish.weights import FAST_PREFIX, SLOW_PREFIX, read_config

REFERENCE_FRAMES = 16
# Residual codebooks of the S2 codec hold 1024 entries, a quarter of the semantic 4096;
# reference prompts keep that ratio for the synthetic presets.
RESIDUAL_FRACTION = 4


def from_s2_key(name: str) -> str:
    """Checkpoint tensor name -> fish-speech 0.1.0 parameter name."""
    if name.startswith(SLOW_PREFIX):
        return name[len(SLOW_PREFIX):]
    if name.startswith(f"{FAST_PREFIX}codebook_embeddings."):
        return name[len(FAST_PREFIX):]
    if name.startswith(FAST_PREFIX):
        return "fast_" + name[len(FAST_PREFIX):]
    raise KeyError(f"not an S2 checkpoint tensor name: {name}")


def model_args(cfg: FishConfig):
    from fish_speech.models.text2semantic.llama import DualARModelArgs

    s, f = cfg.slow, cfg.fast
    return DualARModelArgs(
        model_type="dual_ar", vocab_size=s.vocab_size, n_layer=s.n_layer, n_head=s.n_head,
        n_local_heads=s.n_local_heads, head_dim=s.head_dim, dim=s.dim, intermediate_size=s.intermediate_size,
        rope_base=s.rope_base, norm_eps=s.norm_eps, max_seq_len=s.max_seq_len, dropout=0.0,
        tie_word_embeddings=s.tie_word_embeddings, attention_qkv_bias=False, attention_o_bias=False,
        attention_qk_norm=s.qk_norm, use_gradient_checkpointing=False,
        scale_codebook_embeddings=True,  # S2 divides semantic positions by sqrt(num_codebooks + 1)
        codebook_size=cfg.codebook_size, num_codebooks=cfg.num_codebooks,
        n_fast_layer=f.n_layer, fast_dim=f.dim, fast_n_head=f.n_head, fast_n_local_heads=f.n_local_heads,
        fast_head_dim=f.head_dim, fast_intermediate_size=f.intermediate_size,
        fast_attention_qkv_bias=False, fast_attention_qk_norm=f.qk_norm, fast_attention_o_bias=False,
    )


class SemanticIds:
    """The three attributes fish-speech 0.1.0 reads from its tokenizer object."""

    def __init__(self, cfg: FishConfig):
        self.semantic_begin_id = cfg.semantic_begin_id
        self.semantic_end_id = cfg.semantic_end_id
        self.semantic_id_to_token_id = {i: cfg.semantic_begin_id + i for i in range(cfg.n_semantic)}


@lru_cache(maxsize=1)
def s2_model_class():
    from fish_speech.models.text2semantic.llama import BaseTransformer, DualARTransformer

    class S2DualARTransformer(DualARTransformer):
        """fish-speech 0.1.0 DualARTransformer with S2's final-normed fast-AR input."""

        def forward_generate(self, inp, input_pos=None, audio_masks=None, audio_parts=None, return_all=False):
            r = BaseTransformer.forward_generate(self, inp, input_pos, audio_masks, audio_parts, return_all)
            r.hidden_states = self.fast_project_in(self.norm(r.hidden_states))
            return r

    return S2DualARTransformer


class _Float32Arena:
    """fp32 memory the parameter reads are copied into, reused from read to read.

    A fresh fp32 copy per read is fresh pages the kernel zeroes first: the full-size reference
    job spent 1,725 of its 2,320 CPU seconds in the kernel that way (docs/fish.md). Reads take
    consecutive regions of one buffer the size of the largest tensor; once every copy handed out
    is gone (weak references), the next read starts at the front again. A read that does not fit
    behind copies still alive gets a fresh tensor, as before, so copies never overlap."""

    def __init__(self, numel: int):
        self.buffer = torch.empty(numel, dtype=torch.float32)
        self.used = 0
        self.handed: list[weakref.ref] = []

    def copy(self, stored: torch.Tensor) -> torch.Tensor:
        self.handed = [r for r in self.handed if r() is not None]
        if not self.handed:
            self.used = 0
        n = stored.numel()
        if self.used + n > self.buffer.numel():
            return stored.float()
        out = self.buffer[self.used:self.used + n].view(stored.shape).copy_(stored)
        self.used += n
        self.handed.append(weakref.ref(out))
        return out


class _ReadAsFloat32(torch.nn.Module):
    """Parametrization: the stored bf16 tensor, read as fp32 (an exact upcast) into the model's
    arena at each use; then its checkpoint pages are handed back (`MappedCheckpoint.release`)."""

    def __init__(self, arena: _Float32Arena, release):
        super().__init__()
        self.arena, self.release = arena, release

    def forward(self, stored: torch.Tensor) -> torch.Tensor:
        copy = self.arena.copy(stored)
        self.release(stored)
        return copy


def prepare_decode(model, cfg: FishConfig, rows: int) -> None:
    """Fit `model` for a decode of positions [0, rows): new fp32 KV caches and position tables (RoPE,
    causal mask) of upstream's for that many rows, rounded up to 8 as upstream's `setup_caches` does.

    Sized to the decode, not to the whole context: at fish-s2-pro's 32768 positions the KV caches
    would be 9.7 GB and the causal mask 1 GB. New each time (upstream keeps longer caches it already
    has), so a decode's bits depend on its own rows only. The tables come from upstream's own
    constructor on a model without layers or vocabulary; floating ones in fp32, as `.float()` left them.
    """
    if not 0 < rows <= cfg.slow.max_seq_len:
        raise ValueError(f"a decode of {rows} positions does not fit max_seq_len {cfg.slow.max_seq_len}")
    model.max_seq_len = -1  # upstream's "no caches yet"
    model.setup_caches(max_batch_size=1, max_seq_len=rows, dtype=torch.float32)
    shell_args = dataclasses.replace(model.config, max_seq_len=model.max_seq_len, n_layer=0, n_fast_layer=0,
                                     vocab_size=1, codebook_size=1, dim=1, fast_dim=1)
    shell = s2_model_class()(shell_args, tokenizer=SemanticIds(cfg))
    for name, table in shell.named_buffers():
        setattr(model, name, table.float() if table.is_floating_point() else table)


def load_reference_model(weights_dir: Path):
    """The upstream model in eval mode with every checkpoint tensor loaded (strict) as a bf16 view of
    the memory-mapped shards; each parameter reads as an fp32 copy made at its use (into the arena),
    after which the tensor's checkpoint pages are handed back.

    The math is the full-fp32 model's (bf16 -> fp32 is exact), but the process never holds the
    model: of the checkpoint, only the tensor being read (`loader.MappedCheckpoint`), plus one arena
    the size of the largest tensor that the reads are copied into (`_Float32Arena`). Reads outside a
    module call (the tied output head `embeddings.weight`) upcast and hand back the same way.
    """
    from anetts.models.fish.loader import MappedCheckpoint

    cfg = read_config(weights_dir)
    args = model_args(cfg)
    with torch.device("meta"):  # no parameter memory: the checkpoint's tensors are assigned below
        model = s2_model_class()(args, tokenizer=SemanticIds(cfg))
    checkpoint = MappedCheckpoint(weights_dir)
    state = {from_s2_key(k): v for k, v in checkpoint.tensors.items()}
    model.load_state_dict(state, strict=True, assign=True)
    prepare_decode(model, cfg, 1)
    arena = _Float32Arena(max(t.numel() for t in state.values() if t.is_floating_point()))
    for module in list(model.modules()):
        for name, _ in list(module.named_parameters(recurse=False)):
            parametrize.register_parametrization(module, name, _ReadAsFloat32(arena, checkpoint.release), unsafe=True)
    model.mapped_checkpoint = checkpoint  # the maps live as long as the model
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise RuntimeError(f"reference model: tensors left unloaded: {left}")
    return model.eval(), cfg


def stored_tensors(model) -> dict[str, torch.Tensor]:
    """Upstream parameter name -> the bf16 tensor `load_reference_model` keeps for it."""
    return {f"{prefix}.{name}": plist.original for prefix, m in model.named_modules()
            if parametrize.is_parametrized(m) for name, plist in m.parametrizations.items()}


# ---------------------------------------------------------------------------------------
# A realistic prompt and the greedy reference decode
# ---------------------------------------------------------------------------------------

def semantic_bias(cfg: FishConfig) -> torch.Tensor:
    """Upstream's logit bias: only semantic tokens and <|im_end|> can be sampled."""
    bias = torch.full((cfg.slow.vocab_size,), -math.inf)
    bias[cfg.semantic_begin_id:cfg.semantic_end_id + 1] = 0.0
    bias[cfg.im_end_id] = 0.0
    return bias


def reference_codes(cfg: FishConfig, frames: int = 8, seed: int = 1) -> np.ndarray:
    """Stand-in reference codes (num_codebooks, frames): semantic codes over the whole codebook,
    residual ones over the first quarter (the S2 codec's 1024 of 4096)."""
    g = np.random.default_rng(seed)
    codes = np.zeros((cfg.num_codebooks, frames), dtype=np.int64)
    codes[0] = g.integers(0, cfg.codebook_size, frames)
    codes[1:] = g.integers(0, max(1, cfg.codebook_size // RESIDUAL_FRACTION), (cfg.num_codebooks - 1, frames))
    return codes


def make_prompt(cfg: FishConfig, tokenizer, text: str = "The quick brown fox.",
                reference_text: str = "A reference.", reference_frames: int = 8,
                seed: int = 1) -> np.ndarray:
    """An S2 (1 + num_codebooks, T) prompt built by the runtime's prompt builder
    (`prompt.build_prompt`: system turn with the reference transcript and `reference_frames` frames
    of stand-in codes, user turn with the text, open voice turn)."""
    from anetts.models.fish.prompt import build_prompt

    return build_prompt(cfg, tokenizer, text, reference_text, reference_codes(cfg, reference_frames, seed))


def _reset_fast_cache(model) -> None:
    for layer in model.fast_layers:
        layer.attention.kv_cache.k_cache.zero_()
        layer.attention.kv_cache.v_cache.zero_()


@torch.inference_mode()
def reference_decode(model, cfg: FishConfig, prompt: np.ndarray, n_frames: int = REFERENCE_FRAMES,
                     stop_at_end: bool = False) -> dict:
    """Greedy S2 decode: prefill the prompt, then `n_frames` slow steps each followed by 10 fast passes.
    With `stop_at_end`, a frame whose token is <|im_end|> is the last (upstream's generation stops
    there): it has no fast passes, its codes and fast logits are 0.

    Returns numpy arrays (frame 0's slow step is the prefill's last position):
      slow_logits (F, V)          full slow logits before the bias
      slow_hidden (F, D)          final-normed slow state (the fast AR's input)
      prefill_layer_hidden (L+1, T, D)  residual stream of every prompt position before layer 0..L-1 and after the last
      prefill_slow_hidden (T, D)  final-normed slow state of every prompt position
      prefill_head_logits (T, R)  slow logits of every prompt position at the restricted head's rows
                                  (`FishConfig.restricted_ids`: what the last slow chunk's head gives)
      decode_layer_hidden (F-1, L+1, D) the same for each decode step
      semantic_tokens (F,), codes (F, num_codebooks), fast_logits (F, num_codebooks, codebook_size)
      positions (F,)              slow position that produced each frame
    """
    T = prompt.shape[1]
    if T + n_frames > cfg.slow.max_seq_len:
        raise ValueError(f"prompt of {T} tokens + {n_frames} frames exceeds max_seq_len {cfg.slow.max_seq_len}")
    prepare_decode(model, cfg, T + n_frames)
    bias = semantic_bias(cfg)
    captured: list[torch.Tensor] = []
    hooks = [model.layers[0].register_forward_pre_hook(lambda m, a: captured.append(a[0][0].clone()))]
    hooks += [layer.register_forward_hook(lambda m, a, out: captured.append(out[0].clone())) for layer in model.layers]
    out = {k: [] for k in ("slow_logits", "slow_hidden", "semantic_tokens", "codes", "fast_logits", "positions",
                           "decode_layer_hidden")}
    try:
        x, pos = torch.from_numpy(prompt)[None], torch.arange(T)
        for f in range(n_frames):
            captured.clear()
            # the prefill returns every prompt position's logits and state (upstream's `return_all`), not only the last's
            r = model.forward_generate(x, pos, return_all=f == 0)
            layer_hidden = torch.stack(captured)  # (L+1, S, D)
            if f == 0:
                out["prefill_layer_hidden"] = layer_hidden.float().numpy()
                out["prefill_slow_hidden"] = r.hidden_states[0].float().numpy()
                out["prefill_head_logits"] = r.logits[0][:, list(cfg.restricted_ids)].float().numpy()
            else:
                out["decode_layer_hidden"].append(layer_hidden[:, -1].float().numpy())
            logits, hidden = r.logits[0, -1].float(), r.hidden_states[0, -1]
            token = int(torch.argmax(logits + bias))
            if stop_at_end and token == cfg.im_end_id:
                out["slow_logits"].append(logits.numpy())
                out["slow_hidden"].append(hidden.float().numpy())
                out["semantic_tokens"].append(token)
                out["codes"].append([0] * cfg.num_codebooks)
                out["fast_logits"].append(np.zeros((cfg.num_codebooks, cfg.codebook_size), np.float32))
                out["positions"].append(int(pos[-1]))
                break
            codes = [min(max(token - cfg.semantic_begin_id, 0), cfg.codebook_size - 1)]
            _reset_fast_cache(model)
            fast_logits = [model.forward_generate_fast(hidden[None], torch.tensor([0]))[0, -1].float()]
            h = model.fast_embeddings(torch.tensor([codes[0]]))
            for i in range(1, cfg.num_codebooks):
                fl = model.forward_generate_fast(h, torch.tensor([i]))[0, -1].float()
                fast_logits.append(fl)
                codes.append(int(torch.argmax(fl)))
                h = model.fast_embeddings(torch.tensor([codes[-1]]))
            out["slow_logits"].append(logits.numpy())
            out["slow_hidden"].append(hidden.float().numpy())
            out["semantic_tokens"].append(token)
            out["codes"].append(codes)
            out["fast_logits"].append(torch.stack(fast_logits).numpy())
            out["positions"].append(int(pos[-1]))
            x = torch.tensor([token, *codes]).view(1, cfg.num_codebooks + 1, 1)
            pos = torch.tensor([T + f])
    finally:
        for h in hooks:
            h.remove()
    prefill = ("prefill_layer_hidden", "prefill_slow_hidden", "prefill_head_logits")
    result = {k: np.asarray(v) for k, v in out.items() if k not in prefill}
    result["decode_layer_hidden"] = np.asarray(out["decode_layer_hidden"]).reshape(
        len(out["semantic_tokens"]) - 1, cfg.slow.n_layer + 1, cfg.slow.dim)
    result.update({k: out[k] for k in prefill})
    result["prompt"] = prompt
    result["semantic_tokens"] = result["semantic_tokens"].astype(np.int64)
    result["codes"] = result["codes"].astype(np.int64)
    return result


def write_reference(weights_dir: Path, out_path: Path, n_frames: int = REFERENCE_FRAMES) -> dict:
    """Run the reference decode on a weights directory and save it as npz (atomically)."""
    weights_dir, out_path = Path(weights_dir), Path(out_path)
    model, cfg = load_reference_model(weights_dir)
    tk = tok.load_tokenizer(weights_dir / tok.TOKENIZER_NAME, cfg)
    result = reference_decode(model, cfg, make_prompt(cfg, tk), n_frames)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out_path.name}.", suffix=".npz", dir=out_path.parent)
    os.close(fd)
    try:
        np.savez(tmp, **result)
        os.replace(tmp, out_path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return result
