"""Per-job start-up: each build job imports only what it uses and loads only the weights it needs.

Import checks run in a fresh interpreter, as a job does (this process has imported everything).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from anetts.models.kokoro import weights as W

ROOT = Path(__file__).resolve().parent.parent


def _fresh(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


@pytest.mark.parametrize("stage, absent", [
    ("decoder_pre", ("transformers", "spacy", "misaki", "coremltools")),
    ("generator", ("transformers", "spacy", "misaki", "coremltools")),
    # kokoro.modules imports transformers for ALBERT's class; the text pipeline still stays out
    ("f0ntrain", ("spacy", "misaki", "coremltools")),
])
def test_a_stage_without_albert_loads_neither_albert_nor_the_text_pipeline(tiny_weights, stage, absent):
    out = _fresh(f"""
        import sys
        from anetts.families import get_family
        model = get_family("kokoro").stage({stage!r}).load({str(tiny_weights)!r}, 3)
        print(sorted(m for m in {absent!r} if m in sys.modules), hasattr(model, "bert"))
    """)
    assert out == "[] False"


def test_components_equal_kmodels_own(tiny_weights):
    full = W.load_kmodel(tiny_weights)
    parts = W.load_components(tiny_weights, ("predictor", "decoder"))
    assert parts.vocab == full.vocab
    for name in ("predictor", "decoder"):
        want, got = getattr(full, name).state_dict(), getattr(parts, name).state_dict()
        assert list(got) == list(want), name
        for key in want:
            assert torch.equal(got[key], want[key]), f"{name}.{key}"


def test_unknown_component_is_named(tiny_weights):
    with pytest.raises(KeyError, match="'bert'"):
        W.load_components(tiny_weights, ("bert",))


def test_kokoro_imported_after_its_submodules_is_whole_and_shares_them():
    out = _fresh("""
        import sys
        from anetts import imports
        (istftnet,) = imports.submodules("kokoro", "istftnet")
        before = "kokoro" in sys.modules, "transformers" in sys.modules
        import kokoro
        import kokoro.istftnet
        print(before, kokoro.istftnet is istftnet, kokoro.model.Decoder is istftnet.Decoder, callable(kokoro.KPipeline))
    """)
    assert out == "(False, False) True True True"


def test_coremltools_without_its_unused_probes_then_both_importable():
    out = _fresh("""
        import sys
        from anetts import imports
        ct = imports.coremltools()
        skipped = sorted(m for m in imports.COREMLTOOLS_SKIPPED_PROBES if m in sys.modules)
        import sklearn, transformers
        print(skipped, callable(ct.convert), ct.proto.Model_pb2.Model.__name__)
    """)
    assert out == "[] True Model"


def test_snakemake_in_the_project_venv_imports_no_remote_cluster_plugin():
    """Snakemake imports every installed executor / storage plugin at each start, and hashes every job's
    params through pandas whenever pandas is installed: the slurm / kubernetes / s3 plugins (and pandas,
    which only slurm needs) live in `make cluster`'s venv, not here (docs/startup.md: half of a no-op run)."""
    out = _fresh("""
        import importlib.util, sys
        from snakemake.cli import get_argument_parser
        get_argument_parser()  # collects the plugins, as every snakemake run does
        print(sorted(m for m in sys.modules if m.split(".")[0] in (
            "snakemake_executor_plugin_slurm", "snakemake_executor_plugin_kubernetes", "snakemake_storage_plugin_s3",
            "kubernetes", "boto3", "pandas")), importlib.util.find_spec("pandas") is not None)
    """)
    assert out == "[] False"
