"""A real executor plugin building for real: `snakemake all --profile profiles/cluster-generic`
submits every job through profiles/cluster-generic/submit.sh, which runs it as its own process on
this machine, and the packages it builds are byte-identical to the local build's (`built_workflow`,
the same one-bucket kokoro-tiny config built with `--cores 2`)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from anetts.artifacts import tree_sha256
from anetts.compile.inspect import package_files
from anetts.compile.reproducible import CONVERSION_DATE_KEY, item_identifier
from workflow_helpers import REPO, commit_copy, make_workflow_copy, run_snakemake, small_config

MODEL = "kokoro-tiny"
PROFILE = REPO / "profiles" / "cluster-generic"


def manifest(workdir: Path) -> dict:
    return json.loads((workdir / "artifacts" / MODEL / "manifest.json").read_text())


@pytest.fixture(scope="module")
def cluster_build(module_tmp, tiny_weights):
    workdir = make_workflow_copy(module_tmp, small_config(tiny_weights))
    shutil.copytree(REPO / "profiles", workdir / "profiles")
    commit_copy(workdir)  # a checkout, as `built_workflow`'s: the manifests' provenance compares
    t0 = time.monotonic()
    proc = run_snakemake(workdir, "all", "--profile", "profiles/cluster-generic")
    print(f"cluster-generic build: {time.monotonic() - t0:.0f} s")
    return workdir, proc.stdout + proc.stderr


def test_every_job_was_submitted_and_ran_as_its_own_process(cluster_build):
    workdir, out = cluster_build
    assert "Using profiles profiles/cluster-generic" in out
    submitted = re.findall(r"Submitted job (\d+) with external jobid '(job\.\w+)'", out)
    ids = {ext for _, ext in submitted}
    jobs = int(re.search(r"^total\s+(\d+)$", out, re.M).group(1))
    assert len(submitted) == len(ids) == jobs - 1  # every job but `all` (no action: run in place)
    state = workdir / ".snakemake" / "cluster-generic"
    pids = set()
    for ext in ids:
        assert (state / f"{ext}.rc").read_text().strip() == "0", ext
        pids.add((state / f"{ext}.pid").read_text().strip())
        log = (state / f"{ext}.log").read_text()
        assert "--mode remote" in log and "1 of 1 steps (100%) done" in log, ext  # one rule per process
    assert len(pids) == len(ids)


def test_cluster_build_gives_the_local_manifest(cluster_build, built_workflow):
    local, remote = manifest(built_workflow), manifest(cluster_build[0])
    sha = lambda m, kind: {p["path"]: p["sha256"] for p in m[kind]}
    assert sha(remote, "packages") == sha(local, "packages") and len(sha(local, "packages")) == 4
    assert sha(remote, "bundles") == sha(local, "bundles") and len(sha(local, "bundles")) == 4
    for pkg, digest in sha(remote, "packages").items():
        assert tree_sha256(cluster_build[0] / "artifacts" / MODEL / pkg) == digest
    # the rest of the manifest too, but the TorchScript exports' hashes: torch.jit.save writes
    # a random .data/serialization_id and the absolute source paths (this copy's anetts/) into
    # each .debug_pkl, so the same trace differs byte-wise between two builds; the packages
    # converted from it do not
    for m in (local, remote):
        for p in m["packages"]:
            p.pop("torchscript_sha256")
        # two copies of one tree, each committed on its own: the commit ids differ, nothing else
        assert m["provenance"]["git"].pop("commit") and m["provenance"]["git"]["dirty"] is False
    assert remote == local


def test_saved_packages_have_stable_identifiers_and_spec_bytes(built_workflow):
    from coremltools.proto import Model_pb2

    model_dir = built_workflow / "artifacts" / MODEL
    pkgs = sorted((model_dir / "packages").glob("*/*.mlpackage")) + sorted((model_dir / "bundles").glob("*.mlpackage"))
    assert len(pkgs) == 8
    for pkg in pkgs:
        info = json.loads((pkg / "Manifest.json").read_text())
        assert {k: item_identifier(v["path"]) for k, v in info["itemInfoEntries"].items()} == \
            {k: k for k in info["itemInfoEntries"]}, pkg
        _, spec_file, _ = package_files(pkg)
        raw = spec_file.read_bytes()
        spec = Model_pb2.Model()
        spec.ParseFromString(raw)
        assert spec.SerializeToString(deterministic=True) == raw, pkg
        assert CONVERSION_DATE_KEY not in spec.description.metadata.userDefined, pkg  # the day of the build


# -- the three scripts on their own ------------------------------------------------------------------
def script(name: str, *args: str, cwd: Path) -> str:
    return subprocess.run([str(PROFILE / name), *args], cwd=cwd, capture_output=True, text=True,
                          check=True, timeout=30).stdout.strip()


def wait_status(job: str, cwd: Path, want: str) -> str:
    deadline = time.monotonic() + 20
    while (status := script("status.sh", job, cwd=cwd)) == "running" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert status == want, (job, status)
    return status


def test_submit_status_cancel(tmp_path):
    ok, bad, slow = (tmp_path / f"{n}.sh" for n in ("ok", "bad", "slow"))
    ok.write_text("echo hello\n")
    bad.write_text("exit 3\n")
    slow.write_text("sleep 60\n")
    jobs = {n: script("submit.sh", str(p), cwd=tmp_path) for n, p in (("ok", ok), ("bad", bad), ("slow", slow))}
    assert len(set(jobs.values())) == 3 and all(re.fullmatch(r"job\.\w+", j) for j in jobs.values())
    state = tmp_path / ".snakemake" / "cluster-generic"
    wait_status(jobs["ok"], tmp_path, "success")
    assert (state / f"{jobs['ok']}.log").read_text() == "hello\n"
    wait_status(jobs["bad"], tmp_path, "failed")
    assert script("status.sh", jobs["slow"], cwd=tmp_path) == "running"
    pid = int((state / f"{jobs['slow']}.pid").read_text())
    assert os.getpgid(pid) == pid  # its own process group: cancel.sh stops all of it
    script("cancel.sh", jobs["slow"], cwd=tmp_path)
    wait_status(jobs["slow"], tmp_path, "failed")
