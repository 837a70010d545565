"""Kokoro weights: the upstream on-disk layout and its validation (synthetic checkpoints: synthetic.py).

Layout of a weights directory (identical for every source):
    config.json          upstream model config (dims, istftnet, vocab)
    kokoro-v1_0.pth      dict {bert, bert_encoder, predictor, text_encoder, decoder} of state
                         dicts, keys prefixed `module.` as in the published checkpoint
    voices/<name>.pt     (510, 1, 256) fp32 style packs

The model itself is always upstream's `kokoro.model.KModel`; this module never re-implements it.
"""
from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import torch

from anetts import imports
from anetts.models.kokoro.dsp import KOKORO

log = logging.getLogger(__name__)

CHECKPOINT_NAME = "kokoro-v1_0.pth"
CONFIG_NAME = "config.json"
VOICES_DIR = "voices"
COMPONENTS = ("bert", "bert_encoder", "predictor", "text_encoder", "decoder")
VOICE_SHAPE = (KOKORO.voice_rows, 1, KOKORO.ref_s_dim)


class WeightsError(ValueError):
    """A weights directory or checkpoint that cannot be used; the message names the culprit."""


def _quietly(build):
    with warnings.catch_warnings():
        # upstream's LSTM dropout / deprecated weight_norm warnings are noise for us
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", FutureWarning)
        return build()


def _quiet_kmodel(config: dict, checkpoint: Path):
    # kokoro.model without kokoro/__init__.py, which also imports the text pipeline (misaki, spaCy)
    (model,) = imports.submodules("kokoro", "model")
    return _quietly(lambda: model.KModel(repo_id="hexgrad/Kokoro-82M", config=config, model=str(checkpoint)).eval())


def _build_component(name: str, config: dict) -> torch.nn.Module:
    """One KModel component from upstream's own class, with the arguments `KModel.__init__` passes
    (kokoro/model.py); tests/test_weights.py checks it against KModel's."""
    if name == "predictor":  # kokoro.modules still imports transformers (for CustomAlbert)
        (modules,) = imports.submodules("kokoro", "modules")
        return modules.ProsodyPredictor(style_dim=config["style_dim"], d_hid=config["hidden_dim"],
                                        nlayers=config["n_layer"], max_dur=config["max_dur"], dropout=config["dropout"])
    if name == "decoder":  # kokoro.istftnet needs torch only
        (istftnet,) = imports.submodules("kokoro", "istftnet")
        return istftnet.Decoder(dim_in=config["hidden_dim"], style_dim=config["style_dim"], dim_out=config["n_mels"],
                                disable_complex=False, **config["istftnet"])
    raise KeyError(f"no standalone builder for KModel component {name!r}; known: predictor, decoder")


def load_components(weights_dir: Path, names: tuple[str, ...]) -> torch.nn.Module:
    """Only the KModel components `names` (attributes `predictor`, `decoder`, plus `vocab`), their
    tensors alone read from the (validated) checkpoint: a stage that runs the decoder needs neither
    ALBERT nor transformers."""
    weights_dir = Path(weights_dir)
    config = read_config(weights_dir)
    parts = torch.nn.Module()
    for name in names:
        parts.add_module(name, _quietly(lambda: _build_component(name, config)))
    # mmap: only the tensors of `names` are read from disk
    checkpoint = torch.load(weights_dir / CHECKPOINT_NAME, map_location="cpu", weights_only=True, mmap=True)
    for name in names:
        # strict: validation guarantees every tensor is there (KModel falls back to strict=False)
        getattr(parts, name).load_state_dict(_strip_module_prefix(checkpoint[name]))
    parts.vocab = config["vocab"]
    return parts.eval()


def init_kmodel(config: dict, scratch_dir: Path):
    """Upstream KModel with upstream's random init (an empty checkpoint loads nothing)."""
    empty = Path(scratch_dir) / "empty.pth"
    torch.save({}, empty)
    try:
        return _quiet_kmodel(config, empty)
    finally:
        empty.unlink(missing_ok=True)


def read_config(weights_dir: Path) -> dict:
    path = Path(weights_dir) / CONFIG_NAME
    if not path.is_file():
        raise WeightsError(f"missing weight file: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise WeightsError(f"{path} is not valid JSON: {e}") from e


def _strip_module_prefix(state: dict) -> dict:
    return {(k[7:] if k.startswith("module.") else k): v for k, v in state.items()}


def validate_checkpoint(config: dict, checkpoint: Path, scratch_dir: Path) -> None:
    """Check a checkpoint against the architecture of `config`, naming the first bad tensor.

    Upstream's loader falls back to `strict=False` and silently keeps random weights for
    anything missing, so a truncated checkpoint would otherwise build "fine".
    """
    checkpoint = Path(checkpoint)
    if not checkpoint.is_file():
        raise WeightsError(f"missing weight file: {checkpoint}")
    try:
        loaded = torch.load(checkpoint, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for corrupt files
        raise WeightsError(f"cannot read checkpoint {checkpoint}: {e}") from e
    if not isinstance(loaded, dict):
        raise WeightsError(f"{checkpoint}: expected a dict of component state dicts")
    missing = [c for c in COMPONENTS if c not in loaded]
    extra = [c for c in loaded if c not in COMPONENTS]
    if missing or extra:
        raise WeightsError(f"{checkpoint}: missing components {missing}, unexpected components {extra}")
    reference = init_kmodel(config, scratch_dir)
    for component in COMPONENTS:
        want = getattr(reference, component).state_dict()
        got = _strip_module_prefix(loaded[component])
        for name in want:
            if name not in got:
                raise WeightsError(f"{checkpoint}: missing tensor {component}.{name}")
        for name, tensor in got.items():
            full = f"{component}.{name}"
            if name not in want:
                raise WeightsError(f"{checkpoint}: unexpected tensor {full}")
            if tuple(tensor.shape) != tuple(want[name].shape):
                raise WeightsError(
                    f"{checkpoint}: tensor {full} has shape {tuple(tensor.shape)}, "
                    f"expected {tuple(want[name].shape)}"
                )
            if tensor.is_floating_point() and not torch.isfinite(tensor).all():
                raise WeightsError(f"{checkpoint}: tensor {full} contains NaN or inf")


def validate_voice(path: Path) -> torch.Tensor:
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"missing voice file: {path}")
    voice = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(voice, torch.Tensor) or tuple(voice.shape) != VOICE_SHAPE:
        shape = tuple(voice.shape) if isinstance(voice, torch.Tensor) else type(voice).__name__
        raise WeightsError(f"voice {path}: expected a tensor of shape {VOICE_SHAPE}, got {shape}")
    if not torch.isfinite(voice).all():
        raise WeightsError(f"voice {path} contains NaN or inf")
    return voice


def validate_weights_dir(weights_dir: Path, voices: list[str], scratch_dir: Path) -> dict:
    """Validate a weights directory; returns its config."""
    weights_dir = Path(weights_dir)
    config = read_config(weights_dir)
    for key in ("vocab", "n_token", "hidden_dim", "style_dim", "plbert", "istftnet"):
        if key not in config:
            raise WeightsError(f"{weights_dir / CONFIG_NAME}: missing key {key!r}")
    try:
        KOKORO.check_config(config, str(weights_dir / CONFIG_NAME))
    except ValueError as e:
        raise WeightsError(str(e)) from None
    validate_checkpoint(config, weights_dir / CHECKPOINT_NAME, scratch_dir)
    for name in voices:
        validate_voice(weights_dir / VOICES_DIR / f"{name}.pt")
    return config


def load_kmodel(weights_dir: Path):
    """Upstream KModel in eval mode from a (validated) weights directory."""
    weights_dir = Path(weights_dir)
    return _quiet_kmodel(read_config(weights_dir), weights_dir / CHECKPOINT_NAME)


def list_voices(weights_dir: Path) -> list[str]:
    return sorted(p.stem for p in (Path(weights_dir) / VOICES_DIR).glob("*.pt"))


def load_voice(weights_dir: Path, name: str) -> torch.Tensor:
    path = Path(weights_dir) / VOICES_DIR / f"{name}.pt"
    if not path.is_file():
        raise WeightsError(f"unknown voice {name!r}; available: {list_voices(weights_dir)}")
    return validate_voice(path)


def prepare_for_trace(model):
    """Fold weight norm into plain weights: same values, a simpler traced graph."""
    from torch.nn.utils import remove_weight_norm

    for module in model.modules():
        if hasattr(module, "weight_g") and hasattr(module, "weight_v"):
            remove_weight_norm(module)
    return model.eval()


def host_dsp_params(weights_dir: Path) -> dict:
    """The hn-NSF merge layer (decoder.generator.m_source.l_linear), run on the host at runtime."""
    ckpt = torch.load(Path(weights_dir) / CHECKPOINT_NAME, map_location="cpu", weights_only=True)
    dec = _strip_module_prefix(ckpt["decoder"])
    return {
        "l_linear_weight": dec["generator.m_source.l_linear.weight"].double().tolist(),
        "l_linear_bias": dec["generator.m_source.l_linear.bias"].double().tolist(),
    }
