"""The generator body over a sequence folded into rows with halos and upsampled by sub-pixel
convolutions (anetts.models.kokoro.fold, .subpixel) equals the whole run over every valid frame; a
halo short of the body's reach does not."""
from __future__ import annotations

import copy
import functools
import json
import re
import shutil

import numpy as np
import pytest
import torch
import yaml

from anetts.models.kokoro.dsp import KOKORO, spectrum_to_audio
from anetts.models.kokoro.fold import HALO, MAX_AXIS, FoldGeometry, halo_frames
from anetts.models.kokoro.reference import example_for_seconds
from anetts.models.kokoro.stages.base import EXAMPLE_VOICE
from anetts.models.kokoro.stages.generator import FoldedBody, GeneratorModule, GeneratorStage
from anetts.models.kokoro.subpixel import SubPixelConv

from workflow_helpers import run_snakemake

SECONDS = 7  # 560 frames at 80 Hz: three rows, so two row boundaries inside the sequence


@functools.cache
def _reference(model, weights_dir):
    """Upstream's stage-boundary tensors for the example (one upstream run for the module)."""
    return example_for_seconds(model, weights_dir, SECONDS, EXAMPLE_VOICE)


@pytest.fixture(scope="module")
def body_run(tiny_model, tiny_weights):
    """A float64 copy of the model, the example inputs and the whole body's conv_post output."""
    inputs = GeneratorStage().example_inputs(tiny_model, tiny_weights, SECONDS, reference=_reference(tiny_model, tiny_weights))
    inputs = {k: v.astype(np.float64) for k, v in inputs.items()}
    model = copy.deepcopy(tiny_model).double()  # the session's model stays float32
    t = {k: torch.from_numpy(v) for k, v in inputs.items()}
    with torch.inference_mode():
        whole, _ = GeneratorModule(model).body(t["x_pre"], t["ref_s"][:, :KOKORO.style_dim], t["har"], t["mask"])
    valid = int(inputs["mask"].sum()) * 60 + 1  # 4,800 Hz frames, the reflection pad's included
    return model, inputs, whole.numpy()[..., :valid]


def _folded(model, inputs, halo: int, length: int) -> np.ndarray:
    g = FoldGeometry.for_frames(inputs["mask"].shape[-1], halo)
    rows = [g.fold(inputs["x_pre"]), inputs["ref_s"], g.fold(inputs["har"], 60, 1), g.fold(inputs["mask"])]
    with torch.inference_mode():
        out = FoldedBody(model, halo)(*(torch.from_numpy(a) for a in rows)).numpy()
    assert g.rows == 3
    return g.unfold(out, length)


def test_the_folded_body_equals_the_whole_over_every_valid_frame(body_run):
    model, inputs, whole = body_run
    got = _folded(model, inputs, halo_frames(model.decoder.generator), whole.shape[-1])
    # float64: what is left is rounding (the statistics sum rows in another order), 1e-13 of the scale
    assert np.abs(got - whole).max() <= 1e-9 * np.abs(whole).max()


def test_a_halo_short_of_the_reach_breaks_the_row_boundaries(body_run):
    model, inputs, whole = body_run
    reach = halo_frames(model.decoder.generator)
    short = reach - 2
    got = _folded(model, inputs, short, whole.shape[-1])
    err, scale = np.abs(got - whole).max(axis=(0, 1)), np.abs(whole).max()
    g = FoldGeometry.for_frames(inputs["mask"].shape[-1], short)
    near = np.zeros(err.shape, bool)  # within the body's reach of a row boundary (4,800 Hz)
    for k in range(1, g.rows):
        near[max(0, k * g.valid * 60 - reach * 60):k * g.valid * 60 + reach * 60] = True
    assert err[near].max() > 1e-6 * scale  # the boundaries break;
    # elsewhere only through the statistics the broken frames enter, by far less
    assert err[~near].max() < err[near].max() / 10


def test_every_bucket_folds_under_the_widest_axis():
    halo = HALO
    for seconds in (3, 7, 10, 15, 30):
        g = FoldGeometry.for_frames(KOKORO.f0_frames(seconds), halo)
        assert g.width * g.upsample + 1 <= MAX_AXIS
        assert g.rows * g.valid >= KOKORO.f0_frames(seconds) + 1  # the centres cover every frame
    ramp = np.arange(2 * 800, dtype=np.float32).reshape(1, 2, 800)
    g = FoldGeometry.for_frames(800, halo, 1, max_axis=61)  # rows of 60 frames, 1:1
    rows = g.fold(ramp)
    assert np.array_equal(g.unfold(rows[..., halo:halo + g.valid], 800), ramp)
    assert rows[0, 0, :halo].tolist() == [0.0] * halo  # before the sequence: zeros
    with pytest.raises(ValueError, match="leaves no centre"):
        FoldGeometry.for_frames(800, 200)


@pytest.mark.parametrize("c_in, c_out, kernel, stride, padding", [(8, 4, 20, 10, 5), (4, 3, 12, 6, 3), (3, 2, 4, 2, 1)])
def test_a_subpixel_conv_equals_the_transposed_conv(c_in, c_out, kernel, stride, padding):
    torch.manual_seed(0)
    up = torch.nn.ConvTranspose1d(c_in, c_out, kernel, stride, padding=padding).double()
    x = torch.randn(2, c_in, 37, dtype=torch.float64)
    with torch.no_grad():
        assert torch.allclose(SubPixelConv(up)(x), up(x), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="kernel - 2·padding = stride"):
        SubPixelConv(torch.nn.ConvTranspose1d(c_in, c_out, kernel + 1, stride, padding=padding))


def test_the_folded_stage_and_the_host_tail_give_the_whole_stages_waveform(body_run, tiny_model, tiny_weights):
    """The ANE layout as the runtime runs it (fold, the stage's module, unfold, dsp.spectrum_to_audio)
    against the GPU layout's waveform, on the stage's own example inputs."""
    model, inputs, _ = body_run
    whole, folded = GeneratorStage("whole"), GeneratorStage("folded")
    rows = folded.example_inputs(tiny_model, tiny_weights, SECONDS, reference=_reference(tiny_model, tiny_weights))
    assert [t.shape for t in folded.function(SECONDS).inputs] == [rows[k].shape for k in
                                                                   ("x_rows", "ref_s", "har_rows", "mask_rows")]
    t = {k: torch.from_numpy(v.astype(np.float64)) for k, v in inputs.items()}
    with torch.inference_mode():
        waveform = whole.build(model).double()(t["x_pre"], t["ref_s"], t["har"], t["mask"]).numpy().reshape(-1)
        spectrum = folded.build(model).double()(*(torch.from_numpy(rows[k].astype(np.float64))
                                         for k in ("x_rows", "ref_s", "har_rows", "mask_rows"))).numpy()
    frames = int(inputs["mask"].sum())
    audio = spectrum_to_audio(folded.fold(SECONDS).unfold(spectrum, frames * 60 + 1))
    assert audio.shape == (frames * 300,)
    # the graph's inverse STFT holds float32 tables; the host's runs in float64
    assert np.abs(audio - waveform[:frames * 300]).max() <= 1e-5 * np.abs(waveform).max()


def test_a_folded_build_speaks_as_the_whole_build_does(built_workflow, tmp_path):
    """kokoro-tiny rebuilt with the ANE layout's generator (folded, all fp16, CPU_AND_NE): only the
    generator's steps rerun, its package passes the parity gate, and the runtime speaks the same
    audio as the whole layout's build (torch backend: fp32 exports; mil: the fp16 packages)."""
    from anetts.loader import load

    work = tmp_path / "wf"
    shutil.copytree(built_workflow, work, symlinks=True)
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg["families"]["kokoro"]["stages"]["generator"].update(layout="folded", fp32_ops=[], compute_units="CPU_AND_NE")
    (work / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    proc = run_snakemake(work, "artifacts/kokoro-tiny/manifest.json")
    rerun = set(re.findall(r"stage=(\w+)", proc.stdout + proc.stderr))
    assert rerun == {"generator"}, f"the layout's edit reran {sorted(rerun)}"
    model = work / "artifacts" / "kokoro-tiny"
    manifest = json.loads((model / "manifest.json").read_text())
    generator = [p for p in manifest["packages"] if p["stage"] == "generator"]
    assert [t["name"] for t in generator[0]["functions"][0]["inputs"]] == ["x_rows", "ref_s", "har_rows", "mask_rows"]
    text = "spˈiːʧ sˈɪnθəsˌɪs."
    for backend, floor_db in (("torch", 80.0), ("mil", 20.0)):
        whole = load(built_workflow / "artifacts" / "kokoro-tiny", backend=backend).synthesize(phonemes=text, seed=0)
        folded = load(model, backend=backend).synthesize(phonemes=text, seed=0)
        assert folded.audio.shape == whole.audio.shape
        noise = float(np.sum((folded.audio - whole.audio) ** 2))
        snr = 10 * np.log10(float(np.sum(whole.audio ** 2)) / max(noise, 1e-30))
        assert snr >= floor_db, f"{backend}: the folded build's audio is {snr:.1f} dB from the whole build's"
