"""Host DSP (anetts.models.kokoro.dsp) against upstream kokoro 0.9.4 modules."""

import numpy as np
import pytest
import torch

from kokoro.istftnet import Generator, SourceModuleHnNSF, TorchSTFT

from anetts.models.kokoro import dsp
from anetts.models.kokoro.dsp import KOKORO, SourceDraws


def _f0_curve(n_f0: int, rng: np.random.Generator) -> np.ndarray:
    """A speech-like 80 Hz F0 curve with the awkward cases: unvoiced zeros, exactly 10 Hz, negatives."""
    t = np.arange(n_f0)
    f0 = 140 + 60 * np.sin(t / 15) + rng.normal(0, 5, n_f0)
    f0[20:35] = 0.0  # unvoiced
    f0[50] = dsp.VOICED_THRESHOLD  # exactly the threshold: unvoiced (strict >)
    f0[51] = dsp.VOICED_THRESHOLD + 1e-9
    f0[60:63] = [-4.0, -0.5, 3.0]  # the F0 predictor can go slightly negative
    f0[-5:] = 0.0
    return f0


def _inject(monkeypatch, draws: SourceDraws, dtype: torch.dtype) -> None:
    """Make upstream SineGen/SourceModuleHnNSF use ``draws`` instead of torch's RNG."""

    def fake_rand(*shape, **kw):
        assert tuple(shape) == (1, dsp.N_HARMONICS), shape
        return torch.from_numpy(draws.rand_ini.astype(np.float32))[None].clone()

    def fake_randn_like(x, **kw):
        if x.shape[-1] == dsp.N_HARMONICS:  # SineGen's noise
            return torch.from_numpy(draws.sine_noise)[None].to(dtype)
        return torch.zeros_like(x)  # SourceModuleHnNSF's noise branch (unused by Generator)

    monkeypatch.setattr(torch, "rand", fake_rand)
    monkeypatch.setattr(torch, "randn_like", fake_randn_like)


def _upstream_source64(monkeypatch, f0: np.ndarray, draws: SourceDraws):
    torch.manual_seed(0)  # l_linear init
    m = SourceModuleHnNSF(24000, 300, harmonic_num=8, voiced_threshod=10).double()
    _inject(monkeypatch, draws, torch.float64)
    with torch.no_grad():
        # Generator.f0_upsamp: nearest x300 of the (1, 2F) curve, then (1, 600F, 1)
        f0_up = torch.nn.Upsample(scale_factor=300)(torch.from_numpy(f0)[None, None]).transpose(1, 2)
        src, _, uv = m(f0_up)
    w, b = m.l_linear.weight.detach().numpy(), m.l_linear.bias.detach().numpy()
    return src[0, :, 0].numpy(), uv[0, :, 0].numpy(), w, b


@pytest.fixture(scope="module")
def case():
    rng = np.random.default_rng(7)
    f0 = _f0_curve(KOKORO.f0_frames(2), rng)  # 2 s: 160 F0 frames, 48000 samples
    return f0, SourceDraws.sample(f0.size * 300, rng)


def test_harmonic_source_matches_upstream_float64(monkeypatch, case):
    f0, draws = case
    ref, uv, w, b = _upstream_source64(monkeypatch, f0, draws)
    host = dsp.harmonic_source(f0, w, b, draws, dtype=np.float64)
    assert host.shape == ref.shape == (f0.size * 300,)
    assert np.max(np.abs(host - ref)) < 1e-9
    assert dsp.harmonic_source(f0, w, b, draws).dtype == np.float32
    # uv is strict: exactly 10 Hz and the negatives are unvoiced
    np.testing.assert_array_equal(uv.reshape(-1, 300)[:, 0], (f0 > 10).astype(np.float64))


def test_rand_ini_never_reaches_the_output(case):
    """Upstream adds rand_ini at sample 0, but the 1/300 linear downsample reads samples 149/150."""
    f0, draws = case
    w, b = np.ones((1, 9)) * 0.3, np.array([0.05])
    no_ini = SourceDraws(rand_ini=np.zeros(9), sine_noise=draws.sine_noise)
    np.testing.assert_array_equal(
        dsp.harmonic_source(f0, w, b, draws, dtype=np.float64),
        dsp.harmonic_source(f0, w, b, no_ini, dtype=np.float64),
    )


def test_unvoiced_frames_are_noise_only(case):
    f0, draws = case
    sines = dsp.sine_excitation(f0, draws).reshape(f0.size, 300, 9)
    noise = draws.sine_noise.reshape(f0.size, 300, 9)
    unvoiced = f0 <= 10
    expected = noise[unvoiced] * np.float64(np.float32(0.1) / np.float32(3))
    np.testing.assert_allclose(sines[unvoiced], expected, rtol=0, atol=1e-15)
    assert np.all(np.abs(sines[~unvoiced]) <= 0.1 + 0.003 * 6)


def test_source_draws():
    a = SourceDraws.sample(600, np.random.default_rng(3))
    b = SourceDraws.sample(600, np.random.default_rng(3))
    assert a.rand_ini.shape == (9,) and a.rand_ini[0] == 0 and np.all(a.rand_ini[1:] < 1)
    assert a.sine_noise.shape == (600, 9)
    np.testing.assert_array_equal(a.sine_noise, b.sine_noise)
    with pytest.raises(ValueError, match="rand_ini"):
        SourceDraws(rand_ini=np.ones(9), sine_noise=a.sine_noise)
    with pytest.raises(ValueError, match="samples"):
        dsp.harmonic_source(np.full(3, 100.0), np.ones((1, 9)), np.zeros(1), a)  # needs 900


def test_stft_har_matches_upstream_torchstft(case):
    f0, draws = case
    src = dsp.harmonic_source(f0, np.full((1, 9), 0.4), np.array([0.01]), draws)  # float32
    har = dsp.stft_har(src)
    assert har.shape == (1, 22, src.size // 5 + 1) and har.dtype == np.float32
    # upstream exactly (float32 torch.stft)
    mag, ph = (t.numpy()[0] for t in TorchSTFT(20, 5, 20).transform(torch.from_numpy(src)[None]))
    assert np.max(np.abs(har[0, :11] - mag)) < 1e-6
    dph = np.angle(np.exp(1j * (har[0, 11:].astype(np.float64) - ph)))  # modulo the +-pi convention
    assert np.max(np.abs(dph)[mag > 1e-3]) < 1e-3  # phase of ~0 bins is noise in float32
    # float64 torch.stft on the same input: only our float32 output rounding remains
    spec = torch.stft(
        torch.from_numpy(src.astype(np.float64))[None], 20, 5, 20,
        window=torch.hann_window(20, periodic=True, dtype=torch.float64), return_complex=True,
    ).numpy()[0]
    assert np.max(np.abs(har[0, :11] - np.abs(spec))) < 1e-6
    dph = np.angle(np.exp(1j * (har[0, 11:].astype(np.float64) - np.angle(spec))))
    assert np.max(np.abs(dph)[np.abs(spec) > 1e-6]) < 1e-6


def test_dc_and_nyquist_phase_is_zero_or_plus_pi():
    x = np.random.default_rng(0).normal(size=500)
    x[100:200] = -1.0  # constant negative stretch: DC real < 0
    har = dsp.stft_har(x)
    edge_phase = har[0, [11, 21]]
    assert np.all((edge_phase == 0) | (edge_phase == np.float32(np.pi)))
    assert np.any(edge_phase == np.float32(np.pi))


@pytest.mark.filterwarnings("ignore:.*weight_norm:FutureWarning")
def test_make_har_matches_upstream_generator(monkeypatch, case):
    """The har that upstream Generator.forward builds (f0_upsamp + m_source + STFT), float32."""
    f0, draws = case
    f0 = f0[:40]  # 0.5 s keeps float32 phase drift negligible
    draws = SourceDraws(draws.rand_ini, draws.sine_noise[: f0.size * 300])
    torch.manual_seed(0)
    gen = Generator(8, [3], [10, 6], 8, [[1, 3, 5]], [20, 12], 20, 5).eval()
    captured = {}
    transform = gen.stft.transform

    def capture(x):
        captured["source"] = x.numpy()[0]
        captured["mag"], captured["phase"] = out = transform(x)
        return out

    monkeypatch.setattr(gen.stft, "transform", capture)
    _inject(monkeypatch, draws, torch.float32)
    with torch.no_grad():
        gen(torch.zeros(1, 8, f0.size), torch.zeros(1, 8), torch.from_numpy(f0.astype(np.float32))[None])
    ref_mag, ref_phase = captured["mag"].numpy()[0], captured["phase"].numpy()[0]
    w, b = (p.detach().numpy() for p in (gen.m_source.l_linear.weight, gen.m_source.l_linear.bias))

    # upstream's float32 cumulative phase is already off by ~1e-3 rad after 0.5 s
    source = dsp.harmonic_source(f0, w, b, draws)
    assert np.max(np.abs(source - captured["source"])) < 2e-4
    # the STFT of upstream's own source is float-exact
    har_up = dsp.stft_har(captured["source"])
    assert np.max(np.abs(har_up[0, :11] - ref_mag)) < 1e-6
    dph = np.angle(np.exp(1j * (har_up[0, 11:].astype(np.float64) - ref_phase)))
    assert np.max(np.abs(dph)[ref_mag > 1e-3]) < 1e-4

    har = dsp.make_har(f0, w, b, draws, KOKORO.har_len(1))
    n = (f0.size // 2) * 120 + 1
    assert har.shape == (1, 22, KOKORO.har_len(1)) and ref_mag.shape == (11, n)
    np.testing.assert_array_equal(har[:, :, :n], dsp.stft_har(source))
    assert not har[:, :, n:].any()
    with pytest.raises(ValueError, match="padded length"):
        dsp.make_har(f0, w, b, draws, n - 1)


def _upstream_align(features: torch.Tensor, pred_dur: torch.Tensor) -> torch.Tensor:
    """KModel.forward_with_tokens' alignment, verbatim."""
    indices = torch.repeat_interleave(torch.arange(features.shape[2]), pred_dur)
    pred_aln_trg = torch.zeros((features.shape[2], indices.shape[0]))
    pred_aln_trg[indices, torch.arange(indices.shape[0])] = 1
    return features @ pred_aln_trg.unsqueeze(0)


@pytest.mark.parametrize("n_tokens", [1, 2, 37])
def test_align_matches_upstream_one_hot_matmul(n_tokens):
    rng = np.random.default_rng(n_tokens)
    feats = rng.normal(size=(1, 16, n_tokens)).astype(np.float32)
    dur = rng.integers(1, 6, size=n_tokens)
    ref = _upstream_align(torch.from_numpy(feats), torch.from_numpy(dur)).numpy()
    # bucket-padded inputs: extra tokens with garbage features and durations are ignored
    feats_pad = np.concatenate([feats, rng.normal(size=(1, 16, 5)).astype(np.float32)], axis=2)
    dur_pad = np.concatenate([dur, [9, 9, 9, 9, 9]])[None]
    aligned, n = dsp.align(feats_pad, dur_pad, n_tokens, 256)
    assert n == dur.sum() == ref.shape[2]
    assert aligned.shape == (1, 16, 256) and aligned.dtype == np.float32
    np.testing.assert_array_equal(aligned[:, :, :n], ref)  # exact
    assert not aligned[:, :, n:].any()
    np.testing.assert_array_equal(
        dsp.alignment_indices(dur_pad, n_tokens), np.repeat(np.arange(n_tokens), dur)
    )


def test_align_errors():
    feats = np.ones((1, 4, 3), dtype=np.float32)
    with pytest.raises(ValueError, match="more than the 10-frame bucket"):
        dsp.align(feats, np.array([4, 4, 4]), 3, 10)
    aligned, n = dsp.align(feats, np.array([4, 4, 4]), 3, 12)  # exactly full is fine
    assert n == 12 and aligned.all()
    with pytest.raises(ValueError, match="n_valid_tokens"):
        dsp.align(feats, np.array([1, 1, 1]), 4, 10)
    with pytest.raises(ValueError, match="negative"):
        dsp.alignment_indices(np.array([1, -1]), 2)


def test_geometry():
    assert dsp.frames_to_samples == 600
    assert (KOKORO.frames(3), KOKORO.f0_frames(3), KOKORO.samples(3), KOKORO.har_len(3)) == (
        120, 240, 72000, 14401,
    )
    assert KOKORO.har_len(30) == 4800 * 30 + 1 and KOKORO.seconds(120) == 3.0
    with pytest.raises(ValueError):
        KOKORO.frames(0.01)
