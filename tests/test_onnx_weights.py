"""The `onnx` weights source: a tiny Kokoro graph exported and dynamically quantized here, mapped back.

The graph is made the way the published int8 export was: torch's TorchScript ONNX exporter
(weight norm folds into anonymous effective weights), then onnxruntime's `quantize_dynamic`
(MatMulInteger, ConvInteger, DynamicQuantizeLSTM, `<w>_quantized` / `_scale` / `_zero_point`).
Node scopes are renamed to the published export's (this torch names only the leaf module,
`/lstm/LSTM_quant`; the published file has `/encoder/predictor/lstm/LSTM_quant`).
"""
from __future__ import annotations

import copy
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from onnxruntime.quantization import QuantType, quantize_dynamic

from anetts.models.kokoro import onnx_weights as O
from anetts.models.kokoro import weights as W
from anetts.weights import materialize_weights

# leaf scope of this torch's exporter -> the published export's scope (examples from that file:
# /encoder/F0.1/conv1x1/Conv_quant, /encoder/shared/LSTM_quant, /decoder/decoder/generator/ups.1/...)
SCOPES = {
    "embedding": "encoder/text_encoder/embedding",
    "bert_encoder": "encoder/bert_encoder",
    "lstm": "encoder/predictor/lstm",
    "duration_proj": "encoder/predictor/duration_proj",
    "shared": "encoder/shared",
    "F0_proj": "encoder/F0_proj",
    "N_proj": "encoder/N_proj",
    "ups.1": "decoder/decoder/generator/ups.1",
    "conv_post": "decoder/decoder/generator/conv_post",
}


class _Enc(torch.nn.Module):
    def __init__(self, km):
        super().__init__()
        self.predictor, self.bert_encoder, self.text_encoder = km.predictor, km.bert_encoder, km.text_encoder


class _Dec(torch.nn.Module):
    def __init__(self, km):
        super().__init__()
        self.decoder = km.decoder


class Slice(torch.nn.Module):
    """Upstream modules of every weight kind, at their upstream attribute paths."""

    def __init__(self, km):
        super().__init__()
        self.encoder, self.decoder = _Enc(km), _Dec(km)

    def forward(self, tokens, bert, en, style):
        p, g = self.encoder.predictor, self.decoder.decoder.generator
        emb = self.encoder.text_encoder.embedding(tokens)  # Gather
        d_en = self.encoder.bert_encoder(bert)  # MatMul (non-square Linear)
        x, _ = p.lstm(en.transpose(1, 2))  # bidirectional LSTM
        dur = p.duration_proj(x)
        f0, n = p.F0Ntrain(en, style)  # shared LSTM, weight-norm convs, ConvTranspose pool, conv1x1, AdaIN fc
        up = F.interpolate(en[:, :256], scale_factor=2.0)
        post = g.conv_post(F.leaky_relu(g.ups[1](F.leaky_relu(up, 0.1)), 0.1))  # weight-norm ConvTranspose, Conv
        return emb, d_en, dur, f0, n, post


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(1, 170, (1, 12), generator=g), torch.randn(1, 12, 64, generator=g),
            torch.randn(1, 640, 12, generator=g), torch.randn(1, 128, generator=g))


@pytest.fixture(scope="module")
def exported(tiny_model, tmp_path_factory):
    """(upstream slice, its fp32 state, int8 ONNX path, fp32 ONNX path)."""
    tmp = tmp_path_factory.mktemp("onnx")
    model = Slice(tiny_model).eval()
    fp32, int8 = tmp / "slice.onnx", tmp / "slice.int8.onnx"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, _inputs(), str(fp32), dynamo=False, opset_version=17,
                          input_names=["tokens", "bert", "en", "style"])
    m = onnx.load(str(fp32))
    for node in m.graph.node:
        parts = node.name.split("/")
        if len(parts) > 2:
            node.name = "/" + "/".join([SCOPES.get(parts[1], f"encoder/{parts[1]}"), *parts[2:]])
    onnx.save(m, str(fp32))
    quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QInt8)
    return model, fp32, int8


def _state(model) -> dict[str, torch.Tensor]:
    """The slice's tensors keyed like the upstream checkpoint (`component.rest`)."""
    out = {}
    for comp, mod in (("predictor", model.encoder.predictor), ("bert_encoder", model.encoder.bert_encoder),
                      ("text_encoder", model.encoder.text_encoder), ("decoder", model.decoder.decoder)):
        out.update({f"{comp}.{k}": v for k, v in mod.state_dict().items()})
    return out


def _effective(state, key):
    """weight_norm's weight from (g, v), as the export folds it."""
    base = key.rsplit(".", 1)[0]
    v, g = state[f"{base}.weight_v"].double(), state[f"{base}.weight_g"].double()
    return (g * v / v.flatten(1).norm(dim=1).reshape(-1, *[1] * (v.dim() - 1))).float()


USED = ("text_encoder.embedding.", "bert_encoder.", "predictor.lstm.", "predictor.duration_proj.", "predictor.shared.",
        "predictor.F0.", "predictor.N.", "predictor.F0_proj.", "predictor.N_proj.", "decoder.generator.ups.1.",
        "decoder.generator.conv_post.")


@pytest.mark.parametrize("kind", ["int8", "fp32"])
def test_every_tensor_maps_back_within_the_quantization_step(exported, kind):
    model, fp32, int8 = exported
    state, _ = O.extract_state(O._Graph(int8 if kind == "int8" else fp32))
    named = O._Graph(fp32).init
    want = _state(model)
    used = [k for k in want if k.startswith(USED) and not k.endswith((".norm.weight", ".norm.bias"))]
    assert len(used) > 60
    for key in used:
        if key.endswith(".weight_g"):
            continue  # compared through the effective weight below
        if key.endswith(".weight_v"):
            ref = _effective(want, key)
            base = key.rsplit(".", 1)[0]
            got = _effective({f"{base}.weight_v": torch.from_numpy(state[key]),
                              f"{base}.weight_g": torch.from_numpy(state[f"{base}.weight_g"])}, key)
        else:
            assert key in state or O.onnx_name(key) in named, f"{key} not found"
            ref = want[key]
            got = torch.from_numpy(state[key]) if key in state else None
            if got is None:
                continue  # a plain fp32 initializer by name: checked in the end-to-end test
        assert tuple(got.shape) == tuple(ref.shape), key
        # symmetric int8: the rounding error is at most half a step, step = max|w| / 127 per tensor
        # (per channel / direction it is smaller); fp32 maps back exactly up to weight-norm roundoff
        step = float(ref.abs().max()) / 127 if kind == "int8" else 2e-5 * float(ref.abs().max())
        err = float((got - ref).abs().max())
        assert err <= 0.5 * step * 1.01 + 1e-7, f"{key}: error {err:.3g} > half step {0.5 * step:.3g}"


def test_upstream_forward_with_mapped_weights_matches_onnxruntime(exported):
    """Gate order, directions, transposes and weight norm all show up in the outputs: every mapped
    tensor of a copy is scrambled first, so a tensor the mapping misses cannot pass."""
    model, fp32, _ = exported
    graph = O._Graph(fp32)
    state, _ = O.extract_state(graph)
    mapped = copy.deepcopy(model)
    comps = {"predictor": mapped.encoder.predictor, "bert_encoder": mapped.encoder.bert_encoder,
             "text_encoder": mapped.encoder.text_encoder, "decoder": mapped.decoder.decoder}
    gen = torch.Generator().manual_seed(5)
    restored = 0
    for comp, mod in comps.items():
        sd = mod.state_dict()
        for k in sd:
            key = f"{comp}.{k}"
            if not key.startswith(USED) or key.endswith((".norm.weight", ".norm.bias")):
                continue
            if key in state:
                sd[k] = torch.from_numpy(state[key]).reshape(sd[k].shape)
            elif O.onnx_name(key) in graph.init:
                sd[k] = torch.from_numpy(np.array(graph.init[O.onnx_name(key)])).reshape(sd[k].shape)
            else:
                sd[k] = torch.randn(sd[k].shape, generator=gen)  # missed by the mapping: garbage
                continue
            restored += 1
        mod.load_state_dict(sd)
    assert restored > 60
    inputs = _inputs(seed=1)
    feeds = dict(zip(["tokens", "bert", "en", "style"], [t.numpy() for t in inputs]))
    with torch.no_grad():
        ours = [t.numpy() for t in mapped(*inputs)]
    theirs = ort.InferenceSession(str(fp32), providers=["CPUExecutionProvider"]).run(None, feeds)
    for name, a, b in zip(["emb", "d_en", "dur", "f0", "n", "post"], ours, theirs):
        snr = 10 * np.log10(np.sum(b.astype(np.float64) ** 2) / max(np.sum((a - b).astype(np.float64) ** 2), 1e-30))
        assert snr > 80, f"{name}: upstream with mapped fp32 weights vs onnxruntime {snr:.1f} dB"


def test_materialize_onnx_source_builds_a_valid_weights_dir(exported, tiny_weights, tmp_path):
    """The whole pipeline on an export that lacks most of the model names the first missing tensor;
    the voice pack and sha256 pin are checked."""
    _, fp32, _ = exported
    pack = tmp_path / "voices.npz"
    voice = torch.load(tiny_weights / "voices" / "syn_a.pt", weights_only=True).numpy()
    np.savez(pack, syn_a=voice)
    src = {"source": "onnx", "model": str(fp32), "voices_path": str(pack), "voices": ["syn_a"],
           "config": str(tiny_weights / W.CONFIG_NAME)}
    with pytest.raises(W.WeightsError, match=r"no initializer for upstream tensor bert\.embeddings"):
        materialize_weights("kokoro", src, tmp_path / "w")
    assert not (tmp_path / "w").exists()
    with pytest.raises(W.WeightsError, match="does not match the pinned"):
        materialize_weights("kokoro", {**src, "sha256": "0" * 64}, tmp_path / "w")
    with pytest.raises(W.WeightsError, match=r"voice 'nobody' is not in"):
        O._voices_from(pack, ["nobody"], tmp_path / "v")


def test_missing_initializer_is_named(exported, tmp_path):
    _, _, int8 = exported
    m = onnx.load(str(int8))
    lstm = next(n for n in m.graph.node if n.op_type == "DynamicQuantizeLSTM")
    gone = lstm.input[8]  # W scale
    keep = [t for t in m.graph.initializer if t.name != gone]
    del m.graph.initializer[:]
    m.graph.initializer.extend(keep)
    bad = tmp_path / "bad.onnx"
    onnx.save(m, str(bad))
    with pytest.raises(O.OnnxWeightsError, match=f"missing initializer '{gone}'"):
        O.extract_state(O._Graph(bad))


def test_scope_to_module():
    assert O.scope_to_module("/encoder/F0.1/conv1x1/Conv_quant") == "predictor.F0.1.conv1x1"
    assert O.scope_to_module("/encoder/text_encoder/cnn.0/cnn.0.0/Conv_quant") == "text_encoder.cnn.0.0"
    assert O.scope_to_module("/decoder/decoder/asr_res/asr_res.0/Conv_quant") == "decoder.asr_res.0"
    assert O.scope_to_module(
        "/encoder/bert/encoder/albert_layer_groups.0/albert_layers.0/attention/query_3/MatMul_quant"
    ) == "bert.encoder.albert_layer_groups.0.albert_layers.0.attention.query"
    assert O.scope_to_module("/Transpose") is None


def test_onnx_weights_have_their_own_code_inputs():
    """Editing synthetic-only code (weight statistics, calibration) must not rebuild ONNX weights;
    replacing the ONNX file or the voice pack must."""
    import yaml

    from anetts.workflow import WorkflowConfig

    cfg = yaml.safe_load((Path(__file__).resolve().parents[1] / "config.yaml").read_text())
    wf = WorkflowConfig(cfg)
    onnx_code, synthetic_code = wf.weights_code("kokoro-82m-onnx"), wf.weights_code("kokoro-tiny")
    assert any(p.endswith("onnx_weights.py") for p in onnx_code)
    assert not any(p.endswith(("weight_stats.json", "reference.py")) for p in onnx_code)
    assert any(p.endswith("weight_stats.json") for p in synthetic_code)
    assert not any(p.endswith("onnx_weights.py") for p in synthetic_code)
    src = cfg["models"]["kokoro-82m-onnx"]["weights"]
    assert wf.weights_inputs("kokoro-82m-onnx") == [src["model"], src["voices_path"]]
    assert wf.weights_inputs("kokoro-tiny") == []


def test_schema_accepts_the_onnx_entry_and_rejects_a_bad_pin():
    import jsonschema
    import yaml

    root = Path(__file__).resolve().parents[1]
    schema = yaml.safe_load((root / "schemas" / "config.schema.yaml").read_text())
    cfg = yaml.safe_load((root / "config.yaml").read_text())
    jsonschema.validate(cfg, schema)
    cfg["models"]["kokoro-82m-onnx"]["weights"]["sha256"] = "not-a-sha"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(cfg, schema)
