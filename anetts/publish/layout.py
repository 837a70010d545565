"""What a built model looks like on the Hub, and the gate a tree must pass to get there.

Repository layout (one Hub repo holds one built model)::

    README.md          model card: front matter, parity table, sizes, how to load and speak
    LICENSE            licence of the weights and the code the packages are derived from
    .gitattributes     binary files through LFS
    manifest.json      this layout: every file's path, size, sha256; variants; provenance
    <model>/           the runtime's model directory, paths as in its own manifest.json
        manifest.json, packages/, bundles/, export/ (TorchScript), assets/ (the runtime's vocab,
        voices, ...), parity/ reports, parity_summary.{md,json}

The model directory keeps the build's relative paths, so the runtime opens the downloaded
``<model>/`` exactly like ``artifacts/<model>``. Variants are subsets a loader downloads with
``allow_patterns``: ``coreml`` (what Core ML needs, macOS) and ``torch`` (adds the TorchScript
exports the Linux runtime runs).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from anetts.artifacts import HF_SCHEME, file_sha256, manifest_path, tree_sha256, write_json
from anetts.families import declaration
from anetts.family import HubCard
from anetts.publish.errors import PublishError
from anetts.runtime.manifest import manifest_paths  # torch-free, like the rest of the manifest reader
from anetts.runtime.placement import placement_records
from anetts.units import format_bytes

LAYOUT_VERSION = 1
PUBLISH_MANIFEST = "manifest.json"
_LICENSES = Path(__file__).parent / "licenses"
MANIFEST_NAME = manifest_path("model").name  # the build manifest inside a model dir

# Binary files go through LFS; a text file over 10 MiB would too, which the Hub decides on preupload.
GITATTRIBUTES = "".join(f"{p} filter=lfs diff=lfs merge=lfs -text\n" for p in (
    "*.bin", "*.mlmodel", "*.pt", "*.pth", "*.npy", "*.npz", "*.png", "*.safetensors"))


def _read_json(path: Path, what: str) -> dict:
    if not path.is_file():
        raise PublishError(f"{what} is missing: {path} (build the model first: snakemake all)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise PublishError(f"cannot read {what} {path}: {e}") from e


# ------------------------------------------------------------------------------------------ gate

def check_gate(model_dir: Path) -> tuple[dict, dict]:
    """The build manifest and parity summary of a tree that passed every gate; else PublishError naming why.

    Checked: no failed parity report anywhere, the summary passed, every manifest package and bundle
    passed its gate with its report present and passing, and every listed package, bundle and
    TorchScript still matches its manifest sha256.
    """
    model_dir = Path(model_dir)
    manifest = _read_json(model_dir / MANIFEST_NAME, "build manifest")
    # the Hub tree mirrors the model dir: every listed path must lie inside it (a variant's ../../ too)
    manifest_paths(model_dir, manifest, f"build manifest {model_dir / MANIFEST_NAME}", PublishError, inside=model_dir)
    summary = _read_json(model_dir / "parity_summary.json", "parity summary")
    failed = sorted(model_dir.glob("parity/*/*.failed.json")) + sorted(model_dir.glob("bundles/*.parity.failed.json"))
    if failed:
        rel = failed[0].relative_to(model_dir)
        raise PublishError(f"package {rel.parent.name}/{rel.name.split('.')[0]} failed its parity gate ({rel}); "
                           f"only a tree where every gate passed can be published")
    for row in summary.get("buckets", []):
        if not row.get("passed"):
            raise PublishError(f"package {row['stage']}/{row['bucket']} failed its parity gate (parity_summary.json)")
    if not summary.get("all_passed"):
        raise PublishError(f"parity summary of {model_dir} does not say every gate passed")
    entries = [(f"package {p['stage']}/{p['bucket']}", p) for p in manifest.get("packages", [])]
    entries += [(f"bundle {b['stage']}", b) for b in manifest.get("bundles", [])]
    if not entries:
        raise PublishError(f"{model_dir / MANIFEST_NAME} lists no packages")
    summarized = {(r["stage"], r["bucket"]) for r in summary.get("buckets", [])}
    for label, e in entries:
        verdict = e.get("parity") or {}
        report = model_dir / verdict.get("report", "")
        if not verdict.get("passed") or not report.is_file() or not json.loads(report.read_text()).get("passed"):
            raise PublishError(f"{label} has no passing parity report ({verdict.get('report')}); it is not verified")
        if "bucket" in e and (e["stage"], e["bucket"]) not in summarized:
            raise PublishError(f"{label} is not in parity_summary.json; rebuild the summary")
        targets = [(e["path"], e["sha256"])]
        if e.get("torchscript"):
            targets.append((e["torchscript"], e.get("torchscript_sha256")))
        for rel, sha in targets:
            path = model_dir / rel
            if not path.exists():
                raise PublishError(f"{label}: {rel} is listed in the manifest but missing")
            if sha is None or tree_sha256(path) != sha:
                raise PublishError(f"{label}: {rel} does not match its manifest sha256; it was modified after "
                                   f"the build verified it (rebuild it)")
    for a in manifest.get("assets", []):
        path = model_dir / a["path"]
        if not path.is_file() or tree_sha256(path) != a["sha256"]:
            raise PublishError(f"runtime asset {a['name']}: {a['path']} is missing or does not match its manifest "
                               f"sha256 (rebuild it)")
    return manifest, summary


# ------------------------------------------------------------------------------------------ files

def runtime_files(model_dir: Path, manifest: dict) -> dict[str, list[str]]:
    """Variant -> files (relative to the model dir) the runtime needs, all listed by the manifest."""
    model_dir = Path(model_dir)
    def tree(rel: str) -> list[str]:
        p = model_dir / rel
        if p.is_file():
            return [rel]
        return sorted(f.relative_to(model_dir).as_posix() for f in p.rglob("*")
                      if f.is_file() and f.name != ".snakemake_timestamp")

    # the runtime reads packages and the manifest's runtime assets, never the build's weights
    common = [MANIFEST_NAME, "parity_summary.md", "parity_summary.json"] + [a["path"] for a in manifest.get("assets", [])]
    for e in manifest.get("packages", []):
        common += tree(e["path"]) + [e["parity"]["report"]]
    for b in manifest.get("bundles", []):
        common += tree(b["path"]) + [b["parity"]["report"]]
    torch_only = []
    for e in manifest.get("packages", []):
        torch_only += tree(e["torchscript"]) + ([e["scenario"]] if e.get("scenario") else [])
    common = sorted(set(common))
    missing = [f for f in common + torch_only if not (model_dir / f).is_file()]
    if missing:
        raise PublishError(f"{model_dir}: {missing[0]} is needed by the runtime but missing")
    return {"coreml": common, "torch": sorted(set(common + torch_only))}


def _link_or_copy(src: Path, dst: Path) -> bool:
    """Hard-link (True: the staged file *is* the verified one) or copy (False: it must be re-hashed)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)  # the staging tree is a view of verified build files, not a second copy
        return True
    except OSError:
        shutil.copy2(src, dst)
        return False


# ------------------------------------------------------------------------------------------ card

def placement_lines(records: list[dict]) -> list[str]:
    """The card's section on placement measured on Macs (``anetts bench --placement``), if any."""
    if not records:
        return []
    lines = ["## Placement measured on a Mac", "",
             "`anetts bench --placement`: each stage's largest bucket timed under Core ML on the Neural Engine "
             "(`CPU_AND_NE`) and on the GPU (`CPU_AND_GPU`); a Core ML runtime on the same chip runs each stage on "
             "the faster.", "", "| chip | measured | stage | bucket | CPU_AND_NE s | CPU_AND_GPU s | ANE op fraction | chosen |",
             "|---|---|---|---|---|---|---|---|"]
    for r in records:
        for stage, st in r["placement"]["stages"].items():
            units = st["units"]
            t = [f"{units[u]['median_s']:.4f}" if u in units else "" for u in ("CPU_AND_NE", "CPU_AND_GPU")]
            frac = (units.get("CPU_AND_NE", {}).get("plan") or {}).get("ane_op_fraction")
            lines.append(f"| {r['chip']} | {r['created_utc']} | {stage} | {st['bucket']} | {t[0]} | {t[1]} | "
                         f"{'' if frac is None else f'{frac:.2f}'} | {st['chosen']} |")
    return [*lines, ""]


def hub_card(family: str, model) -> HubCard:
    """The family's licence data for the Hub (its declaration's ``hub``), or a PublishError naming what lacks it."""
    try:
        card = declaration(family).hub
    except KeyError as e:
        raise PublishError(f"{model}: unknown family {family!r} in its manifest") from e
    if card is None:
        raise PublishError(f"{model}: the {family} family declares no licence data for the Hub (FamilyDecl.hub), "
                           f"so its builds are not published")
    return card


def weights_description(w: dict) -> str:
    """The model card's words for the weights a build was made from (its manifest's ``weights``)."""
    source = w.get("source")
    if source == "synthetic":
        return (f"**synthetic** (`{w.get('preset')}`, seed {w.get('seed')}): real architecture and shapes, no "
                f"training, so it speaks noise, not words")
    if source == "hf":
        return f"`{w.get('repo_id')}` at revision `{w.get('revision')}`"
    if source == "onnx":
        return (f"the upstream checkpoint's ONNX export `{Path(str(w.get('model'))).name}` (sha256 `{w.get('sha256')}`), "
                f"converted to the upstream format")
    if source == "local":
        return "a local copy of the upstream checkpoint (its files' sha256 are in the build manifest)"
    raise PublishError(f"unknown weights source {source!r} in the build manifest")


def model_card(manifest: dict, summary: dict, files: dict[str, int], repo_id: str, variants: dict,
               placements: list[dict] = ()) -> str:
    model, family = manifest["model"], manifest["family"]
    card = hub_card(family, model)
    w = manifest.get("weights", {})
    front = ["---", f"license: {card.license}", "pipeline_tag: text-to-speech", "library_name: coreml"]
    if w.get("source") != "synthetic":  # synthetic weights are not derived from the upstream checkpoint
        front.append(f"base_model: {w.get('repo_id') or card.base_model}")
    front += ["tags:"] + [f"- {t}" for t in ["coreml", "apple-neural-engine", "text-to-speech", "anetts", *card.tags]]
    front.append("---")
    git = manifest.get("provenance", {}).get("git", {})
    weights_line = weights_description(w)
    lines = [*front, "", f"# {model}: Core ML packages built by ane-tts", "",
             f"`{family}` split into static-shape Core ML stages (ML Program, per-bucket packages and one "
             f"multifunction bundle per stage) plus host DSP. Weights: {weights_line}. Built from ane-tts commit "
             f"{'`' + git['commit'] + '`' if git.get('commit') else '(not recorded: built outside a git checkout)'}"
             f"{' (dirty tree)' if git.get('dirty') else ''}.", "",
             "## Load and speak", "", "```bash", "pip install ane-tts",
             f"anetts speak \"Hello.\" -o hello.wav --model {HF_SCHEME}{repo_id}@<commit>", "```", "",
             "```python", "import anetts", f"tts = anetts.load(\"{HF_SCHEME}{repo_id}@<commit>\")  # torch off macOS, coreml on it",
             "audio = tts.synthesize(\"Hello.\").audio", "```", "",
             "Pin `<commit>` to a commit sha: the download is checked file by file against `manifest.json` "
             "(sha256, size, no LFS pointers, every `.mlpackage` complete) before first use, and later loads work "
             "offline from the Hugging Face cache (`HF_HUB_OFFLINE=1`).", "",
             "## Parity (measured at build time)", "",
             "Worst float-output SNR on the valid region against the upstream fp32 eager model (dB); "
             "`pred_dur`: fraction of exact integer durations.", "",
             "| stage | bucket | TorchScript | MIL executor | Core ML | pred_dur exact | gate (min dB) | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for r in summary.get("buckets", []):
        exact = r.get("mil_outputs", {}).get("pred_dur", {}).get("exact_fraction")
        coreml = "not run (Linux)" if r.get("coreml_min_snr_db") is None else f"{r['coreml_min_snr_db']:.1f}"
        lines.append(f"| {r['stage']} | {r['bucket']} | {r['trace_min_snr_db']:.1f} | {r['mil_min_snr_db']:.1f} | "
                     f"{coreml} | {'' if exact is None else f'{exact:.3f}'} | {r.get('gate', {}).get('min_snr_db', '')} | "
                     f"{'pass' if r['passed'] else 'FAIL'} |")
    ran_coreml = any(r.get("coreml_min_snr_db") is not None for r in summary.get("buckets", []))
    machine = summary.get("provenance", {}).get("machine", {})
    lines += ["", f"Verified on {machine.get('system')} {machine.get('machine')}: the packages' own ML Programs were run "
              f"by the ane-tts MIL reference executor" + (" and by Core ML." if ran_coreml else
              ("; Core ML did not run in it (it needs macOS); placement measured on a Mac is below." if placements else
              "; Core ML itself did not run (it needs macOS), so device timings and ANE placement are unmeasured.")), "",
              "## Packages", "", "| stage | bucket | path | size | deployment target | compute units |", "|---|---|---|---|---|---|"]
    for p in manifest.get("packages", []):
        lines.append(f"| {p['stage']} | {p['bucket']} | `{model}/{p['path']}` | {format_bytes(p['bytes'])} | "
                     f"{p.get('deployment_target')} | {p.get('compute_units')} |")
    for b in manifest.get("bundles", []):
        lines.append(f"| {b['stage']} | {', '.join(b.get('buckets', {}))} (bundle) | `{model}/{b['path']}` | "
                     f"{format_bytes(b['bytes'])} | macOS15 | |")
    sizes = {v: sum(files[f"{model}/{f}"] for f in fs) for v, fs in variants.items()}
    lines += ["", *placement_lines(list(placements)), "## Variants", "",
              *(f"- `{v}`: {len(fs)} files, {format_bytes(sizes[v])}" for v, fs in variants.items()), "",
              "`coreml` is what Core ML needs (macOS 13+, bundles macOS 15+); `torch` adds the TorchScript exports "
              "the runtime runs on Linux. `anetts.load` downloads only the variant its backend needs.", "",
              "## Licence", "", f"{card.license}; see `LICENSE`.", ""]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ staging

def stage_tree(model_dir: Path, out: Path, repo_id: str, gated: tuple[dict, dict] | None = None) -> dict:
    """Write the Hub tree of a gated model directory to ``out`` (atomically); return its publish manifest.

    ``gated``: what :func:`check_gate` returned for this directory (else it runs here). Files are hard
    links to the verified build where possible; a copy is re-hashed against the build manifest, so
    what is uploaded is what parity verified.
    """
    model_dir, out = Path(model_dir), Path(out)
    manifest, summary = gated or check_gate(model_dir)
    family, model = manifest["family"], manifest["model"]
    card = hub_card(family, model_dir)
    variants = runtime_files(model_dir, manifest)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        linked = all([_link_or_copy(model_dir / rel, tmp / model / rel) for rel in variants["torch"]])
        for label, rel, sha in ([(f"package {p['stage']}/{p['bucket']}", p["path"], p["sha256"]) for p in manifest["packages"]]
                                + [(f"bundle {b['stage']}", b["path"], b["sha256"]) for b in manifest.get("bundles", [])]
                                + [(f"TorchScript {p['stage']}/{p['bucket']}", p["torchscript"], p["torchscript_sha256"])
                                   for p in manifest["packages"]]):
            if not linked and tree_sha256(tmp / model / rel) != sha:
                raise PublishError(f"{label}: staged copy {rel} does not match the manifest sha256")
        for name, src in card.files.items():
            shutil.copy2(_LICENSES / src, tmp / name)
        (tmp / ".gitattributes").write_text(GITATTRIBUTES, encoding="utf-8")
        files = {p.relative_to(tmp).as_posix(): p.stat().st_size for p in tmp.rglob("*") if p.is_file()}
        repo_variants = {v: [f"{model}/{f}" for f in fs] for v, fs in variants.items()}
        (tmp / "README.md").write_text(model_card(manifest, summary, files, repo_id, variants,
                                                        placement_records(model_dir)), encoding="utf-8")
        listed = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
        publish_manifest = {
            "layout_version": LAYOUT_VERSION,
            "model": model,
            "family": family,
            "model_dir": model,
            "repo_id": repo_id,
            "variants": repo_variants,
            "files": [{"path": f, "size": (tmp / f).stat().st_size, "sha256": file_sha256(tmp / f)} for f in listed],
            "parity": {"all_passed": summary["all_passed"],
                       "buckets": [{k: r[k] for k in ("stage", "bucket", "passed", "mil_min_snr_db", "coreml_min_snr_db")}
                                   for r in summary["buckets"]]},
            "weights": manifest.get("weights"),
            # no publish time or machine here: an unchanged build must stage a byte-identical tree
            "build_provenance": manifest.get("provenance"),
        }
        write_json(tmp / PUBLISH_MANIFEST, publish_manifest)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return publish_manifest
