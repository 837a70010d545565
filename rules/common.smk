# Config validation, bucket lists and input functions shared by every rule.
import sys

# use this checkout's anetts even if another is installed
sys.path.insert(0, workflow.basedir)

from anetts import artifacts
from anetts.recovery import STATE_DIR, recover
from anetts.workflow import WorkflowConfig, check_yaml_syntax, validate_config

check_yaml_syntax("config.yaml")


configfile: "config.yaml"


# a build killed with kill -9 left locks, running jobs and temporaries: clear them before
# Snakemake locks (a no-op while another build of this directory is alive)
if workflow.is_main_process:
    recover()

validate_config(config)
WF = WorkflowConfig(config, root=workflow.basedir)

# Jobs fork from one warm process of this build instead of importing torch & co. each
# (config `job_server`, anetts/jobserver.py); started only when there is work to do.
from anetts.jobserver import BuildServer

JOB_SERVER = BuildServer(
    config["job_server"],
    workflow.basedir,
    WF.job_imports(config["model"]),
    STATE_DIR / "job-server.log",
)


onstart:
    JOB_SERVER.start(workflow.local_exec)


onsuccess:
    JOB_SERVER.stop()


onerror:
    JOB_SERVER.stop()


wildcard_constraints:
    model="|".join(WF.model_names),
    stage="|".join(WF.stage_names),
    bucket=WF.bucket_regex,


def manifest_file(model):
    return artifacts.manifest_path(model)


def weights_out(wildcards):
    return str(artifacts.weights_dir(wildcards.model))


# threads and resources of every rule, from the measured costs (anetts/resources.py)
from anetts.resources import RULES, RuleResources

# Every artifact path the rules name, built once by anetts.artifacts (wildcards in braces).
PATHS = artifacts.rule_patterns()


def _job_wildcards(rule):
    return [f"{{{w}}}" for w in (RULES[rule].wildcards if rule in RULES else ())]


def log_of(rule):
    """The log of a job of `rule`: logs/<rule>/<its wildcards>.log (anetts.artifacts.job_log)."""
    return str(artifacts.job_log("{model}", rule, *_job_wildcards(rule)))


def benchmark_of(rule):
    """The benchmark of a job of `rule`, in the layout anetts.resources reads back."""
    return str(artifacts.job_benchmark("{model}", rule, *_job_wildcards(rule)))


RES = RuleResources(WF, global_resources=workflow.global_resources)
