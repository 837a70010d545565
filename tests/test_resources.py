"""Declared threads/resources: the table covers every rule, cluster profiles parse, caps are honoured."""
from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from anetts import artifacts, resources
from anetts.resources import RULES, RuleResources, ResourceError, estimate
from anetts.workflow import WorkflowConfig
from workflow_helpers import REPO, cluster_python, make_workflow_copy, run_snakemake, small_config

BENCH_SCRIPT = REPO / "benchmarks" / "resources_from_benchmarks.py"


def repo_config() -> dict:
    return yaml.safe_load((REPO / "config.yaml").read_text())


# -- the cost model ------------------------------------------------------------------------------
def test_estimate_interpolates_and_never_drops_below_a_smaller_size():
    pts = [{"x": 3, "s": 10.0}, {"x": 10, "s": 24.0}, {"x": 30, "s": 20.0}]
    assert estimate(pts, 3, "s") == 10.0
    assert estimate(pts, 1, "s") == 10.0  # below the smallest: the smallest's cost
    assert estimate(pts, 6.5, "s") == pytest.approx(17.0)
    assert estimate(pts, 20, "s") == 24.0  # a noisy lower point above does not lower it
    assert estimate(pts, 40, "s") == 20.0  # slope of the two largest is negative: flat


def test_estimate_extrapolates_along_the_last_slope_or_proportionally():
    assert estimate([{"x": 3, "s": 10.0}, {"x": 10, "s": 24.0}], 30, "s") == pytest.approx(64.0)
    assert estimate([{"x": 10, "s": 24.0}], 30, "s") == pytest.approx(72.0)
    assert estimate([{"x": None, "s": 5.0}, {"x": None, "s": 7.0}], 30, "s") == 7.0  # ceilings: the worst
    with pytest.raises(ResourceError, match="no measured 'max_rss_mib'"):
        estimate([{"x": 3, "s": 1.0}], 3, "max_rss_mib")


def test_declared_values_add_headroom_and_scale_with_the_attempt():
    assert resources.mem_mb(1000) == 1664  # 1000 MiB = 1048.6 MB, x1.5, rounded up to 128
    assert resources.mem_mb(1000, attempt=2) == 2 * 1664
    assert resources.mem_mb(10) == resources.MEM_FLOOR_MB
    assert resources.runtime_min(90) == 4  # (2 x 90 + 60) s
    assert resources.runtime_min(90, attempt=3) == 12
    assert resources.disk_mb(10, 20) == resources.DISK_FLOOR_MB
    assert resources.disk_mb(3000, 1000) == 5000


def test_every_configured_job_has_resources_at_least_its_measurement():
    """Every rule x stage x bucket of every model in config.yaml resolves, and no declaration is
    below what the table measured for that job (a job exceeding its declaration is a bug)."""
    wf = WorkflowConfig(repo_config(), root=REPO)
    res = RuleResources(wf)
    checked = 0
    for model in wf.model_names:
        for rule in RULES:
            for stage, bucket in resources.rule_jobs(wf, rule, model):
                d = res.declared(rule, model, stage, bucket)
                assert d["mem_mb"] >= resources.MEM_FLOOR_MB and d["runtime"] >= 1 and d["disk_mb"] >= 1
                for p in res.points(model, rule, stage):
                    if p["x"] is None or p["x"] == res.size(rule, model, stage, bucket):
                        assert d["mem_mb"] >= p["max_rss_mib"] * resources.MIB / 1e6, (model, rule, stage, bucket)
                        assert d["runtime"] * 60 >= p["s"], (model, rule, stage, bucket)
                checked += 1
    assert checked > 3 * len(RULES)


def test_table_lookup_aliases_family_default_and_clear_errors():
    cfg = repo_config()
    cfg["models"]["other"] = {"family": "kokoro", "weights": {"source": "synthetic", "preset": "kokoro-tiny"}}
    wf = WorkflowConfig(cfg, root=REPO)
    pts = [{"x": None, "s": 1.0, "max_rss_mib": 100.0}]
    table = {"models": {"big": {"weights": {"*": pts}}}, "aliases": {"kokoro-82m-hf": "big"},
             "family_defaults": {"kokoro": "big"}}
    res = RuleResources(wf, table=table)
    assert res.measured_model("kokoro-82m-hf") == "big" and res.measured_model("other") == "big"
    with pytest.raises(ResourceError, match="no costs for rule 'export'"):
        res.declared("export", "other", "duration", "t32")
    with pytest.raises(ResourceError, match="no entry in the resources table"):
        RuleResources(wf, table={"models": {}}).declared("weights", "other")
    with pytest.raises(ResourceError, match="'nosuchrule' has no entry in anetts.resources.RULES"):
        res.threads("nosuchrule")


# -- the rules use it --------------------------------------------------------------------------------
def rule_blocks() -> dict[str, str]:
    blocks = {}
    for smk in sorted((REPO / "rules").glob("*.smk")):
        for block in re.split(r"(?m)^(?=rule )", smk.read_text()):
            m = re.match(r"rule (\w+):", block)
            if m:
                blocks[m.group(1)] = block
    return blocks


def test_every_rule_declares_threads_resources_and_a_benchmark_in_the_table_layout():
    blocks = rule_blocks()
    targets = set(resources.ACTIONLESS_RULES) | set(resources.LOCAL_RULES)
    assert set(blocks) - targets == set(RULES), "rules/*.smk and anetts.resources.RULES disagree"
    for rule, block in blocks.items():
        if rule in targets:
            continue
        assert f'threads: RES.threads("{rule}")' in block, rule
        # a scheduling priority, where a rule has one, is declared from the same table
        assert (f'priority: RES.priority("{rule}")' in block) == bool(RULES[rule].priority), rule
        assert f'**RES.of("{rule}")' in block, rule
        # the paths come from the rule's RULES entry (rules/common.smk: log_of, benchmark_of), and
        # resources_from_benchmarks.py reads the wildcards back from them
        assert f'log_of("{rule}")' in block and f'benchmark_of("{rule}")' in block, rule
        tail = "/".join("{%s}" % w for w in RULES[rule].wildcards)
        wildcards = ["{%s}" % w for w in RULES[rule].wildcards]
        for kind, ext, path_of in (("benchmarks", "tsv", artifacts.job_benchmark), ("logs", "log", artifacts.job_log)):
            path = f"artifacts/{{model}}/{kind}/{rule}/{tail}.{ext}" if tail else f"artifacts/{{model}}/{kind}/{rule}.{ext}"
            assert str(path_of("{model}", rule, *wildcards)) == path, (rule, path)


# -- cluster profiles ----------------------------------------------------------------------------------
PROFILE_PARSE = """
import sys
from snakemake.cli import get_argument_parser
a = get_argument_parser(profiles=sys.argv[1:]).parse_args([])
print({"executor": a.executor, "jobs": a.jobs, "retries": a.retries, "storage": a.default_storage_provider,
       "rerun_incomplete": a.rerun_incomplete, "cores": a.cores})
"""


def parse_profiles(*profiles: Path) -> subprocess.CompletedProcess:
    return subprocess.run([cluster_python(), "-c", PROFILE_PARSE, *map(str, profiles)], capture_output=True, text=True)


def test_cluster_profiles_parse_with_their_plugins_and_a_typo_is_an_error(tmp_path):
    # the workflow profile comes last, as Snakemake orders them
    slurm = parse_profiles(REPO / "profiles/slurm", REPO / "profiles/default")
    assert slurm.returncode == 0, slurm.stderr[-2000:]
    got = eval(slurm.stdout.strip().splitlines()[-1])
    assert got == {"executor": "slurm", "jobs": 100, "retries": 1, "storage": None, "rerun_incomplete": True, "cores": 2}
    k8s = parse_profiles(REPO / "profiles/kubernetes")
    assert k8s.returncode == 0, k8s.stderr[-2000:]
    assert eval(k8s.stdout.strip().splitlines()[-1])["storage"] == "s3"
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.yaml").write_text((REPO / "profiles/kubernetes/config.yaml").read_text().replace(
        "kubernetes-namespace", "kubernetes-namspace"))
    proc = parse_profiles(bad)
    assert proc.returncode != 0 and "kubernetes-namspace" in proc.stderr


def dry_run_jobs(stdout: str) -> list[dict]:
    jobs = []
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", stdout):
        m = re.match(r"(local)?rule (\w+):", block)
        if not m:
            continue
        fields = dict(re.findall(r"(?m)^    (\w+): (.*)$", block))
        res = dict(kv.split("=", 1) for kv in fields.get("resources", "").split(", ") if "=" in kv)
        wildcards = dict(kv.split("=", 1) for kv in fields.get("wildcards", "").split(", ") if "=" in kv)
        jobs.append({"rule": m.group(2), "local": bool(m.group(1)), "threads": int(fields.get("threads", 1)),
                     "priority": int(fields.get("priority", 0)), "resources": res, "wildcards": wildcards})
    return jobs


@pytest.fixture(scope="module")
def workflow_copy(module_tmp, tiny_weights) -> Path:
    cfg = small_config(tiny_weights, duration=[32, 64])
    onnx = cfg["models"]["kokoro-82m-onnx"]["weights"]  # real weights, for rule listen (`make onnx-weights`)
    onnx["model"], onnx["voices_path"] = str(REPO / onnx["model"]), str(REPO / onnx["voices_path"])
    workdir = make_workflow_copy(module_tmp, cfg)
    shutil.copytree(REPO / "profiles", workdir / "profiles")
    return workdir


def test_slurm_dry_run_lists_every_job_with_its_declared_resources(workflow_copy):
    # all + the optional targets + a Fish model (its scenario rules), a Fish variant (compressed
    # scenario stages, the variant's chain) and a real-weights Kokoro's listener gate: every rule that
    # a scheduler packs
    out = run_snakemake(workflow_copy, "-n", "--forceall", "all", "aimodels", "variants", "artifacts/fish-tiny/manifest.json",
                        "artifacts/fish-tiny/variants/fish-int8/manifest.json", "artifacts/kokoro-82m-onnx/listen.json",
                        "--profile", "profiles/slurm",
                        python=cluster_python()).stdout
    jobs = dry_run_jobs(out)
    wf = WorkflowConfig(yaml.safe_load((workflow_copy / "config.yaml").read_text()), root=workflow_copy)
    res = RuleResources(wf)
    assert {j["rule"] for j in jobs} == set(RULES) | {"all", "aimodels", "variants"}
    for job in jobs:
        if job["rule"] in resources.ACTIONLESS_RULES:
            continue
        assert not job["local"], job  # submitted to SLURM, not run on the submit host
        w = job["wildcards"]
        want = res.declared(job["rule"], w["model"], w.get("stage"), w.get("bucket"))
        got = job["resources"]
        assert int(got["mem_mb"]) == want["mem_mb"] and int(got["runtime"]) == want["runtime"], job
        assert "disk_mb" in got, job  # <TBD> until the inputs exist
        assert job["threads"] == RULES[job["rule"]].threads, job
        assert job["priority"] == RULES[job["rule"]].priority, job
    # the jobs that take both cores and that 1-thread work waits on run first when both are free
    assert {j["rule"] for j in jobs if j["priority"]} == {"reference", "parity"}


def test_a_jobs_disk_counts_the_files_of_a_directory_input(tmp_path):
    """Snakemake sizes a directory input (an export, the weights) by its own entry; the declared
    disk counts the files under it. A real Snakemake run of a rule whose inputs are a 3 MiB
    directory and a 1 MiB file: 4 MiB by `inputs_mb`, about 1 by Snakemake's `input.size_mb`."""
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "a.bin").write_bytes(b"x" * 2 * resources.MIB)
    (tmp_path / "d" / "sub" / "b.bin").write_bytes(b"x" * resources.MIB)
    (tmp_path / "f.bin").write_bytes(b"x" * resources.MIB)
    (tmp_path / "Snakefile").write_text(
        "from anetts.resources import inputs_mb\n\n"
        "rule sizes:\n"
        "    input: d='d', f='f.bin'\n"
        "    output: 'sizes.txt'\n"
        "    resources: disk_mb=lambda w, input: round(inputs_mb(input)), snakemake_mb=lambda w, input: round(input.size_mb)\n"
        "    shell: 'echo {resources.disk_mb} {resources.snakemake_mb} > {output}'\n")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", "sizes.txt"], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "sizes.txt").read_text().split() == ["4", "1"]


# -- a real run under --resources ------------------------------------------------------------------------
def test_a_job_above_the_memory_cap_is_refused_before_anything_runs(workflow_copy):
    weights_mb = RuleResources(WorkflowConfig(yaml.safe_load((workflow_copy / "config.yaml").read_text()),
                                              root=workflow_copy)).declared("weights", "kokoro-tiny")["mem_mb"]
    proc = run_snakemake(workflow_copy, "all", "--resources", f"mem_mb={weights_mb - 1}", check=False)
    assert proc.returncode != 0
    assert (f"rule weights (model=kokoro-tiny) declares mem_mb={weights_mb}, more than --resources "
            f"mem_mb={weights_mb - 1}") in proc.stderr + proc.stdout
    assert not (workflow_copy / "artifacts" / "kokoro-tiny" / "weights").exists()


def job_times(workdir: Path, output: str) -> tuple[float, float]:
    name = base64.urlsafe_b64encode(output.encode()).decode()
    rec = json.loads((workdir / ".snakemake" / "metadata" / name).read_text())
    return rec["starttime"], rec["endtime"]


def test_memory_cap_serializes_jobs_and_the_table_is_derived_from_their_benchmarks(workflow_copy, tmp_path):
    """Two 1-thread exports on 2 cores would run together; a cap that fits one at a time must
    run them one after the other. Their benchmark files then yield the table's points."""
    targets = [f"artifacts/kokoro-tiny/export/duration/{b}.scenario.npz" for b in ("t32", "t64")]
    # jobs in their own processes: the table is for those (anetts/jobserver.py)
    run_snakemake(workflow_copy, *targets, "--config", "job_server=False", "--set-resources", "export:mem_mb=1000", "weights:mem_mb=1000", "--resources", "mem_mb=1500")
    (s1, e1), (s2, e2) = sorted(job_times(workflow_copy, t) for t in targets)
    assert e1 <= s2, "the memory cap let two 1000 MB jobs run at once under mem_mb=1500"

    table = tmp_path / "table.json"
    proc = subprocess.run([sys.executable, str(BENCH_SCRIPT), "--workdir", str(workflow_copy), "--model", "kokoro-tiny",
                           "--table", str(resources.TABLE_PATH), "-o", str(table)], capture_output=True, text=True)
    assert proc.returncode == 2 and "no benchmark files for rules" in proc.stderr  # a partial build is not a table
    proc = subprocess.run([sys.executable, str(BENCH_SCRIPT), "--workdir", str(workflow_copy), "--model", "kokoro-tiny",
                           "--table", str(resources.TABLE_PATH), "-o", str(table), "--allow-missing"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    entry = json.loads(table.read_text())["models"]["kokoro-tiny"]
    pts = sorted(entry["export"]["duration"], key=lambda p: p["x"])
    assert [p["x"] for p in pts] == [32, 64] and all(p["max_rss_mib"] > 50 and p["s"] > 0 for p in pts)
    export_dir = workflow_copy / "artifacts" / "kokoro-tiny" / "export" / "duration"
    written = sum(f.stat().st_size for f in export_dir.glob("t32.*") if f.is_file()) / resources.MIB
    written += sum(f.stat().st_size for f in (export_dir / "t32.functions").rglob("*") if f.is_file()) / resources.MIB
    assert pts[0]["out_mib"] == pytest.approx(written, rel=1e-3)
    assert entry["weights"]["*"][0]["x"] is None
    # the stages this partial build did not export keep their old points
    old = json.loads(resources.TABLE_PATH.read_text())["models"]["kokoro-tiny"]["export"]
    assert {k: v for k, v in entry["export"].items() if k != "duration"} == {k: v for k, v in old.items() if k != "duration"}
    assert len(old) > 1

    # the same build's summary: every job's figures, the runs' /usr/bin/time -v reports, disk
    run_log = tmp_path / "run.log"
    with open(run_log, "w") as log:
        subprocess.run(["/usr/bin/time", "-v", sys.executable, "-c", "pass"], stderr=log, check=True)
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "build_summary.py"), "--workdir", str(workflow_copy),
                           "--model", "kokoro-tiny", "--run-log", str(run_log), "--run-log", str(run_log),
                           "--command", "snakemake (test)", "-o", str(tmp_path / "summary.json")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    tsvs = list((workflow_copy / "artifacts" / "kokoro-tiny" / "benchmarks").rglob("*.tsv"))
    assert summary["total"]["jobs"] == len(tsvs) >= 3 and summary["commands"] == ["snakemake (test)"]
    assert [r["exit_status"] for r in summary["runs"]] == [0, 0] and all(r["max_rss_mib"] > 1 for r in summary["runs"])
    assert summary["disk_mb"]["export"] > 0 and summary["packages"] == []
