"""What the Fish runtime reads besides packages: the tokenizer, the config and the input embedding.

The slow AR's 11-row input embedding (`embeddings[row0] + Σ codebook_embeddings[code_i + i·4096]`,
÷√11 at semantic positions) runs on the host from fp16 tables, not as a Core ML stage: per token it
reads 11 rows (11 × dim × 2 B = 56 KB at S2 Pro size), a gather the host does in microseconds, while a
Core ML stage would have to hold both tables (1.0 GB at S2 Pro size, half of a macOS package's
budget) to read those same rows, and a gather over a 155,776-row table is not an ANE op.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from anetts.models.fish.config import CONFIG_NAME, FishConfig
from anetts.models.fish.tokenizer import TOKENIZER_NAME

EMBEDDINGS = "embeddings.fp16.npy"  # (vocab, dim) slow-AR text/semantic embedding
CODEBOOK_EMBEDDINGS = "codebook_embeddings.fp16.npy"  # (num_codebooks * codebook_size, dim)


def write_runtime_assets(weights_dir: Path, out_dir: Path) -> list[str]:
    import torch

    from anetts.models.fish.loader import load_tensors
    from anetts.models.fish.weights import FAST_PREFIX, SLOW_PREFIX

    weights_dir, out_dir = Path(weights_dir), Path(out_dir)
    for name in (CONFIG_NAME, TOKENIZER_NAME):
        shutil.copyfile(weights_dir / name, out_dir / name)
    names = {EMBEDDINGS: f"{SLOW_PREFIX}embeddings.weight", CODEBOOK_EMBEDDINGS: f"{FAST_PREFIX}codebook_embeddings.weight"}
    for file, tensor in names.items():
        t = load_tensors(weights_dir, [tensor])[tensor]
        np.save(out_dir / file, t.to(torch.float16).numpy())
        del t
    return [CONFIG_NAME, TOKENIZER_NAME, *names]


class InputEmbedding:
    """The slow AR's input embedding from the fp16 assets (memory-mapped: only the rows read are paged in)."""

    def __init__(self, cfg: FishConfig, text_table: Path, codebook_table: Path):
        self.cfg = cfg
        self.text = np.load(text_table, mmap_mode="r")
        self.codebooks = np.load(codebook_table, mmap_mode="r")

    @classmethod
    def from_dir(cls, assets_dir: Path) -> "InputEmbedding":
        assets_dir = Path(assets_dir)
        return cls(FishConfig.from_json(assets_dir / CONFIG_NAME), assets_dir / EMBEDDINGS,
                   assets_dir / CODEBOOK_EMBEDDINGS)

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        """rows (1 + num_codebooks, T) ids -> (T, dim) float32."""
        cfg = self.cfg
        rows = np.asarray(rows, np.int64)
        x = self.text[rows[0]].astype(np.float32)
        offsets = (np.arange(cfg.num_codebooks) * cfg.codebook_size)[:, None]
        vq = self.codebooks[(rows[1:] + offsets).reshape(-1)].astype(np.float32)
        vq = vq.reshape(cfg.num_codebooks, rows.shape[1], -1).sum(axis=0)
        semantic = (rows[0] >= cfg.semantic_begin_id) & (rows[0] <= cfg.semantic_end_id)
        x[semantic] = (x[semantic] + vq[semantic]) / np.float32(cfg.semantic_scale)
        return x
