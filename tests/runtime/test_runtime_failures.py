"""Failure behaviour: clear errors from the API, non-zero exits from the CLI, never an empty wav."""
from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest
import soundfile as sf

from anetts.cli import main
from anetts.loader import load
from anetts.runtime import ArtifactError, BackendUnavailable, InputError, IntegrityError
from rt_common import SHORT, copy_model_dir

BAD_INPUTS = [
    (dict(text=""), "empty"),
    (dict(text="  \n\t "), "empty"),
    (dict(text="?! ... --"), "punctuation"),
    (dict(phonemes="∆∆ ∆"), "nothing to speak"),
    (dict(phonemes=".,!"), "nothing to speak"),
    (dict(phonemes=SHORT, speed=0), "speed must be"),
    (dict(phonemes=SHORT, speed=-1.0), "speed must be"),
    (dict(phonemes=SHORT, speed=100), "speed must be"),
    (dict(phonemes=SHORT, speed=float("nan")), "speed must be"),
    (dict(phonemes=SHORT, speed="fast"), "speed must be"),
    (dict(phonemes=SHORT, voice="xx"), "unknown voice 'xx'; available: ['syn_a', 'syn_b']"),
    (dict(), "exactly one"),
    (dict(text="Hello", phonemes=SHORT), "exactly one"),
]


@pytest.mark.parametrize("kwargs,message", BAD_INPUTS)
def test_bad_input_raises_a_clear_error(tts, kwargs, message):
    with pytest.raises(InputError, match=message.replace("[", r"\[").replace("]", r"\]").replace("?", r"\?")):
        tts.synthesize(**{"voice": "syn_a", **kwargs})
    with pytest.raises(InputError):  # stream validates before it returns, not at the first chunk
        tts.stream(**{"voice": "syn_a", **kwargs})


def test_missing_manifest(tmp_path):
    with pytest.raises(ArtifactError, match="no manifest"):
        load(tmp_path)


def test_missing_package(model_dir, tmp_path):
    copy = copy_model_dir(model_dir, tmp_path / "m")
    shutil.rmtree(copy / "packages" / "decoder_pre" / "3s.mlpackage")
    with pytest.raises(ArtifactError, match="decoder_pre/3s is missing"):
        load(copy)


def test_tampered_package_fails_sha256_naming_it(model_dir, tmp_path):
    copy = copy_model_dir(model_dir, tmp_path / "m")
    weights = sorted((copy / "packages" / "generator" / "3s.mlpackage").rglob("weight.bin"))[0]
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(bytes(data))
    tts = load(copy, backend="torch")  # loading stays cheap; the hash is checked on first use
    with pytest.raises(IntegrityError, match=r"generator/3s .*sha256"):
        tts.synthesize(phonemes=SHORT, voice="syn_a")
    out = tmp_path / "out.wav"
    assert main(["speak", "--phonemes", SHORT, "--voice", "syn_a", "--model-dir", str(copy), "-o", str(out)]) == 1
    assert not out.exists()


def test_tampered_voice_asset_fails_sha256_naming_it(model_dir, tmp_path):
    copy = copy_model_dir(model_dir, tmp_path / "m")
    assert not (copy / "weights").exists()
    voice = copy / "assets" / "voices" / "syn_b.npy"
    data = bytearray(voice.read_bytes())
    data[-3] ^= 0x10
    voice.write_bytes(bytes(data))
    tts = load(copy, backend="torch")
    assert tts.synthesize(phonemes=SHORT, voice="syn_a").audio.size  # the other voice is intact
    with pytest.raises(IntegrityError, match=r"voices/syn_b\.npy"):
        tts.synthesize(phonemes=SHORT, voice="syn_b")


def test_tampered_torchscript_fails_sha256(model_dir, tmp_path):
    copy = copy_model_dir(model_dir, tmp_path / "m")
    pt = copy / "export" / "duration" / "t32.functions" / "main.pt"
    pt.write_bytes(pt.read_bytes() + b"\0")
    with pytest.raises(IntegrityError, match="duration/t32"):
        load(copy, backend="torch").synthesize(phonemes=SHORT, voice="syn_a")


def test_manifest_without_host_block(model_dir, tmp_path):
    copy = copy_model_dir(model_dir, tmp_path / "m")
    m = json.loads((copy / "manifest.json").read_text())
    del m["host"]
    (copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match="host"):
        load(copy)


@pytest.mark.skipif(sys.platform == "darwin", reason="Core ML is available on macOS")
def test_coreml_backend_needs_macos(model_dir, tmp_path):
    with pytest.raises(BackendUnavailable, match=rf"needs macOS.*{sys.platform}.*--backend torch"):
        load(model_dir, backend="coreml")
    out = tmp_path / "x.wav"
    assert main(["speak", "Hello.", "--backend", "coreml", "--model-dir", str(model_dir), "-o", str(out)]) == 1
    assert not out.exists()


def test_unknown_backend(model_dir):
    with pytest.raises(InputError, match="unknown backend"):
        load(model_dir, backend="tpu")


def test_coreai_backend_needs_aimodel_assets(model_dir):
    with pytest.raises(BackendUnavailable, match=r"runs \.aimodel assets; the manifest of .* lists none for \["):
        load(model_dir, backend="coreai")


# ------------------------------------------------------------------------------------- CLI


def test_cli_speak_writes_a_24khz_wav(model_dir, tmp_path, capsys):
    out = tmp_path / "hi.wav"
    assert main(["speak", "Hi there.", "--voice", "syn_b", "--speed", "1.2", "--model-dir", str(model_dir), "-o", str(out)]) == 0
    audio, sr = sf.read(out, dtype="float32")
    assert sr == 24000 and audio.ndim == 1 and audio.shape[0] > 0 and audio.shape[0] % 600 == 0
    assert np.abs(audio).max() > 0
    assert "RTF" in capsys.readouterr().out


def test_cli_speak_phonemes_with_progress(model_dir, tmp_path, capsys):
    out = tmp_path / "long.wav"
    long = " ".join([SHORT] * 4)  # more than one chunk of 3 s
    assert main(["speak", "--phonemes", long, "--voice", "syn_a", "--model-dir", str(model_dir), "-o", str(out)]) == 0
    assert sf.info(str(out)).frames > 0
    assert "phonemes" in capsys.readouterr().err  # the tqdm bar, in the plan's units


@pytest.mark.parametrize("args,message,rc", [
    (["speak", "", "--voice", "syn_a"], "empty", 1),
    (["speak", "...", "--voice", "syn_a"], "punctuation", 1),
    (["speak", "--phonemes", "∆∆", "--voice", "syn_a"], "nothing to speak", 1),
    (["speak", "Hello.", "--voice", "xx"], "unknown voice", 1),
    # a bad value of an option is a usage error naming the option
    (["speak", "Hello.", "--voice", "syn_a", "--speed", "0"], "--speed: speed must be", 2),
    (["speak", "Hello.", "--voice", "syn_a", "--speed", "-3"], "--speed: speed must be", 2),
])
def test_cli_bad_input_exits_non_zero_without_a_wav(model_dir, tmp_path, capsys, args, message, rc):
    out = tmp_path / "bad.wav"
    assert main([*args, "--model-dir", str(model_dir), "-o", str(out)]) == rc
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_cli_missing_model_dir(tmp_path, capsys):
    assert main(["speak", "Hello.", "--model-dir", str(tmp_path / "nope"), "-o", str(tmp_path / "a.wav")]) == 1
    assert "no manifest" in capsys.readouterr().err


def test_cli_usage_errors_exit_2(tmp_path):
    assert main(["speak", "Hello."]) == 2  # no -o
    assert main(["speak", "-o", str(tmp_path / "a.wav")]) == 2  # neither text nor phonemes
    assert main(["speak", "Hi", "--speed", "fast", "-o", str(tmp_path / "a.wav")]) == 2


def test_cli_run_mil_delegates(model_dir, tmp_path, capsys):
    pkg = model_dir / "packages" / "decoder_pre" / "3s.mlpackage"
    from anetts.scenario import load_scenario

    inputs = tmp_path / "3s.inputs.npz"  # the export's one call, as a plain npz of inputs
    np.savez(inputs, **load_scenario(model_dir / "export" / "decoder_pre" / "3s.scenario.npz")[0].calls[0].inputs)
    out = tmp_path / "out.npz"
    assert main(["run-mil", str(pkg), "--inputs", str(inputs), "-o", str(out)]) == 0
    manifest = json.loads((model_dir / "manifest.json").read_text())
    entry = next(p for p in manifest["packages"] if p["stage"] == "decoder_pre" and p["bucket"] == "3s")
    with np.load(out) as got:
        assert sorted(got.files) == sorted(o["name"] for o in entry["functions"][0]["outputs"])
        assert all(np.isfinite(got[k]).all() for k in got.files)
    missing = tmp_path / "missing.mlpackage"
    assert main(["run-mil", str(missing), "--inputs", str(inputs)]) != 0
    assert "missing.mlpackage" in capsys.readouterr().err


# ------------------------------------------------------------------------------------- mil


def test_bundles_serve_every_bucket_from_macos15(model_dir):
    per_bucket = load(model_dir, backend="mil", deployment_target="macOS14")
    bundled = load(model_dir, backend="mil", deployment_target="macOS15")
    entries = bundled.artifacts.entries("generator")
    assert all(e.path.parent.name == "bundles" and e.function != "main" for e in entries)
    assert all(e.path.parent.name != "bundles" for e in per_bucket.artifacts.entries("generator"))
    a = per_bucket.synthesize(phonemes=SHORT, voice="syn_a", seed=0).audio
    b = bundled.synthesize(phonemes=SHORT, voice="syn_a", seed=0).audio
    assert a.shape == b.shape and np.array_equal(a, b)  # the same programs, merged
    with pytest.raises(ArtifactError, match="deployment target 'macOS'"):
        load(model_dir, backend="mil", deployment_target="macOS")


def test_torch_backend_runs_a_bundled_bucket_from_its_export_folder(model_dir):
    """The one export layout: a bucket's folder holds its one function as `main.pt`; where the
    runtime serves the bucket from its stage's bundle (function `b3s`, ...), torch runs that file."""
    per_bucket = load(model_dir, backend="torch", deployment_target="macOS14")
    bundled = load(model_dir, backend="torch", deployment_target="macOS15")
    entry = bundled.artifacts.package("generator", "3s")
    assert entry.function != "main" and entry.torchscript.is_dir()
    assert [p.name for p in entry.torchscript.glob("*.pt")] == ["main.pt"]
    a = per_bucket.synthesize(phonemes=SHORT, voice="syn_a", seed=0).audio
    b = bundled.synthesize(phonemes=SHORT, voice="syn_a", seed=0).audio
    assert a.shape == b.shape and np.array_equal(a, b)


def test_mil_backend_runs_the_packages(model_dir, tts):
    from anetts.runtime.audio import log_mel_similarity

    mil = load(model_dir, backend="mil")
    ours = mil.synthesize(phonemes=SHORT, voice="syn_a", seed=0)
    ref = tts.synthesize(phonemes=SHORT, voice="syn_a", seed=0)
    assert ours.audio.shape[0] == ours.durations.sum() * 600
    # fp16 packages may move a rounding boundary of a duration by one frame, not more
    if ours.durations.shape == ref.durations.shape:
        assert np.abs(ours.durations - ref.durations).max() <= 1
    assert log_mel_similarity(ours.audio, ref.audio, ours.sample_rate)["log_mel_corr"] > 0.7


def test_kokoro_keeps_the_runtime_protocol(model_dir):
    """What the CLI and the server read of any runtime (anetts.runtime.speech), on Kokoro."""
    from anetts.runtime.speech import SpeechChunk, SpeechRuntime

    tts = load(model_dir, backend="torch")
    assert isinstance(tts, SpeechRuntime) and tts.family == "kokoro" and tts.sample_rate == 24000
    assert tts.capabilities.blending and tts.capabilities.timestamps and not tts.capabilities.cloning
    assert set(tts.options) >= {"phonemes", "lang"} and tts.default_voice in tts.voices
    chunks = tts.stream("Hi there. Bye now.", "syn_a", 1.25, seed=3, sentences=True)
    got = list(chunks)
    assert len(got) == 2 and all(isinstance(c, SpeechChunk) for c in got) and got[-1].is_last
    assert sum(c.units for c in got) == chunks.units and chunks.unit == "phonemes"
    assert all(c.codes is None and c.audio.size == c.output_frames * 600 for c in got)
    assert [w.word for c in got for w in c.words] == ["Hi", "there", ".", "Bye", "now", "."]
    with pytest.raises(InputError) as e:
        tts.check_voice_name("syn_a(1)+nobody(1)")
    assert e.value.field == "voice" and "nobody" in str(e.value)
