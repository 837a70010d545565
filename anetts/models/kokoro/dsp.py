"""Host-side DSP for Kokoro-82M: the parts of the forward pass that do not lower to Core ML.

Upstream (``kokoro`` 0.9.4) does three things inside the model that we do on the host instead:

1. **Alignment** (``KModel.forward_with_tokens``): a one-hot ``(T_tokens, frames)`` matrix built
   from ``repeat_interleave(pred_dur)``; the data-dependent repeat does not lower, and a direct
   column gather is exact and ~100x cheaper than the matmul.
2. **hn-NSF harmonic source** (``Generator.forward`` -> ``f0_upsamp`` + ``m_source``): stochastic
   (``torch.rand``/``randn_like``) and numerically fragile (a cumulative phase of ~5e5 rad after
   30 s, which float32 -- and fp16 even more so -- cannot carry).
3. **Forward STFT** of that source (``TorchSTFT.transform``) giving ``har`` (1, 22, L/5 + 1).

Everything here reproduces upstream's math operation for operation (including its
interpolation index arithmetic), so that with the same random draws the host source equals a
float64 run of upstream to ~1e-12. See docs/ane-notes.md §4.

Shapes use F = number of 40 Hz duration frames; the F0 curve has 2F points (80 Hz), the
waveform and the source 600F samples (24 kHz), and ``har`` 120F + 1 STFT frames.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------
# Geometry and constants (upstream config: istftnet upsample_rates [10, 6], n_fft 20, hop 5)
# --------------------------------------------------------------------------------------------

SAMPLE_RATE = 24000
FRAME_RATE = 40  # duration frames (pred_dur, en, asr) per second
F0_RATE = 80  # F0 / N / x_pre frames per second
frames_to_samples = SAMPLE_RATE // FRAME_RATE  # 600 waveform samples per duration frame
F0_UPSAMPLE = SAMPLE_RATE // F0_RATE  # 300 = prod(upsample_rates) * hop = m_source upsample_scale

STYLE_DIM = 128  # config style_dim: ref_s (1, 256) = [decoder style | prosody style]
VOICE_ROWS = 510  # rows of a voice pack: one per phoneme count (upstream picks voice[len(phonemes) - 1])

N_FFT = 20  # gen_istft_n_fft; also the forward STFT's filter/window length
HOP = 5  # gen_istft_hop_size
N_BINS = N_FFT // 2 + 1  # 11 one-sided bins -> har has 2 * 11 = 22 channels
HAR_CHANNELS = 2 * N_BINS

# SourceModuleHnNSF(sampling_rate=24000, upsample_scale=300, harmonic_num=8, voiced_threshod=10)
HARMONIC_NUM = 8
N_HARMONICS = HARMONIC_NUM + 1  # fundamental + 8 overtones
SINE_AMP = 0.1
NOISE_STD = 0.003
VOICED_THRESHOLD = 10.0  # Hz; uv = f0 > 10 (strictly greater)


@dataclass(frozen=True)
class KokoroGeometry:
    """Rates of Kokoro's tensors; every length derives from the 40 Hz frame count.

    For a bucket of ``s`` seconds: ``frames`` = 40 s (asr / en), ``f0_frames`` = 80 s
    (F0, N, x_pre), ``har_len`` = 4800 s + 1 (``har`` STFT frames), ``samples`` = 24000 s.
    """

    sample_rate: int = SAMPLE_RATE
    frame_rate: int = FRAME_RATE
    f0_rate: int = F0_RATE
    hop: int = HOP
    n_fft: int = N_FFT
    upsample_rates: tuple[int, ...] = (10, 6)
    style_dim: int = STYLE_DIM  # a voice row is [decoder style | prosody style], style_dim each
    voice_rows: int = VOICE_ROWS  # one style row per phoneme count, 1..510

    @property
    def ref_s_dim(self) -> int:
        return 2 * self.style_dim

    def check_config(self, config: dict, where: str = "config.json") -> None:
        """Raise naming the key when an upstream config disagrees with the geometry the stages and
        host DSP are written for (e.g. a re-trained model with another vocoder hop)."""
        ist = config.get("istftnet", {})
        found = {"style_dim": config.get("style_dim"), "istftnet.gen_istft_hop_size": ist.get("gen_istft_hop_size"),
                 "istftnet.gen_istft_n_fft": ist.get("gen_istft_n_fft"),
                 "istftnet.upsample_rates": tuple(ist.get("upsample_rates", ()))}
        expected = {"style_dim": self.style_dim, "istftnet.gen_istft_hop_size": self.hop,
                    "istftnet.gen_istft_n_fft": self.n_fft, "istftnet.upsample_rates": self.upsample_rates}
        for key, want in expected.items():
            if found[key] != want:
                raise ValueError(f"{where}: {key} is {found[key]!r}; this build's Kokoro geometry needs {want!r}")

    @property
    def samples_per_frame(self) -> int:
        return self.sample_rate // self.frame_rate  # 600

    def frames(self, seconds: float) -> int:
        """40 Hz duration frames covering ``seconds`` (must be a whole number of frames)."""
        n = self.frame_rate * seconds
        if abs(n - round(n)) > 1e-9:
            raise ValueError(f"{seconds} s is not a whole number of {self.frame_rate} Hz frames")
        return int(round(n))

    def f0_frames(self, seconds: float) -> int:
        """80 Hz F0/N/x_pre frames: 2 per duration frame."""
        return self.frames(seconds) * (self.f0_rate // self.frame_rate)

    def samples(self, seconds: float) -> int:
        """Waveform samples: 600 per duration frame."""
        return self.frames(seconds) * self.samples_per_frame

    def har_len(self, seconds: float) -> int:
        """``har`` STFT frames: centred STFT of the source, L/hop + 1 = 4800 s + 1."""
        return self.samples(seconds) // self.hop + 1

    def seconds(self, n_frames: int) -> float:
        """Audio duration of ``n_frames`` 40 Hz frames."""
        return n_frames / self.frame_rate


KOKORO = KokoroGeometry()


def frame_mask(n_valid: int, length: int) -> np.ndarray:
    """(1, 1, length) float32 validity mask: 1 for the first n_valid frames, 0 for bucket padding."""
    m = np.zeros((1, 1, length), np.float32)
    m[..., :n_valid] = 1.0
    return m


def pad_last(a: np.ndarray, length: int) -> np.ndarray:
    """Zero-pad (or reject) the last axis to `length`."""
    if a.shape[-1] > length:
        raise ValueError(f"array of length {a.shape[-1]} does not fit bucket length {length}")
    out = np.zeros(a.shape[:-1] + (length,), np.float32)
    out[..., : a.shape[-1]] = a
    return out


# --------------------------------------------------------------------------------------------
# 1. Alignment
# --------------------------------------------------------------------------------------------


def alignment_indices(pred_dur: np.ndarray, n_valid_tokens: int) -> np.ndarray:
    """Frame -> token index map: token i repeated ``pred_dur[i]`` times, valid tokens only.

    ``pred_dur`` is (T,) or (1, T) (the Duration stage's output; padded tokens beyond
    ``n_valid_tokens`` are ignored). ``n_valid_tokens`` counts the two wrap tokens (id 0) too,
    since upstream aligns them like any other token. Returns (frames,) int64, the same as
    upstream's ``repeat_interleave(arange(T), pred_dur)``.
    """
    dur = np.asarray(pred_dur).reshape(-1)
    if not 0 < n_valid_tokens <= dur.shape[0]:
        raise ValueError(f"n_valid_tokens={n_valid_tokens} outside 1..{dur.shape[0]} (pred_dur length)")
    dur = dur[:n_valid_tokens]
    if not np.all(np.isfinite(dur)) or np.any(dur != np.round(dur)):
        raise ValueError("pred_dur must hold whole numbers (upstream rounds the durations)")
    dur = dur.astype(np.int64)
    if np.any(dur < 0):
        raise ValueError(f"pred_dur has negative durations: {dur[dur < 0].tolist()}")
    return np.repeat(np.arange(n_valid_tokens, dtype=np.int64), dur)


def align(
    features: np.ndarray, pred_dur: np.ndarray, n_valid_tokens: int, n_frames_padded: int
) -> tuple[np.ndarray, int]:
    """Expand per-token features to 40 Hz frames: (1, C, T_tokens) -> ((1, C, n_frames_padded), frames).

    Column ``f`` of the result is column ``alignment_indices(...)[f]`` of ``features``; frames
    after the valid ones are zero. On the valid frames this equals upstream's
    ``d.transpose(-1, -2) @ pred_aln_trg`` / ``t_en @ pred_aln_trg`` bit for bit (a one-hot
    matmul adds exact zeros), at a fraction of the cost.
    """
    features = np.asarray(features)
    if features.ndim != 3 or features.shape[0] != 1:
        raise ValueError(f"features must be (1, C, T_tokens), got {features.shape}")
    idx = alignment_indices(pred_dur, n_valid_tokens)
    if n_valid_tokens > features.shape[2]:
        raise ValueError(f"n_valid_tokens={n_valid_tokens} > features' {features.shape[2]} tokens")
    n_frames = int(idx.shape[0])
    if n_frames > n_frames_padded:
        raise ValueError(
            f"predicted durations give {n_frames} frames ({KOKORO.seconds(n_frames):.2f} s), more than "
            f"the {n_frames_padded}-frame bucket ({KOKORO.seconds(n_frames_padded):.2f} s); "
            "use a larger bucket or split the text"
        )
    out = np.zeros((1, features.shape[1], n_frames_padded), dtype=features.dtype)
    out[:, :, :n_frames] = features[:, :, idx]
    return out, n_frames


# --------------------------------------------------------------------------------------------
# 2. hn-NSF harmonic source
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceDraws:
    """The random draws upstream's SineGen makes for one utterance.

    ``rand_ini`` (9,): initial phase per harmonic in [0, 1), ``rand_ini[0] == 0`` (upstream's
    ``torch.rand`` with the fundamental zeroed). ``sine_noise`` (n_samples, 9): standard normal,
    upstream's ``torch.randn_like(sine_waves)``, scaled by the voiced/unvoiced noise amplitude.
    (Upstream also draws ``randn_like(uv)`` for the noise branch, which Generator discards.)
    """

    rand_ini: np.ndarray
    sine_noise: np.ndarray

    def __post_init__(self) -> None:
        if self.rand_ini.shape != (N_HARMONICS,):
            raise ValueError(f"rand_ini must be ({N_HARMONICS},), got {self.rand_ini.shape}")
        if self.rand_ini[0] != 0:
            raise ValueError("rand_ini[0] must be 0: upstream gives the fundamental no phase offset")
        if self.sine_noise.ndim != 2 or self.sine_noise.shape[1] != N_HARMONICS:
            raise ValueError(f"sine_noise must be (n_samples, {N_HARMONICS}), got {self.sine_noise.shape}")

    @property
    def n_samples(self) -> int:
        return int(self.sine_noise.shape[0])

    @classmethod
    def sample(cls, n_samples: int, rng: np.random.Generator) -> "SourceDraws":
        """Production draws from a seeded numpy Generator (same distributions as upstream)."""
        rand_ini = rng.random(N_HARMONICS)
        rand_ini[0] = 0.0
        return cls(rand_ini=rand_ini, sine_noise=rng.standard_normal((n_samples, N_HARMONICS)))


def _linear_resample_weights(in_len: int, out_len: int, scale_factor: float):
    """Index/weight arithmetic of ``F.interpolate(mode="linear", align_corners=False, scale_factor=s)``.

    Mirrors ATen's ``compute_source_index_and_lambda`` in double: the ratio is ``1 / s`` (not
    in/out), source = ratio * (dst + 0.5) - 0.5 clamped at 0, and the right neighbour is
    clamped at the last input. Returns (i0, i1, w0, w1), each (out_len,); y = w0*x[i0] + w1*x[i1].
    """
    ratio = 1.0 / scale_factor
    dst = np.arange(out_len, dtype=np.float64)
    src = np.maximum(ratio * (dst + 0.5) - 0.5, 0.0)
    i0 = np.minimum(np.floor(src).astype(np.int64), in_len - 1)
    w1 = np.clip(src - i0, 0.0, 1.0)
    i1 = i0 + (i0 < in_len - 1)
    return i0, i1, 1.0 - w1, w1


def sine_excitation(f0_curve: np.ndarray, draws: SourceDraws) -> np.ndarray:
    """Upstream ``SineGen.forward`` output ``sine_waves`` (600F, 9) float64 for an (2F,) 80 Hz F0 curve.

    Steps, following upstream (``f0`` = curve nearest-upsampled x300 by ``Generator.f0_upsamp``):

    - ``rad = (f0 * h / 24000) % 1`` for harmonics h = 1..9, plus ``rand_ini`` at sample 0;
    - downsample by 1/300 (linear), cumsum, x 2*pi (float64: the phase reaches ~5e5 rad);
    - x 300 and upsample x300 (linear); ``sin`` x 0.1;
    - ``uv = f0 > 10``; ``sine * uv + noise_amp * N(0, 1)`` with noise_amp 0.003 voiced and
      0.1/3 unvoiced.

    The downsample reads only 2 samples per 300, so only those of ``rad`` are computed.
    """
    f0_curve = np.asarray(f0_curve, dtype=np.float64).reshape(-1)
    n_f0 = f0_curve.shape[0]
    n_samples = n_f0 * F0_UPSAMPLE
    if draws.n_samples != n_samples:
        raise ValueError(f"draws have {draws.n_samples} samples; the F0 curve needs {n_samples} (= {n_f0} x 300)")
    harmonics = np.arange(1, N_HARMONICS + 1, dtype=np.float64)  # (9,)

    def rad_at(t: np.ndarray) -> np.ndarray:
        # (f0_values / sampling_rate) % 1 at full-rate samples t (f0 there = curve[t // 300]);
        # then upstream adds rand_ini at t == 0 only.
        r = np.mod(f0_curve[t // F0_UPSAMPLE, None] * harmonics / SAMPLE_RATE, 1.0)
        r[t == 0] += draws.rand_ini
        return r

    # Downsample 600F -> 2F: each output averages samples 300d+149 and 300d+150, both inside
    # F0 frame d -- so sample 0, where rand_ini was added, is never read (see test).
    i0, i1, w0, w1 = _linear_resample_weights(n_samples, n_f0, 1.0 / F0_UPSAMPLE)
    rad_ds = w0[:, None] * rad_at(i0) + w1[:, None] * rad_at(i1)  # (2F, 9)
    phase = np.cumsum(rad_ds, axis=0) * 2 * np.pi * F0_UPSAMPLE  # same op order as upstream

    i0, i1, w0, w1 = _linear_resample_weights(n_f0, n_samples, float(F0_UPSAMPLE))
    sines = np.sin(w0[:, None] * phase[i0] + w1[:, None] * phase[i1]) * SINE_AMP  # (600F, 9)

    uv = (f0_curve > VOICED_THRESHOLD).astype(np.float64)[:, None]  # (2F, 1)
    # Upstream's uv is float32, so its noise amplitudes are float32 constants in any precision.
    noise_amp = np.where(uv > 0, np.float32(NOISE_STD), np.float32(1.0) * np.float32(SINE_AMP) / np.float32(3))
    sines = sines.reshape(n_f0, F0_UPSAMPLE, N_HARMONICS)
    noise = draws.sine_noise.reshape(n_f0, F0_UPSAMPLE, N_HARMONICS)
    out = sines * uv[:, :, None] + noise_amp.astype(np.float64)[:, :, None] * noise
    return out.reshape(n_samples, N_HARMONICS)


def harmonic_source(
    f0_curve: np.ndarray,
    l_linear_weight: np.ndarray,
    l_linear_bias: np.ndarray,
    draws: SourceDraws,
    dtype=np.float32,
) -> np.ndarray:
    """Merged harmonic source ``har_source`` (600F,) for an (2F,) 80 Hz F0 curve.

    Upstream: ``tanh(l_linear(SineGen(f0_upsamp(F0))))`` with ``l_linear`` = Linear(9, 1) from
    ``decoder.generator.m_source.l_linear`` (weight (1, 9), bias (1,)). Computed in float64
    and returned as ``dtype`` (float32 for the model; float64 for parity tests).
    """
    w = np.asarray(l_linear_weight, dtype=np.float64).reshape(1, N_HARMONICS)
    b = np.asarray(l_linear_bias, dtype=np.float64).reshape(1)
    sines = sine_excitation(f0_curve, draws)  # (600F, 9)
    return np.tanh(sines @ w[0] + b[0]).astype(dtype)


# --------------------------------------------------------------------------------------------
# 3. Forward STFT -> har
# --------------------------------------------------------------------------------------------


def hann_window(n: int = N_FFT) -> np.ndarray:
    """Periodic Hann (``torch.hann_window(n, periodic=True)``), float64 (n,)."""
    return 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n) / n)


def stft(source: np.ndarray) -> np.ndarray:
    """``torch.stft(source, 20, 5, 20, hann, center=True, pad_mode="reflect")``: (L,) -> (11, L/5 + 1) complex128."""
    x = np.asarray(source, dtype=np.float64).reshape(-1)
    pad = N_FFT // 2
    if x.shape[0] <= pad:
        raise ValueError(f"source of {x.shape[0]} samples is too short for reflect padding by {pad}")
    x = np.pad(x, pad, mode="reflect")  # torch.stft's default; CustomSTFT's replicate differs at the edges
    frames = np.lib.stride_tricks.sliding_window_view(x, N_FFT)[::HOP]  # (L/5 + 1, 20)
    return np.fft.rfft(frames * hann_window(), axis=1).T  # (11, L/5 + 1)


def stft_har(source: np.ndarray) -> np.ndarray:
    """``har`` = concat(|X|, angle(X)) of the source's STFT: (L,) -> (1, 22, L/5 + 1) float32.

    Equals upstream ``TorchSTFT.transform`` + ``torch.cat`` except for one deliberate
    convention: the DC and Nyquist bins of a real signal are real, and the *sign* of their
    zero imaginary part is an FFT-implementation accident. ``atan2(-0.0, re < 0)`` is -pi and
    ``atan2(+0.0, re < 0)`` is +pi, so different FFTs (torch vs numpy vs Core ML, whose atan2
    even returns 0 there) disagree by 2*pi on those channels, which ``noise_convs`` consume
    raw. We force imag to +0.0, so their phase is exactly 0 or +pi. Other -0.0 parts are
    canonicalised too (``x + 0.0`` turns -0.0 into +0.0).
    """
    spec = stft(source)
    re = spec.real + 0.0
    im = spec.imag + 0.0
    im[0] = 0.0
    im[-1] = 0.0
    mag = np.hypot(re, im)
    phase = np.arctan2(im, re)
    return np.concatenate([mag, phase], axis=0)[None].astype(np.float32)


def spectrum_to_audio(spectrum: np.ndarray) -> np.ndarray:
    """The generator's tail on the host, for a body that ends at conv_post (the folded layout):
    (1, 22, N) log-magnitude and phase channels of N valid frames → (N - 1) × 5 samples float32.

    Upstream: exp of the first 11 channels, sin of the last 11 (a phase), then ``torch.istft``
    (centred, periodic Hann, window-power normalized), as stages/generator.py's InverseSTFT does in
    the graph. float64 throughout: exp of a log-magnitude turns fp16's error into a relative one.
    """
    x = np.asarray(spectrum, np.float64)[0]
    n = x.shape[-1]
    frames = np.fft.irfft(np.exp(x[:N_BINS]) * np.exp(1j * np.sin(x[N_BINS:])), n=N_FFT, axis=0)  # (20, N)
    window = hann_window()
    length = (n - 1) * HOP + N_FFT
    signal, envelope = np.zeros(length), np.zeros(length)
    for t in range(N_FFT):  # overlap-add: sample t of every frame, frames HOP apart
        signal[t:t + n * HOP:HOP] += frames[t] * window[t]
        envelope[t:t + n * HOP:HOP] += window[t] ** 2
    start = N_FFT // 2
    out = signal / np.maximum(envelope, 1e-3)
    return out[start:start + (n - 1) * HOP].astype(np.float32)


def make_har(
    f0_curve: np.ndarray,
    l_linear_weight: np.ndarray,
    l_linear_bias: np.ndarray,
    draws: SourceDraws,
    har_len_padded: int,
) -> np.ndarray:
    """The generator's ``har`` input: (2F,) F0 curve -> (1, 22, har_len_padded) float32, zero padded.

    Valid length is 120F + 1 (= ``KOKORO.har_len``). The source is rounded to float32 before
    the STFT, as upstream's float32 model does.
    """
    source = harmonic_source(f0_curve, l_linear_weight, l_linear_bias, draws, dtype=np.float32)
    har = stft_har(source)
    n = har.shape[2]
    if n > har_len_padded:
        raise ValueError(f"har has {n} frames, more than the padded length {har_len_padded}")
    out = np.zeros((1, HAR_CHANNELS, har_len_padded), dtype=np.float32)
    out[:, :, :n] = har
    return out
