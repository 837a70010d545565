"""Threads and resources (mem_mb, runtime, disk_mb) of every rule, from measured costs.

A scheduler (SLURM, Kubernetes, or the local one under `--resources`) can only pack jobs it
knows the size of. Every rule's `threads:` and `resources:` come from here, computed from
`resources_table.json`: per model, rule and stage, the wall seconds, peak RSS and output size of
the jobs of a measured build (Snakemake `benchmark:` files, turned into the table by
benchmarks/resources_from_benchmarks.py), or ceilings where only a whole-build figure exists.

A job's cost depends on one size per rule (`RuleSpec.scale`): the bucket size for per-bucket
rules, the sum of a stage's bucket sizes for per-stage rules, the package count for per-model
summaries. Between measured sizes the cost is interpolated; below the smallest it is the
smallest's (costs grow with size); above the largest it is extrapolated along the slope of the
two largest points, or proportionally from one point. The declared value then adds headroom:
the peak RSS is sampled (every 0.5 s for the first 15 s of a job, then every 30 s), and
measurements of one machine are a guess for another.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from anetts.artifacts import tree_bytes

TABLE_PATH = Path(__file__).with_name("resources_table.json")

# A job's declared memory: the estimated peak RSS (MiB) times this, plus a floor, rounded up.
MEM_HEADROOM = 1.5
MEM_FLOOR_MB = 512
MEM_STEP_MB = 128
# Runtime in minutes (Snakemake's and SLURM's unit): twice the wall seconds plus one minute for
# interpreter start-up and imports (torch) on a cold node.
RUNTIME_FACTOR = 2.0
RUNTIME_STARTUP_S = 60
# Scratch disk: inputs plus estimated outputs, times this; Snakemake's own default floor.
DISK_HEADROOM = 1.25
DISK_FLOOR_MB = 1000
MIB = 1024 * 1024


class ResourceError(ValueError):
    pass


@dataclass(frozen=True)
class RuleSpec:
    threads: int
    # what a job's cost grows with: "bucket", "stage" (sum of the stage's bucket sizes),
    # "packages" (the model's package count) or None (constant)
    scale: str | None
    # the wildcards after the model in the rule's benchmark path, in order:
    # artifacts/<model>/benchmarks/<rule>/<w1>/<w2>.tsv
    wildcards: tuple[str, ...]
    # which jobs of a model the rule has: "bundled" (its stages whose buckets are bundled, StageDecl.bundle),
    # "chain" (one per reference bucket, families with a chain check), "end_to_end" (one per model
    # whose family declares an end-to-end check), "listen" (one per model configuring the listener
    # gate), or None (no stage filter)
    jobs: str | None = None
    # Snakemake's `priority:` (higher first among ready jobs). 1 for the jobs that take both of a
    # 2-core box's cores and that later 1-thread work waits on (a bucket's reference: its exports;
    # a bucket's parity: its stage's bundle): run when both cores are free, they leave the 1-thread
    # jobs to pair up, rather than one running beside an idle core (docs/startup.md; measured in
    # benchmarks/results/startup_log.md, session 15)
    priority: int = 0


RULES: dict[str, RuleSpec] = {
    "weights": RuleSpec(2, None, ()),
    "reference": RuleSpec(2, "bucket", ("bucket",), priority=1),
    "export": RuleSpec(1, "bucket", ("stage", "bucket")),
    "convert": RuleSpec(1, "bucket", ("stage", "bucket")),
    "parity": RuleSpec(2, "bucket", ("stage", "bucket"), priority=1),
    "bundle": RuleSpec(1, "stage", ("stage",), "bundled"),
    "bundle_parity": RuleSpec(2, "stage", ("stage",), "bundled"),
    "chain_parity": RuleSpec(2, "bucket", ("bucket",), "chain"),
    "end_to_end": RuleSpec(2, "packages", (), "end_to_end"),
    "listen": RuleSpec(2, None, (), "listen"),
    "parity_summary": RuleSpec(1, "packages", ()),
    "manifest": RuleSpec(1, "packages", ()),
    "runtime_assets": RuleSpec(1, None, ()),
    "aimodel": RuleSpec(1, "bucket", ("stage", "bucket"), "bundled"),
    "aimodel_parity": RuleSpec(2, "bucket", ("stage", "bucket"), "bundled"),
    "compress": RuleSpec(2, "bucket", ("variant", "stage", "bucket")),
    "variant_chain_parity": RuleSpec(2, "bucket", ("variant", "bucket"), "chain"),
    "variant_manifest": RuleSpec(1, "packages", ("variant",)),
    "variants_summary": RuleSpec(1, "packages", ()),
    "report": RuleSpec(1, "packages", ()),
}
# Rules without an action: never submitted, nothing to declare.
ACTIONLESS_RULES = ("all", "aimodels", "variants", "publish")
# Rules that run on the submitting host (Snakemake `localrules`): publishing needs the user's token
# and the network, which cluster nodes may lack; the scheduler never packs them.
LOCAL_RULES = ("publish_model",)
ANY_STAGE = "*"


def load_table(path: Path = TABLE_PATH) -> dict:
    try:
        table = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ResourceError(f"{path}: cannot read the resources table: {err}") from err
    if not isinstance(table.get("models"), dict):
        raise ResourceError(f"{path}: no `models` object")
    return table


def estimate(points: list[dict], x: float | None, key: str) -> float:
    """Cost `key` at size x from measured points [{"x": size or None, key: value}, ...]."""
    vals = [(p["x"], float(p[key])) for p in points if p.get(key) is not None]
    if not vals:
        raise ResourceError(f"no measured {key!r}")
    if x is None or any(px is None for px, _ in vals):
        return max(v for _, v in vals)
    best: dict[float, float] = {}
    for px, v in vals:  # repeated measurements of one size: the worst
        best[px] = max(v, best.get(px, v))
    xs = sorted(best)
    if x <= xs[0]:
        return best[xs[0]]
    if x >= xs[-1]:
        if len(xs) == 1:
            return best[xs[0]] * x / xs[0] if xs[0] > 0 else best[xs[0]]
        slope = max(0.0, (best[xs[-1]] - best[xs[-2]]) / (xs[-1] - xs[-2]))
        return best[xs[-1]] + slope * (x - xs[-1])
    for lo, hi in zip(xs, xs[1:]):
        if lo <= x <= hi:
            v = best[lo] + (best[hi] - best[lo]) * (x - lo) / (hi - lo)
            return max(v, best[lo])  # monotone: never below a smaller measured size
    raise AssertionError("unreachable")


def _round_up(value: float, step: int) -> int:
    return int(math.ceil(value / step) * step)


def mem_mb(rss_mib: float, attempt: int = 1) -> int:
    return _round_up(max(MEM_FLOOR_MB, rss_mib * MIB / 1e6 * MEM_HEADROOM), MEM_STEP_MB) * attempt


def runtime_min(seconds: float, attempt: int = 1) -> int:
    return int(math.ceil((RUNTIME_FACTOR * seconds + RUNTIME_STARTUP_S) / 60)) * attempt


def disk_mb(input_mb: float, output_mb: float) -> int:
    return max(DISK_FLOOR_MB, _round_up(DISK_HEADROOM * (input_mb + output_mb), 100))


def inputs_mb(paths) -> float:
    """MiB of a job's inputs, a directory counted by the files under it. Snakemake's `input.size_mb`
    takes a directory's own entry (a few kB), so a convert of a 3 GB export (a directory) declared
    the disk of its small files alone."""
    return sum(tree_bytes(p) for p in map(Path, paths) if p.exists()) / MIB


class RuleResources:
    """What the rules declare: `threads: RES.threads("export")`, `resources: **RES.of("export")`.

    global_resources: Snakemake's `workflow.global_resources`, so a job that alone exceeds a
    `--resources` cap is refused while the DAG is built (nothing runs) with the rule named,
    instead of Snakemake's message at scheduling time, after other jobs have already run.
    """

    def __init__(self, wf, table: dict | None = None, global_resources=None):
        self.wf = wf
        self.table = table if table is not None else load_table()
        self.global_resources = global_resources

    # -- lookup --------------------------------------------------------------------------------
    def measured_model(self, model: str) -> str:
        """The table entry used for `model`: its own, an alias, or its family's default."""
        models = self.table["models"]
        if model in models:
            return model
        alias = self.table.get("aliases", {}).get(model)
        if alias in models:
            return alias
        family_default = self.table.get("family_defaults", {}).get(self.wf.family_of(model))
        if family_default in models:
            return family_default
        raise ResourceError(f"model {model!r}: no entry in the resources table, no alias and no family default; "
                            f"measure it (benchmarks/resources_from_benchmarks.py) or add it to `aliases`")

    def points(self, model: str, rule: str, stage: str | None) -> list[dict]:
        measured = self.measured_model(model)
        entry = self.table["models"][measured]
        if rule == "io_from":
            raise ResourceError("`io_from` is a key of a model entry, not a rule")
        fallback = self.table.get("family_defaults", {}).get(self.wf.family_of(model)) if self.wf else None
        if rule not in entry and fallback in self.table["models"] and fallback != measured:
            # a partly measured model: the family's default entry for what was not measured
            measured, entry = fallback, self.table["models"][fallback]
        if rule not in entry:
            raise ResourceError(f"resources table, model {measured!r}: no costs for rule {rule!r}")
        by_stage = entry[rule]
        pts = by_stage.get(stage) if stage is not None else None
        if pts is None and stage is not None and self.wf is not None:
            # an instance of a repeated stage (slow_chunk3) costs what its measured siblings did
            base = self.wf.decl(model).stage(stage).name
            siblings = [p for s, ps in by_stage.items() if s != ANY_STAGE and s.rstrip("0123456789") == base for p in ps]
            pts = siblings or None
        if pts is None:
            pts = by_stage.get(ANY_STAGE)
        if pts is None:
            raise ResourceError(f"resources table, model {measured!r}, rule {rule!r}: "
                                f"no costs for stage {stage!r} (measured: {sorted(by_stage)})")
        return pts

    def size(self, rule: str, model: str, stage: str | None = None, bucket: str | None = None) -> float | None:
        scale = spec(rule).scale
        if scale is None:
            return None
        if scale == "bucket":
            if rule in ("reference", "chain_parity", "variant_chain_parity"):
                return self.wf.reference_size(model, bucket)
            return self.wf.bucket_size(model, stage, bucket)
        if scale == "stage":
            return sum(self.wf.bucket_size(model, stage, b) for b in self.wf.buckets(model, stage))
        if scale == "packages":
            return len(self.wf.packages(model))
        raise ResourceError(f"rule {rule!r}: unknown scale {scale!r}")

    def estimate(self, rule: str, model: str, stage: str | None = None, bucket: str | None = None) -> dict:
        """Estimated wall seconds, peak RSS (MiB), output MiB per input MiB, and output MiB."""
        pts = self.points(model, rule, stage)
        x = self.size(rule, model, stage, bucket)
        est = {"seconds": estimate(pts, x, "s"), "rss_mib": estimate(pts, x, "max_rss_mib")}
        ceiling = self.table["models"][self.measured_model(model)].get("ceiling", {})
        measured_x = [p["x"] for p in pts if p.get("x") is not None]
        if x is not None and measured_x and x > max(measured_x) and "max_rss_mib" in ceiling:
            # beyond the measured sizes the slope of two sampled peaks can run far above what a
            # whole build of this model was seen to need; never below a measured point, though
            est["rss_mib"] = max(min(est["rss_mib"], ceiling["max_rss_mib"]), estimate(pts, max(measured_x), "max_rss_mib"))
        io_from = self.table["models"][self.measured_model(model)].get("io_from")
        if io_from in self.table["models"] and not any("out_per_in" in p or "out_mib" in p for p in pts):
            # output sizes in proportion to the inputs, as measured on a smaller model of the family
            by_stage = self.table["models"][io_from].get(rule, {})
            pts = by_stage.get(stage) or by_stage.get(ANY_STAGE) or pts
        if any(p.get("out_per_in") is not None for p in pts):
            est["out_per_in"] = estimate(pts, None, "out_per_in")
        if any(p.get("out_mib") is not None for p in pts):
            est["out_mib"] = estimate(pts, x, "out_mib")
        return est

    def declared(self, rule: str, model: str, stage=None, bucket=None, input_mb: float = 0.0, attempt: int = 1) -> dict:
        est = self.estimate(rule, model, stage, bucket)
        # outputs: the measured size, or in proportion to the inputs where those are larger
        out_mb = max(est.get("out_mib", 0.0) * MIB / 1e6, est.get("out_per_in", 0.0) * input_mb)
        return {"mem_mb": mem_mb(est["rss_mib"], attempt), "runtime": runtime_min(est["seconds"], attempt),
                "disk_mb": disk_mb(input_mb, out_mb)}

    # -- what the rules use --------------------------------------------------------------------
    def threads(self, rule: str) -> int:
        return spec(rule).threads

    def priority(self, rule: str) -> int:
        return spec(rule).priority

    def of(self, rule: str) -> dict:
        """Snakemake resource callables for `rule` (evaluated per job, `attempt` 1, 2, … on --retries).

        Only disk_mb reads the input size: Snakemake defers a callable whose inputs do not exist
        yet, and the memory and runtime must be known (and checked against caps) up front.
        """
        spec(rule)

        def job(wildcards):
            return wildcards.model, wildcards.get("stage"), wildcards.get("bucket")

        def mem(wildcards, attempt):
            value = self.declared(rule, *job(wildcards), attempt=attempt)["mem_mb"]
            return self._check_cap(rule, wildcards, "mem_mb", value)

        def runtime(wildcards, attempt):
            value = self.declared(rule, *job(wildcards), attempt=attempt)["runtime"]
            return self._check_cap(rule, wildcards, "runtime", value)

        def disk(wildcards, input):
            value = self.declared(rule, *job(wildcards), input_mb=inputs_mb(input))["disk_mb"]
            return self._check_cap(rule, wildcards, "disk_mb", value)

        return {"mem_mb": mem, "runtime": runtime, "disk_mb": disk}

    def _check_cap(self, rule, wildcards, name, value):
        cap = None
        if self.global_resources is not None:
            try:
                cap = self.global_resources[name].value
            except (KeyError, AttributeError):
                cap = None
        if isinstance(cap, int) and value > cap:
            job = ", ".join(f"{k}={v}" for k, v in wildcards.items())
            raise ResourceError(f"rule {rule} ({job}) declares {name}={value}, more than --resources {name}={cap} "
                                f"allows, so it could never run; raise the cap, or override the declaration with "
                                f"--set-resources {rule}:{name}=N")
        return value


def rule_jobs(wf, rule: str, model: str) -> list[tuple[str | None, str | None]]:
    """(stage, bucket) of every job `rule` has for `model` (RuleSpec.jobs and .wildcards say which)."""
    rs = spec(rule)
    if rs.jobs == "end_to_end":
        return [(None, None)] if wf.end_to_end_reports(model) else []
    if rs.jobs == "listen":
        return [(None, None)] if wf.listen_reports(model) else []
    stages = wf.bundled_stages(model) if rs.jobs == "bundled" else wf.stages(model)
    if rs.jobs == "chain":
        return [(None, Path(p).stem) for p in wf.chain_reports(model)]
    if rs.jobs is not None and not stages:
        return []
    if rs.wildcards == ("bucket",):
        return sorted({(None, b) for s in stages for b in wf.buckets(model, s) if wf.export_reference(model, s, b)})
    if "stage" in rs.wildcards:
        return [(s, b if "bucket" in rs.wildcards else None) for s in stages for b in wf.buckets(model, s)]
    return [(None, None)]


def spec(rule: str) -> RuleSpec:
    if rule not in RULES:
        raise ResourceError(f"rule {rule!r} has no entry in anetts.resources.RULES (threads, scale, benchmark wildcards)")
    return RULES[rule]
