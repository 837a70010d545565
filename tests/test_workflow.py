"""The Snakemake DAG end to end on kokoro-tiny: build, manifest, no-op, incremental rebuilds."""
from __future__ import annotations

import json
import re

import pytest
import yaml

from anetts.artifacts import tree_sha256

from workflow_helpers import make_workflow_copy, run_snakemake, small_config

MODEL = "kokoro-tiny"
# what one changed stage/bucket reruns: its own chain, its stage's bundle, and the model-wide outputs
ONE_BUCKET_CHAIN = {"export": 1, "convert": 1, "parity": 1, "bundle": 1, "bundle_parity": 1, "end_to_end": 1,
                    "parity_summary": 1, "manifest": 1, "report": 1, "all": 1}


def planned_jobs(workdir, *args) -> dict[str, int]:
    """Job counts per rule of a dry run (empty when there is nothing to do)."""
    out = run_snakemake(workdir, "-n", "all", *args).stdout
    if "Nothing to be done" in out:
        return {}
    table = out.split("Job stats:", 1)[1].split("total", 1)[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


def test_build_writes_manifest_of_all_packages(built_workflow):
    manifest = json.loads((built_workflow / "artifacts" / MODEL / "manifest.json").read_text())
    assert manifest["model"] == MODEL and manifest["family"] == "kokoro"
    got = {(p["stage"], p["bucket"]) for p in manifest["packages"]}
    assert got == {("duration", "t32"), ("f0ntrain", "3s"), ("decoder_pre", "3s"), ("generator", "3s")}
    for entry in manifest["packages"]:
        pkg = built_workflow / "artifacts" / MODEL / entry["path"]
        assert pkg.is_dir() and (pkg / "Manifest.json").is_file()
        assert entry["sha256"] == tree_sha256(pkg)
        # typed functions: a bucket is its package's one stateless function
        (fn,) = entry["functions"]
        assert fn["name"] == entry["function"] == "main" and fn["states"] == []
        assert fn["inputs"] and fn["outputs"] and entry["geometry"]
        assert all(t["dtype"] in ("float32", "int32") for t in fn["inputs"] + fn["outputs"])
        assert entry["parity"]["passed"] and entry["parity"]["mil_min_snr_db"] >= 35
    gen = next(p for p in manifest["packages"] if p["stage"] == "generator")
    assert {t["name"]: t["shape"] for t in gen["functions"][0]["inputs"]}["har"] == [1, 22, 14401]
    assert manifest["weights"]["files"]["kokoro-v1_0.pth"]


def test_parity_summary_is_written(built_workflow):
    model_dir = built_workflow / "artifacts" / MODEL
    summary = json.loads((model_dir / "parity_summary.json").read_text())
    assert summary["all_passed"] and len(summary["buckets"]) == 4
    assert "| generator | 3s |" in (model_dir / "parity_summary.md").read_text()
    for png in ("parity_snr.png", "parity_waveform.png"):
        assert (model_dir / png).stat().st_size > 10_000


def test_bundles_and_inspect_reports(built_workflow):
    model_dir = built_workflow / "artifacts" / MODEL
    manifest = json.loads((model_dir / "manifest.json").read_text())
    assert {b["stage"] for b in manifest["bundles"]} == {"duration", "f0ntrain", "decoder_pre", "generator"}
    for b in manifest["bundles"]:
        assert b["parity"]["passed"] and (model_dir / b["path"]).is_dir()
    info = json.loads((model_dir / "inspect" / "decoder_pre" / "3s.json").read_text())
    ops = info["functions"]["main"]["ops"]
    assert "linear" not in ops and ops["conv"] > 0  # decoder_pre is configured for the conv2d rewrite
    for stage, bucket in (("generator", "3s"), ("duration", "t32"), ("f0ntrain", "3s")):
        # the default conv1d rewrite leaves no linear op in any stage (the conversion fails otherwise)
        report = json.loads((model_dir / "packages" / stage / f"{bucket}.json").read_text())
        assert report["linear_rewrite"]["rewritten"] > 0 and report["linear_rewrite"]["linear_remaining"] == 0
        assert "linear" not in json.loads((model_dir / "inspect" / stage / f"{bucket}.json").read_text()
                                          )["functions"]["main"]["ops"], stage
    assert {f["rule"] for f in json.loads((model_dir / "inspect" / "duration" / "t32.json").read_text())["lint"]} \
        >= {"ane_unfriendly_ops"}  # LSTMs are flagged


def test_package_metadata_and_precision(built_workflow):
    import coremltools as ct

    pkgs = built_workflow / "artifacts" / MODEL / "packages"
    spec = ct.utils.load_spec(str(pkgs / "decoder_pre" / "3s.mlpackage"))
    meta = dict(spec.description.metadata.userDefined)
    assert meta["anetts.stage"] == "decoder_pre" and meta["anetts.bucket"] == "3s"
    assert json.loads(meta["anetts.geometry"])["frames"] == 120
    assert all(i.shortDescription for i in spec.description.input)
    assert spec.description.metadata.license.startswith("Apache-2.0")
    report = json.loads((pkgs / "decoder_pre" / "3s.json").read_text())
    assert report["provenance"]["versions"]["coremltools"]
    # the configured precision is what the program computes and stores: decoder_pre fp16, duration fp32
    fp16 = json.loads((built_workflow / "artifacts" / MODEL / "inspect" / "decoder_pre" / "3s.json").read_text())
    fp32 = json.loads((built_workflow / "artifacts" / MODEL / "inspect" / "duration" / "t32.json").read_text())
    assert meta["anetts.precision"] == report["precision"] == "fp16"
    assert fp16["functions"]["main"]["fp16_program"] is True
    assert set(fp16["functions"]["main"]["weight_dtypes"]) == {"float16"}
    assert fp32["functions"]["main"]["fp16_program"] is False
    assert "float16" not in fp32["functions"]["main"]["weight_dtypes"]


def test_noop_rebuild_has_nothing_to_do(built_workflow):
    assert planned_jobs(built_workflow) == {}


def test_editing_one_stage_reruns_only_that_stage(built_workflow):
    stage_file = built_workflow / "anetts" / "models" / "kokoro" / "stages" / "f0ntrain.py"
    original = stage_file.read_text()
    try:
        stage_file.write_text(original + "\n# a comment is an edit too\n")
        jobs = planned_jobs(built_workflow)
    finally:
        stage_file.write_text(original)
    assert jobs == ONE_BUCKET_CHAIN


def test_editing_shared_masking_reruns_every_stage(built_workflow):
    shared = built_workflow / "anetts" / "models" / "kokoro" / "masked.py"
    original = shared.read_text()
    try:
        shared.write_text(original + "\n# edit\n")
        jobs = planned_jobs(built_workflow)
    finally:
        shared.write_text(original)
    assert jobs["export"] == 4 and jobs["convert"] == 4 and jobs["bundle"] == 4


def test_editing_synthetic_weights_code_leaves_real_weights_alone(built_workflow):
    # the session build uses `source: local` weights: synthetic-only code is not its input
    synthetic = built_workflow / "anetts" / "models" / "kokoro" / "synthetic.py"
    original = synthetic.read_text()
    try:
        synthetic.write_text(original + "\n# edit\n")
        jobs = planned_jobs(built_workflow)
    finally:
        synthetic.write_text(original)
    assert jobs == {}


def _build_copy(built_workflow, dest):
    """A copy of the session's build that a test may damage; mtimes kept, so it is up to date too."""
    import shutil

    shutil.copytree(built_workflow, dest, symlinks=True)
    return dest, dest / "artifacts" / MODEL


def _verify(work, model_dir, *args):
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "anetts.cli", "verify", str(model_dir), *args],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(work)})


def test_verify_finds_a_corrupted_package_and_repair_makes_it_rebuild(built_workflow, tmp_path):
    work, model_dir = _build_copy(built_workflow, tmp_path / "wf")
    weight = model_dir / "packages" / "f0ntrain" / "3s.mlpackage" / "Data" / "com.apple.CoreML" / "weights" / "weight.bin"
    data = bytearray(weight.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weight.write_bytes(data)
    assert planned_jobs(work) == {}  # what Snakemake alone sees

    checked = _verify(work, model_dir)
    assert checked.returncode == 1 and "packages/f0ntrain/3s.mlpackage" in checked.stderr
    repaired = _verify(work, model_dir, "--repair")
    assert repaired.returncode == 1 and not (model_dir / "manifest.json").exists()
    jobs = planned_jobs(work)
    assert jobs["convert"] == 1 and jobs["manifest"] == 1 and "export" not in jobs


def test_repairing_one_voice_rebuilds_every_asset(built_workflow, tmp_path):
    """A voice is one file of the `runtime_assets` directory output: removing the file alone left a
    directory Snakemake saw as up to date, and the rebuilt manifest without that voice."""
    work, model_dir = _build_copy(built_workflow, tmp_path / "wf")
    before = json.loads((model_dir / "manifest.json").read_text())["assets"]
    voice = model_dir / "assets" / "voices" / "syn_a.npy"
    voice.write_bytes(voice.read_bytes()[:1000])

    repaired = _verify(work, model_dir, "--repair")
    assert repaired.returncode == 1 and "assets/voices/syn_a.npy" in repaired.stderr
    assert not (model_dir / "assets").exists()  # the whole output the voice belongs to
    run_snakemake(work, "all")
    after = json.loads((model_dir / "manifest.json").read_text())["assets"]
    assert [(a["name"], a["sha256"]) for a in after] == [(a["name"], a["sha256"]) for a in before]
    assert _verify(work, model_dir).returncode == 0


def test_a_deleted_package_is_rebuilt_although_the_manifest_is_there(built_workflow, tmp_path):
    """Snakemake does not rebuild a deleted input of an output it judges up to date (it said
    "Nothing to be done"); every manifested output is a target of `all` as well."""
    import shutil

    work, model_dir = _build_copy(built_workflow, tmp_path / "wf")
    shutil.rmtree(model_dir / "packages" / "f0ntrain" / "3s.mlpackage")
    jobs = planned_jobs(work)
    assert jobs["convert"] == 1 and jobs["manifest"] == 1 and "export" not in jobs


def test_repair_of_a_read_only_model_dir_is_a_clear_error_and_removes_nothing(built_workflow, tmp_path):
    import os
    import subprocess
    import sys

    work, model_dir = _build_copy(built_workflow, tmp_path / "wf")
    voice = model_dir / "assets" / "voices" / "syn_a.npy"
    voice.write_bytes(voice.read_bytes()[:1000])
    dirs = [model_dir, *(p for p in model_dir.rglob("*") if p.is_dir())]
    for d in dirs:
        d.chmod(0o555)
    # root writes anyway: run as an unprivileged user of a user namespace (its uid is ours outside)
    as_user = ["unshare", "--user", "--map-user=1000", "--map-group=1000"] if os.geteuid() == 0 else []
    try:
        proc = subprocess.run([*as_user, sys.executable, "-m", "anetts.cli", "verify", str(model_dir), "--repair"],
                              capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(work)})
    finally:
        for d in dirs:
            d.chmod(0o755)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "cannot repair" in proc.stderr and "nothing was removed" in proc.stderr
    assert (model_dir / "manifest.json").is_file() and (model_dir / "assets" / "voices" / "syn_b.npy").is_file()


def test_yaml_syntax_error_in_config_names_line_and_column(tmp_path):
    workdir = make_workflow_copy(tmp_path / "wf", small_config())
    text = (workdir / "config.yaml").read_text().splitlines()
    line = next(i for i, t in enumerate(text) if t.startswith("models:")) + 2  # 1-based, the line after
    text.insert(line - 1, "  broken: [unclosed")
    (workdir / "config.yaml").write_text("\n".join(text) + "\n")
    proc = run_snakemake(workdir, "-n", "all", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "config.yaml: YAML syntax error at line" in out and f"at line {line}, column 11" in out


def test_changing_one_bucket_list_builds_only_the_new_bucket(built_workflow):
    cfg = small_config(None)
    cfg["models"] = yaml.safe_load((built_workflow / "config.yaml").read_text())["models"]
    cfg["families"]["kokoro"]["stages"]["duration"]["buckets"] = [32, 64]
    alt = built_workflow / "config_more_buckets.yaml"
    alt.write_text(yaml.safe_dump(cfg))
    assert planned_jobs(built_workflow, "--configfile", str(alt)) == ONE_BUCKET_CHAIN


@pytest.mark.parametrize("edit, key", [
    (lambda c: c["families"]["kokoro"]["stages"]["generator"].update(precision="fp8"), "precision"),
    (lambda c: c["families"]["kokoro"]["stages"]["duration"].update(buckets=[]), "buckets"),
    (lambda c: c["models"]["kokoro-tiny"]["weights"].update(seed=-1), "seed"),
    (lambda c: c.update(model="no-such-model"), "model"),
    (lambda c: c["families"]["kokoro"]["stages"].update(vocoder={"buckets": [3]}), "vocoder"),
    (lambda c: c["parity"].setdefault("stages", {}).update(genrator={"min_snr_db": 30}), "parity.stages.genrator"),
])
def test_bad_config_fails_naming_the_key(tmp_path, edit, key):
    cfg = small_config()
    edit(cfg)
    workdir = make_workflow_copy(tmp_path / "wf", cfg)
    proc = run_snakemake(workdir, "-n", "all", check=False)
    assert proc.returncode != 0
    assert key in proc.stdout + proc.stderr


def test_a_models_stage_block_lies_over_the_familys_settings():
    """Validation fills schema defaults in, but not into a model's overlay blocks: a model that sets
    only its buckets or precision keeps every other setting of its family's stage."""
    from pathlib import Path

    from snakemake.exceptions import WorkflowError

    from anetts.workflow import WorkflowConfig, validate_config

    repo = Path(__file__).resolve().parents[1]
    cfg = validate_config(yaml.safe_load((repo / "config.yaml").read_text()))
    wf = WorkflowConfig(cfg)
    assert cfg["models"]["fish-s2-pro"]["stages"]["slow_chunk"] == {"chunks": 9, "buckets": [1024]}
    fish = wf.convert_options("fish-s2-pro", "slow_chunk0")
    assert (fish["deployment_target"], fish["compute_units"]) == ("macOS15", "CPU_AND_NE")  # the family's
    onnx = wf.convert_options("kokoro-82m-onnx", "decoder_pre")
    assert onnx["linear_rewrite"] == "conv2d" and onnx["fp32_ops"]  # family's rewrite, model's fp32 ops
    assert wf.convert_options("kokoro-82m-onnx", "f0ntrain")["deployment_target"] == "macOS14"
    # the block is still checked against the schema
    bad = yaml.safe_load((repo / "config.yaml").read_text())
    bad["models"]["fish-tiny"]["stages"]["codec"]["deployment_target"] = "macOS99"
    with pytest.raises(WorkflowError, match="macOS99"):
        validate_config(bad)
