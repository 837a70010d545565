#!/usr/bin/env python
"""Where the generator stage loses precision: fp16 rounding emulated per layer group, in torch.

The generator stage module (the one the DAG exports) runs in fp32 on a bucket's example inputs;
then again with fp16 rounding applied to the weights and outputs of the leaf modules of one
group at a time (Conv1d, ConvTranspose1d, Linear, InstanceNorm1d: roughly what fp16 compute does
at layer boundaries; inside-layer accumulation is not modelled), and with the tail (conv_post
output -> exp / sin -> inverse STFT) rounded separately. Waveform SNR on the valid region of each
variant vs fp32 shows which group caps the stage. Also reports the range of conv_post's
log-magnitude channels: exp() turns an absolute fp16 error of |x| * 2^-11 into that relative error.

    python benchmarks/generator_precision.py --model kokoro-82m-onnx --bucket 3 -o gen_precision.json
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from anetts import artifacts  # noqa: E402
from anetts.models.kokoro.impl import FAMILY  # noqa: E402

LEAVES = (nn.Conv1d, nn.ConvTranspose1d, nn.Linear, nn.InstanceNorm1d)


def half(t: torch.Tensor) -> torch.Tensor:
    return t.half().float()


@contextlib.contextmanager
def fp16_groups(module: nn.Module, prefixes: tuple[str, ...]):
    """Round weights and outputs of the leaf modules under `prefixes` to fp16, then restore."""
    saved, hooks = [], []
    for name, m in module.named_modules():
        if isinstance(m, LEAVES) and name.startswith(prefixes):
            for p in m.parameters(recurse=False):
                saved.append((p, p.detach().clone()))
                p.data = half(p.data)
            hooks.append(m.register_forward_hook(lambda _m, _i, out: half(out)))
    try:
        yield
    finally:
        for h in hooks:
            h.remove()
        for p, v in saved:
            p.data = v


@contextlib.contextmanager
def fp16_tail(module: nn.Module, exp_sin: bool):
    """Round the tail: the inverse STFT's inputs (exp / sin outputs) or nothing."""
    istft = module.istft
    real = istft.forward

    def forward(magnitude, phase, frame_mask):
        return real(half(magnitude), half(phase), frame_mask)

    if exp_sin:
        istft.forward = forward
    try:
        yield
    finally:
        istft.forward = real


def snr_db(ref, test) -> float:
    ref, test = np.asarray(ref, np.float64).ravel(), np.asarray(test, np.float64).ravel()
    err = np.sum((ref - test) ** 2)
    return float(10 * np.log10(np.sum(ref**2) / err)) if err > 0 else 200.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="kokoro-82m-onnx")
    ap.add_argument("--bucket", type=int, default=3, help="generator bucket (seconds) whose reference to use")
    ap.add_argument("-o", "--output", type=Path, required=True)
    args = ap.parse_args(argv)
    mdir = artifacts.model_dir(args.model, REPO / "artifacts")
    weights = mdir / "weights"
    stage = FAMILY.stage("generator")
    model = stage.load(weights, args.bucket)
    ref = dict(np.load(mdir / "reference" / f"{args.bucket}s.npz"))
    inputs = stage.example_inputs(model, weights, args.bucket, ref)
    module = stage.build(model)
    valid = stage.valid_regions(inputs)["waveform"][1]
    feed = [torch.from_numpy(inputs[k]) for k in ("x_pre", "ref_s", "har", "mask")]

    post: dict[str, np.ndarray] = {}
    module.conv_post.register_forward_hook(lambda _m, _i, o: post.__setitem__("x", o.detach().numpy()))

    def run() -> np.ndarray:
        with torch.no_grad():
            return module(*[f.clone() for f in feed]).numpy().reshape(-1)[:valid]

    base = run()
    bins = module.post_n_fft // 2 + 1
    n_valid = int(inputs["mask"].sum()) * 2 + 1  # conv_post frames (x2 upsampled mask, +1 reflection pad) approx
    logmag = post["x"][0, :bins, :n_valid]
    groups = {
        "all": ("",),
        "noise path (noise_convs, noise_res)": ("noise_convs", "noise_res"),
        "ups": ("ups",),
        "resblocks": ("resblocks",),
        "resblocks.0-2 (first level)": ("resblocks.0", "resblocks.1", "resblocks.2"),
        "resblocks.3-5 (second level)": ("resblocks.3", "resblocks.4", "resblocks.5"),
        "conv_post": ("conv_post",),
        "all but conv_post": ("noise_convs", "noise_res", "ups", "resblocks"),
    }
    rows = {}
    for label, prefixes in groups.items():
        with fp16_groups(module, prefixes):
            rows[label] = snr_db(base, run())
    with fp16_tail(module, exp_sin=True):
        rows["exp/sin outputs only"] = snr_db(base, run())
    with fp16_groups(module, ("",)), fp16_tail(module, exp_sin=True):
        rows["all + exp/sin outputs"] = snr_db(base, run())
    result = {
        "model": args.model, "bucket": f"{args.bucket}s", "valid_samples": int(valid),
        "snr_db_fp16_emulated": rows,
        "conv_post_logmag": {"min": float(logmag.min()), "max": float(logmag.max()),
                             "rms": float(np.sqrt(np.mean(logmag**2)))},
    }
    for k, v in rows.items():
        print(f"{k:40s} {v:6.1f} dB")
    print("conv_post log-magnitude range", result["conv_post_logmag"])
    args.output.write_text(json.dumps(result, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
