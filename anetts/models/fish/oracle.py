"""An independent float64 re-implementation of the slow and fast AR, from the raw checkpoint tensors.

It shares no code with fish-speech: it exists to pin down the numerics the CoreML stages must
reproduce (semantic-position embedding, QK norm before RoPE, RoPE layout, GQA grouping, final norm,
tied head), and to show that a wrong RoPE layout is caught.

RoPE layouts:
  "interleaved"          S2's: rotates adjacent pairs (x[2i], x[2i+1]) — the correct one;
  "half_split"           NeoX rotate_half on (x[i], x[i + hd/2]) with unchanged weights — wrong;
  "half_split_permuted"  NeoX after permuting q/k rows of wqkv and q_norm/k_norm per head by
                         [0, 2, ..., hd-2, 1, 3, ..., hd-1] — equivalent to interleaved.
"""
from __future__ import annotations

import torch

from anetts.models.fish.config import FishConfig
from anetts.models.fish.weights import FAST_PREFIX, SLOW_PREFIX

ROPE_LAYOUTS = ("interleaved", "half_split", "half_split_permuted")


def rope_table(positions: torch.Tensor, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (S, head_dim/2), computed in fp32 and rounded to bf16 as upstream does."""
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angle = positions.to(torch.float32)[:, None] * inv[None]
    return (angle.cos().to(torch.bfloat16).double(), angle.sin().to(torch.bfloat16).double())


def half_split_permutation(head_dim: int) -> torch.Tensor:
    return torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    # x: (S, H, hd); cos/sin: (S, hd/2)
    c, s = cos[:, None], sin[:, None]
    if layout == "interleaved":
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack([a * c - b * s, b * c + a * s], dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * c - b * s, b * c + a * s], dim=-1)


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def _block(W: dict, p: str, d, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rope: str) -> torch.Tensor:
    """One pre-norm transformer block over all positions of x (S, D), causal."""
    S = x.shape[0]
    wqkv = W[p + "attention.wqkv.weight"]
    qn, kn = (W[p + "attention.q_norm.weight"], W[p + "attention.k_norm.weight"]) if d.qk_norm else (None, None)
    if rope == "half_split_permuted":
        perm = half_split_permutation(d.head_dim)
        q_rows = wqkv[:d.q_size].view(d.n_head, d.head_dim, -1)[:, perm].reshape(d.q_size, -1)
        k_rows = wqkv[d.q_size:d.q_size + d.kv_size].view(d.n_local_heads, d.head_dim, -1)[:, perm]
        wqkv = torch.cat([q_rows, k_rows.reshape(d.kv_size, -1), wqkv[d.q_size + d.kv_size:]])
        if d.qk_norm:
            qn, kn = qn[perm], kn[perm]
    h = _rms(x, W[p + "attention_norm.weight"], d.norm_eps)
    qkv = h @ wqkv.T
    q = qkv[:, :d.q_size].view(S, d.n_head, d.head_dim)
    k = qkv[:, d.q_size:d.q_size + d.kv_size].view(S, d.n_local_heads, d.head_dim)
    v = qkv[:, d.q_size + d.kv_size:].view(S, d.n_local_heads, d.head_dim)
    if d.qk_norm:  # before RoPE
        q, k = _rms(q, qn, d.norm_eps), _rms(k, kn, d.norm_eps)
    layout = "interleaved" if rope == "interleaved" else "half_split"
    q, k = _rope(q, cos, sin, layout), _rope(k, cos, sin, layout)
    # query head j reads KV head j // group (repeat_interleave, not repeat)
    kv_of = torch.arange(d.n_head) // d.gqa_group
    att = torch.einsum("qhd,khd->hqk", q, k[:, kv_of]) / d.head_dim ** 0.5
    causal = torch.ones(S, S, dtype=torch.bool).tril()
    att = att.masked_fill(~causal, float("-inf")).softmax(-1)
    y = torch.einsum("hqk,khd->qhd", att, v[:, kv_of]).reshape(S, d.q_size)
    x = x + y @ W[p + "attention.wo.weight"].T
    h = _rms(x, W[p + "ffn_norm.weight"], d.norm_eps)
    ff = torch.nn.functional.silu(h @ W[p + "feed_forward.w1.weight"].T) * (h @ W[p + "feed_forward.w3.weight"].T)
    return x + ff @ W[p + "feed_forward.w2.weight"].T


def _check_rope(rope: str) -> None:
    if rope not in ROPE_LAYOUTS:
        raise ValueError(f"rope must be one of {ROPE_LAYOUTS}, got {rope!r}")


def slow_prefill(state: dict[str, torch.Tensor], cfg: FishConfig, prompt: torch.Tensor,
                 rope: str = "interleaved") -> dict[str, torch.Tensor]:
    """Slow AR over a (1 + num_codebooks, T) prompt from position 0, causal, no cache.

    Returns float64 `logits` (V,) and final-normed `hidden` (D,) at the last position.
    """
    _check_rope(rope)
    d = cfg.slow
    W = {k: v.double() for k, v in state.items() if k.startswith(SLOW_PREFIX) or "codebook_embeddings" in k}
    row0, codes = prompt[0], prompt[1:]
    semantic = (row0 >= cfg.semantic_begin_id) & (row0 <= cfg.semantic_end_id)
    table = W[f"{FAST_PREFIX}codebook_embeddings.weight"]
    offsets = torch.arange(cfg.num_codebooks)[:, None] * cfg.codebook_size
    vq = table[codes + offsets].sum(0) * semantic[:, None]
    x = W[f"{SLOW_PREFIX}embeddings.weight"][row0] + vq
    x = torch.where(semantic[:, None], x / cfg.semantic_scale, x)
    cos, sin = rope_table(torch.arange(prompt.shape[1]), d.head_dim, d.rope_base)
    for i in range(d.n_layer):
        x = _block(W, f"{SLOW_PREFIX}layers.{i}.", d, x, cos, sin, rope)
    out = _rms(x[-1], W[f"{SLOW_PREFIX}norm.weight"], d.norm_eps)
    return {"logits": out @ W[f"{SLOW_PREFIX}embeddings.weight"].T, "hidden": out}


def fast_frame(state: dict[str, torch.Tensor], cfg: FishConfig, hidden: torch.Tensor, codes: torch.Tensor,
               rope: str = "interleaved") -> torch.Tensor:
    """Fast AR of one frame, teacher-forced and in parallel (no cache): position 0 takes the slow
    state, position i the fast embedding of codes[i-1]. Returns float64 logits (num_codebooks, codebook_size):
    row i >= 1 predicts codes[i]; row 0 is discarded upstream (codebook 0 comes from the semantic token)."""
    _check_rope(rope)
    d = cfg.fast
    W = {k: v.double() for k, v in state.items() if k.startswith(FAST_PREFIX)}
    x = torch.cat([hidden.double()[None], W[f"{FAST_PREFIX}embeddings.weight"][codes[:cfg.num_codebooks - 1]]])
    # the fast AR uses the slow AR's rope_base (upstream builds it from the slow config)
    cos, sin = rope_table(torch.arange(cfg.num_codebooks), d.head_dim, d.rope_base)
    for i in range(d.n_layer):
        x = _block(W, f"{FAST_PREFIX}layers.{i}.", d, x, cos, sin, rope)
    return _rms(x, W[f"{FAST_PREFIX}norm.weight"], d.norm_eps) @ W[f"{FAST_PREFIX}output.weight"].T
