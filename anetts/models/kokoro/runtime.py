"""Kokoro text -> 24 kHz speech from the built stages: orchestration, bucket choice and host DSP.

Per chunk::

    phonemes -> ids [0, *ids, 0] -> duration (smallest token bucket that fits)
      -> align d / t_en by pred_dur (host) -> f0ntrain -> decoder_pre
      -> hn-NSF source + STFT (host, float64 phase) -> har -> generator (smallest seconds bucket)
      -> trim to frames x 600 samples

All model math runs in the built artifacts (through a :class:`~anetts.runtime.runners.Runner`);
this module only pads to buckets, builds masks and does the host DSP. Every stage gets its valid
region re-padded with zeros to its own bucket, so nothing computed on padding reaches the audio.
Text goes through upstream's frontend for its language (:mod:`anetts.models.kokoro.frontend`), chunked
as upstream chunks it within the largest buckets; a chunk whose predicted length still overflows is
split again (at words, where the language has them) before any frame stage runs. English chunks carry
word timestamps (:mod:`anetts.models.kokoro.timestamps`). A loaded runtime may be called from several
threads: the G2P runs under one lock, everything else is per call or loaded under the backend's lock.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import numbers
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

from anetts.models.kokoro.dsp import KOKORO, SourceDraws, align, frame_mask, make_har, pad_last, spectrum_to_audio
from anetts.models.kokoro.fold import FoldGeometry
from anetts.runtime.errors import ArtifactError, InputError, TTSError, check_text_unicode, validate_seed
from anetts.runtime.manifest import ModelArtifacts, PackageEntry
from anetts.runtime.planned import Planned
from anetts.runtime.runners import Runner
from anetts.runtime.speech import Capabilities
from anetts.models.kokoro.blend import echo, parse_blend
from anetts.models.kokoro.assets import STYLE_DIM, VOCAB_FILE, VOICE_LANGUAGES_FILE, VOICE_ROWS, VOICES_DIR
from anetts.models.kokoro.frontend import SAMPLE_TEXTS, Frontend, frontend, named_language
from anetts.models.kokoro.text import MAX_PHONEMES, TextChunk, chunk_text, phoneme_limit, tokenize
from anetts.models.kokoro.timestamps import Word, word_timestamps
from anetts.runtime.captions import WordTimestamp

log = logging.getLogger(__name__)

SAMPLE_RATE = KOKORO.sample_rate  # 24000
SAMPLES_PER_FRAME = KOKORO.samples_per_frame  # 600
SPEED_RANGE = (0.25, 4.0)
DEFAULT_SEED = 0
FADE_MS = 5.0
# Chunk budget estimate: tokens per second of audio at speed 1. Kokoro-82M speaks ~16-17, the
# calibrated synthetic weights ~14; a lower figure leaves margin, and a chunk that overflows
# anyway is split again after the duration stage.
TOKENS_PER_SECOND = 13.0


class _Timings:
    def __init__(self):
        self.t: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, key: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.t[key] += time.perf_counter() - t0

    def as_dict(self) -> dict[str, float]:
        return dict(self.t)


@dataclass
class ChunkResult:
    """One synthesized chunk (what :meth:`KokoroRuntime.stream` yields)."""

    index: int
    total: int  # chunks known when this one was yielded (grows if a chunk had to be split)
    text: str | None
    phonemes: str
    input_ids: list[int]  # as fed to `duration`: [0, *ids, 0]
    pred_dur: np.ndarray  # (len(input_ids),) frames per token
    buckets: dict[str, str]
    audio: np.ndarray  # float32, 24 kHz, fades applied at joins
    timings: dict[str, float]
    dropped: list[str] = field(default_factory=list)
    is_last: bool = False
    sample_rate: int = SAMPLE_RATE
    words: list[WordTimestamp] = field(default_factory=list)  # seconds from the start of the whole output
    codes = None  # Kokoro makes audio, no discrete codes (anetts.runtime.speech)

    @property
    def frames(self) -> int:
        return int(self.pred_dur.sum())

    @property
    def units(self) -> int:
        """The phonemes this chunk spoke: what ``stream``'s plan counts."""
        return len(self.phonemes)

    @property
    def input_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def output_frames(self) -> int:
        return self.frames

    @property
    def seconds(self) -> float:
        return self.audio.shape[0] / self.sample_rate


@dataclass
class SynthesisResult:
    """Joined audio of all chunks with per-stage timings (seconds, summed over chunks)."""

    audio: np.ndarray
    sample_rate: int
    timings: dict[str, float]
    chunks: list[ChunkResult]

    @property
    def seconds(self) -> float:
        return self.audio.shape[0] / self.sample_rate

    @property
    def rtf(self) -> float:
        """Real-time factor: wall time / audio time (lower is faster)."""
        return self.timings["total"] / self.seconds if self.seconds else math.inf

    @property
    def durations(self) -> np.ndarray:
        """Predicted frames per token of all chunks, concatenated."""
        return np.concatenate([c.pred_dur for c in self.chunks])

    @property
    def dropped(self) -> list[str]:
        return [s for c in self.chunks for s in c.dropped]

    @property
    def words(self) -> list[WordTimestamp]:
        """Word timestamps of all chunks (empty where the input was phonemes or the language has no words)."""
        return [w for c in self.chunks for w in c.words]


@dataclass
class _Piece:
    text: str | None
    phonemes: str
    ids: list[int]  # wrapped
    dropped: list[str]
    words: tuple[Word, ...] = ()


class _TooLong(Exception):
    def __init__(self, frames: int):
        self.frames = frames


def _validate_speed(speed) -> float:
    lo, hi = SPEED_RANGE
    if isinstance(speed, bool) or not isinstance(speed, numbers.Real) or not math.isfinite(speed) or not lo <= speed <= hi:
        raise InputError(f"speed must be a number in [{lo:g}, {hi:g}], got {speed!r}", field="speed")
    return float(speed)


def _split_phonemes(ps: str) -> tuple[str, str] | None:
    """Split a phoneme string near its middle: after . ! ? first, then , ; : —, then any space."""
    ps = ps.strip()
    if len(ps) < 2:
        return None
    mid = len(ps) / 2
    best = None
    for i, ch in enumerate(ps):
        if ch != " " or i == 0:
            continue
        prev = ps[i - 1]
        rank = 0 if prev in ".!?…" else 1 if prev in ",;:—" else 2
        key = (rank, abs(i - mid))
        if best is None or key < best[0]:
            best = (key, i)
    i = best[1] if best else len(ps) // 2
    left, right = ps[:i].strip(), ps[i:].strip()
    return (left, right) if left and right else None


def fade_edges(audio: np.ndarray, fade_in: int, fade_out: int) -> np.ndarray:
    """Raised-cosine fade-in/-out over the first/last samples (in place on a float32 copy)."""
    out = np.array(audio, dtype=np.float32, copy=True)
    n = out.shape[0]
    for length, at_start in ((fade_in, True), (fade_out, False)):
        k = min(int(length), n // 2)
        if k <= 0:
            continue
        ramp = (0.5 - 0.5 * np.cos(np.pi * (np.arange(k) + 0.5) / k)).astype(np.float32)
        if at_start:
            out[:k] *= ramp
        else:
            out[n - k :] *= ramp[::-1]
    return out


def _host_params(manifest: dict, where: str) -> tuple[np.ndarray, np.ndarray]:
    """The hn-NSF merge layer (1, 9) and bias (1,), run on the host, from the manifest's `host` block."""
    try:
        w = np.asarray(manifest["host"]["l_linear_weight"], dtype=np.float64).reshape(1, 9)
        b = np.asarray(manifest["host"]["l_linear_bias"], dtype=np.float64).reshape(1)
    except (KeyError, ValueError, TypeError) as e:
        raise ArtifactError(f"{where}: bad 'host' block, need l_linear_weight [[9]] and l_linear_bias [1] ({e})") from e
    if not (np.isfinite(w).all() and np.isfinite(b).all()):
        raise ArtifactError(f"{where}: host l_linear parameters are not finite")
    return w, b


class KokoroRuntime:
    """Text or phonemes -> 24 kHz float32 audio from a built Kokoro model directory
    (the runtime protocol of :mod:`anetts.runtime.speech`)."""

    family = "kokoro"
    sample_rate = SAMPLE_RATE
    capabilities = Capabilities(blending=True, cloning=False, timestamps=True, speed=True, audio=True)
    options = ("phonemes", "lang", "max_phonemes", "fade_ms")

    def __init__(self, artifacts: ModelArtifacts, backend: Runner, *, tokens_per_second: float = TOKENS_PER_SECOND):
        self.artifacts = artifacts
        self.backend = backend
        self.tokens_per_second = float(tokens_per_second)
        vocab_file = artifacts.asset(VOCAB_FILE)
        try:
            vocab = json.loads(vocab_file.read_text(encoding="utf-8"))
            self.vocab = {str(k): int(v) for k, v in vocab.items()}
        except (ValueError, AttributeError, OSError) as e:
            raise ArtifactError(f"cannot read the vocab {vocab_file}: {e}") from e
        # each voice's language (a build before voice_languages.json: the upstream-style names say it)
        self.voice_languages: dict[str, str] = {}
        if VOICE_LANGUAGES_FILE in artifacts.assets:
            path = artifacts.asset(VOICE_LANGUAGES_FILE)
            try:
                self.voice_languages = {str(k): str(v) for k, v in json.loads(path.read_text(encoding="utf-8")).items()}
            except (ValueError, AttributeError, OSError) as e:
                raise ArtifactError(f"cannot read the voice languages {path}: {e}") from e
        self.l_linear_weight, self.l_linear_bias = _host_params(artifacts.manifest, str(artifacts.model_dir))
        self._voices: dict[str, np.ndarray] = {}
        self.max_tokens = artifacts.max_tokens("duration")
        self.max_frames = artifacts.max_frames()

    # ------------------------------------------------------------------ voices

    @property
    def voices(self) -> list[str]:
        return [n[len(VOICES_DIR) + 1:-len(".npy")] for n in self.artifacts.asset_names(f"{VOICES_DIR}/")]

    @property
    def default_voice(self) -> str:
        names = self.voices
        listed = [v for v in (self.artifacts.manifest.get("weights", {}).get("voices") or []) if v in names]
        if "af_heart" in names:
            return "af_heart"
        if listed or names:
            return (listed or names)[0]
        raise ArtifactError(f"no voices listed in the manifest of {self.artifacts.model_dir}")

    @property
    def warmup_texts(self) -> tuple[str, ...]:
        """What the server times at start: a sentence in the default voice's language, once and three
        times over (two lengths: its estimate of seconds per phoneme is a line)."""
        text = SAMPLE_TEXTS[frontend(None, self.default_voice, self.voice_languages).code]
        return text, " ".join([text] * 3)

    def check_voice_name(self, voice) -> None:
        """An InputError naming an unknown voice, or a blend's bad term, before anything is planned."""
        self.voice_pack(voice)

    def voice_pack(self, voice: str | np.ndarray | None) -> np.ndarray:
        """(510, 256) float32 style rows of a named voice, a blend ``"a(0.7)+b(0.3)"`` (the packs
        weighted, weights normalized: :mod:`anetts.models.kokoro.blend`) or a given pack."""
        if voice is None:
            voice = self.default_voice
        if isinstance(voice, str) and voice not in self._voices and ("+" in voice or "(" in voice):
            terms = parse_blend(voice)
            names = set(self.voices)
            unknown = [n for n, _ in terms if n not in names]
            if unknown:
                raise InputError(f"voice {echo(voice)}: unknown voice(s) {unknown}; available: {sorted(names)}",
                                 field="voice")
            return sum(w * self.voice_pack(n) for n, w in terms).astype(np.float32)
        if isinstance(voice, str):
            if voice not in self._voices:
                names = self.voices
                if voice not in names:
                    raise InputError(f"unknown voice {echo(voice)}; available: {names}", field="voice")
                path = self.artifacts.asset(f"{VOICES_DIR}/{voice}.npy")
                try:
                    pack = np.load(path, allow_pickle=False)
                except (OSError, ValueError) as e:
                    raise ArtifactError(f"cannot read voice {voice!r} ({path}): {e}") from e
                if pack.shape != (VOICE_ROWS, STYLE_DIM) or not np.isfinite(pack).all():
                    raise ArtifactError(f"voice {voice!r} ({path}): expected finite ({VOICE_ROWS}, {STYLE_DIM}), got {pack.shape}")
                self._voices[voice] = pack.astype(np.float32, copy=False)
            return self._voices[voice]
        pack = np.asarray(getattr(voice, "numpy", lambda: voice)(), dtype=np.float32)
        if pack.size != VOICE_ROWS * STYLE_DIM:
            raise InputError(f"a voice pack must have {VOICE_ROWS}x{STYLE_DIM} values, got shape {pack.shape}",
                             field="voice")
        return pack.reshape(VOICE_ROWS, STYLE_DIM)

    @staticmethod
    def style_row(pack: np.ndarray, n_phonemes: int) -> np.ndarray:
        """Upstream's choice ``voice[len(phonemes) - 1]`` as (1, 256)."""
        return pack[min(max(n_phonemes, 1), VOICE_ROWS) - 1][None].astype(np.float32)

    # ------------------------------------------------------------------ planning

    def phoneme_limit(self, speed: float = 1.0, max_phonemes: int | None = None) -> int:
        """Most phonemes per chunk that fit the largest token bucket and (estimated) seconds bucket."""
        limit = phoneme_limit(self.max_tokens, KOKORO.seconds(self.max_frames), self.tokens_per_second * speed)
        limit = min(limit, MAX_PHONEMES)
        if max_phonemes is not None:
            if max_phonemes < 1:
                raise InputError(f"max_phonemes must be >= 1, got {max_phonemes}")
            limit = min(limit, int(max_phonemes))
        return limit

    def _tokenize(self, ps: str) -> tuple[list[int], list[str]]:
        ids, dropped = tokenize(ps, self.vocab)
        return [0, *ids, 0], dropped

    def plan(self, text: str | None = None, *, phonemes: str | None = None, speed: float = 1.0,
             max_phonemes: int | None = None, lang: str | None = None, voice=None,
             sentences: bool = False) -> list[TextChunk]:
        """The chunks ``text`` (or ``phonemes``) will be synthesized in (language: ``lang``, else ``voice``'s)."""
        fe = frontend(lang, self.default_voice if voice is None else voice, self.voice_languages)
        return [TextChunk(p.text or "", p.phonemes, p.words)
                for p in self._plan(text, phonemes, speed, max_phonemes, fe, sentences)]

    def _plan(self, text, phonemes, speed, max_phonemes, fe: Frontend, sentences: bool = False) -> list[_Piece]:
        if (text is None) == (phonemes is None):
            raise InputError("give either text or phonemes (exactly one)")
        what, value = ("text", text) if text is not None else ("phonemes", phonemes)
        if not isinstance(value, str):
            raise InputError(f"{what} must be a string, got {type(value).__name__}")
        if not value.strip():
            raise InputError(f"{what} is empty or whitespace only; nothing to speak")
        check_text_unicode(value, what)
        limit = self.phoneme_limit(speed, max_phonemes)
        try:
            if phonemes is not None:
                ps = " ".join(phonemes.split())
                tokenize(ps, self.vocab)  # raises (naming the problem) if nothing is speakable; warns on drops
                known = " ".join("".join(ch for ch in ps if ch in self.vocab).split())
                chunks = chunk_text(known, limit, phonemize_fn=lambda s: s)
                chunks = [TextChunk(None, c.phonemes) for c in chunks]
            else:
                if not any(ch.isalnum() for ch in text):
                    raise InputError(f"text {text.strip()[:40]!r} has no letters or digits (punctuation only); nothing to speak")
                chunks = fe.chunks(text, limit, sentences=sentences)
        except InputError:
            raise
        except ValueError as e:
            raise InputError(str(e)) from e

        pieces: list[_Piece] = []
        problems = []
        for c in chunks:
            try:
                ids, dropped = self._tokenize(c.phonemes)
            except ValueError as e:  # a chunk of only unknown symbols / punctuation
                problems.append(str(e))
                log.warning("skipping chunk %r: %s", c.text or c.phonemes, e)
                continue
            pieces.append(_Piece(c.text, c.phonemes, ids, dropped, c.words))
        if not pieces:
            raise InputError(f"{what} {value.strip()[:40]!r} gives nothing to speak: {problems[0] if problems else 'no chunks'}")
        return pieces

    # ------------------------------------------------------------------ synthesis

    def _prepare(self, entry: PackageEntry, timings: _Timings) -> None:
        with timings("load"):
            self.backend.prepare(entry.stage, entry.bucket)

    def warmup(self) -> None:
        """Load the G2P of every language the voices speak now instead of on first use. Packages stay
        loaded per bucket on first use, so memory follows the buckets a caller's texts need."""
        codes = {self.voice_languages.get(v) or named_language(v) for v in self.voices} - {None}
        for code in sorted(codes):
            Frontend(code).phonemes(SAMPLE_TEXTS[code])

    def _run_tokens(self, ids: Sequence[int], ref_s: np.ndarray, speed: float, rng: np.random.Generator,
                    timings: _Timings) -> tuple[np.ndarray, np.ndarray, dict[str, str]]:
        """One utterance through the four stages: (audio (frames*600,), pred_dur (n,), buckets)."""
        A, run = self.artifacts, self.backend.run
        n = len(ids)
        dur = A.token_bucket("duration", n)
        if dur is None:
            raise InputError(f"{n} tokens do not fit the largest duration bucket ({self.max_tokens} tokens)")
        self._prepare(dur, timings)
        T = dur.tokens
        input_ids = np.zeros((1, T), np.int32)
        input_ids[0, :n] = ids
        attention = np.zeros((1, T), np.int32)
        attention[0, :n] = 1
        with timings("duration"):
            d = run("duration", dur.bucket, {"input_ids": input_ids, "ref_s": ref_s,
                                             "speed": np.array([speed], np.float32), "attention_mask": attention})
        pred_dur = d["pred_dur"][0, :n].astype(np.int64)
        frames = int(pred_dur.sum())
        if frames > self.max_frames:
            raise _TooLong(frames)
        f0e, dpe, gen = (A.frame_bucket(s, frames) for s in ("f0ntrain", "decoder_pre", "generator"))
        for e in (f0e, dpe, gen):
            self._prepare(e, timings)
        f2 = 2 * frames

        with timings("align"):
            en, _ = align(d["d"].transpose(0, 2, 1), pred_dur, n, f0e.input("en").shape[-1])
            asr, _ = align(d["t_en"], pred_dur, n, dpe.input("asr").shape[-1])
        with timings("f0ntrain"):
            f = run("f0ntrain", f0e.bucket, {"en": en, "s": d["s"], "mask": frame_mask(frames, f0e.input("mask").shape[-1])})
        f0, noise = f["F0_pred"][:, :f2], f["N_pred"][:, :f2]
        with timings("decoder_pre"):
            x_pre = run("decoder_pre", dpe.bucket, {
                "asr": asr,
                "f0": pad_last(f0[:, None, :], dpe.input("f0").shape[-1]),
                "n_input": pad_last(noise[:, None, :], dpe.input("n_input").shape[-1]),
                "ref_s": ref_s,
                "mask": frame_mask(frames, dpe.input("mask").shape[-1]),
            })["x_pre"][:, :, :f2]
        with timings("har"):
            draws = SourceDraws.sample(frames * SAMPLES_PER_FRAME, rng)
            har = make_har(f0[0], self.l_linear_weight, self.l_linear_bias, draws, int(gen.geometry["har_frames"]))
        with timings("generator"):
            wav = self._vocode(gen, x_pre, ref_s, har, f2)
        audio = np.ascontiguousarray(wav.reshape(-1)[: frames * SAMPLES_PER_FRAME], dtype=np.float32)
        if not np.isfinite(audio).all():
            raise TTSError(f"{self.backend.name} backend produced non-finite audio ({gen.label})")
        buckets = {"duration": dur.bucket, "f0ntrain": f0e.bucket, "decoder_pre": dpe.bucket, "generator": gen.bucket}
        return audio, pred_dur, buckets

    def _vocode(self, gen: PackageEntry, x_pre: np.ndarray, ref_s: np.ndarray, har: np.ndarray, f2: int) -> np.ndarray:
        """The generator stage over `f2` 80 Hz frames → 24 kHz samples. A whole-layout package gives the
        waveform; a folded one (kokoro.fold: its inputs are rows) gives conv_post's spectrum, whose
        tail (exp, sin, inverse STFT) the host runs."""
        if "x_rows" not in {t.name for t in gen.inputs}:
            return self.backend.run("generator", gen.bucket, {
                "x_pre": pad_last(x_pre, gen.input("x_pre").shape[-1]),
                "ref_s": ref_s,
                "har": har,
                "mask": frame_mask(f2, gen.input("mask").shape[-1]),
            })["waveform"]
        rows = gen.input("x_rows").shape
        fold = FoldGeometry(rows[0], rows[-1])
        spectrum = self.backend.run("generator", gen.bucket, {
            "x_rows": fold.fold(x_pre),
            "ref_s": ref_s,
            "har_rows": fold.fold(har, fold.upsample, 1),
            "mask_rows": fold.fold(np.ones((1, 1, f2), np.float32)),
        })["spectrum"]
        return spectrum_to_audio(fold.unfold(spectrum, f2 * fold.upsample + 1))

    def predict_durations(self, input_ids: Sequence[int], voice=None, speed: float = 1.0, *,
                          ref_s: np.ndarray | None = None) -> np.ndarray:
        """Only the ``duration`` stage: frames per token (n,) for wrapped ids ``[0, *ids, 0]``."""
        speed = _validate_speed(speed)
        ids = [int(i) for i in input_ids]
        if ref_s is None:
            ref_s = self.style_row(self.voice_pack(voice), len(ids) - 2)
        dur = self.artifacts.token_bucket("duration", len(ids))
        if dur is None:
            raise InputError(f"{len(ids)} tokens do not fit the largest duration bucket ({self.max_tokens} tokens)")
        T, n = dur.tokens, len(ids)
        input_ids = np.zeros((1, T), np.int32)
        input_ids[0, :n] = ids
        attention = (np.arange(T) < n).astype(np.int32)[None]
        out = self.backend.run("duration", dur.bucket, {"input_ids": input_ids, "attention_mask": attention,
                                                        "ref_s": np.asarray(ref_s, np.float32).reshape(1, 256),
                                                        "speed": np.array([speed], np.float32)})
        return out["pred_dur"][0, :n].astype(np.int64)

    def synthesize_tokens(self, input_ids: Sequence[int], voice=None, speed: float = 1.0, *,
                          ref_s: np.ndarray | None = None, seed: int = DEFAULT_SEED) -> ChunkResult:
        """Upstream ``KModel.forward_with_tokens`` equivalent: wrapped ids ``[0, *ids, 0]``, no chunking.

        ``ref_s`` (1, 256) overrides the voice row (default ``voice[len(ids) - 3]``, i.e. upstream's
        ``voice[len(phonemes) - 1]``). Raises :class:`InputError` if the utterance does not fit.
        """
        speed, seed = _validate_speed(speed), validate_seed(seed)
        ids = [int(i) for i in input_ids]
        if len(ids) < 3:
            raise InputError(f"input_ids must hold at least one token between the two 0 wraps, got {ids}")
        if ref_s is None:
            ref_s = self.style_row(self.voice_pack(voice), len(ids) - 2)
        ref_s = np.asarray(ref_s, np.float32).reshape(1, 256)
        timings = _Timings()
        t0 = time.perf_counter()
        try:
            audio, pred_dur, buckets = self._run_tokens(ids, ref_s, speed, np.random.default_rng(seed), timings)
        except _TooLong as e:
            raise InputError(f"{len(ids)} tokens predict {e.frames} frames ({KOKORO.seconds(e.frames):.2f} s), more "
                             f"than the largest seconds bucket ({KOKORO.seconds(self.max_frames):g} s)") from None
        t = timings.as_dict()
        t["total"] = time.perf_counter() - t0
        return ChunkResult(0, 1, None, "", ids, pred_dur, buckets, audio, t, is_last=True)

    def stream(self, text: str | None = None, voice=None, speed: float = 1.0, *, phonemes: str | None = None,
               seed: int = DEFAULT_SEED, max_phonemes: int | None = None, lang: str | None = None,
               fade_ms: float = FADE_MS, sentences: bool = False) -> Planned[ChunkResult]:
        """Yield audio chunk by chunk as each is ready. Input is validated, and planned, before this
        returns: the result's ``units`` is the phonemes to speak.

        ``lang``: upstream's language code or alias (``a``, ``en-gb``, ``ja`` ...); default: the voice's.
        ``sentences``: text in one chunk per sentence (not packed up to the buckets), so the first
        audio comes after the first sentence rather than after the first full chunk.
        """
        t0 = time.perf_counter()
        speed, seed = _validate_speed(speed), validate_seed(seed)
        voice = self.default_voice if voice is None else voice
        pack = self.voice_pack(voice)
        planning = _Timings()
        fe = frontend(lang, voice, self.voice_languages)
        with planning("frontend"):
            pieces = self._plan(text, phonemes, speed, max_phonemes, fe, sentences)
        planning.t["total"] = time.perf_counter() - t0
        return Planned(self._stream(deque(pieces), pack, speed, seed, fade_ms, planning, fe),
                       sum(len(p.phonemes) for p in pieces), "phonemes")

    def _stream(self, pending: deque, pack, speed, seed, fade_ms, planning: _Timings, fe: Frontend) -> Iterator[ChunkResult]:
        rng = np.random.default_rng(seed)
        fade = int(round(fade_ms * SAMPLE_RATE / 1000))
        index = 0
        samples = 0  # audio yielded so far: the next chunk's offset for its word times
        carry = planning.as_dict()  # the first chunk carries the planning time
        while pending:
            piece = pending.popleft()
            timings = _Timings()
            t0 = time.perf_counter()
            ref_s = self.style_row(pack, len(piece.phonemes))
            try:
                audio, pred_dur, buckets = self._run_tokens(piece.ids, ref_s, speed, rng, timings)
            except _TooLong as e:
                parts = fe.split(TextChunk(piece.text or "", piece.phonemes, piece.words)) if piece.words else None
                if parts is not None:  # at word marks, so each part keeps its words
                    log.info("chunk of %d phonemes predicts %d frames > %d; splitting it at words", len(piece.phonemes),
                             e.frames, self.max_frames)
                    for c in reversed(parts):
                        try:
                            ids, dropped = self._tokenize(c.phonemes)
                        except ValueError:
                            continue
                        pending.appendleft(_Piece(c.text, c.phonemes, ids, dropped, c.words))
                    continue
                halves = _split_phonemes(piece.phonemes)
                if halves is None:
                    raise InputError(
                        f"{piece.phonemes!r} predicts {e.frames} frames, more than the largest seconds bucket "
                        f"({KOKORO.seconds(self.max_frames):g} s) at speed {speed:g}, and cannot be split further"
                    ) from None
                log.info("chunk of %d phonemes predicts %d frames > %d; splitting it", len(piece.phonemes), e.frames, self.max_frames)
                for ps in reversed(halves):
                    try:
                        ids, dropped = self._tokenize(ps)
                    except ValueError:
                        continue
                    pending.appendleft(_Piece(piece.text, ps, ids, dropped))
                continue
            last = not pending
            with timings("post"):
                audio = fade_edges(audio, fade if index else 0, 0 if last else fade)
            t = timings.as_dict()
            t["total"] = time.perf_counter() - t0
            for k, v in carry.items():
                t[k] = t.get(k, 0.0) + v
            carry = {}
            words = word_timestamps(piece.words, pred_dur, samples / SAMPLE_RATE)
            yield ChunkResult(index, index + 1 + len(pending), piece.text, piece.phonemes, piece.ids, pred_dur,
                              buckets, audio, t, piece.dropped, is_last=last, words=words)
            samples += audio.shape[0]
            index += 1

    def synthesize(self, text: str | None = None, voice=None, speed: float = 1.0, *, phonemes: str | None = None,
                   seed: int = DEFAULT_SEED, max_phonemes: int | None = None, lang: str | None = None,
                   fade_ms: float = FADE_MS) -> SynthesisResult:
        """Text (or phonemes) -> joined 24 kHz float32 audio with per-stage timings."""
        t0 = time.perf_counter()
        chunks = list(self.stream(text, voice, speed, phonemes=phonemes, seed=seed, max_phonemes=max_phonemes,
                                  lang=lang, fade_ms=fade_ms))
        t1 = time.perf_counter()
        audio = np.concatenate([c.audio for c in chunks]) if len(chunks) > 1 else chunks[0].audio
        timings: dict[str, float] = defaultdict(float)
        for c in chunks:
            for k, v in c.timings.items():
                if k != "total":
                    timings[k] += v
        timings["post"] += time.perf_counter() - t1
        timings["total"] = time.perf_counter() - t0
        return SynthesisResult(audio, SAMPLE_RATE, dict(timings), chunks)
