"""Fish fixtures: fish-tiny weights and one upstream reference decode, built once per session."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def fish_tiny(tmp_path_factory) -> Path:
    from anetts.weights import materialize_weights

    out = tmp_path_factory.mktemp("fish") / "weights"
    materialize_weights("fish", {"source": "synthetic", "preset": "fish-tiny", "seed": 0}, out)
    return out


@pytest.fixture(scope="session")
def fish_reference(fish_tiny):
    """(model, config, prompt, decode result) of the upstream reference on fish-tiny."""
    from anetts.models.fish import reference as R
    from anetts.models.fish.tokenizer import TOKENIZER_NAME, load_tokenizer

    model, cfg = R.load_reference_model(fish_tiny)
    prompt = R.make_prompt(cfg, load_tokenizer(fish_tiny / TOKENIZER_NAME, cfg))
    return model, cfg, prompt, R.reference_decode(model, cfg, prompt)


@pytest.fixture(scope="session")
def fish_build(tmp_path_factory, fish_tiny) -> Path:
    """One `snakemake all` of fish-tiny (bucket ctx256) shared by the workflow and runtime tests."""
    from fish_helpers import fish_config
    from workflow_helpers import make_workflow_copy, run_snakemake

    workdir = make_workflow_copy(tmp_path_factory.mktemp("fishwf"), fish_config(fish_tiny))
    run_snakemake(workdir, "all")
    return workdir


@pytest.fixture(scope="session")
def model_dir(fish_build) -> Path:
    """The fish-tiny model directory of `fish_build`."""
    return fish_build / "artifacts" / "fish-tiny"


@pytest.fixture(scope="session")
def reference_clip(model_dir):
    """(wav bytes, float audio) of 5 frames fish-tiny's own codec made: a reference clip to clone from."""
    import io

    import numpy as np
    import soundfile as sf

    from anetts.models.fish import codec as C

    codes = np.random.default_rng(0).integers(0, 128, size=(10, 5))
    codes[0] = np.random.default_rng(1).integers(0, 512, size=5)
    audio = C.upstream_decode(C.load_codec(model_dir / "weights"), codes)
    buf = io.BytesIO()
    sf.write(buf, audio, C.SAMPLE_RATE, format="WAV", subtype="FLOAT")
    return buf.getvalue(), audio
