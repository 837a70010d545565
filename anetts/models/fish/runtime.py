"""Fish S2 Pro text -> codes -> 44.1 kHz speech from the built stages.

Per text chunk::

    prompt rows (prompt.build_prompt) -> host input embedding (fp16 assets)
      -> slow chunks `prefill` in blocks (KV states; the last chunk's head  ─┐
         gives the restricted logits of the last prompt row)                │
      -> per frame: semantic draw (RAS) from the restricted logits          │ stop at <|im_end|>
                    -> fast_ar `frame` (10 passes, codes drawn in the graph │ or the frame budget
                       on the host's noise; or 10 x `decode`, drawn here)  │
                    -> [token, a0..a9] embedded -> slow chunks `decode`    │
                       (the next final-normed state and its logits)       ─┘
      -> codes (frames, 10) -> codec stage (bucketed, windows) -> audio

Per frame that is one call per slow chunk and one fused fast-AR call (S2 Pro: 9 + 1).

All network math runs in the built packages through the runners of :mod:`anetts.runtime.runners`
(mil: the MIL executor on the .mlpackages; torch: the fp32 TorchScript exports the packages were
converted from; coreml: Core ML, macOS only); the host embeds inputs, samples and pads. The slow stages' KV context is the package's bucket: a prompt plus
its frame budget that would not fit is never truncated: earlier chunks are dropped from the
conversation, a text chunk is split, and a generation that reaches the end of the context goes on
in a fresh one (the same turns, the voice turn holding the latest frames generated so far).
"""
from __future__ import annotations

import functools
import logging
import math
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from anetts.models.fish import prompt as P
from anetts.models.fish.assets import CODEBOOK_EMBEDDINGS, EMBEDDINGS, InputEmbedding
from anetts.models.fish.config import CONFIG_NAME, FishConfig
from anetts.models.fish.prefix import DEFAULT_MB, PrefixCache, Snapshot, prefix_key
from anetts.models.fish.sampling import (DECODE, FRAME, NOISE_LOW, SamplingParams, SemanticSampler, frame_draw,
                                         gumbel_noise, sample_logits)
from anetts.models.fish.tokenizer import TOKENIZER_NAME, TokenizerError, load_tokenizer
from anetts.runtime.errors import ArtifactError, InputError, TTSError, check_text_unicode, validate_seed
from anetts.runtime.manifest import ModelArtifacts, PackageEntry
from anetts.runtime.planned import Planned
from anetts.runtime.runners import Runner
from anetts.runtime.speech import Capabilities, Reference

log = logging.getLogger(__name__)

SAMPLE_RATE = 44100
SAMPLES_PER_FRAME = 2048  # 46.44 ms of audio per frame
FRAME_SECONDS = SAMPLES_PER_FRAME / SAMPLE_RATE
CODEC_STAGE = "codec"
# frames of codes a codec window reads before the frames it emits (at most half the largest bucket),
# and after them: the codec stage is causal, so none (a codec package may declare either in its
# geometry: `context_frames`, `lookahead_frames`). Windowed and streamed audio equals the one-shot
# decode where the codec's receptive field fits the context.
CODEC_CONTEXT = 16
CODEC_LOOKAHEAD = 0
MIN_ROOM = 16  # fewest frames a chunk's prompt must leave in the context
BUDGET_PER_TOKEN, MIN_BUDGET = 12, 32  # upstream's frame budget: max(32, 12 x text tokens)
BLOCK_FRAMES = 8  # frames per streamed block


# ------------------------------------------------------------------------------------------------
# results
# ------------------------------------------------------------------------------------------------

@dataclass
class FishChunk:
    """One streamed block: new frames of one text chunk (and their audio when the build has a codec)."""

    chunk: int  # index of the text chunk
    text: str
    codes: np.ndarray  # (new frames, num_codebooks) int64
    audio: np.ndarray | None  # float32 44.1 kHz for the frames final so far (None: no codec stage)
    frames_total: int  # frames generated so far, all chunks
    elapsed: float  # seconds since the call
    is_chunk_end: bool = False
    stop: str | None = None  # at a chunk's end: "im_end", "max_frames"
    context_restarts: int = 0
    is_last: bool = False
    # at a text chunk's end, for that chunk: seconds per part, and the prompt rows prefilled (`prefill_rows`)
    # and started from the prefix cache (`prefill_cached_rows`)
    timings: dict | None = None
    input_tokens: int = 0  # at a chunk's end: the text chunk's tokens
    sample_rate: int = SAMPLE_RATE
    words = ()  # Fish has no word alignment (anetts.runtime.speech)

    @property
    def units(self) -> int:
        """The frames of this block: what ``stream``'s plan counts."""
        return len(self.codes)

    @property
    def output_frames(self) -> int:
        return len(self.codes)


@dataclass
class FishResult:
    codes: np.ndarray  # (frames, num_codebooks) int64, all chunks
    chunk_codes: list[np.ndarray]
    audio: np.ndarray | None  # None when the build has no codec stage
    sample_rate: int
    timings: dict[str, float]
    chunks: list[str]
    stops: list[str]
    context_restarts: int = 0
    semantic_tokens: np.ndarray | None = None

    @property
    def frames(self) -> int:
        return int(self.codes.shape[0])

    @property
    def seconds(self) -> float:
        """Audio seconds (frames x 46.44 ms)."""
        return self.frames * FRAME_SECONDS

    @property
    def rtf(self) -> float:
        """wall / audio (lower is faster)."""
        return self.timings["total"] / self.seconds if self.seconds else math.inf

    @property
    def rtfx(self) -> float:
        """audio / wall."""
        return self.seconds / self.timings["total"] if self.timings.get("total") else math.inf


@dataclass
class _Plan:
    text: str
    budget: int
    tokens: int  # of the text


# ------------------------------------------------------------------------------------------------
# the decode loop: the one loop synthesis, the chain check and the end-to-end gate run
# ------------------------------------------------------------------------------------------------

class Picks:
    """What the decode loop asks at each pick, and what it shows after each frame. Synthesis samples
    (`Sampling`); the chain check and the end-to-end gate decode greedily against upstream's decode
    (`anetts.models.fish.greedy.Greedy`), following upstream's picks where they must."""

    def __init__(self):
        self.timings: dict = defaultdict(float)

    def semantic(self, frame: int, logits: np.ndarray) -> int:
        """Frame `frame`'s token id from the restricted head's logits (the last slow chunk's)."""
        raise NotImplementedError

    def code(self, frame: int, codebook: int, logits: np.ndarray) -> int:
        """Code `codebook` (1..num_codebooks-1) of frame `frame` from that fast-AR pass's logits
        (the stepped fast AR, `decode`)."""
        raise NotImplementedError

    def draw(self, frame: int) -> dict[str, np.ndarray]:
        """The fused fast AR's (`frame`) sampling inputs for frame `frame` (`sampling.frame_draw`)."""
        raise NotImplementedError

    def drawn(self, frame: int, codes: list[int], logits: np.ndarray) -> list[int]:
        """After a fused call: the codes 1..num_codebooks-1 the graph drew and every pass's logits
        (num_codebooks, codebook_size); returns the codes the frame keeps."""
        return codes

    def seen(self, frame: int, position: int, hidden: np.ndarray, head_logits: np.ndarray,
             fast_logits: list[np.ndarray]) -> None:
        """After each frame: the slow position that produced it, its final-normed slow state, the head's
        logits and every fast pass's logits (pass 0's are discarded; none at <|im_end|>)."""


class Sampling(Picks):
    """Upstream's draws: the semantic token with RAS, each code by top-p / top-k / temperature (greedy
    at temperature 0), from one seeded stream kept across the chunks of an utterance."""

    def __init__(self, params: SamplingParams, cfg: FishConfig, row_ids: np.ndarray, seed: int):
        super().__init__()
        self.params, self.cfg, self.rng = params, cfg, np.random.default_rng(seed)
        self.sampler = SemanticSampler(params, row_ids, (cfg.semantic_begin_id, cfg.semantic_end_id), self.rng)

    def semantic(self, frame: int, logits: np.ndarray) -> int:
        return self.sampler(logits)

    def code(self, frame: int, codebook: int, logits: np.ndarray) -> int:
        p = self.params
        return sample_logits(logits, p.temperature, p.top_p, p.top_k, self.rng)

    def draw(self, frame: int) -> dict[str, np.ndarray]:
        """The noise `code` would take for codes 1..n-1, in its order (none drawn when greedy)."""
        p, shape = self.params, (1, self.cfg.num_codebooks - 1, self.cfg.codebook_size)
        noise = np.zeros(shape, np.float32) if p.greedy else gumbel_noise(self.rng.uniform(NOISE_LOW, 1.0, size=shape))
        return frame_draw(p.temperature, p.top_p, p.top_k, noise)


class FishDecoder:
    """Prompt rows -> frames (semantic token, 10 codes) through the AR stages' packages.

    `program(stage)` gives a loaded stage package (`slow_chunk<k>`, the last with the restricted
    head's `logits`; `fast_ar`) with `run(function, inputs, state)` and `new_state()` (zeroed KV
    states); the host embeds the input rows, `Picks` chooses every token and code. `context` is the slow chunks' KV rows, `prefill`
    their prefill block. `fast_function`: the fast AR's `frame` (fused, one call per frame) or
    `decode` (stepped); None: the package's default. `prefix_cache`: where the slow states after a
    prompt's fixed prefix are kept (:mod:`anetts.models.fish.prefix`); None: every prompt prefilled whole."""

    def __init__(self, cfg: FishConfig, embed: Callable[[np.ndarray], np.ndarray], program: Callable[[str], object],
                 chunk_stages: Sequence[str], context: int, prefill: int, row_ids: np.ndarray,
                 fast_function: str | None = None, prefix_cache: PrefixCache | None = None):
        self.cfg, self.embed, self.program = cfg, embed, program
        self.chunk_stages, self.context, self.prefill_tokens = list(chunk_stages), int(context), int(prefill)
        self.row_ids = np.asarray(row_ids)
        if fast_function not in (None, FRAME, DECODE):
            raise InputError(f"fast_function must be {FRAME!r} (fused) or {DECODE!r} (stepped), got {fast_function!r}")
        self.fast_function = fast_function
        self.prefix_cache = prefix_cache
        self._state_bytes: int | None = None

    @property
    def fused(self) -> bool:
        return (self.fast_function or self.program("fast_ar").default_function) == FRAME

    def room(self, T: int) -> int:
        """Frames a T-token prompt leaves in the context (0 if its padded prefill does not fit)."""
        if -(-T // self.prefill_tokens) * self.prefill_tokens > self.context:
            return 0
        return self.context - T + 1

    def _slow(self, x: np.ndarray, pos: int, function: str, states: list, row: int) -> tuple[np.ndarray, np.ndarray]:
        """Row `row` of the last chunk's outputs: the final-normed slow state and the head's logits."""
        out = {"hidden_out": x}
        for stage, st in zip(self.chunk_stages, states):
            out = self.program(stage).run(function, {"hidden": out["hidden_out"], "pos": np.array([pos], np.int32)}, st)
        return out["hidden_out"][0, row], out["logits"].reshape(-1, len(self.row_ids))[row]

    def _prefill(self, rows: np.ndarray, timings, prefix: int = 0) -> tuple[np.ndarray, np.ndarray, list]:
        """Prefill prompt `rows` whose first `prefix` rows are a fixed prefix (the system turn): from the
        cached states after its last whole block when there are some, else from zeroed states, keeping
        them at that block's end. Aligned to the blocks, a cached start makes the very calls, with the
        very inputs and states, that the whole prefill makes from that row on: the outputs, and so greedy
        codes, are bit-identical to the uncached path's."""
        t0 = time.perf_counter()
        T = rows.shape[1]
        boundary = self._boundary(prefix, T)
        key = prefix_key(rows[:, :boundary], self.prefill_tokens) if boundary else None
        snap = self.prefix_cache.get(key) if key else None
        x = self.embed(rows)
        if snap is not None:
            states, start = self._restore(snap), boundary
        else:
            states, start = [self.program(s).new_state() for s in self.chunk_stages], 0
            if key:  # up to the boundary, keep the states there, go on from it
                self._prefill_blocks(x, 0, boundary, states)
                self._keep(key, boundary, states)
        h, logits = self._prefill_blocks(x, boundary if key else 0, T, states)
        timings["prefill"] += time.perf_counter() - t0
        timings["prefill_rows"] += T - start
        timings["prefill_cached_rows"] += start
        return h, logits, states

    def _prefill_blocks(self, x: np.ndarray, start: int, stop: int, states: list) -> tuple[np.ndarray, np.ndarray]:
        """Embedded prompt rows ``x[start:stop]`` through the slow chunks, one prefill block per call from
        ``start`` (a block boundary); the last block's (h, logits)."""
        Pn = self.prefill_tokens
        h = logits = None
        for p in range(start, stop, Pn):
            k = min(Pn, stop - p)
            block = np.zeros((1, Pn, x.shape[1]), np.float32)
            block[0, :k] = x[p:p + k]
            h, logits = self._slow(block, p, "prefill", states, k - 1)
        return h, logits

    def _boundary(self, prefix: int, T: int) -> int:
        """The last prefill-block boundary inside a `prefix`-row fixed prefix of a T-row prompt; 0: no caching."""
        if self.prefix_cache is None or not self.prefix_cache.enabled:
            return 0
        boundary = prefix // self.prefill_tokens * self.prefill_tokens
        return boundary if 0 < boundary < T else 0

    def _restore(self, snap: Snapshot) -> list:
        return [self.program(s).copy_state(st) for s, st in zip(self.chunk_stages, snap.states)]

    def _snapshot_bytes(self, states: list) -> int:
        if self._state_bytes is None:  # the same for every snapshot of these programs
            self._state_bytes = sum(self.program(s).state_bytes(st) for s, st in zip(self.chunk_stages, states))
        return self._state_bytes

    def _keep(self, key: str, rows: int, states: list) -> None:
        nbytes = self._snapshot_bytes(states)
        if nbytes <= self.prefix_cache.max_bytes:  # no copy for a cache too small to hold it
            copies = tuple(self.program(s).copy_state(st) for s, st in zip(self.chunk_stages, states))
            self.prefix_cache.put(key, Snapshot(copies, rows, nbytes))

    def _room(self, nbytes: int, evict: bool) -> bool:
        return nbytes <= self.prefix_cache.max_bytes if evict else self.prefix_cache.fits(nbytes)

    def prefill_prefix(self, rows: np.ndarray, *, evict: bool = True) -> bool:
        """Prefill a fixed prefix alone (rows (1 + num_codebooks, L): a voice's system turn) up to its last
        whole block and keep the states, so the prompts that open with it start there. True when they are
        cached (now or before); False when they cannot be: the cache is off or too small, the prefix is
        shorter than a block, or (not `evict`) keeping them would drop another prefix's."""
        rows = np.asarray(rows, np.int64)
        Pn = self.prefill_tokens
        boundary = self._boundary(rows.shape[1], rows.shape[1] + 1)
        if not boundary:
            return False
        key = prefix_key(rows[:, :boundary], Pn)
        if key in self.prefix_cache:
            return True
        if self._state_bytes is not None and not self._room(self._state_bytes, evict):
            return False
        states = [self.program(s).new_state() for s in self.chunk_stages]
        nbytes = self._snapshot_bytes(states)
        if not self._room(nbytes, evict):
            return False
        # whole blocks: the calls a prompt's own prefill makes up to the boundary
        self._prefill_blocks(self.embed(rows[:, :boundary]), 0, boundary, states)
        return self.prefix_cache.put(key, Snapshot(tuple(states), boundary, nbytes))

    def _frame(self, f: int, pos: int, h: np.ndarray, logits: np.ndarray, picks: Picks,
               fast_state) -> tuple[int, list[int]]:
        """Frame `f` from the final-normed slow state `h` and the head's `logits` over it (made at slow
        position `pos`): (token id, codes a0..a9)."""
        cfg, t = self.cfg, picks.timings
        hid = h.reshape(1, 1, -1).astype(np.float32)
        t1 = time.perf_counter()
        token = picks.semantic(f, logits)
        t["sample"] += time.perf_counter() - t1
        fast_logits: list[np.ndarray] = []
        codes: list[int] = []
        if token != cfg.im_end_id:
            codes = [min(max(token - cfg.semantic_begin_id, 0), cfg.codebook_size - 1)]
        if codes and self.fused:
            draw = picks.draw(f)
            t0 = time.perf_counter()
            out = self.program("fast_ar").run(FRAME, {"hidden": hid, "code": np.array(codes, np.int32), **draw},
                                              fast_state)
            t1 = time.perf_counter()
            t["fast"] += t1 - t0
            fast_logits = list(out["frame_logits"][0])
            codes += picks.drawn(f, [int(c) for c in out["codes"].reshape(-1)], out["frame_logits"][0])
            t["sample"] += time.perf_counter() - t1
        elif codes:
            fast = self.program("fast_ar")
            for c in range(cfg.num_codebooks):
                t0 = time.perf_counter()
                fl = fast.run(DECODE, {"hidden": hid, "code": np.array([0 if c == 0 else codes[-1]], np.int32),
                                       "pos": np.array([c], np.int32)}, fast_state)["logits"].reshape(-1)
                t1 = time.perf_counter()
                t["fast"] += t1 - t0
                fast_logits.append(fl)
                if c > 0:  # pass 0 (the slow state) only fills the KV; its logits are discarded
                    codes.append(picks.code(f, c, fl))
                t["sample"] += time.perf_counter() - t1
        picks.seen(f, pos, h, logits, fast_logits)
        return token, codes

    def generate(self, rows: np.ndarray, budget: int, picks: Picks, *, stop_at_end: bool = True,
                 restart: Callable[[np.ndarray], np.ndarray] | None = None,
                 prefix: int = 0) -> Iterator[tuple[int, list[int]]]:
        """Frames (token, codes) from prompt `rows` (1 + num_codebooks, T): at most `budget`, until
        <|im_end|> (when `stop_at_end`; else it is yielded with no codes and fed back with codebook
        rows 0). When the next slow step would pass the context, `restart(codes so far)` gives the rows
        of a fresh context to go on from (without it the generation stops there, logged). `prefix`: the
        rows of the fixed prefix that `rows` and every restart's rows open with (the system turn), whose
        prefill the prefix cache keeps."""
        rows = np.asarray(rows, np.int64)
        if rows.ndim != 2 or rows.shape[0] != self.cfg.num_codebooks + 1:
            raise InputError(f"prompt rows must be ({self.cfg.num_codebooks + 1}, T), got {rows.shape}")
        if rows.shape[1] < 1:
            raise InputError("empty prompt")
        if self.room(rows.shape[1]) < 1:
            raise InputError(f"a prompt of {rows.shape[1]} tokens does not fit the context of {self.context}")
        return self._generate(rows, budget, picks, stop_at_end, restart, prefix)

    def _generate(self, rows, budget, picks, stop_at_end, restart, prefix) -> Iterator[tuple[int, list[int]]]:
        h, logits, states = self._prefill(rows, picks.timings, prefix)
        pos = rows.shape[1]  # the slow position the next input row goes to
        fast_state = self.program("fast_ar").new_state()
        done: list[list[int]] = []
        for f in range(budget):
            token, codes = self._frame(f, pos - 1, h, logits, picks, fast_state)
            if token == self.cfg.im_end_id and stop_at_end:
                return
            yield token, codes
            if not codes:  # <|im_end|> kept (stop_at_end False): fed back with codebook rows 0
                codes_in = [0] * self.cfg.num_codebooks
            else:
                codes_in = codes
                done.append(codes)
            if f + 1 == budget:
                return
            if pos >= self.context:  # the next slow step has no KV row left
                if restart is None:
                    log.warning("context of %d rows full after %d frames; stopping", self.context, f + 1)
                    return
                rows = restart(np.asarray(done, np.int64).T)
                if rows is None:
                    return
                h, logits, states = self._prefill(rows, picks.timings, prefix)
                pos = rows.shape[1]
                continue
            t0 = time.perf_counter()
            x = self.embed(np.array([token, *codes_in]).reshape(-1, 1))
            h, logits = self._slow(x[None], pos, "decode", states, 0)
            picks.timings["slow"] += time.perf_counter() - t0
            pos += 1


# ------------------------------------------------------------------------------------------------
# the runtime
# ------------------------------------------------------------------------------------------------

class FishRuntime:
    """Text -> codes (frames, 10) -> 44.1 kHz audio (when the build has a codec stage) from a Fish build
    (the runtime protocol of :mod:`anetts.runtime.speech`). Its one built voice is ``default`` (no
    reference); other voices are cloned from a reference clip (:meth:`make_voice`). `prefix_cache_mb`: the
    cap of the cache of prefilled system turns (:mod:`anetts.models.fish.prefix`; 0: none kept)."""

    family = "fish"
    sample_rate = SAMPLE_RATE
    options = ("temperature", "top_p", "top_k", "max_frames", "chunk_length", "block_frames")
    DEFAULT_VOICE = "default"
    # what the server times at start: one short text (a frame costs seconds at full size on a CPU)
    warmup_texts = ("Hello there. This is a warm-up.",)

    def __init__(self, artifacts: ModelArtifacts, backend: Runner, *, prefix_cache_mb: int = DEFAULT_MB):
        self.artifacts, self.backend = artifacts, backend
        self.prefix_cache = PrefixCache(prefix_cache_mb)
        self._encoder = None  # upstream's DAC for reference clips, loaded on first use
        try:
            self.cfg = FishConfig.from_json(artifacts.asset(CONFIG_NAME))
            self.tokenizer = load_tokenizer(artifacts.asset(TOKENIZER_NAME), self.cfg)
        except (TokenizerError, ValueError, OSError) as e:
            raise ArtifactError(f"{artifacts.model_dir}: cannot read the Fish config/tokenizer assets: {e}") from e
        # the slow AR's input embedding on the host, from the fp16 tables (rows (11, T) -> (T, dim))
        self.embed = InputEmbedding(self.cfg, artifacts.asset(EMBEDDINGS), artifacts.asset(CODEBOOK_EMBEDDINGS))
        # the slow AR's chunks: the instances of the repeated stage, in the order the manifest's stage
        # block gives them (`index` of `chunks`), each with its packages
        stages = artifacts.manifest.get("stages") or {}
        chunks = {int(st["index"]): s for s, st in stages.items() if "index" in st}
        count = {int(stages[s]["chunks"]) for s in chunks.values()}
        if not chunks or len(count) != 1 or sorted(chunks) != list(range(count.pop())):
            raise ArtifactError(f"{artifacts.model_dir}: the manifest's stages must hold the slow AR's chunks "
                                f"0..N-1 (each with its `index` and `chunks`), got {sorted(chunks)}")
        self.chunk_stages = [chunks[i] for i in sorted(chunks)]
        for s in self.chunk_stages:
            if not self._buckets(s):
                raise ArtifactError(f"{artifacts.model_dir}: the manifest has no {s} package")
        if not self._buckets("fast_ar"):
            raise ArtifactError(f"{artifacts.model_dir}: the manifest has no fast_ar package")
        # one context bucket per build (the largest the slow chunks share)
        buckets = [set(self._buckets(s)) for s in self.chunk_stages]
        common = sorted(set.intersection(*buckets), key=lambda b: artifacts.package(self.chunk_stages[0], b).geometry["context"])
        if not common:
            raise ArtifactError(f"{artifacts.model_dir}: the slow chunks share no context bucket ({buckets})")
        self.bucket = common[-1]
        g = artifacts.package(self.chunk_stages[0], self.bucket).geometry
        self.context, self.prefill_tokens = int(g["context"]), int(g["prefill"])
        self.fast_bucket = self._stage_bucket("fast_ar")
        self.row_ids = np.asarray(self.cfg.restricted_ids, np.int64)
        last = artifacts.package(self.chunk_stages[-1], self.bucket)
        rows = next((t.shape[-1] for t in last.outputs if t.name == "logits"), None)
        if rows != len(self.row_ids):
            raise ArtifactError(f"{last.label}: the last slow chunk must give the restricted head's `logits` "
                                f"({len(self.row_ids)} rows, the config's), got {rows}")
        buckets = {"fast_ar": self.fast_bucket}
        self.decoder = FishDecoder(self.cfg, self.embed, lambda s: backend.program(s, buckets.get(s, self.bucket)),
                                   self.chunk_stages, self.context, self.prefill_tokens, self.row_ids,
                                   prefix_cache=self.prefix_cache)
        self.codec_entries = sorted((artifacts.package(s, b) for s, b in artifacts.packages if s == CODEC_STAGE),
                                    key=lambda e: e.input("codes").shape[-1])

    def _buckets(self, stage: str) -> list[str]:
        return [b for s, b in self.artifacts.packages if s == stage]

    def _stage_bucket(self, stage: str) -> str:
        """The bucket of the fast AR: the slow chunks' own, else its only one."""
        buckets = self._buckets(stage)
        if self.bucket in buckets or len(buckets) == 1:
            return self.bucket if self.bucket in buckets else buckets[0]
        raise ArtifactError(f"{self.artifacts.model_dir}: {stage} has buckets {buckets} and none is the slow "
                            f"chunks' {self.bucket}")

    # -------------------------------------------------------------- info

    @property
    def has_codec(self) -> bool:
        return bool(self.codec_entries)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(blending=False, cloning=True, timestamps=False, speed=False, audio=self.has_codec)

    @property
    def voices(self) -> list[str]:
        return [self.DEFAULT_VOICE]

    @property
    def default_voice(self) -> str:
        return self.DEFAULT_VOICE

    def check_voice_name(self, voice) -> None:
        self._reference(voice)

    def _reference(self, voice) -> tuple[str | None, np.ndarray | None]:
        """(transcript, codes) of a voice: none for ``default``, a :class:`Reference`'s own."""
        if voice is None or voice == self.DEFAULT_VOICE:
            return None, None
        if isinstance(voice, Reference):
            return voice.text, voice.codes
        raise InputError(f"unknown voice {str(voice)[:64]!r}: a Fish build speaks {self.voices} or a voice cloned from "
                         "a reference clip", field="voice")

    def make_voice(self, text: str, *, audio=None, rate: int | None = None, codes=None) -> Reference:
        """A cloned voice from a reference clip (``audio`` at ``rate``, encoded once here) or its ``codes``
        (10, frames), with the clip's transcript ``text``: checked so that every request with it fits."""
        if (audio is None) == (codes is None):
            raise InputError("give a reference clip or its codes (exactly one)", field="reference_audio")
        if audio is not None:
            codes = self.encode_reference(audio, rate)
        text, codes = self.check_voice(text, codes)
        return Reference(text, codes)

    def warmup(self) -> None:
        """Verify and load every package now instead of on first use."""
        for stage, bucket in self.artifacts.packages:
            self.backend.prepare(stage, bucket)

    def set_prefix_cache_mb(self, mb: int) -> None:
        """A new cap (MiB) for the prefilled system turns kept; 0 keeps none."""
        self.prefix_cache.resize(mb)

    def share_prefix_cache(self, cache: PrefixCache) -> None:
        """Keep prefilled system turns in `cache`, another runtime's of the same build (a server's
        workers): a turn prefilled by one starts every worker's prompts. A snapshot is only ever copied
        (``Program.copy_state`` of the program that restores it), never run on, so any worker may."""
        self.prefix_cache = self.decoder.prefix_cache = cache

    def prepare_voice(self, voice, *, evict: bool = True) -> bool:
        """Prefill a voice's system turn (its transcript and reference codes) now, so its requests start
        after it: True when it is cached (now or before), False when the cache cannot hold it (off, too
        small, a turn shorter than a prefill block, or, not `evict`, full)."""
        ref_text, ref_codes = self.check_reference(*self._reference(voice))
        return self.decoder.prefill_prefix(self._system_rows(ref_text, ref_codes), evict=evict)

    def _system_rows(self, ref_text, ref_codes) -> np.ndarray:
        """The rows every prompt of a voice opens with: its system turn."""
        return P.encode(self.cfg, [P.system_turn(self.cfg, self.tokenizer, ref_text, ref_codes)])

    # -------------------------------------------------------------- prompt and plan

    def check_reference(self, reference_text, reference_codes) -> tuple[str | None, np.ndarray | None]:
        if reference_codes is None:
            if reference_text:
                raise InputError("reference_text needs reference_codes (the codes of the reference audio)",
                                 field="reference_text")
            return None, None
        try:
            codes = P.check_codes(self.cfg, reference_codes)
        except P.PromptError as e:
            raise InputError(str(e), field="reference_codes") from None
        if isinstance(reference_text, str):
            check_text_unicode(reference_text, "reference_text")
        try:
            text = P.check_text(self.cfg, self.tokenizer, reference_text or " x", "reference_text") \
                if reference_text else ""
        except P.PromptError as e:
            raise InputError(str(e), field="reference_text") from None
        return text, codes

    def check_voice(self, reference_text: str, reference_codes=None) -> tuple[str, np.ndarray]:
        """A voice's transcript and codes, checked once when the voice is made: with them, the prompt for
        a one-word text must leave ``MIN_ROOM`` rows of the context for speech, or every request with
        the voice would fail. Without codes (before the clip is encoded), the transcript alone is
        checked, with a one-frame clip."""
        codes = np.zeros((self.cfg.num_codebooks, 1), np.int64) if reference_codes is None else reference_codes
        text, codes = self.check_reference(reference_text, codes)
        T = self.prompt("x", text, codes).shape[1]
        if self._room(T) < MIN_ROOM:
            n_text = len(self.tokenizer.encode(text, add_special_tokens=False).ids)
            clip = "" if reference_codes is None else f" and the clip's {codes.shape[1]} frames"
            raise InputError(f"the transcript's {n_text} tokens{clip} make a prompt of {T} rows, which leaves "
                             f"{self._room(T)} of the context's {self.context} rows for speech (need >= "
                             f"{MIN_ROOM}): shorten the transcript or the clip", field="reference_text")
        return text, codes

    def prompt(self, text: str, reference_text: str | None = None, reference_codes=None,
               history: Sequence[tuple[str, np.ndarray]] = (), spoken=None) -> np.ndarray:
        """The slow AR's (11, T) prompt rows for one text chunk (`prompt.build_prompt`)."""
        return P.build_prompt(self.cfg, self.tokenizer, text, reference_text, reference_codes, history, spoken)

    def _room(self, T: int) -> int:
        return self.decoder.room(T)

    def plan(self, text: str, reference_text: str | None = None, reference_codes=None, *,
             chunk_length: int = P.CHUNK_BYTES, max_frames: int | None = None) -> list[_Plan]:
        """The text chunks (each with its frame budget) `text` is generated in."""
        if isinstance(text, str):
            check_text_unicode(text, "text")
        try:
            text = P.check_text(self.cfg, self.tokenizer, text)
            pieces = P.chunk_text(text, chunk_length)
        except P.PromptError as e:
            raise InputError(str(e)) from None
        ref_text, ref_codes = self.check_reference(reference_text, reference_codes)
        out, pending = [], list(pieces)
        while pending:
            piece = pending.pop(0)
            T = self.prompt(piece, ref_text, ref_codes).shape[1]
            if self._room(T) < MIN_ROOM:
                halves = P.halve(piece)
                if halves is None:
                    raise InputError(f"the prompt for {piece[:40]!r} is {T} tokens: with the reference it leaves "
                                     f"{self._room(T)} of the context's {self.context} rows for speech (need >= {MIN_ROOM}) "
                                     "and the text cannot be split further; use a shorter reference or text")
                pending[:0] = list(halves)
                continue
            n_tok = len(self.tokenizer.encode(piece, add_special_tokens=False).ids)
            budget = max(MIN_BUDGET, BUDGET_PER_TOKEN * n_tok)
            if max_frames is not None:
                budget = min(budget, int(max_frames))
            out.append(_Plan(piece, budget, n_tok))
        return out

    # -------------------------------------------------------------- decode

    def sampling(self, temperature: float = 0.7, top_p: float = 0.7, top_k: int = 30, seed: int = 0) -> Sampling:
        """Upstream's draws with these settings (validated: a bad one is an InputError naming it)."""
        try:
            params = SamplingParams(temperature, top_p, top_k)
        except ValueError as e:
            raise InputError(str(e)) from None
        return Sampling(params, self.cfg, self.row_ids, validate_seed(seed))

    def iter_codes(self, rows: np.ndarray, n_frames: int, *, temperature: float = 0.0, top_p: float = 0.7,
                   top_k: int = 30, seed: int = 0, stop_at_end: bool = True,
                   timings: dict | None = None, picks: Picks | None = None) -> Iterator[tuple[int, list[int]]]:
        """Frames (semantic token, codes) of up to `n_frames` straight from prompt rows (no chunking,
        no restarts): the decode loop alone, e.g. to compare with upstream's greedy reference decode.
        `picks` replaces the sampling settings (the chain check's and the end-to-end gate's greedy picks)."""
        picks = picks or self.sampling(temperature, top_p, top_k, seed)
        if timings is not None:
            picks.timings = timings
        rows = np.asarray(rows)
        if rows.ndim == 2 and rows.shape[1] + n_frames - 1 > self.context:
            raise InputError(f"a {rows.shape[1]}-token prompt + {n_frames} frames needs {rows.shape[1] + n_frames - 1} "
                             f"KV rows, more than the context of {self.context}")
        return self.decoder.generate(rows, n_frames, picks, stop_at_end=stop_at_end)

    def generate_codes(self, rows: np.ndarray, n_frames: int, *, temperature: float = 0.0, top_p: float = 0.7,
                       top_k: int = 30, seed: int = 0, stop_at_end: bool = True) -> dict:
        """`iter_codes` collected: semantic_tokens (F,), codes (F, 10) (an <|im_end|> frame kept when
        not `stop_at_end` has codes 0), timings."""
        timings: dict = defaultdict(float)
        t0 = time.perf_counter()
        frames = list(self.iter_codes(rows, n_frames, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                                      stop_at_end=stop_at_end, timings=timings))
        timings["total"] = time.perf_counter() - t0
        tokens = np.array([t for t, _ in frames], np.int64)
        codes = np.array([c if c else [0] * self.cfg.num_codebooks for _, c in frames], np.int64).reshape(-1, self.cfg.num_codebooks)
        return {"semantic_tokens": tokens, "codes": codes, "timings": dict(timings)}

    # -------------------------------------------------------------- codec

    def _codec_margins(self, entry: PackageEntry) -> tuple[int, int]:
        g, F = entry.geometry, entry.input("codes").shape[-1]
        return int(g.get("context_frames", min(CODEC_CONTEXT, F // 2))), int(g.get("lookahead_frames", CODEC_LOOKAHEAD))

    def _codec_call(self, codes: np.ndarray) -> np.ndarray:
        """Audio of (frames, 10) codes in one call to the smallest bucket that holds them."""
        n = codes.shape[0]
        entry = next((e for e in self.codec_entries if e.input("codes").shape[-1] >= n), None)
        if entry is None:
            raise TTSError(f"{n} frames exceed the largest codec bucket ({self.codec_entries[-1].input('codes').shape[-1]})")
        F = entry.input("codes").shape[-1]
        x = np.zeros((1, self.cfg.num_codebooks, F), np.int32)
        x[0, :, :n] = codes.T
        inputs = {"codes": x}
        if any(t.name == "frames_valid" for t in entry.inputs):
            inputs["frames_valid"] = np.array([n], np.int32)
        out = self.backend.run(CODEC_STAGE, entry.bucket, inputs)["audio"].reshape(-1)
        audio = np.ascontiguousarray(out[:n * SAMPLES_PER_FRAME], dtype=np.float32)
        if not np.isfinite(audio).all():
            raise TTSError(f"{self.backend.name} backend produced non-finite audio ({entry.label})")
        return audio

    def decode_span(self, codes: np.ndarray, start: int, stop: int, final: bool) -> np.ndarray:
        """Audio of frames [start, stop) of `codes`, decoded with up to `context` frames before and
        `lookahead` after (all the rest when `final`), in windows that fit the largest bucket."""
        codes = np.asarray(codes)
        biggest = self.codec_entries[-1]
        left, right = self._codec_margins(biggest)
        F = biggest.input("codes").shape[-1]
        step = F - left - right
        if step < 1:
            raise ArtifactError(f"the largest codec bucket ({F} frames) is not larger than its context + lookahead")
        parts = []
        a = start
        while a < stop:
            b = min(stop, a + step)
            lo, hi = max(0, a - left), min(codes.shape[0], b + right)
            if start == 0 and final and codes.shape[0] <= F and stop == codes.shape[0]:
                lo, hi, b = 0, codes.shape[0], stop  # everything fits one call
            audio = self._codec_call(codes[lo:hi])
            parts.append(audio[(a - lo) * SAMPLES_PER_FRAME:(b - lo) * SAMPLES_PER_FRAME])
            a = b
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    def decode_audio(self, codes: np.ndarray) -> np.ndarray | None:
        """One-shot audio of (frames, 10) codes; None when the build has no codec stage."""
        if not self.has_codec:
            return None
        codes = np.asarray(codes)
        if codes.shape[0] == 0:
            return np.zeros(0, np.float32)
        return self.decode_span(codes, 0, codes.shape[0], final=True)

    def encode_reference(self, audio, sample_rate: int) -> np.ndarray:
        """Codes (10, frames) of a reference clip for `reference_codes`: upstream's DAC encoder in
        torch on the host, from the build's codec.pth (anetts.models.fish.codec says why it is not
        a Core ML stage). Cache them with the voice: the clip is encoded once, not per generation."""
        from anetts.models.fish import codec as C

        weights = self._codec_weights()
        try:
            audio = C.check_reference_audio(audio, sample_rate, self.max_reference_samples)
        except C.CodecError as e:
            raise InputError(str(e), field="reference_audio") from None
        if self._encoder is None:
            self._encoder = C.load_codec(weights)
        return C.upstream_encode(self._encoder, audio, sample_rate).astype(np.int32)

    def _codec_weights(self) -> Path:
        from anetts.models.fish import codec as C

        weights = self.artifacts.model_dir / self.artifacts.manifest.get("weights_dir", "weights")
        if not (weights / C.CODEC_NAME).is_file():
            raise ArtifactError(f"no {C.CODEC_NAME} in {weights}: encoding a reference clip needs the build's "
                                f"codec weights (or pass reference_codes)")
        return weights

    @functools.cached_property
    def max_reference_samples(self) -> int:
        """The longest reference clip this build's codec encodes (``codec.max_reference_samples``)."""
        from anetts.models.fish import codec as C

        try:
            return C.max_reference_samples(C.read_codec_config(self._codec_weights()))
        except C.CodecError as e:
            raise ArtifactError(str(e)) from None

    # -------------------------------------------------------------- synthesis

    def stream(self, text: str, voice=None, speed: float = 1.0, *, seed: int = 0, sentences: bool = False,
               temperature: float = 0.7, top_p: float = 0.7, top_k: int = 30, max_frames: int | None = None,
               chunk_length: int = P.CHUNK_BYTES, block_frames: int = BLOCK_FRAMES) -> Planned[FishChunk]:
        """Yield blocks of frames as they are generated (with the audio final so far, when the build
        has a codec). Input is validated, and planned, before this returns: the result's ``units`` is
        the frames of budget of its chunks (the most it will make).

        ``voice``: ``default`` or a :class:`Reference` (:meth:`make_voice`). ``speed`` must be 1: S2 has
        no rate control. ``sentences`` changes nothing: blocks of ``block_frames`` stream whatever the text."""
        t0 = time.perf_counter()
        reference_text, reference_codes = self._reference(voice)
        if speed != 1.0:
            raise InputError(f"speed {speed!r}: Fish S2 has no speaking-rate control; only 1.0", field="speed")
        try:
            params = SamplingParams(temperature, top_p, top_k)
        except ValueError as e:
            raise InputError(str(e)) from None
        seed = validate_seed(seed)
        if max_frames is not None and (isinstance(max_frames, bool) or int(max_frames) < 1):
            raise InputError(f"max_frames must be >= 1, got {max_frames!r}")
        if block_frames < 1:
            raise InputError(f"block_frames must be >= 1, got {block_frames}")
        plans = self.plan(text, reference_text, reference_codes, chunk_length=chunk_length, max_frames=max_frames)
        ref_text, ref_codes = self.check_reference(reference_text, reference_codes)
        return Planned(self._stream(plans, ref_text, ref_codes, params, seed, block_frames, t0),
                       sum(p.budget for p in plans), "frames")

    def _history(self, piece: str, history: list, ref_text, ref_codes, budget: int) -> list:
        """The latest earlier chunks that fit with `piece` and its budget (oldest dropped first)."""
        kept = list(history)
        while kept and self._room(self.prompt(piece, ref_text, ref_codes, kept).shape[1]) < budget:
            kept.pop(0)
        return kept

    def _stream(self, plans, ref_text, ref_codes, params, seed, block_frames, t0) -> Iterator[FishChunk]:
        gen = Sampling(params, self.cfg, self.row_ids, seed)
        prefix = self._system_rows(ref_text, ref_codes).shape[1]  # every chunk's and restart's prompt opens with it
        history: list[tuple[str, np.ndarray]] = []
        total = 0
        spent: dict[str, float] = {}  # gen.timings at the last chunk's end
        for ci, plan in enumerate(plans):
            kept = self._history(plan.text, history, ref_text, ref_codes, plan.budget)
            rows = self.prompt(plan.text, ref_text, ref_codes, kept)
            restarts = [0]

            def restart(done: np.ndarray, plan=plan) -> np.ndarray:
                # a fresh context: the same system and user turns, the voice turn holding the latest frames
                base = self.prompt(plan.text, ref_text, ref_codes).shape[1]
                keep = min(done.shape[1], (self.context - base) // 2)
                while keep >= 1 and self._room(base + keep) < 2:
                    keep -= 1
                if keep < 1:
                    log.warning("chunk %d: context of %d rows full and no room to go on in a fresh one; stopping",
                                ci, self.context)
                    restarts.append("context_full")
                    return None
                restarts[0] += 1
                log.info("chunk %d: context of %d rows full; going on in a fresh context with the last %d frames",
                         ci, self.context, keep)
                return self.prompt(plan.text, ref_text, ref_codes, (), done[:, -keep:])

            codes: list[list[int]] = []
            emitted = pending = 0
            stop = "max_frames"
            frames = self.decoder.generate(rows, plan.budget, gen, restart=restart, prefix=prefix)
            while True:
                try:
                    token, c = next(frames)
                    codes.append(c)
                    pending += 1
                    total += 1
                except StopIteration:
                    if "context_full" in restarts:
                        stop = "context_full"
                    elif len(codes) < plan.budget:
                        stop = "im_end"
                    break
                if pending >= block_frames:
                    block = np.asarray(codes, np.int64)
                    audio, upto = self._stream_audio(block, emitted, final=False, timings=gen.timings)
                    if upto > emitted or not self.has_codec:
                        yield FishChunk(ci, plan.text, block[len(block) - pending:], audio, total,
                                        time.perf_counter() - t0)
                        pending = 0
                        emitted = upto
            if stop == "max_frames":
                log.warning("chunk %d (%r) reached its budget of %d frames without <|im_end|>", ci, plan.text[:40],
                            plan.budget)
            block = np.asarray(codes, np.int64).reshape(-1, self.cfg.num_codebooks)
            audio, _ = self._stream_audio(block, emitted, final=True, timings=gen.timings)
            yield FishChunk(ci, plan.text, block[len(block) - pending:], audio, total, time.perf_counter() - t0,
                            is_chunk_end=True, stop=stop, context_restarts=restarts[0], is_last=ci == len(plans) - 1,
                            timings={k: v - spent.get(k, 0.0) for k, v in gen.timings.items()},
                            input_tokens=plan.tokens)
            spent = dict(gen.timings)
            if len(block):
                history.append((plan.text, block.T))

    def _stream_audio(self, codes: np.ndarray, emitted: int, final: bool, timings) -> tuple[np.ndarray | None, int]:
        """Audio of frames [emitted, upto): all frames when final, else those `lookahead` frames old."""
        if not self.has_codec:
            return None, len(codes)
        _, right = self._codec_margins(self.codec_entries[-1])
        upto = len(codes) if final else max(emitted, len(codes) - right)
        if upto <= emitted:
            return np.zeros(0, np.float32), emitted
        t0 = time.perf_counter()
        audio = self.decode_span(codes, emitted, upto, final)
        timings["codec"] += time.perf_counter() - t0
        return audio, upto

    def synthesize(self, text: str, voice=None, *, temperature: float = 0.7, top_p: float = 0.7, top_k: int = 30,
                   seed: int = 0, max_frames: int | None = None, chunk_length: int = P.CHUNK_BYTES) -> FishResult:
        """Text -> codes (and one-shot codec audio per text chunk, when the build has a codec)."""
        t0 = time.perf_counter()
        blocks = list(self.stream(text, voice, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                                  max_frames=max_frames, chunk_length=chunk_length, block_frames=1 << 30))
        per_chunk: dict[int, list[np.ndarray]] = defaultdict(list)
        texts, stops, restarts, timings = {}, {}, 0, defaultdict(float)
        audio_parts = []
        for b in blocks:
            per_chunk[b.chunk].append(b.codes)
            texts[b.chunk] = b.text
            if b.audio is not None:
                audio_parts.append(b.audio)
            if b.is_chunk_end:
                stops[b.chunk] = b.stop
                restarts += b.context_restarts
                for k, v in (b.timings or {}).items():
                    timings[k] += v
        nc = self.cfg.num_codebooks
        chunk_codes = [np.concatenate(per_chunk[i]).reshape(-1, nc) for i in sorted(per_chunk)]
        codes = np.concatenate(chunk_codes).reshape(-1, nc) if chunk_codes else np.zeros((0, nc), np.int64)
        audio = np.concatenate(audio_parts) if self.has_codec else None
        timings["total"] = time.perf_counter() - t0
        return FishResult(codes, chunk_codes, audio, SAMPLE_RATE, dict(timings), [texts[i] for i in sorted(texts)],
                          [stops[i] for i in sorted(stops)], restarts)
