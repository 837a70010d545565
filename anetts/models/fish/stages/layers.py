"""Traceable pieces shared by the Fish AR stages: RMSNorm, interleaved RoPE from a bf16 table,
GQA attention over an fp16 KV state written at the position, and a transformer block.

Each mirrors the upstream module it replaces (fish_speech.models.text2semantic.llama) in fp32
eager, so the eager wrapper equals the reference; the differences are what tracing and Core ML
need: the KV cache is a buffer written with slice assignment at an int32 position (a Core ML
state), GQA is a reshape of the queries (query head h reads KV head h // group, upstream's
repeat_interleave) and the causal mask is computed from the position with a finite fill.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from anetts.models.fish.config import ARDims

# Masked attention scores are replaced (torch.where, not added) by this: finite in fp16, and
# exp(MASKED - max) underflows to exactly 0 in the softmax.
MASKED = -1e4
RMS_LOWERINGS = ("decomposed", "layer_norm")
# "half_split" (NeoX rotate_half on unpermuted weights) is wrong for Fish: it exists as the
# negative control that parity must reject.
ROPE_LAYOUTS = ("interleaved", "half_split")


def rope_table(positions: int, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) of shape (positions, head_dim // 2), rounded to bf16 as upstream's table is."""
    from fish_speech.models.text2semantic.llama import precompute_freqs_cis

    t = precompute_freqs_cis(positions, head_dim, base).float()  # (positions, head_dim/2, 2), bf16 values
    return t[..., 0].contiguous(), t[..., 1].contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, lowering: str = "decomposed") -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last axis.

    `layer_norm`: LayerNorm over concat(x, -x), first half kept; that concat has mean exactly 0
    and variance mean(x^2), so it is the same RMSNorm as one layer_norm op: the graph then has no
    fp16 x*x tensor, which overflows for |x| > 256."""
    if lowering == "decomposed":
        return x * torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + eps) * weight
    if lowering == "layer_norm":
        d = x.shape[-1]
        return F.layer_norm(torch.cat([x, -x], dim=-1), (2 * d,), eps=eps)[..., :d] * weight
    raise ValueError(f"unknown RMSNorm lowering {lowering!r}; choose one of {RMS_LOWERINGS}")


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs (x[2i], x[2i+1]) (GPT-J style, as upstream): x (B, T, H, hd), cos/sin (T, hd/2)."""
    b, t, h, hd = x.shape
    xs = x.reshape(b, t, h, hd // 2, 2)
    x0, x1 = xs[..., 0], xs[..., 1]
    c, s = cos.reshape(1, t, 1, hd // 2), sin.reshape(1, t, 1, hd // 2)
    return torch.stack([x0 * c - x1 * s, x1 * c + x0 * s], dim=-1).reshape(b, t, h, hd)


def apply_rope_half_split(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX layout: rotate (x[i], x[i + hd/2]); not Fish's, see ROPE_LAYOUTS."""
    b, t, h, hd = x.shape
    x0, x1 = x[..., :hd // 2], x[..., hd // 2:]
    c, s = cos.reshape(1, t, 1, hd // 2), sin.reshape(1, t, 1, hd // 2)
    return torch.cat([x0 * c - x1 * s, x1 * c + x0 * s], dim=-1)


class Block(nn.Module):
    """One pre-norm transformer block (upstream TransformerBlock) with its KV cache held by the owner."""

    def __init__(self, d: ARDims, tensors: dict[str, torch.Tensor], prefix: str, lowering: str = "decomposed",
                 rope: str = "interleaved"):
        super().__init__()
        if rope not in ROPE_LAYOUTS:
            raise ValueError(f"unknown RoPE layout {rope!r}; choose one of {ROPE_LAYOUTS}")
        self.d, self.lowering = d, lowering
        self.rope = apply_rope if rope == "interleaved" else apply_rope_half_split
        names = ["attention.wqkv.weight", "attention.wo.weight", "feed_forward.w1.weight", "feed_forward.w2.weight",
                 "feed_forward.w3.weight", "attention_norm.weight", "ffn_norm.weight"]
        if d.qk_norm:
            names += ["attention.q_norm.weight", "attention.k_norm.weight"]
        missing = [prefix + n for n in names if prefix + n not in tensors]
        if missing:
            raise KeyError(f"block {prefix}: missing tensors {missing}")
        for n in names:
            self.register_parameter(n.replace(".", "_"), nn.Parameter(tensors[prefix + n].float(), requires_grad=False))

    def norm(self, x, w):
        return rms_norm(x, w, self.d.norm_eps, self.lowering)

    def attention(self, x, cos, sin, mask, k_cache, v_cache, p):
        d = self.d
        b, t, _ = x.shape
        q, k, v = F.linear(x, self.attention_wqkv_weight).split([d.q_size, d.kv_size, d.kv_size], dim=-1)
        q = q.reshape(b, t, d.n_head, d.head_dim)
        k = k.reshape(b, t, d.n_local_heads, d.head_dim)
        v = v.reshape(b, t, d.n_local_heads, d.head_dim)
        if d.qk_norm:  # per head, before RoPE
            q = rms_norm(q, self.attention_q_norm_weight, d.norm_eps, self.lowering)
            k = rms_norm(k, self.attention_k_norm_weight, d.norm_eps, self.lowering)
        q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
        k_cache[:, :, p:p + t] = k.transpose(1, 2)
        v_cache[:, :, p:p + t] = v.transpose(1, 2)
        g = d.gqa_group
        # (B, H, T, hd) -> (B, KVH, g*T, hd): row j*T + s is query head kvh*g + j at token s
        q = q.transpose(1, 2).reshape(b, d.n_local_heads, g * t, d.head_dim)
        att = (q @ k_cache.transpose(-1, -2)) * d.head_dim ** -0.5
        att = torch.where(mask, att, torch.full_like(att, MASKED))
        y = att.softmax(-1) @ v_cache  # (B, KVH, g*T, hd)
        y = y.reshape(b, d.n_head, t, d.head_dim).transpose(1, 2).reshape(b, t, d.q_size)
        return F.linear(y, self.attention_wo_weight)

    def forward(self, x, cos, sin, mask, k_cache, v_cache, p):
        h = x + self.attention(self.norm(x, self.attention_norm_weight), cos, sin, mask, k_cache, v_cache, p)
        f = self.norm(h, self.ffn_norm_weight)
        return h + F.linear(F.silu(F.linear(f, self.feed_forward_w1_weight)) * F.linear(f, self.feed_forward_w3_weight),
                            self.feed_forward_w2_weight)


class CachedStack(nn.Module):
    """Blocks over fp16-state KV caches `k_cache_{i}` / `v_cache_{i}` (1, kv_heads, context, head_dim),
    one pair per layer. Subclasses are the traced modules: the caches are buffers of the traced
    module itself, so coremltools names the states after them."""

    def __init__(self, d: ARDims, blocks: dict[int, Block], context: int, rope_positions: int):
        super().__init__()
        self.d, self.context, self.layer_ids = d, context, list(blocks)
        self.blocks = nn.ModuleList(blocks.values())
        cos, sin = rope_table(rope_positions, d.head_dim, d.rope_base)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        for i in self.layer_ids:
            for kind in ("k", "v"):
                self.register_buffer(f"{kind}_cache_{i}", torch.zeros(1, d.n_local_heads, context, d.head_dim))

    def run_blocks(self, x, pos):
        """x (1, T, dim) at positions pos[0] .. pos[0]+T-1 (int32); caches written at those rows."""
        t = x.shape[1]
        p = pos[0]
        positions = pos + torch.arange(t, dtype=torch.int32)
        cos = torch.index_select(self.rope_cos, 0, positions)
        sin = torch.index_select(self.rope_sin, 0, positions)
        keys = torch.arange(self.context, dtype=torch.int32)
        mask = keys[None, :] <= positions[:, None]  # (T, context): causal, and hides unwritten rows
        mask = mask.repeat(self.d.gqa_group, 1)  # rows follow the grouped queries (j*T + s)
        for i, block in zip(self.layer_ids, self.blocks):
            x = block(x, cos, sin, mask, getattr(self, f"k_cache_{i}"), getattr(self, f"v_cache_{i}"), p)
        return x
