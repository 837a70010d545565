"""rules/aimodel.smk in the DAG (dry runs): `aimodels` plans every bucket, `all` only when config asks."""
from __future__ import annotations

import re

import jsonschema
import pytest
import yaml

from anetts.workflow import ConfigError, WorkflowConfig

from workflow_helpers import REPO, make_workflow_copy, run_snakemake, small_config


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



def test_aimodel_config_errors_name_the_key():
    cfg = small_config()
    cfg["aimodel"] = {"stages": ["vocoder"]}
    with pytest.raises(ConfigError, match=r"aimodel.stages: \['vocoder'\] are not stages of kokoro-tiny"):
        WorkflowConfig(cfg).aimodel_parity_reports("kokoro-tiny")
    cfg["aimodel"] = {"in_all": "yes"}
    with pytest.raises(jsonschema.ValidationError, match="'yes' is not of type 'boolean'"):
        jsonschema.validate(cfg, yaml.safe_load((REPO / "schemas" / "config.schema.yaml").read_text()))
