"""``anetts bench``: the benchmark harness users run on their own machine (Apple Silicon above all).

Family-neutral: what one run measures, on a built model directory of any family:

- per package: verification (sha256) and load time (Core ML: load + on-device compile); per function
  of the package (Kokoro: its one function; Fish's slow chunks: ``prefill`` and ``decode`` on a fresh
  KV state), the first call separately, then warm calls, on the build's own example inputs;
- end to end, the family's workload (its declaration's ``bench`` module) for a fixed passage at about
  3, 7, 15 and 30 s of audio (only the lengths the build can make in one piece): Kokoro through
  ``synthesize_tokens`` with per-stage times, and upstream ``KModel`` on CPU and, where torch has it,
  MPS side by side; Fish as greedy decode frames (slow chunks, head, fast AR per frame) and the codec;
- peak RSS, and on macOS with Core ML the ``MLComputePlan`` placement of every package's ops.

Timing schedule: ``warmup`` untimed calls per case, then ``iterations`` rounds in each of which
every case runs once, in an order shuffled by a seeded RNG (counterbalanced: no case always runs
first or right after the same neighbour). Statistics: median, p90, p95, min, mean.

The JSON goes to ``<model_dir>/bench/<chip>-<backend>-<UTC>.json`` and carries provenance; the
model's HTML report reads every JSON in that folder, so a file sent back from a Mac shows up there.
The ``coreml`` backend needs macOS and is refused elsewhere before anything runs.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import logging
import math
import platform
import random
import re
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from anetts import artifacts
from anetts.provenance import provenance
from anetts.runtime.placement import CANDIDATES, PlacementError, check_placement, chip_name
from anetts.runtime.runners import COMPUTE_UNITS, EXECUTORS as BACKENDS

log = logging.getLogger(__name__)

BENCH_KIND = "anetts-bench"
BENCH_SCHEMA = 1
UPSTREAM_DEVICES = ("cpu", "mps")
# A fixed passage (same as benchmarks/runtime_vs_upstream.py), cut by each family's workload.
PASSAGE = (
    "The old lighthouse stood at the edge of the cliff, its white paint peeling in long strips after "
    "decades of salt and wind. Every evening the keeper climbed the narrow stairs, counted the steps "
    "out of habit, and lit the lamp before the last of the daylight faded over the water. Ships passed "
    "far out at sea, their lights small and steady, and none of the sailors ever knew his name. In the "
    "winter the storms came from the north, and the waves broke so hard against the rocks that the whole "
    "tower seemed to tremble. He kept a journal of the weather, the birds, and the boats, writing a few "
    "careful lines each night by the glow of the great lens. Years later, when the light was automated "
    "and the keeper moved to the village, people found the journals stacked neatly in a cupboard, "
    "hundreds of pages describing a life spent watching the horizon and waiting for nothing in particular."
)
TARGETS_S = (3, 7, 15, 30)


@dataclass
class Workload:
    """A family's end-to-end cases for the harness: `cases[name]() -> (wall s, details or None)`
    (names `upstream-<device>:<target>` are an upstream side, dropped with their device if it fails),
    and `rows(samples, details)` -> the JSON's `end_to_end` rows."""

    cases: dict[str, Callable[[], tuple[float, dict | None]]]
    rows: Callable[[dict, dict], list[dict]]
    settings: dict
    upstream: dict = field(default_factory=dict)  # per device: available, load_s or the reason
    upstream_runs: set = field(default_factory=set)  # devices whose cases are in `cases`
    notes: list = field(default_factory=list)


class BenchError(RuntimeError):
    """A benchmark that cannot run as asked (platform, arguments, artifacts)."""


# ---------------------------------------------------------------------------------- statistics

def stats(samples: list[float]) -> dict:
    """Median, p90, p95 (linear interpolation), min, mean of wall seconds, and the samples."""
    if not samples:
        raise BenchError("no timed samples (iterations must be >= 1)")
    a = np.asarray(samples, dtype=np.float64)
    return {"n": int(a.size), "median_s": float(np.median(a)), "p90_s": float(np.percentile(a, 90)),
            "p95_s": float(np.percentile(a, 95)), "min_s": float(a.min()), "mean_s": float(a.mean()),
            "samples_s": [float(x) for x in a]}


def schedule(cases: list[str], iterations: int, seed: int) -> list[list[str]]:
    """One shuffled order of the cases per iteration, reproducible from the seed."""
    rng = random.Random(seed)
    rounds = []
    for _ in range(iterations):
        order = list(cases)
        rng.shuffle(order)
        rounds.append(order)
    return rounds


def peak_rss_bytes() -> int:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r if sys.platform == "darwin" else r * 1024)  # bytes on macOS, KiB on Linux


# ---------------------------------------------------------------------------------- naming

def slug(text: str, limit: int = 40) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return (s[:limit].rstrip("-")) or "unknown"


def bench_path(model_dir: Path, chip: str, backend: str, when: _dt.datetime) -> Path:
    model_dir = Path(model_dir)
    stamp = when.strftime("%Y%m%dT%H%M%SZ")
    return artifacts.bench_dir(model_dir.name, root=model_dir.parent) / f"{slug(chip)}-{backend}-{stamp}.json"


def parse_compute_units(values: list[str] | None) -> str | dict[str, str] | None:
    """`ALL` for every stage, or `stage=UNITS` pairs; None keeps the manifest's per-stage units."""
    if not values:
        return None
    if len(values) == 1 and "=" not in values[0]:
        if values[0] not in COMPUTE_UNITS:
            raise BenchError(f"--compute-units {values[0]!r}: choose one of {list(COMPUTE_UNITS)} or STAGE=UNITS")
        return values[0]
    out = {}
    for v in values:
        stage, sep, cu = v.partition("=")
        if not sep or cu not in COMPUTE_UNITS:
            raise BenchError(f"--compute-units {v!r}: expected STAGE=UNITS with UNITS in {list(COMPUTE_UNITS)}")
        out[stage] = cu
    return out


# ---------------------------------------------------------------------------------- targets

def usable_targets(targets, capacity_s: float) -> list[int]:
    """The target seconds a build can produce in one piece; the whole capacity (floored) if none fit."""
    fit = [t for t in targets if t <= capacity_s]
    return fit or [max(1, int(capacity_s))]


# ---------------------------------------------------------------------------------- programs

def example_calls(entry) -> dict[str, dict[str, np.ndarray]]:
    """Inputs per function of `entry`: the first call of each function in the scenario its parity
    played (a one-call stage's call on its example inputs; timed on a fresh state: a call
    costs the same whatever the state holds)."""
    from anetts.scenario import load_scenario

    path = entry.scenario
    if path is None or not Path(path).is_file():
        raise BenchError(f"{entry.label}: its scenario {path} is missing (the manifest's `scenario`); "
                         "the bench times each package on its build's own example calls")
    try:
        sc, _ = load_scenario(Path(path))
    except (KeyError, ValueError) as e:  # ScenarioError is a ValueError
        raise BenchError(f"{entry.label}: {path} is not a usable scenario ({e})") from e
    calls = {}
    for c in sc.calls:
        if c.function not in calls:
            # a bundle's bucket runs its export's one call under the bundle's name for the bucket
            name = entry.function if len(sc.functions) == 1 else c.function
            spec = entry.spec(name)
            calls[name] = {t.name: np.ascontiguousarray(c.inputs[t.name]).astype(t.np_dtype, copy=False)
                           for t in spec.inputs}
    return calls


def workload_module(family: str):
    """The family's end-to-end workload for the bench (its declaration's `bench` module)."""
    import importlib

    from anetts.families import declaration

    decl = declaration(family)
    if decl.bench is None:
        raise BenchError(f"family {family!r} declares no bench workload (FamilyDecl.bench)")
    return importlib.import_module(decl.bench)


# ---------------------------------------------------------------------------------- the run

def run_bench(model_dir: Path, backend: str | None = None, *, compute_units=None, iterations: int = 5,
              warmup: int = 2, seed: int = 0, targets=TARGETS_S, voice: str | None = None, speed: float | None = None,
              lang: str | None = None, upstream=UPSTREAM_DEVICES, threads: int | None = None,
              compute_plan: bool = True, placement: bool = False) -> dict:
    """Run the whole harness; returns the JSON-ready result (see the module docstring). ``placement``:
    also time each stage under every candidate compute unit (:func:`measure_placement`; Core ML only)."""
    from anetts.loader import load
    from anetts.runtime import ModelArtifacts

    if backend is not None and backend != "auto" and backend not in BACKENDS:
        raise BenchError(f"--backend {backend!r}: choose from {list(BACKENDS)}")
    if placement and sys.platform != "darwin":
        raise BenchError(f"--placement times each stage on Core ML's compute units {list(CANDIDATES)}: it needs "
                         f"the coreml backend on macOS, and this platform is {sys.platform!r}; run it on a Mac and "
                         "send the bench JSON back (docs/macos.md)")
    if backend == "coreml" and sys.platform != "darwin":
        raise BenchError(f"--backend coreml needs macOS (Core ML runs only there); this platform is {sys.platform!r} "
                         f"({platform.system()} {platform.machine()}). Use --backend torch or --backend mil here, "
                         "and run the coreml bench on a Mac")
    if iterations < 1 or warmup < 0:
        raise BenchError(f"need iterations >= 1 and warmup >= 0, got {iterations} and {warmup}")
    if backend not in (None, "auto", "coreml") and compute_units is not None:
        raise BenchError(f"--compute-units applies to the coreml backend only, not {backend!r}")
    work = workload_module(ModelArtifacts.load(model_dir).family)
    started = _dt.datetime.now(_dt.timezone.utc)
    t_start = time.perf_counter()

    tts = load(model_dir, backend=None if backend == "auto" else backend, threads=threads, compute_units=compute_units)
    runner, arts = tts.backend, tts.artifacts  # the runtime's Runner (anetts.runtime.runners)
    backend = runner.name
    if placement and backend != "coreml":
        raise BenchError(f"--placement times Core ML's compute units; the {backend} backend has none (use --backend coreml)")
    if backend != "coreml" and compute_units is not None:
        raise BenchError(f"--compute-units applies to the coreml backend only, not {backend!r}")
    entries = [arts.package(s, b) for s, b in sorted(arts.packages)]

    # -- per package: verify, load (+ compile); per function: first call ----------------------
    stages: dict[str, dict] = {}
    calls: dict[str, tuple] = {}
    for e in entries:
        t0 = time.perf_counter()
        arts.verify(e, torchscript=runner.name == "torch")
        t1 = time.perf_counter()
        program = runner.program(e.stage, e.bucket)
        t2 = time.perf_counter()
        cu = runner.compute_units(e.stage, e) if runner.name == "coreml" else None
        functions = example_calls(e)
        for fn, inputs in functions.items():
            label = f"{e.label}:{fn}" if len(functions) > 1 else e.label
            state = program.new_state(fn)
            t3 = time.perf_counter()
            program.run(fn, inputs, state)
            first = time.perf_counter() - t3
            calls[label] = (program, fn, inputs, state)
            stages[label] = {"label": label, "stage": e.stage, "bucket": e.bucket, "function": fn, "compute_units": cu,
                             "verify_s": t1 - t0, "load_s": t2 - t1, "first_call_s": first,
                             "stateful": state is not None}
    rss_after_load = peak_rss_bytes()

    # -- the family's end-to-end cases (and upstream sides where it has them) -------------------
    w = work.workload(tts, targets=targets, voice=voice, speed=speed, lang=lang, upstream=upstream)
    cases: dict[str, callable] = {}
    for label, (program, fn, inputs, state) in calls.items():
        cases[f"stage:{label}"] = (lambda p=program, fn=fn, x=inputs, st=state: (_timed(lambda: p.run(fn, x, st)), None))
    cases.update(w.cases)

    for _ in range(max(warmup, 1) if w.upstream_runs else warmup):
        for name in list(cases):
            if name not in cases:  # dropped with its failed upstream device
                continue
            try:
                cases[name]()
            except Exception as err:  # noqa: BLE001 - upstream on MPS can lack ops; keep the rest of the run
                if not name.startswith("upstream-"):
                    raise
                dev_name = name.split(":")[0].removeprefix("upstream-")
                w.upstream[dev_name] = {"available": False, "reason": f"upstream failed: {type(err).__name__}: {err}"}
                w.upstream_runs.discard(dev_name)
                for other in [n for n in cases if n.startswith(f"upstream-{dev_name}:")]:
                    del cases[other]
    samples: dict[str, list[float]] = {name: [] for name in cases}
    details: dict[str, list[dict]] = {name: [] for name in cases}
    rounds = schedule(list(cases), iterations, seed)
    for i, order in enumerate(rounds):
        for name in order:
            wall, extra = cases[name]()
            samples[name].append(wall)
            if extra is not None:
                details[name].append(extra)
        log.info("iteration %d/%d done", i + 1, iterations)

    for label in stages:
        stages[label]["warm"] = stats(samples[f"stage:{label}"])

    plan = _compute_plans(entries, runner) if compute_plan else {"available": False, "reason": "not requested"}
    placed = measure_placement(arts, iterations, warmup) if placement else None
    return {
        "kind": BENCH_KIND,
        "schema": BENCH_SCHEMA,
        "model": arts.name,
        "family": arts.family,
        "model_dir": str(model_dir),
        "backend": backend,
        "compute_units": compute_units,
        "chip": chip_name(),
        "created_utc": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "wall_s": time.perf_counter() - t_start,
        "settings": {"iterations": iterations, "warmup": warmup, "seed": seed, **w.settings,
                     "upstream": list(upstream or []), "torch_threads": _torch_threads(), "schedule": rounds},
        "stages": list(stages.values()),
        "end_to_end": w.rows(samples, details),
        "upstream": w.upstream,
        "memory": {"peak_rss_bytes_after_load": rss_after_load, "peak_rss_bytes": peak_rss_bytes()},
        "compute_plan": plan,
        "placement": placed,
        "notes": ["times are wall seconds",
                  "load_s: backend load of the package (Core ML: load and on-device compile); "
                  "first_call_s: the first call of the function after it (a stateful function: on a fresh state)",
                  *w.notes],
        "provenance": provenance(),
    }


def _torch_threads() -> int | None:
    """torch's intra-op threads where torch is loaded (the torch and mil executors, upstream); else None."""
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else None


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _compute_plans(entries, runner) -> dict:
    """MLComputePlan placement per package (macOS, coreml backend); a reason otherwise."""
    if runner.name != "coreml":
        return {"available": False, "reason": f"compute plans need the coreml backend on macOS (backend {runner.name})"}
    from anetts.compile.inspect import compute_plan

    out = {"available": True, "packages": {}}
    for e in entries:
        cu = runner.compute_units(e.stage, e)
        try:
            plan = compute_plan(e.path, cu)
        except Exception as err:  # noqa: BLE001 - MLComputePlan needs macOS 14.4+; record why, keep the timings
            out["packages"][e.label] = {"error": f"{type(err).__name__}: {err}"}
            continue
        fn = plan.get(e.function) or next(iter(plan.values()))
        out["packages"][e.label] = {k: fn[k] for k in ("compute_units", "by_device", "cost_by_device", "ane_op_fraction")}
    return out


def _plan_summary(path, units: str, function: str) -> dict | None:
    from anetts.compile.inspect import compute_plan

    plan = compute_plan(path, units)
    fn = plan.get(function) or next(iter(plan.values()))
    return {k: fn[k] for k in ("compute_units", "by_device", "cost_by_device", "ane_op_fraction")}


def _largest(entries):
    """The bucket whose inputs hold the most elements: the one a stage's speed matters most at."""
    return max(entries, key=lambda e: sum(math.prod(d for d in t.shape if d) for t in e.inputs))


def measure_placement(arts, iterations: int, warmup: int) -> dict:
    """Each stage's largest bucket timed on Core ML under every unit of ``CANDIDATES`` (its first function,
    ``warmup`` untimed calls, then the median of ``iterations``), with the compute plan of each; the
    faster is chosen (anetts.runtime.placement says how the runtime uses it)."""
    from anetts.runtime.runners import Runner

    out = {"schema": 1, "iterations": iterations, "stages": {}}
    for stage in sorted({s for s, _ in arts.packages}):
        entry = _largest([arts.package(s, b) for s, b in arts.packages if s == stage])
        fn, inputs = next(iter(example_calls(entry).items()))
        timed = {}
        for units in CANDIDATES:
            program = Runner("coreml", arts, compute_units={stage: units}).program(stage, entry.bucket)
            state = program.new_state(fn)
            for _ in range(warmup):
                program.run(fn, inputs, state)
            median = stats([_timed(lambda: program.run(fn, inputs, state)) for _ in range(iterations)])["median_s"]
            try:
                plan = _plan_summary(entry.path, units, entry.function)
            except Exception as err:  # noqa: BLE001 - MLComputePlan needs macOS 14.4+; keep the timing
                plan = {"error": f"{type(err).__name__}: {err}"}
            timed[units] = {"median_s": median, "plan": plan}
            log.info("placement %s/%s %s: %.4f s", stage, entry.bucket, units, median)
        out["stages"][stage] = {"bucket": entry.bucket, "chosen": min(timed, key=lambda u: timed[u]["median_s"]),
                                "units": timed}
    return check_placement(out, "the measured placement")


# ---------------------------------------------------------------------------------- validation

def validate_bench(data, where: str) -> dict:
    """Check a bench JSON's shape (what the report reads); raise naming the file and the key."""
    if not isinstance(data, dict):
        raise BenchError(f"{where}: a bench JSON must be an object")
    if data.get("kind") != BENCH_KIND:
        raise BenchError(f"{where}: kind must be {BENCH_KIND!r}, got {data.get('kind')!r}")
    if data.get("schema") != BENCH_SCHEMA:
        raise BenchError(f"{where}: schema {data.get('schema')!r} is not {BENCH_SCHEMA} (an older or newer anetts?)")
    for key in ("model", "backend", "chip", "created_utc", "settings", "stages", "end_to_end", "memory", "provenance"):
        if key not in data:
            raise BenchError(f"{where}: missing key {key!r}")
    for i, s in enumerate(data["stages"]):
        for key in ("stage", "bucket", "load_s", "first_call_s", "warm"):
            if key not in s:
                raise BenchError(f"{where}: stages[{i}] lacks {key!r}")
        _check_stats(s["warm"], f"{where}: stages[{i}].warm")
    if data.get("placement") is not None:
        try:
            check_placement(data["placement"], where)
        except PlacementError as e:
            raise BenchError(str(e)) from None
    for i, r in enumerate(data["end_to_end"]):
        for key in ("target_s", "audio_s", "warm", "rtf_median"):
            if key not in r:
                raise BenchError(f"{where}: end_to_end[{i}] lacks {key!r}")
        _check_stats(r["warm"], f"{where}: end_to_end[{i}].warm")
    return data


def _check_stats(s, where: str) -> None:
    for key in ("n", "median_s", "p90_s", "p95_s"):
        v = s.get(key) if isinstance(s, dict) else None
        if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise BenchError(f"{where}.{key} must be a finite number >= 0, got {v!r}")


# ---------------------------------------------------------------------------------- CLI

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="anetts bench", description="Benchmark a built model on this machine: per-package "
                                "load, first-call and warm times, end-to-end RTF, and upstream PyTorch side by side.")
    p.add_argument("--model-dir", type=Path, required=True, help="built model directory (artifacts/<model>)")
    p.add_argument("--backend", choices=BACKENDS, default=None, help="an executor of anetts.runtime.runners (default: "
                   "coreml on macOS, else torch, or mil for a model without faithful TorchScript)")
    p.add_argument("--compute-units", nargs="+", default=None, metavar="UNITS",
                   help=f"coreml: one of {', '.join(COMPUTE_UNITS)} for every stage, or STAGE=UNITS pairs "
                        "(default: per stage from the manifest)")
    p.add_argument("--iterations", type=int, default=5, help="timed rounds, each case once per round (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per case first (default 2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the per-round order (default 0)")
    p.add_argument("--targets", type=int, nargs="+", default=list(TARGETS_S), help="audio seconds (default 3 7 15 30)")
    p.add_argument("--voice", default=None, help="Kokoro: voice (default: the build's first)")
    p.add_argument("--speed", type=float, default=None, help="Kokoro: speed (default 1.0)")
    p.add_argument("--lang", default=None, help="Kokoro: language of the passage's G2P (default en-us)")
    p.add_argument("--upstream", nargs="*", default=list(UPSTREAM_DEVICES), choices=UPSTREAM_DEVICES,
                   help="upstream PyTorch devices timed side by side (default: cpu mps; none: --upstream)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (torch backend and upstream)")
    p.add_argument("--no-compute-plan", action="store_true", help="skip MLComputePlan placement (coreml)")
    p.add_argument("--placement", action="store_true",
                   help=f"coreml on macOS: also time each stage's largest bucket on {' and '.join(CANDIDATES)} and "
                        "record the faster per stage; a Core ML runtime on this chip then uses it (docs/macos.md)")
    p.add_argument("-o", "--output", type=Path, default=None,
                   help="JSON path (default <model-dir>/bench/<chip>-<backend>-<UTC>.json)")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from anetts.runtime import TTSError

    try:
        cu = parse_compute_units(args.compute_units)
        if args.threads is not None:
            import torch

            torch.set_num_threads(args.threads)
        result = run_bench(args.model_dir, args.backend, compute_units=cu, iterations=args.iterations,
                           warmup=args.warmup, seed=args.seed, targets=args.targets, voice=args.voice,
                           speed=args.speed, lang=args.lang, upstream=args.upstream, threads=args.threads,
                           compute_plan=not args.no_compute_plan, placement=args.placement)
        validate_bench(result, "bench result")
        when = _dt.datetime.strptime(result["created_utc"], "%Y-%m-%dT%H:%M:%SZ")
        out = args.output or bench_path(args.model_dir, result["chip"], result["backend"], when)
        with artifacts.atomic_file(out) as tmp:
            artifacts.write_json(tmp, result)
    except (BenchError, TTSError, OSError) as e:
        print(f"anetts bench: error: {e}", file=sys.stderr)
        return 1
    for r in result["end_to_end"]:
        ups = ", ".join(f"upstream {d} x{u['ratio_upstream_over_runtime']:.2f}" for d, u in r["upstream"].items())
        frame = r.get("per_frame_median_s", {}).get("frame")
        print(f"{r['target_s']:>3} s target: {r['audio_s']:.2f} s audio, median {r['warm']['median_s']:.3f} s "
              f"(p95 {r['warm']['p95_s']:.3f}), RTF {r['rtf_median']:.3f}" + (f"; {ups}" if ups else "")
              + (f"; {frame * 1e3:.1f} ms per frame" if frame is not None else ""))
    print(f"wrote {out} ({result['backend']} on {result['chip']}); send this file back to be shown in the report")
    return 0


if __name__ == "__main__":
    sys.exit(main())
