"""rules/aimodel.smk in the DAG (dry runs): `aimodels` plans every bucket, `all` only when config asks."""
from __future__ import annotations

import re

import yaml

from workflow_helpers import make_workflow_copy, run_snakemake, small_config


def planned(workdir, target, *args) -> dict[str, int]:
    out = run_snakemake(workdir, "-n", target, *args).stdout
    table = out.split("Job stats:", 1)[1].split("total", 1)[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


def test_aimodel_target_and_config(tmp_path):
    workdir = make_workflow_copy(tmp_path / "wf", small_config())
    jobs = planned(workdir, "aimodels")
    # one asset and one gate per configured bucket (one per stage here), from the same exports
    assert jobs["aimodel"] == 4 and jobs["aimodel_parity"] == 4 and jobs["export"] == 4
    assert "convert" not in jobs  # the asset does not need the .mlpackage

    cfg = small_config()
    assert cfg["aimodel"]["in_all"] is False
    jobs = planned(workdir, "all")
    assert "aimodel" not in jobs

    cfg["aimodel"] = {"in_all": True, "stages": ["decoder_pre"]}
    (workdir / "in_all.yaml").write_text(yaml.safe_dump(cfg))
    jobs = planned(workdir, "all", "--configfile", "in_all.yaml")
    assert jobs["aimodel"] == 1 and jobs["aimodel_parity"] == 1 and jobs["manifest"] == 1

    cfg["aimodel"] = {"stages": ["vocoder"]}
    (workdir / "bad.yaml").write_text(yaml.safe_dump(cfg))
    proc = run_snakemake(workdir, "-n", "aimodels", "--configfile", "bad.yaml", check=False)
    assert proc.returncode != 0
    assert "aimodel.stages: ['vocoder'] are not stages of kokoro-tiny" in proc.stdout + proc.stderr
