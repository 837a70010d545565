"""Stage `duration`: token ids → durations and the per-token features later stages align.

Upstream modules: bert, bert_encoder, predictor.text_encoder (DurationEncoder), predictor.lstm,
predictor.duration_proj, text_encoder. Packed BiLSTMs become `MaskedBiLSTM`s.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from anetts.models.kokoro.masked import MaskedBiLSTM
from anetts.models.kokoro.reference import FILL, example_token_ids, voice_row
from anetts.models.kokoro.dsp import KOKORO
from anetts.models.kokoro.stages.base import EXAMPLE_VOICE, KokoroStage
from anetts.tensors import MAIN_FUNCTION, FunctionSpec, TensorSpec


class DurationModule(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.bert = model.bert
        self.bert_encoder = model.bert_encoder
        enc = model.predictor.text_encoder
        # DurationEncoder alternates LSTM and AdaLayerNorm blocks
        self.enc_blocks = nn.ModuleList(MaskedBiLSTM(b) if isinstance(b, nn.LSTM) else b for b in enc.lstms)
        self.pred_lstm = MaskedBiLSTM(model.predictor.lstm)
        self.duration_proj = model.predictor.duration_proj
        te = model.text_encoder
        self.embedding, self.cnn, self.te_lstm = te.embedding, te.cnn, MaskedBiLSTM(te.lstm)

    def duration_encoder(self, d_en, s, m_btc):
        """Upstream DurationEncoder.forward; d_en (1,512,T) → (1,T,640)."""
        steps = d_en.shape[-1]
        s_t = s.unsqueeze(1).expand(-1, steps, -1)  # (1,T,128)
        x = torch.cat([d_en.transpose(1, 2), s_t], dim=-1) * m_btc  # (1,T,640)
        for block in self.enc_blocks:
            if isinstance(block, MaskedBiLSTM):
                x = block(x, m_btc)  # (1,T,512)
            else:
                x = block(x, s)  # AdaLayerNorm over channels, (1,T,C) in and out
                x = torch.cat([x, s_t], dim=-1) * m_btc
        return x

    def text_encoder(self, input_ids, m_bct, m_btc):
        """Upstream TextEncoder.forward; → t_en (1,512,T)."""
        x = self.embedding(input_ids).transpose(1, 2) * m_bct
        for block in self.cnn:
            x = block(x) * m_bct
        x = self.te_lstm(x.transpose(1, 2), m_btc)
        return x.transpose(1, 2)

    def forward(self, input_ids, ref_s, speed, attention_mask):
        m = attention_mask.to(torch.float32)
        m_btc, m_bct = m.unsqueeze(-1), m.unsqueeze(1)
        bert = self.bert(input_ids, attention_mask=attention_mask)
        d_en = self.bert_encoder(bert).transpose(-1, -2)
        s = ref_s[:, KOKORO.style_dim:]
        d = self.duration_encoder(d_en, s, m_btc)
        x = self.pred_lstm(d, m_btc)
        logits = self.duration_proj(x)
        duration = torch.sigmoid(logits).sum(dim=-1) / speed
        pred_dur = (torch.clamp(torch.round(duration), min=1.0) * m).to(torch.int32)
        t_en = self.text_encoder(input_ids, m_bct, m_btc)
        # `+ 0`: BNNS rejects a tensor that is both a model input and output
        return pred_dur, d, t_en, s, ref_s + 0


class DurationStage(KokoroStage):
    name = "duration"
    description = "Kokoro duration predictor and text encoders (ALBERT + prosody LSTMs)"

    def function(self, size: int) -> FunctionSpec:
        t = size
        return FunctionSpec(
            MAIN_FUNCTION,
            inputs=(
                TensorSpec("input_ids", (1, t), "int32", "token ids wrapped with 0 at both ends, zero padded"),
                TensorSpec("ref_s", (1, KOKORO.ref_s_dim), "float32", "voice style row voice[len(phonemes)-1]"),
                TensorSpec("speed", (1,), "float32", "speaking rate; durations are divided by it"),
                TensorSpec("attention_mask", (1, t), "int32", "1 for real tokens, 0 for padding"),
            ),
            outputs=(
                TensorSpec("pred_dur", (1, t), "int32", "frames per token (40 frames/s), 0 on padding"),
                TensorSpec("d", (1, t, 640), "float32", "prosody features per token"),
                TensorSpec("t_en", (1, 512, t), "float32", "text encoder features per token"),
                TensorSpec("s", (1, KOKORO.style_dim), "float32", "prosody style ref_s[:, style_dim:]"),
                TensorSpec("ref_s_out", (1, KOKORO.ref_s_dim), "float32", "ref_s passed through"),
            ),
        )

    def valid_regions(self, inputs) -> dict:
        n = int(inputs["attention_mask"].sum())
        return {"pred_dur": (1, n), "d": (1, n), "t_en": (2, n), "s": None, "ref_s_out": None}

    def build(self, model) -> nn.Module:
        return DurationModule(model).eval()

    def example_inputs(self, model, weights_dir: Path, size: int, reference=None) -> dict[str, np.ndarray]:
        from anetts.models.kokoro.weights import list_voices, load_voice

        voices = list_voices(weights_dir)
        voice = load_voice(weights_dir, EXAMPLE_VOICE if EXAMPLE_VOICE in voices else voices[0])
        ids = example_token_ids(model.vocab, max(3, int(FILL * size)))
        input_ids = np.zeros((1, size), np.int32)
        input_ids[0, : len(ids)] = ids
        mask = (np.arange(size) < len(ids)).astype(np.int32)[None]
        return {
            "input_ids": input_ids,
            "ref_s": voice_row(voice, len(ids)).numpy().astype(np.float32),
            "speed": np.ones((1,), np.float32),
            "attention_mask": mask,
        }
