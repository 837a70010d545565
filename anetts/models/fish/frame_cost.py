"""The weight bytes one generated Fish frame reads, and the floor they put on ms/frame.

A decode step is memory-bound at batch 1: per frame the slow AR reads every layer once, the
restricted LM head (in the last slow chunk) once, and the fast AR all its layers and its output
head once per codebook (10 passes; its input embedding is a one-row gather). `frame_bytes` counts those bytes from a
`FishConfig`, per weight tensor as Core ML stores it — fp16, or under a variant's compression
settings (`anetts.compile.compress.resolve_settings`) — so a variant can be projected at S2 Pro
size without building it. `projection` turns bytes into ms/frame at a fraction of each chip's peak
memory bandwidth; only a Mac can say how close a real run comes. `stage_file_bytes` counts the same
tensors per package file, so the workflow refuses a chunk count whose files are too large before
anything is converted.
"""
from __future__ import annotations

import math
from pathlib import Path

FRAME_MS = 2048 / 44100 * 1000  # one frame is 2048 samples at 44.1 kHz: 46.44 ms of audio
# peak unified-memory bandwidth (GB/s), Apple's published figures per chip
BANDWIDTH_GBS = {"M1": 68, "M4 Pro": 273, "M2 Max": 400}
EFFECTIVE = 0.75  # fraction of peak a memory-bound decode step is assumed to reach
FP16 = 2
# what a frame reads, by the stage that holds it: slow chunks, the fast AR (x codebooks); the
# restricted head, in the last slow chunk and fp16 in every variant, is counted on its own (`lm_head`)
GROUPS = {"slow_chunk": "slow_chunks", "fast_ar": "fast_ar_x10"}


def tensor_bytes(rows: int, cols: int, settings: dict | None = None) -> int:
    """Stored bytes of one (rows = output channels) x cols weight, fp16 or compressed.

    Mirrors what coremltools writes: a tensor is compressed only above `weight_threshold`
    elements; linear quantization keeps one fp16 scale per tensor / output channel / block (and an
    offset of the weight's dtype when asymmetric); palettization keeps `nbits` per element plus an
    fp16 LUT per tensor or per group of `group_size` output channels."""
    n = rows * cols
    if settings is None or n <= settings["weight_threshold"]:
        return n * FP16
    if settings["mode"] == "linear":
        bits = 8 if settings["dtype"] in ("int8", "uint8") else 4
        scales = {"per_tensor": 1, "per_channel": rows,
                  "per_block": rows * math.ceil(cols / settings["block_size"])}[settings["granularity"]]
        offsets = 0 if settings["symmetric"] else math.ceil(scales * bits / 8)
        return math.ceil(n * bits / 8) + scales * FP16 + offsets
    if settings["granularity"] == "per_grouped_channel" and rows % settings["group_size"]:
        # coremltools leaves such a weight uncompressed; the compress rule refuses the setting
        raise ValueError(f"group_size {settings['group_size']} does not divide {rows} output channels")
    luts = 1 if settings["granularity"] == "per_tensor" else rows // settings["group_size"]
    return math.ceil(n * settings["nbits"] / 8) + luts * (2 ** settings["nbits"]) * FP16


def _layer_tensors(d) -> list[tuple[int, int]]:
    """(rows, cols) of one transformer layer's matrices, fish-speech's layout (fused wqkv)."""
    return [(d.q_size + 2 * d.kv_size, d.dim), (d.dim, d.q_size),
            (d.intermediate_size, d.dim), (d.intermediate_size, d.dim), (d.dim, d.intermediate_size)]


def _layer_vectors(d) -> int:
    """Elements of one layer's norm weights (two RMSNorms, and q/k norms where the config has them)."""
    return 2 * d.dim + (2 * d.head_dim if d.qk_norm else 0)


def frame_bytes(cfg, settings: dict[str, dict | None] | None = None) -> dict[str, int]:
    """Weight bytes per generated frame, by group (`GROUPS`, and the head), with `settings[stage]`
    (declared stage names: slow_chunk, fast_ar) compressing that stage's tensors; absent or None:
    fp16. The head stays fp16 (`head_bytes`).
    Norm vectors stay fp16 (rank 1: coremltools never compresses them); the RoPE tables, a row
    gathered per position, are not counted."""
    settings = settings or {}
    s, f = cfg.slow, cfg.fast

    def stage(name, matrices, vectors):
        return sum(tensor_bytes(r, c, settings.get(name)) for r, c in matrices) + vectors * FP16

    slow = stage("slow_chunk", _layer_tensors(s) * s.n_layer, s.n_layer * _layer_vectors(s) + s.dim)
    head = head_bytes(cfg)
    fast_pass = stage("fast_ar", [*_layer_tensors(f) * f.n_layer, (cfg.codebook_size, f.dim)],
                      f.n_layer * _layer_vectors(f) + f.dim)
    return {"slow_chunks": slow, "lm_head": head, "fast_ar_x10": cfg.num_codebooks * fast_pass}


def head_bytes(cfg) -> int:
    """fp16 bytes of the restricted head (semantic ids + <|im_end|>) the last slow chunk holds: no
    variant compresses it (`anetts.models.fish.stages.slow_chunk.HEAD_WEIGHT`)."""
    return (cfg.n_semantic + 1) * cfg.slow.dim * FP16


def projection(bytes_per_frame: dict[str, int]) -> dict:
    """ms/frame and the real-time factor ceiling per chip for these bytes."""
    total = sum(bytes_per_frame.values())
    out = {}
    for chip, bw in BANDWIDTH_GBS.items():
        ms = total / (bw * 1e9 * EFFECTIVE) * 1e3
        out[chip] = {"bandwidth_gbs": bw, "ms_per_frame": round(ms, 3), "rtfx_ceiling": round(FRAME_MS / ms, 2)}
    return out


def variant_frame_cost(weights_dir, settings: dict[str, dict | None], weight_bytes: dict[str, int]) -> dict:
    """A built variant's bytes per frame — measured from its packages' weight files (the fast AR's
    embedding table, gathered a row at a time, taken out) and modelled by `frame_bytes` — and the
    measured bytes' projection. `settings` and `weight_bytes` are keyed by stage instance."""
    from pathlib import Path

    from anetts.models.fish.config import CONFIG_NAME, FishConfig

    cfg = FishConfig.from_json(Path(weights_dir) / CONFIG_NAME)
    declared = {}
    for stage, s in settings.items():
        group = next((d for d in GROUPS if stage.startswith(d)), None)  # the codec reads no weights per AR step
        if group is not None:
            declared.setdefault(group, s)
    fast = declared.get("fast_ar")
    # the code embedding is a gather's table: compressed with the stage unless gathers are excluded
    table = tensor_bytes(cfg.codebook_size, cfg.fast.dim, None if fast and "gather" in fast["exclude_op_types"] else fast)
    head = head_bytes(cfg)
    measured = {
        "slow_chunks": sum(b for s, b in weight_bytes.items() if s.startswith("slow_chunk")) - head,
        "lm_head": head,
        "fast_ar_x10": cfg.num_codebooks * (weight_bytes["fast_ar"] - table),
    }
    return {"bytes_per_frame": measured, "total_bytes_per_frame": sum(measured.values()),
            "modelled_bytes_per_frame": frame_bytes(cfg, declared), "effective_bandwidth": EFFECTIVE,
            "projection": projection(measured)}


def _known_config(weights: dict, weights_dir: Path):
    """The model's FishConfig where it is known before the weights job: a synthetic preset's, or the
    config.json of a local checkpoint or of one already downloaded; else None."""
    from anetts.models.fish.config import CONFIG_NAME, FishConfig
    from anetts.models.fish.presets import preset

    if weights["source"] == "synthetic":
        return FishConfig.from_dict(preset(weights["preset"]).config, f"preset {weights['preset']}")
    where = Path(weights["path"]).expanduser() if weights["source"] == "local" else Path(weights_dir)
    return FishConfig.from_json(where / CONFIG_NAME) if (where / CONFIG_NAME).is_file() else None


def stage_file_bytes(weights: dict, weights_dir: Path, settings: dict[str, dict]) -> dict[str, int] | None:
    """Weight bytes of each AR stage's package file (`FamilyDecl.file_bytes`), from the config alone:
    each slow chunk's layers (and the final norm and the restricted head in the last), the fast AR with
    its code embedding and output head, at the stage's precision (fp32: 4 bytes, else 2). The codec
    is not counted (it has no config.json geometry). None: the config is not known yet."""
    from anetts.models.fish.config import chunk_bounds
    from anetts.models.fish.family import DECLARATION

    cfg = _known_config(weights, weights_dir)
    if cfg is None:
        return None
    s, f = cfg.slow, cfg.fast

    def stored(stage: str, elements: int) -> int:
        return elements * (4 if settings[stage].get("precision") == "fp32" else FP16)

    layer = sum(r * c for r, c in _layer_tensors(s)) + _layer_vectors(s)
    chunks = DECLARATION.stages["slow_chunk"].instances(settings["slow_chunk"])
    try:
        bounds = chunk_bounds(s.n_layer, len(chunks))
    except ValueError as e:
        raise ValueError(f"stages.slow_chunk.chunks = {len(chunks)}: {e}") from None
    last = s.dim + (cfg.n_semantic + 1) * s.dim  # the final norm and the restricted head
    out = {name: stored("slow_chunk", (b - a) * layer + (last if b == s.n_layer else 0))
           for name, (a, b) in zip(chunks, bounds)}
    fast = f.n_layer * (sum(r * c for r, c in _layer_tensors(f)) + _layer_vectors(f)) + f.dim
    out["fast_ar"] = stored("fast_ar", fast + 2 * cfg.codebook_size * f.dim)  # + code embedding, output head
    return out
