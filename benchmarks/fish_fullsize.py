"""Fish S2 Pro at full size: the AR stages built chunk by chunk, each job in its own process.

For a weights directory (default: the synthetic `fish-s2-pro` preset, written here), every
stage is one job: each slow chunk (the last with the restricted LM head) and the fast AR load only
their own tensors, trace, convert to an fp16 stateful package (macOS15; slow chunks `prefill` + `decode`)
with `compile_module`, and record wall seconds, peak RSS (ru_maxrss of that job's process, read
by the parent with wait4), package bytes and weight bytes. Optional: a MIL-executor parity job
for one chunk (a prompt prefill, then a few decode positions, against its eager module).

The chunk count defaults to the fewest chunks whose fp16 weights stay below the macOS per-file
size guidance (~2 GB); the figures also say how many the iOS guidance (~1 GB) would need.
Per generated frame the JSON gives the weight bytes read (every slow chunk once, the restricted
head once, the fast AR 10 times) and a bandwidth-bound projection in ms/frame: a projection
from bytes and an assumed bandwidth, not a measurement.

    python benchmarks/fish_fullsize.py --weights /tmp/fish-s2 --work /tmp/fish-full -o fish_fullsize.json
    python benchmarks/fish_fullsize.py --preset fish-tiny --weights /tmp/ft --work /tmp/ftw   # dry run

Jobs run `--parallel` at a time (default 1); a job starts only when the estimated disk and
memory of the running jobs leave room for it (`--max-rss-gb`, the free disk of `--work`).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from anetts.provenance import provenance  # noqa: E402

GB = 1e9
# Per-file size guidance for Core ML packages (the size lint's max_package_mb in config.yaml):
# ~2 GB macOS, ~1 GB iOS; oversized files export without error and then fail to load.
MACOS_FILE_BYTES = 2 * GB
IOS_FILE_BYTES = 1 * GB
FP16 = 2
# M2 Max unified memory bandwidth (Apple's figure); sustained bandwidth is lower, so this is optimistic.
DEFAULT_BANDWIDTH_GBS = 400.0
# 1 frame = 2048 samples at 44.1 kHz (the S2 codec's hop).
FRAME_MS = 2048 / 44100 * 1000


# ---------------------------------------------------------------------------------------
# Sizes from the config (no weights needed)
# ---------------------------------------------------------------------------------------

def layer_bytes(d) -> int:
    from anetts.models.fish.weights import layer_tensors

    return sum(math.prod(s) for s in layer_tensors(d, "x.").values()) * FP16


def chunks_for(cfg, limit: float) -> int:
    """Fewest equal-ish chunks whose largest one's fp16 layer weights stay below `limit` bytes."""
    per = int(limit // layer_bytes(cfg.slow))
    if per < 1:
        raise SystemExit(f"one slow layer ({layer_bytes(cfg.slow)} B) is over the {limit:.0f} B file limit")
    return math.ceil(cfg.slow.n_layer / per)


def kv_bytes(d, rows: int) -> int:
    """fp16 K and V of all of `d`'s layers over `rows` positions."""
    return d.n_layer * 2 * d.n_local_heads * rows * d.head_dim * FP16


# ---------------------------------------------------------------------------------------
# Synthetic weights, tensors written in parallel
# ---------------------------------------------------------------------------------------

def _synth_task(task) -> str:
    import torch

    from anetts.models.fish.config import FishConfig
    from anetts.models.fish import presets, weights

    path, offset, name, shape, preset_name, seed = task
    p = presets.preset(preset_name)
    cfg = FishConfig.from_dict(p.config, preset_name)
    bits = weights.synth_tensor(name, tuple(shape), cfg, seed).contiguous().view(torch.int16).numpy()
    if sys.byteorder != "little":
        bits = bits.byteswap()
    fd = os.open(path, os.O_WRONLY)
    try:
        mv, done = memoryview(bits).cast("B"), 0
        while done < len(mv):
            done += os.pwrite(fd, mv[done:], offset + done)
    finally:
        os.close(fd)
    return name


def synthesize(out: Path, preset_name: str, seed: int, procs: int) -> dict:
    """The files `weights.make_synthetic` writes (same shards, headers and values: each tensor
    has its own RNG stream), but with the tensors drawn by `procs` processes and written at their
    offsets; then the header check of `validate_weights_dir` (values: see `--validate-values`)."""
    import multiprocessing as mp

    from anetts.artifacts import write_json
    from anetts.models.fish import presets, tokenizer as tok, weights
    from anetts.models.fish.config import CONFIG_NAME, FishConfig

    out.mkdir(parents=True, exist_ok=True)
    p = presets.preset(preset_name)
    cfg = FishConfig.from_dict(p.config, f"preset {preset_name}")
    spec = weights.checkpoint_spec(cfg)
    shards = weights.plan_shards(spec, p.shard_bytes)
    wmap, tasks, total = {}, [], 0
    for k, names in enumerate(shards, 1):
        fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        header, off = {}, 0
        for name in names:
            n = math.prod(spec[name]) * FP16
            header[name] = {"dtype": weights.SAFETENSORS_DTYPE, "shape": list(spec[name]), "data_offsets": [off, off + n]}
            off += n
        header["__metadata__"] = {"format": "pt"}
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)  # as _write_shard_streaming pads it
        with open(out / fname, "wb") as fh:
            fh.write(len(blob).to_bytes(8, "little"))
            fh.write(blob)
            fh.truncate(8 + len(blob) + off)
        base = 8 + len(blob)
        for name in names:
            tasks.append((str(out / fname), base + header[name]["data_offsets"][0], name, spec[name], preset_name, seed))
            wmap[name] = fname
        total += off
    tasks.sort(key=lambda t: -math.prod(t[3]))  # biggest first: the embedding table is the long pole
    with mp.get_context("spawn").Pool(procs) as pool:
        for _ in pool.imap_unordered(_synth_task, tasks):
            pass
    write_json(out / weights.INDEX_NAME, {"metadata": {"total_size": total}, "weight_map": wmap})
    (out / CONFIG_NAME).write_text(json.dumps(p.config, indent=2) + "\n", encoding="utf-8")
    tok.write_tokenizer(out / tok.TOKENIZER_NAME, p.text_vocab, cfg.codebook_size)
    return {"preset": preset_name, "seed": seed, "tensors": len(spec), "shards": len(shards),
            "parameters": sum(math.prod(s) for s in spec.values()), "bytes": total, "procs": procs}


# ---------------------------------------------------------------------------------------
# One job (runs in its own process)
# ---------------------------------------------------------------------------------------

def _chunk_index(job: str) -> int:
    """k of a job `slow_chunk<k>` or `parity_slow_chunk<k>` (the stage's one name)."""
    return int(job.split("slow_chunk")[1])


def _stage(cfg, job: str, prefill: int, chunks: int):
    from anetts.models.fish.stages.fast_ar import FastARStage
    from anetts.models.fish.stages.slow_chunk import SlowChunkStage

    if job == "fast_ar":
        return FastARStage(cfg)
    return SlowChunkStage(cfg, _chunk_index(job), chunks, prefill)


def param_bytes(module) -> dict:
    """fp16 bytes of the module's parameters: all, and what one call reads (a gathered table,
    the fast AR's `embeddings`, is read one row per call)."""
    total = read = 0
    for name, p in module.named_parameters():
        n = p.numel() * FP16
        total += n
        read += p.shape[-1] * FP16 if name == "embeddings" else n
    return {"weight_bytes": total, "weight_bytes_read_per_call": read}


def run_job(a) -> dict:
    import torch

    from anetts.compile.export import compile_module as export_stage
    from anetts.artifacts import tree_bytes
    from anetts.models.fish.weights import read_config
    from anetts.options import ConvertOptions

    if a.threads:
        torch.set_num_threads(a.threads)
    t_job = time.perf_counter()
    cfg = read_config(a.weights)
    st = _stage(cfg, a.job, a.prefill, a.chunks)
    fns = st.functions(a.context)
    t0 = time.perf_counter()
    model = st.load(a.weights, a.context)
    module = st.build(model)
    del model
    load_s = time.perf_counter() - t0
    rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    options = ConvertOptions(deployment_target="macOS15", precision="fp16")
    meta = {"model": a.preset, "family": "fish"}
    out_dir = Path(a.work) / "pkg"
    pkg, reports = export_stage(module, fns, out_dir, options, meta, st.name)
    fig = {"job": a.job, "load_s": round(load_s, 2), "rss_after_load_bytes": rss_loaded,
           "functions": [f.name for f in fns],
           "function_seconds": {f.name: reports[f.name]["seconds"] for f in fns},
           "bundle_s": reports["bundle_seconds"],
           "function_package_bytes": {f.name: reports[f.name]["bytes"] for f in fns},
           "lint": sorted({x.get("rule", str(x)) for f in fns for x in reports[f.name]["lint"]}),
           "package_bytes": tree_bytes(pkg), **param_bytes(module)}
    if a.job.startswith("slow_chunk"):
        fig["layers"] = [st.start, st.stop]
        fig["kv_state_bytes"] = sum(math.prod(s.shape) * FP16 for s in st.states(a.context))
    elif a.job == "fast_ar":
        fig["kv_state_bytes"] = sum(math.prod(s.shape) * FP16 for s in st.states())
    else:
        fig["rows"] = st.rows
    # the traced modules and single-function packages are intermediates; the bundle stays for
    # a parity job or --keep-packages and is removed by the parent otherwise
    for f in fns:
        for p in (out_dir / f"{st.name}.{f.name}.pt", out_dir / f"{st.name}.{f.name}.mlpackage"):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    fig["package"] = str(pkg)
    fig["job_wall_s_inside"] = round(time.perf_counter() - t_job, 2)
    return fig


def run_parity(a) -> dict:
    """Chunk `a.job` (parity_slow_chunk<k>) on the MIL executor vs its eager module: the prompt
    embedded on the host, prefilled in blocks, then `a.parity_decode` decode positions."""
    import copy

    import numpy as np
    import torch

    from anetts.models.fish import reference as R
    from anetts.models.fish.assets import InputEmbedding, write_runtime_assets
    from anetts.models.fish.tokenizer import TOKENIZER_NAME, load_tokenizer
    from anetts.models.fish.weights import read_config
    from anetts.options import Gate
    from anetts.compile.export import record_eager
    from anetts.verify.parity import per_call_db, run_scenario

    if a.threads:
        torch.set_num_threads(a.threads)
    t_job = time.perf_counter()
    job = a.job.removeprefix("parity_")
    cfg = read_config(a.weights)
    st = _stage(cfg, job, a.prefill, a.chunks)
    if st.start != 0:
        raise SystemExit("parity: the host embedding is the input of the first chunk only; give slow_chunk0")
    prompt = R.make_prompt(cfg, load_tokenizer(Path(a.weights) / TOKENIZER_NAME, cfg))
    T = prompt.shape[1]
    g = np.random.default_rng(2)
    frames = np.zeros((1 + cfg.num_codebooks, a.parity_decode), np.int64)  # teacher-forced semantic frames
    frames[1:] = g.integers(0, cfg.codebook_size, frames[1:].shape)
    frames[0] = cfg.semantic_begin_id + frames[1]
    assets = Path(a.work) / "assets"  # the runtime's fp16 input embedding tables
    assets.mkdir(parents=True, exist_ok=True)
    write_runtime_assets(a.weights, assets)
    embed = InputEmbedding.from_dir(assets)
    hidden = np.concatenate([embed(prompt), embed(frames)])
    del embed
    sc = st.teacher_forced(hidden, T, a.context)
    module = st.build(st.load(a.weights, a.context))
    t0 = time.perf_counter()
    ref = record_eager(copy.deepcopy(module), sc)
    eager_s = time.perf_counter() - t0
    del module
    pkg = Path(a.work) / "pkg" / f"{st.name}.mlpackage"
    t0 = time.perf_counter()
    report = run_scenario(pkg, sc, ref, Gate(min_snr_db=35.0))
    mil_s = time.perf_counter() - t0
    return {"job": a.job, "package": str(pkg), "prompt_tokens": T,
            "calls": [{"function": c.function, "pos": int(c.inputs["pos"][0]),
                       "tokens": int((c.valid.get("hidden_out") or (1, c.inputs["hidden"].shape[1]))[1])} for c in sc.calls],
            "per_call_db": per_call_db(report), "passed": report["passed"], "gate_min_snr_db": 35.0,
            "eager_s": round(eager_s, 2), "mil_s": round(mil_s, 2),
            "job_wall_s_inside": round(time.perf_counter() - t_job, 2)}


# ---------------------------------------------------------------------------------------
# The parent: schedule jobs, measure, write the JSON
# ---------------------------------------------------------------------------------------

def meminfo(key: str) -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def proc_rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def child(argv: list[str], log: Path) -> subprocess.Popen:
    fh = open(log, "w")
    return subprocess.Popen([sys.executable, __file__, *argv], stdout=fh, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def estimate(cfg, job: str, context: int, chunks: int, same_fs: bool = True) -> dict:
    """Rough fp32 working set (model + eager copy + trace + TorchScript reload + MIL consts)
    and disk (two fp32 TorchScript files, two fp16 packages, the bundle and coremltools'
    temporary copies) of a job, for scheduling only."""
    from anetts.models.fish.frame_cost import head_bytes

    s, f = cfg.slow, cfg.fast
    if job.startswith("slow_chunk") or job.startswith("parity_slow_chunk"):
        from anetts.models.fish.stages.slow_chunk import chunk_bounds

        a, b = chunk_bounds(s.n_layer, chunks)[_chunk_index(job)]
        w16 = (b - a) * layer_bytes(s) + (head_bytes(cfg) if b == s.n_layer else 0)  # the last holds the head
    elif job == "fast_ar":
        w16 = f.n_layer * layer_bytes(f) + 2 * cfg.codebook_size * f.dim * FP16
    else:  # synth
        return {"rss": 0, "disk": 0}
    if job.startswith("parity_"):
        return {"rss": 6 * w16 + (s.vocab_size + cfg.codebook_size * cfg.num_codebooks) * s.dim * 4, "disk": 0}
    # coremltools writes each package into a temporary one first (TMPDIR) and copies it: two fp16
    # copies at the peak; they only count when TMPDIR is on the work folder's filesystem
    temp = 2 * w16 if same_fs else 0
    return {"rss": 10 * w16, "disk": 4 * w16 + 2 * w16 + temp}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--weights", type=Path, required=True, help="weights directory; synthesized from --preset if missing")
    p.add_argument("--preset", default="fish-s2-pro")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", type=Path, required=True, help="scratch folder for packages and logs")
    p.add_argument("--chunks", type=int, help="slow chunks (default: fewest below the macOS ~2 GB file guidance)")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--prefill", type=int, default=16)
    p.add_argument("--only", help="comma-separated jobs to run (slow_chunk<k>, fast_ar); default all")
    p.add_argument("--parity", action="store_true", help="also the MIL-executor parity job of the first chunk")
    p.add_argument("--parity-decode", type=int, default=4, help="decode positions after the prompt prefill")
    p.add_argument("--parallel", type=int, default=1, help="jobs at a time")
    p.add_argument("--threads", type=int, default=0, help="torch threads per job (0: torch's default)")
    p.add_argument("--synth-procs", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    p.add_argument("--max-rss-gb", type=float, default=None, help="scheduling budget for estimated RSS (default: MemTotal)")
    p.add_argument("--kill-rss-gb", type=float, help="kill a job whose RSS passes this (shared machines)")
    p.add_argument("--min-available-gb", type=float, help="kill running jobs while MemAvailable is below this")
    p.add_argument("--bandwidth-gbs", type=float, default=DEFAULT_BANDWIDTH_GBS)
    p.add_argument("--keep-packages", action="store_true")
    p.add_argument("--where", default="", help="free text for the JSON: which machine ran this")
    p.add_argument("-o", "--output", type=Path, help="JSON file for the figures")
    p.add_argument("--job", help=argparse.SUPPRESS)
    p.add_argument("--synth-job", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)

    if a.synth_job:
        t0 = time.perf_counter()
        info = synthesize(a.weights, a.preset, a.seed, a.synth_procs)
        from anetts.models.fish.weights import validate_weights_dir
        validate_weights_dir(a.weights, check_values=False)
        info["wall_s_inside"] = round(time.perf_counter() - t0, 2)
        print("RESULT " + json.dumps(info))
        return 0
    if a.job:
        fig = run_parity(a) if a.job.startswith("parity_") else run_job(a)
        fig["self_peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print("RESULT " + json.dumps(fig))
        return 0

    a.work.mkdir(parents=True, exist_ok=True)
    logs = a.work / "logs"
    logs.mkdir(exist_ok=True)
    result = {"preset": a.preset, "weights": str(a.weights), "where": a.where, "context": a.context,
              "prefill": a.prefill, "precision": "fp16", "deployment_target": "macOS15",
              "parallel": a.parallel, "threads_per_job": a.threads or None, "cpu_count": os.cpu_count(),
              "mem_total_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "jobs": {}}
    t_all = time.perf_counter()
    killed: dict[str, str] = {}  # job -> why the watchdog killed it
    common = ["--weights", str(a.weights), "--work", str(a.work), "--preset", a.preset, "--context", str(a.context),
              "--prefill", str(a.prefill), "--threads", str(a.threads), "--parity-decode", str(a.parity_decode)]

    def wait_one(running: dict) -> None:
        pid, status, ru = os.wait4(-1, 0)
        name, proc, t0 = running.pop(pid)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        text = (logs / f"{name}.log").read_text(errors="replace")
        lines = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
        fig = json.loads(lines[-1][7:]) if lines else {}
        fig.update({"rc": proc.returncode, "wall_s": round(wall, 2), "peak_rss_bytes": ru.ru_maxrss * 1024,
                    "peak_rss_gb": round(ru.ru_maxrss * 1024 / GB, 3), "user_s": round(ru.ru_utime, 1),
                    "sys_s": round(ru.ru_stime, 1)})
        if proc.returncode != 0:
            fig["log_tail"] = text[-3000:]
        if name in killed:
            fig["killed"] = killed[name]
        result["jobs"][name] = fig
        if a.output:  # after every job, so a run stopped part-way keeps what finished
            a.output.write_text(json.dumps(result, indent=1) + "\n")
        print(f"[{time.perf_counter() - t_all:7.1f} s] {name}: rc {proc.returncode}, {wall:.1f} s, "
              f"peak RSS {fig['peak_rss_gb']} GB" + (f", package {fig['package_bytes'] / GB:.3f} GB"
                                                    if "package_bytes" in fig else ""), flush=True)

    # weights
    if not (a.weights / "model.safetensors.index.json").is_file():
        running = {}
        proc = child([*common, "--synth-job", "--seed", str(a.seed), "--synth-procs", str(a.synth_procs)],
                     logs / "synth.log")
        running[proc.pid] = ("synth", proc, time.perf_counter())
        wait_one(running)
        if result["jobs"]["synth"]["rc"] != 0:
            print(result["jobs"]["synth"]["log_tail"])
            return 1
    from anetts.models.fish.frame_cost import head_bytes
    from anetts.models.fish.stages.slow_chunk import chunk_bounds, chunk_stage_name
    from anetts.models.fish.weights import read_config

    cfg = read_config(a.weights)
    n_macos, n_ios = chunks_for(cfg, MACOS_FILE_BYTES), chunks_for(cfg, IOS_FILE_BYTES)
    n = a.chunks or n_macos
    bounds = chunk_bounds(cfg.slow.n_layer, n)
    result["chunking"] = {
        "chunks": n, "bounds": bounds, "chosen_by": "--chunks" if a.chunks else "fewest below the macOS guidance",
        "layer_fp16_bytes": layer_bytes(cfg.slow),
        "macos_limit_bytes": MACOS_FILE_BYTES, "ios_limit_bytes": IOS_FILE_BYTES,
        "chunks_for_macos": n_macos, "chunks_for_ios": n_ios,
        "layers_per_chunk_macos": int(MACOS_FILE_BYTES // layer_bytes(cfg.slow)),
        "layers_per_chunk_ios": int(IOS_FILE_BYTES // layer_bytes(cfg.slow)),
        "chunks_for_macos_gib": chunks_for(cfg, 2 * 2**30), "chunks_for_ios_gib": chunks_for(cfg, 2**30)}
    jobs = [chunk_stage_name(k) for k in range(n)] + ["fast_ar"]
    if a.only:
        jobs = [j for j in jobs if j in a.only.split(",")]
        missing = set(a.only.split(",")) - set(jobs)
        if missing:
            raise SystemExit(f"--only: no such job(s) {sorted(missing)}; jobs: {[*map(str, jobs)]}")
    parity = f"parity_{chunk_stage_name(0)}" if a.parity else None
    print(f"chunks {n} {bounds} (macOS guidance {n_macos}, iOS {n_ios}); jobs {jobs}" + (f" + {parity}" if parity else ""),
          flush=True)

    budget_rss = a.max_rss_gb * GB if a.max_rss_gb else result["mem_total_bytes"]
    tmp = Path(tempfile.gettempdir())
    same_fs = os.stat(tmp).st_dev == os.stat(a.work).st_dev
    result["tmpdir"] = {"path": str(tmp), "same_filesystem_as_work": same_fs}
    result["disk_free_at_start_bytes"] = shutil.disk_usage(a.work).free
    low = {"work": shutil.disk_usage(a.work).free, "tmp": shutil.disk_usage(tmp).free}
    stop = threading.Event()
    pending = list(jobs) + ([parity] if parity else [])
    running: dict[int, tuple] = {}

    def sample() -> None:
        """The least free disk seen (the jobs' peak scratch use); on a shared machine, a job whose
        RSS passes --kill-rss-gb, or any job while MemAvailable is below --min-available-gb, is
        killed (it is this benchmark's own child) before it can take the machine into OOM."""
        while not stop.wait(1.0):
            low["work"] = min(low["work"], shutil.disk_usage(a.work).free)
            low["tmp"] = min(low["tmp"], shutil.disk_usage(tmp).free)
            if not (a.kill_rss_gb or a.min_available_gb):
                continue
            avail = meminfo("MemAvailable")
            for pid, (name, _, _) in list(running.items()):
                rss = proc_rss(pid)
                why = None
                if a.kill_rss_gb and rss > a.kill_rss_gb * GB:
                    why = f"RSS {rss / GB:.2f} GB passed --kill-rss-gb {a.kill_rss_gb}"
                elif a.min_available_gb and avail < a.min_available_gb * GB:
                    why = f"MemAvailable {avail / GB:.2f} GB fell below --min-available-gb {a.min_available_gb}"
                if why:
                    killed[name] = why
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    while pending or running:
        started = False
        for name in list(pending):
            if name == parity:
                chunk = result["jobs"].get(parity.removeprefix("parity_"))
                if chunk is None:
                    continue  # needs the chunk's package
                if chunk["rc"] != 0:
                    pending.remove(name)
                    result["jobs"][name] = {"rc": None, "skipped": "its chunk failed"}
                    continue
            if len(running) >= a.parallel:
                break
            need = estimate(cfg, name, a.context, n, same_fs)
            busy = [estimate(cfg, r[0], a.context, n, same_fs) for r in running.values()]
            if running and (sum(b["rss"] for b in busy) + need["rss"] > budget_rss
                            or sum(b["disk"] for b in busy) + need["disk"] > shutil.disk_usage(a.work).free - 2 * GB):
                continue
            proc = child([*common, "--chunks", str(n), "--job", name], logs / f"{name}.log")
            running[proc.pid] = (name, proc, time.perf_counter())
            pending.remove(name)
            started = True
            print(f"[{time.perf_counter() - t_all:7.1f} s] start {name}", flush=True)
        if running:
            wait_one(running)
            # bundles go once measured, unless kept; the parity job's chunk stays until it ran
            for name, fig in result["jobs"].items():
                pkg = fig.get("package")
                hold = parity is not None and name == parity.removeprefix("parity_") and parity not in result["jobs"]
                if pkg and not name.startswith("parity_") and not a.keep_packages and not hold and Path(pkg).exists():
                    shutil.rmtree(pkg, ignore_errors=True)
        elif not started:
            raise SystemExit(f"cannot schedule {pending}")
    stop.set()
    sampler.join()
    result["total_wall_s"] = round(time.perf_counter() - t_all, 1)
    result["disk_free_min_bytes"] = low

    # per-frame bytes
    built = result["jobs"]
    slow_jobs = [chunk_stage_name(k) for k in range(n)]
    if all(built.get(j, {}).get("rc") == 0 for j in [*slow_jobs, "fast_ar"]):
        head = head_bytes(cfg)  # in the last chunk's package
        slow = sum(built[j]["weight_bytes_read_per_call"] for j in slow_jobs) - head
        fast = built["fast_ar"]["weight_bytes_read_per_call"]
        kv_slow = kv_bytes(cfg.slow, a.context)
        kv_fast = kv_bytes(cfg.fast, cfg.num_codebooks)
        weights_frame = slow + head + cfg.num_codebooks * fast
        bw = a.bandwidth_gbs * GB
        result["per_frame"] = {
            "slow_weight_bytes": slow, "restricted_head_bytes": head,
            "full_head_bytes": cfg.slow.vocab_size * cfg.slow.dim * FP16,
            "fast_weight_bytes_per_call": fast, "fast_calls": cfg.num_codebooks,
            "weight_bytes": weights_frame,
            "kv_read_bytes_at_context": kv_slow + cfg.num_codebooks * kv_fast,
            "note_kv": f"the decode function attends over all {a.context} state rows (masked), so it reads the "
                       "whole slow K/V state per frame; the fast AR reads its 10-row state each call",
            "bandwidth_gbs": a.bandwidth_gbs,
            "projected_ms_weights": round(weights_frame / bw * 1e3, 2),
            "projected_ms_weights_and_kv": round((weights_frame + kv_slow + cfg.num_codebooks * kv_fast) / bw * 1e3, 2),
            "frame_audio_ms": round(FRAME_MS, 2),
            "projection": "bytes / bandwidth: a lower bound for a memory-bound decode at the stated bandwidth "
                          "(M2 Max, 400 GB/s), not a measurement; compute, dispatch and the 10 calls' overheads "
                          "are not counted"}
        for lim, key in ((MACOS_FILE_BYTES, "macos"), (IOS_FILE_BYTES, "ios")):
            result[f"packages_over_{key}_limit"] = [j for j in built if built[j].get("package_bytes", 0) > lim]
    result["provenance"] = provenance()
    if os.environ.get("FISHBENCH_COMMIT"):
        result["provenance"]["code_commit"] = os.environ["FISHBENCH_COMMIT"]
    text = json.dumps(result, indent=1)
    if a.output:
        a.output.write_text(text + "\n")
    print(json.dumps({k: v for k, v in result.items() if k in ("chunking", "per_frame", "total_wall_s")}, indent=1))
    return 0 if all(f.get("rc") == 0 and f.get("passed", True) for f in built.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
