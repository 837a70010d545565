"""A failed trace or conversion exits non-zero and leaves nothing that looks like an artifact."""
from __future__ import annotations

import json

import pytest

from anetts.compile import convert as convert_mod
from anetts.compile.convert import ConversionError, ConvertOptions, convert_export
from anetts.compile.export import ExportError, export_stage
from anetts.families import get_family

FAMILY = get_family("kokoro")
META = {"model": "kokoro-tiny", "family": "kokoro", "source": "synthetic", "revision": "test"}


@pytest.fixture(scope="module")
def exported_duration(tiny_weights, tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("export")
    export_stage(FAMILY, "duration", "t32", 32, None, tiny_weights, None, out / "t32.functions",
                 out / "t32.scenario.npz", out / "t32.export.json", model=tiny_model)
    return out


def test_export_writes_checked_trace(exported_duration):
    report = json.loads((exported_duration / "t32.export.json").read_text())
    assert report["bucket"] == "t32"
    assert set(report["trace_vs_eager"]["main"]) == {"pred_dur", "d", "t_en", "s", "ref_s_out"}
    from anetts.scenario import load_scenario

    # parity's reference, stored once: a one-call scenario of `main`, the eager outputs expected;
    # the traced replay is scored against them here (the torch figure parity reports)
    scenario, expected = load_scenario(exported_duration / "t32.scenario.npz")
    assert [c.function for c in scenario.calls] == ["main"]
    assert set(scenario.calls[0].inputs) == {t["name"] for t in report["functions"][0]["inputs"]}
    assert set(expected[0]) == set(report["trace_vs_eager"]["main"]) == set(report["torch"]["outputs"])
    assert report["torch"]["outputs"]["pred_dur"]["exact_fraction"] == 1.0
    assert [p.name for p in (exported_duration / "t32.functions").iterdir()] == ["main.pt"]


def test_trace_mismatch_fails_and_leaves_nothing(tiny_weights, tiny_model, tmp_path, monkeypatch):
    """A draw inside the graph (a noise source the wrapper forgot to take as an input, as upstream's
    vocoder has): the traced module draws again on replay and differs from the outputs it recorded."""
    import torch

    stage = FAMILY.stage("duration")
    build = stage.build

    def with_internal_noise(model):
        module = build(model)
        forward = module.forward

        def noisy(*args):
            out = forward(*args)
            return (out[0], out[1] + torch.rand_like(out[1]), *out[2:])

        module.forward = noisy
        return module

    monkeypatch.setattr(stage, "build", with_internal_noise)
    with pytest.raises(ExportError, match="traced output d differs"):
        export_stage(FAMILY, "duration", "t32", 32, None, tiny_weights, None, tmp_path / "t32.functions",
                     tmp_path / "t32.scenario.npz", tmp_path / "t32.export.json", model=tiny_model)
    assert list(tmp_path.iterdir()) == []


def test_failed_conversion_leaves_no_package(exported_duration, tmp_path, monkeypatch):
    import coremltools as ct

    def explode(*args, **kwargs):
        raise RuntimeError("convert function for op 'new_ones' not implemented")

    monkeypatch.setattr(ct, "convert", explode)
    pkg, report = tmp_path / "t32.mlpackage", tmp_path / "t32.json"
    pkg.mkdir()  # a stale package from an earlier build must not survive either
    with pytest.raises(ConversionError, match="duration/t32.*new_ones"):
        convert_export(exported_duration / "t32.functions", exported_duration / "t32.export.json", pkg, report,
                       ConvertOptions.make(), META)
    assert not pkg.exists() and not report.exists()


def test_save_failure_half_way_leaves_no_package(exported_duration, tmp_path, monkeypatch):
    def broken_check(spec, io, package):
        raise ConversionError(f"{package}: outputs do not match")

    monkeypatch.setattr(convert_mod, "_check_io", broken_check)
    pkg, report = tmp_path / "t32.mlpackage", tmp_path / "t32.json"
    with pytest.raises(ConversionError):
        convert_export(exported_duration / "t32.functions", exported_duration / "t32.export.json", pkg, report,
                       ConvertOptions.make(), META)
    assert list(tmp_path.iterdir()) == []


def test_unknown_deployment_target_is_an_error(exported_duration, tmp_path):
    with pytest.raises(ConversionError, match="deployment target 'macOS9'"):
        convert_export(exported_duration / "t32.functions", exported_duration / "t32.export.json", tmp_path / "p.mlpackage",
                       tmp_path / "p.json", ConvertOptions.make(deployment_target="macOS9"), META)


def test_an_invalid_converted_program_fails_the_conversion_and_validation_is_restored(exported_duration, tmp_path,
                                                                                     monkeypatch):
    """coremltools' per-pass program validation is skipped during conversion (validated_once); the
    converted program is still validated once, and a failure there is the conversion's."""
    from coremltools.converters.mil.mil.program import Program

    seen = []

    def invalid(self, check_essential_scope=False):
        seen.append(self)
        raise ValueError("var %x is not visible in block")

    monkeypatch.setattr(Program, "validate", invalid)
    pkg, report = tmp_path / "t32.mlpackage", tmp_path / "t32.json"
    with pytest.raises(ConversionError, match="duration/t32.*not visible"):
        convert_export(exported_duration / "t32.functions", exported_duration / "t32.export.json", pkg, report,
                       ConvertOptions.make(), META)
    assert len(seen) == 1  # once, on the converted program, not per pass
    assert not pkg.exists() and not report.exists()
    assert Program.validate is invalid  # the patch is undone, whatever the conversion did


def test_a_conversion_validates_its_program_once_not_after_every_pass(exported_duration, tmp_path, monkeypatch):
    from coremltools.converters.mil.mil.program import Program

    calls = []
    validate = Program.validate
    monkeypatch.setattr(Program, "validate", lambda self, check_essential_scope=False: (calls.append(1),
                                                                                          validate(self))[1])
    convert_export(exported_duration / "t32.functions", exported_duration / "t32.export.json",
                   tmp_path / "t32.mlpackage", tmp_path / "t32.json", ConvertOptions.make(), META)
    assert len(calls) == 1  # coremltools alone would validate before each pipeline and after each pass
