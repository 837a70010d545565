"""Where build outputs live, and how they are written: one naming scheme for every consumer.

Every path under artifacts/<model>/ is built here, so the Snakefile, the build steps and the
runtime cannot disagree about names.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path

ARTIFACTS = Path("artifacts")
# a built model published to the Hugging Face Hub, named where a model directory is taken:
# `hf://owner/name[@revision]` (anetts.load, `anetts speak --model`; parsed by anetts.publish.download)
HF_SCHEME = "hf://"
# Snakemake drops this file into directory outputs as its mtime carrier; it is not content.
IGNORED_IN_TREE_HASH = {".snakemake_timestamp"}

# Set in a build job whose build is gone (anetts.recovery): from then on no step output is moved
# into place, even where a library swallowed the interrupt that should have stopped the job.
BUILD_GONE = threading.Event()


def model_dir(model: str, root: Path = ARTIFACTS) -> Path:
    return Path(root) / model


def weights_dir(model: str, root: Path = ARTIFACTS) -> Path:
    return model_dir(model, root) / "weights"


def assets_dir(model: str, root: Path = ARTIFACTS) -> Path:
    """Files the runtime reads besides packages (vocab, voices, ...), listed in the manifest."""
    return model_dir(model, root) / "assets"


def reference_path(model: str, bucket: str, root: Path = ARTIFACTS) -> Path:
    return model_dir(model, root) / "reference" / f"{bucket}.npz"


def export_base(model: str, stage: str, bucket: str, root: Path = ARTIFACTS) -> Path:
    return model_dir(model, root) / "export" / stage / bucket


def export_files(model: str, stage: str, bucket: str, root: Path = ARTIFACTS) -> dict[str, Path]:
    """Every file an export writes, by role, for every stage: `functions` (a folder of one
    TorchScript per function, `<function>.pt`; a one-call stage's one function is `main`),
    `scenario` (the calls parity plays: inputs, valid regions and expected outputs per call) and
    `report`."""
    base = export_base(model, stage, bucket, root)
    return {"functions": base.with_name(base.name + ".functions"),
            "scenario": base.with_name(base.name + ".scenario.npz"),
            "report": base.with_name(base.name + ".export.json")}


def end_to_end_path(model: str, root: Path = ARTIFACTS) -> Path:
    """The runtime over the compiled packages against upstream on fixed texts (rule end_to_end)."""
    return model_dir(model, root) / "end_to_end.json"


def listen_path(model: str, root: Path = ARTIFACTS) -> Path:
    """The listener gate's verdict (rule listen); its worst clips are in :func:`listen_clips_dir`."""
    return model_dir(model, root) / "listen.json"


def listen_clips_dir(model: str, root: Path = ARTIFACTS) -> Path:
    return model_dir(model, root) / "listen"


def chain_parity_path(model: str, bucket: str, root: Path = ARTIFACTS) -> Path:
    """The compiled chain's check at one reference bucket (packages composed vs upstream)."""
    return model_dir(model, root) / "chain" / f"{bucket}.json"


def package_path(model: str, stage: str, bucket: str, root: Path = ARTIFACTS) -> Path:
    return model_dir(model, root) / "packages" / stage / f"{bucket}.mlpackage"


def package_report(model: str, stage: str, bucket: str, root: Path = ARTIFACTS) -> Path:
    return model_dir(model, root) / "packages" / stage / f"{bucket}.json"


def parity_path(model: str, stage: str, bucket: str, root: Path = ARTIFACTS) -> Path:
    return model_dir(model, root) / "parity" / stage / f"{bucket}.json"


def failed_report_path(out: Path) -> Path:
    """Where a gate that failed writes its report: `<stem>.failed.json` beside the output it did not
    earn (nothing at that output, so nothing downstream takes the failure for a pass)."""
    out = Path(out)
    return out.with_name(out.stem + ".failed.json")


def inspect_path(model: str, stage: str, bucket: str, root: Path = ARTIFACTS) -> Path:
    return model_dir(model, root) / "inspect" / stage / f"{bucket}.json"


def bundle_path(model: str, stage: str, root: Path = ARTIFACTS) -> Path:
    return model_dir(model, root) / "bundles" / f"{stage}.mlpackage"


def bundle_report(model: str, stage: str, root: Path = ARTIFACTS) -> Path:
    return bundle_path(model, stage, root).with_suffix(".json")


def bundle_parity_path(model: str, stage: str, root: Path = ARTIFACTS) -> Path:
    return bundle_path(model, stage, root).with_suffix(".parity.json")


def arrays_beside(report: Path) -> Path:
    """The arrays a gate keeps beside its report (`<bucket>.outputs.npz` for `<bucket>.json`)."""
    return Path(report).with_suffix(".outputs.npz")


def parity_summary_paths(model: str, root: Path = ARTIFACTS) -> dict[str, Path]:
    """Rule parity_summary's outputs by role."""
    d = model_dir(model, root)
    return {"markdown": d / "parity_summary.md", "json": d / "parity_summary.json",
            "snr_plot": d / "parity_snr.png", "waveform_plot": d / "parity_waveform.png"}


def published_path(model: str, root: Path = ARTIFACTS) -> Path:
    """The record of a publish (rule publish_model)."""
    return model_dir(model, root) / "publish" / "published.json"


def job_log(model: str, rule: str, *wildcards: str, root: Path = ARTIFACTS) -> Path:
    """The log of one job of `rule`: logs/<rule>/<w1>/.../<wn>.log (wildcard values after the
    model), or logs/<rule>.log for a job per model."""
    return _job_file(model_dir(model, root) / "logs", rule, wildcards, ".log")


def job_benchmark(model: str, rule: str, *wildcards: str, root: Path = ARTIFACTS) -> Path:
    """The Snakemake `benchmark:` file of one job, laid out like `job_log` (anetts.resources reads
    the rule and its wildcards back from this layout)."""
    return _job_file(model_dir(model, root) / "benchmarks", rule, wildcards, ".tsv")


def job_usage(benchmark: Path) -> Path:
    """The CPU seconds and peak RSS of a job that ran in the job server, whose process tree
    Snakemake's benchmark does not see (anetts.jobserver): job_usage/ laid out like benchmarks/."""
    return _moved(benchmark, "benchmarks", "job_usage", ".json")


def job_usage_of_log(log: Path) -> Path:
    """`job_usage` of the job whose log is `log` (logs/ has the same layout)."""
    return _moved(log, "logs", "job_usage", ".json")


def _moved(path: Path, folder: str, to: str, suffix: str) -> Path:
    parts = Path(path).parts
    i = len(parts) - 1 - parts[::-1].index(folder)
    return Path(*parts[:i], to, *parts[i + 1:]).with_suffix(suffix)


def _job_file(base: Path, rule: str, wildcards: tuple[str, ...], suffix: str) -> Path:
    if not wildcards:
        return base / f"{rule}{suffix}"
    return base.joinpath(rule, *wildcards[:-1]) / f"{wildcards[-1]}{suffix}"


def aimodel_path(model: str, stage: str, bucket: str, root: Path = ARTIFACTS) -> Path:
    """Core AI asset (`.aimodel`, OS 27+) of one stage/bucket, beside the `.mlpackage`."""
    return model_dir(model, root) / "aimodels" / stage / f"{bucket}.aimodel"


def aimodel_report(model: str, stage: str, bucket: str, root: Path = ARTIFACTS) -> Path:
    return model_dir(model, root) / "aimodels" / stage / f"{bucket}.json"


def aimodel_parity_path(model: str, stage: str, bucket: str, root: Path = ARTIFACTS) -> Path:
    return model_dir(model, root) / "aimodel_parity" / stage / f"{bucket}.json"


def manifest_path(model: str, root: Path = ARTIFACTS) -> Path:
    return model_dir(model, root) / "manifest.json"


def bench_dir(model: str, root: Path = ARTIFACTS) -> Path:
    """Where `anetts bench` writes, and where the report looks for bench JSONs (also ones sent back)."""
    return model_dir(model, root) / "bench"


def report_path(model: str, root: Path = ARTIFACTS) -> Path:
    return model_dir(model, root) / "report.html"


def write_json(path: Path, data) -> None:
    Path(path).write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n", encoding="utf-8")


def tree_bytes(path: Path) -> int:
    """Bytes of a file, or of every file under a directory (a package, an export)."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def weight_file_bytes(package: Path) -> int:
    """Bytes of an .mlpackage's weight files (`Data/**/weights/*`), what compression shrinks."""
    return sum(p.stat().st_size for p in (Path(package) / "Data").rglob("weights/*") if p.is_file())


def file_sha256(path: Path) -> str:
    """sha256 of one file's bytes (what registries, the Hub and pins publish)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tree_sha256(path: Path) -> str:
    """sha256 over a file, or over a directory's relative paths and file contents (sorted)."""
    path = Path(path)
    h = hashlib.sha256()
    if path.is_file():
        files = [path]
        base = path.parent
    else:
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.name not in IGNORED_IN_TREE_HASH)
        base = path
    for f in files:
        h.update(f.relative_to(base).as_posix().encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


# What every step writes beside an output before renaming it into place: tempfile names with the
# prefix ".<output name>.", 8 random characters and an optional suffix (atomic_outputs, the
# weights/assets/convert/publish steps). A killed build leaves them; the next one removes them
# (anetts.recovery). `.snakemake_timestamp` has no second dot, so it never matches.
_TEMPORARY = re.compile(r"^\..+\.[a-z0-9_]{8}(\.tmp)?(\.[A-Za-z0-9]+)?$")


def is_temporary(name: str) -> bool:
    return _TEMPORARY.match(name) is not None


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def clear_outputs(*paths: Path) -> None:
    """Remove stale outputs before a step starts, so a failure cannot leave an old one behind."""
    for p in paths:
        _remove(Path(p))


@contextlib.contextmanager
def atomic_outputs(*finals: Path, keep_previous: bool = False, durable: bool = False):
    """Yield temporary paths beside `finals`; move them into place only if the block succeeds.

    A failure (exception) removes the temporaries and, for a build step, any stale finals, so
    nothing that looks like a good artifact survives a failed step. ``keep_previous``: a failure
    leaves an existing final as it was (a file the user named; see :func:`atomic_file`).
    ``durable``: each temporary file is fsynced before its rename and the directory after it, so
    a crash or power loss cannot leave a renamed but empty file. A temporary keeps its final's
    suffix, so writers that pick the format by extension (soundfile, numpy) write the same thing.
    """
    finals = tuple(Path(p) for p in finals)
    temps = []
    for final in finals:
        final.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
        os.close(fd)
        os.unlink(tmp)
        temps.append(Path(tmp + final.suffix))
    try:
        yield temps
        for tmp, final in zip(temps, finals):
            if not tmp.exists():
                raise FileNotFoundError(f"step did not produce {final}")
            if durable and tmp.is_file():
                _fsync(tmp)
        if BUILD_GONE.is_set():
            raise RuntimeError(f"the build that started this job is gone; {finals[0].name} is not kept")
        for tmp, final in zip(temps, finals):
            if not keep_previous or tmp.is_dir() or final.is_dir():  # a rename cannot replace a directory
                _remove(final)
            os.replace(tmp, final)
            if durable:
                _fsync(final.parent)
    except BaseException:
        for p in (*temps, *(() if keep_previous else finals)):
            _remove(p)
        raise


@contextlib.contextmanager
def atomic_file(final: Path):
    """``with atomic_file(out) as tmp: write(tmp)``: a file the user asked for (``anetts speak -o``,
    the server's outputs), written beside ``out`` and renamed over it only once complete and on disk.
    A failure (a full disk, an interrupt) leaves ``out`` as it was, or absent, and no temporary."""
    with atomic_outputs(final, keep_previous=True, durable=True) as (tmp,):
        yield tmp


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- compressed variants (rules/compress.smk): artifacts/<model>/variants/<variant>/ mirrors the
# model dir's packages/ and parity/ for the stages the variant compresses, plus its own manifest
def variant_dir(model: str, variant: str, root: Path = ARTIFACTS) -> Path:
    return model_dir(model, root) / "variants" / variant


def variant_package_path(model: str, variant: str, stage: str, bucket: str, root: Path = ARTIFACTS) -> Path:
    return variant_dir(model, variant, root) / "packages" / stage / f"{bucket}.mlpackage"


def variant_package_report(model: str, variant: str, stage: str, bucket: str, root: Path = ARTIFACTS) -> Path:
    return variant_dir(model, variant, root) / "packages" / stage / f"{bucket}.json"


def variant_parity_path(model: str, variant: str, stage: str, bucket: str, root: Path = ARTIFACTS) -> Path:
    return variant_dir(model, variant, root) / "parity" / stage / f"{bucket}.json"


def variant_chain_path(model: str, variant: str, bucket: str, root: Path = ARTIFACTS) -> Path:
    return variant_dir(model, variant, root) / "chain" / f"{bucket}.json"


def variant_manifest_path(model: str, variant: str, root: Path = ARTIFACTS) -> Path:
    return variant_dir(model, variant, root) / "manifest.json"


def variants_summary_path(model: str, root: Path = ARTIFACTS) -> Path:
    return model_dir(model, root) / "variants" / "summary.json"


def rule_patterns() -> dict[str, str]:
    """Every per-job path of rules/*.smk, built by the functions above with the wildcards in
    braces (`{model}`, `{stage}`, `{bucket}`, `{variant}`): the rules use these verbatim."""
    m, s, b, v = "{model}", "{stage}", "{bucket}", "{variant}"
    export = export_files(m, s, b)
    paths = {
        "weights": weights_dir(m), "assets": assets_dir(m), "reference": reference_path(m, b),
        "export_functions": export["functions"], "scenario": export["scenario"], "export_report": export["report"],
        "package": package_path(m, s, b), "package_report": package_report(m, s, b), "inspect": inspect_path(m, s, b),
        "parity": parity_path(m, s, b), "parity_arrays": arrays_beside(parity_path(m, s, b)),
        "chain": chain_parity_path(m, b), "end_to_end": end_to_end_path(m), "listen": listen_path(m),
        "listen_clips": listen_clips_dir(m),
        "bundle": bundle_path(m, s), "bundle_report": bundle_report(m, s), "bundle_parity": bundle_parity_path(m, s),
        "manifest": manifest_path(m), "report": report_path(m), "published": published_path(m),
        "aimodel": aimodel_path(m, s, b), "aimodel_report": aimodel_report(m, s, b),
        "aimodel_parity": aimodel_parity_path(m, s, b), "aimodel_parity_arrays": arrays_beside(aimodel_parity_path(m, s, b)),
        "variant_package": variant_package_path(m, v, s, b), "variant_report": variant_package_report(m, v, s, b),
        "variant_parity": variant_parity_path(m, v, s, b), "variant_chain": variant_chain_path(m, v, b),
        "variant_manifest": variant_manifest_path(m, v), "variants_summary": variants_summary_path(m),
        "variants_summary_md": variants_summary_path(m).with_suffix(".md"),
        **{f"parity_summary_{k}": p for k, p in parity_summary_paths(m).items()},
    }
    return {k: str(p) for k, p in paths.items()}
