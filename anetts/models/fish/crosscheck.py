"""The second, independent S2 implementation: mlx-audio 0.6.2's native `fish_qwen3_omni` port (MIT).

mlx-audio implements S2 itself (nested config, checkpoint names, final-normed fast input, the
semantic-id range), so greedy codes equal to `reference.py`'s prove the fish-speech adaptation
layer right. It runs on Linux with the `mlx-cpu` wheel. Weights are upcast to fp32 on both sides.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from anetts.models.fish.config import CONFIG_NAME
from anetts.models.fish.weights import read_config, shard_files


def load_mlx_model(weights_dir: Path):
    import mlx.core as mx
    from mlx_audio.tts.models.fish_qwen3_omni import Model, ModelConfig

    weights_dir = Path(weights_dir)
    model = Model(ModelConfig.from_dict(json.loads((weights_dir / CONFIG_NAME).read_text(encoding="utf-8"))))
    raw = {}
    for shard in shard_files(weights_dir):
        raw.update({k: v.astype(mx.float32) for k, v in mx.load(str(weights_dir / shard)).items()})
    model.load_weights(list(model.sanitize(raw).items()), strict=True)
    return model.model


def mlx_decode(weights_dir: Path, prompt: np.ndarray, n_frames: int) -> dict:
    """Greedy decode with the same bias and feedback as reference.reference_decode."""
    import mlx.core as mx

    cfg = read_config(weights_dir)
    m = load_mlx_model(weights_dir)
    bias = np.full(cfg.slow.vocab_size, -np.inf, dtype=np.float32)
    bias[cfg.semantic_begin_id:cfg.semantic_end_id + 1] = 0.0
    bias[cfg.im_end_id] = 0.0
    cache = m.make_cache()
    x = mx.array(prompt[None].astype(np.int32))
    out = {"slow_logits": [], "semantic_tokens": [], "codes": [], "fast_logits": []}
    for _ in range(n_frames):
        r = m(x, cache=cache)
        logits = np.array(r.logits[0, -1].astype(mx.float32))
        hidden = r.hidden_states[:, -1]
        token = int(np.argmax(logits + bias))
        codes = [min(max(token - cfg.semantic_begin_id, 0), cfg.codebook_size - 1)]
        fast_cache = m.make_fast_cache()
        fast_logits = [np.array(m.fast_forward_cached(hidden, fast_cache)[0])]
        h = m.fast_embeddings(mx.array([codes[0]]))
        for _ in range(1, cfg.num_codebooks):
            fl = np.array(m.fast_forward_cached(h, fast_cache)[0])
            fast_logits.append(fl)
            codes.append(int(np.argmax(fl)))
            h = m.fast_embeddings(mx.array([codes[-1]]))
        out["slow_logits"].append(logits)
        out["semantic_tokens"].append(token)
        out["codes"].append(codes)
        out["fast_logits"].append(np.stack(fast_logits))
        x = mx.array([token, *codes], dtype=mx.int32).reshape(1, -1, 1)
    return {k: np.asarray(v) for k, v in out.items()}
