"""Publish -> load -> speak through real huggingface_hub clients and two loopback servers.

The write side is tests/publish/hub_server.py (the Hub's commit protocol into git), the read side
is olah serving the same git repos: each commit made here is downloaded through a real Hub mirror.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from anetts.publish import PublishError, check_gate
from anetts.publish.layout import file_sha256

PHONEMES = "hˈɛloʊ"


def cli(hub, endpoint: str, *args: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "anetts.cli", *args], capture_output=True, text=True,
                          env=hub.env(endpoint, **env), timeout=300)


def publish_cli(hub, model_dir: Path, repo_id: str, *extra: str) -> subprocess.CompletedProcess:
    return cli(hub, hub.write, "publish", "--model-dir", str(model_dir), "--repo-id", repo_id, *extra)


def hub_files(hub, repo_id: str) -> dict[str, str]:
    """path -> blob content kind ('lfs' pointer or 'git') at main, read straight from the git repo."""
    out = {}
    for line in hub.git(repo_id, "ls-tree", "-r", "main").splitlines():
        _mode, _kind, blob, path = line.split(None, 3)
        head = hub.git(repo_id, "cat-file", "-p", blob)[:40]
        out[path] = "lfs" if head.startswith("version https://git-lfs") else "git"
    return out


@pytest.fixture(scope="module")
def published(hub, built_model):
    """kokoro-tiny published once through the CLI; (repo_id, commit, stdout)."""
    repo_id = "anetts/kokoro-tiny"
    proc = publish_cli(hub, built_model, repo_id)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    record = json.loads((built_model / "publish" / "published.json").read_text())
    return repo_id, record, proc.stdout


def test_publish_is_one_commit_with_the_manifested_tree(hub, built_model, published):
    repo_id, record, out = published
    assert record["commit"] == hub.head(repo_id)
    assert hub.git(repo_id, "rev-list", "--count", "main") == "1"
    build = json.loads((built_model / "manifest.json").read_text())
    message = hub.git(repo_id, "log", "-1", "--format=%s", "main")
    assert message.startswith("anetts publish kokoro-tiny from ane-tts ") and record["provenance"]["git"]["commit"] in message
    layout = json.loads((built_model / "publish" / "tree" / "manifest.json").read_text())
    files = hub_files(hub, repo_id)
    assert set(files) == {f["path"] for f in layout["files"]} | {"manifest.json"}
    for required in ("README.md", "LICENSE", ".gitattributes", "kokoro-tiny/manifest.json"):
        assert required in files
    # every package of the build manifest is there, with its binaries behind LFS
    for p in build["packages"]:
        assert f"kokoro-tiny/{p['path']}/Data/com.apple.CoreML/model.mlmodel" in files
        assert files[f"kokoro-tiny/{p['path']}/Data/com.apple.CoreML/weights/weight.bin"] == "lfs"
    for f in layout["files"]:  # the layout manifest is what was staged
        assert file_sha256(built_model / "publish" / "tree" / f["path"]) == f["sha256"]
    card = (built_model / "publish" / "tree" / "README.md").read_text()
    assert card.startswith("---\nlicense: apache-2.0\npipeline_tag: text-to-speech\n")
    summary = json.loads((built_model / "parity_summary.json").read_text())
    for row in summary["buckets"]:  # the measured figures, not placeholders
        assert f"| {row['stage']} | {row['bucket']} | {row['trace_min_snr_db']:.1f} | {row['mil_min_snr_db']:.1f} |" in card
    assert "Apache License" in (built_model / "publish" / "tree" / "LICENSE").read_text()


def test_load_through_olah_verifies_and_speaks_like_the_local_build(hub, built_model, published, tmp_path):
    from anetts.publish import fetch
    from anetts.runtime import load

    repo_id, record, _ = published
    got = fetch(f"hf://{repo_id}@{record['commit']}", backend="torch", endpoint=hub.read, cache_dir=tmp_path / "cache")
    assert got.commit == record["commit"] and got.variant == "torch"
    assert (got.model_dir / "manifest.json").is_file() and "cache" in str(got.snapshot)
    remote = load(str(got.model_dir), backend="torch").synthesize(phonemes=PHONEMES, voice="syn_a", seed=0).audio
    local = load(built_model, backend="torch").synthesize(phonemes=PHONEMES, voice="syn_a", seed=0).audio
    assert remote.size > 0 and np.isfinite(remote).all()
    np.testing.assert_array_equal(remote, local)
    # the coreml variant leaves the TorchScripts on the Hub
    coreml = fetch(f"hf://{repo_id}@{record['commit']}", variant="coreml", endpoint=hub.read, cache_dir=tmp_path / "c2")
    assert not list(coreml.model_dir.rglob("*.pt")) and list(coreml.model_dir.rglob("weight.bin"))


def test_speak_hf_uri_then_offline_from_the_cache(hub, published, tmp_path):
    repo_id, record, _ = published
    home = tmp_path / "hfhome"
    uri = f"hf://{repo_id}@{record['commit']}"
    args = ("speak", "--phonemes", PHONEMES, "--voice", "syn_a", "--backend", "torch", "--model", uri, "--no-progress")
    proc = cli(hub, hub.read, *args, "-o", str(tmp_path / "a.wav"), HF_HOME=str(home))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "a.wav").stat().st_size > 1000
    # Hub gone (closed port), offline: the verified cache is enough
    dead = "http://127.0.0.1:9"
    proc = cli(hub, dead, *args, "-o", str(tmp_path / "b.wav"), HF_HOME=str(home), HF_HUB_OFFLINE="1")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "a.wav").read_bytes() == (tmp_path / "b.wav").read_bytes()
    # a cache that lost a file is not a model: the missing file is named, nothing is spoken
    snap = next((home / "hub").glob("models--anetts--kokoro-tiny/snapshots/*"))
    victim = next(snap.glob("kokoro-tiny/weights/voices/*.pt"))
    victim.unlink()
    proc = cli(hub, dead, *args, "-o", str(tmp_path / "c.wav"), HF_HOME=str(home), HF_HUB_OFFLINE="1")
    assert proc.returncode == 1 and victim.relative_to(snap).as_posix() in proc.stderr
    assert not (tmp_path / "c.wav").exists()


def test_republishing_an_unchanged_tree_makes_no_commit_and_dry_run_plans(hub, built_model, published):
    repo_id, record, _ = published
    proc = publish_cli(hub, built_model, repo_id)
    assert proc.returncode == 0, proc.stderr
    assert "0 added, 0 changed, 0 deleted" in proc.stdout and "no commit" in proc.stdout
    assert hub.head(repo_id) == record["commit"]
    proc = publish_cli(hub, built_model, repo_id, "--dry-run")
    assert proc.returncode == 0 and "dry run: nothing was sent" in proc.stdout
    assert "---- README.md (model card) ----" in proc.stdout and "| stage | bucket |" in proc.stdout


def test_dry_run_lists_changes_and_deletions(hub, model_copy, published):
    repo_id, record, _ = published
    voice = model_copy / "weights" / "voices" / "syn_b.pt"
    voice.unlink()  # a voice dropped from the build: deleted on the Hub
    mf = json.loads((model_copy / "manifest.json").read_text())
    mf["weights"]["voices"] = ["syn_a"]
    (model_copy / "manifest.json").write_text(json.dumps(mf, indent=2))
    proc = publish_cli(hub, model_copy, repo_id, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "  D kokoro-tiny/weights/voices/syn_b.pt" in proc.stdout
    assert "  M kokoro-tiny/manifest.json" in proc.stdout and "  M manifest.json" in proc.stdout
    assert hub.head(repo_id) == record["commit"]  # nothing sent


def test_failed_gate_is_refused_before_any_request(hub, model_copy):
    failed = model_copy / "parity" / "generator" / "3s.failed.json"
    failed.write_text((model_copy / "parity" / "generator" / "3s.json").read_text())
    proc = publish_cli(hub, model_copy, "anetts/refused")
    assert proc.returncode == 1 and "generator/3s failed its parity gate" in proc.stderr
    assert not hub.repo("anetts/refused").exists()  # no create_repo reached the server
    failed.unlink()
    # a package changed after its parity run: refused naming it
    weight = next((model_copy / "packages" / "decoder_pre").glob("*.mlpackage/Data/com.apple.CoreML/weights/weight.bin"))
    data = bytearray(weight.read_bytes())
    data[-1] ^= 0xFF
    weight.write_bytes(bytes(data))
    with pytest.raises(PublishError, match=r"package decoder_pre/3s: packages/decoder_pre/3s.mlpackage does not match"):
        check_gate(model_copy)
    proc = publish_cli(hub, model_copy, "anetts/refused")
    assert proc.returncode == 1 and "decoder_pre/3s" in proc.stderr and not hub.repo("anetts/refused").exists()


def test_missing_token_and_unreachable_hub_send_nothing(hub, built_model, tmp_path):
    proc = cli(hub, hub.write, "publish", "--model-dir", str(built_model), "--repo-id", "anetts/x",
               HF_TOKEN="", HF_HOME=str(tmp_path))
    assert proc.returncode == 1 and "no Hugging Face token" in proc.stderr
    proc = cli(hub, "http://127.0.0.1:9", "publish", "--model-dir", str(built_model), "--repo-id", "anetts/x")
    assert proc.returncode == 1 and "cannot reach the Hub at http://127.0.0.1:9" in proc.stderr
    assert not hub.repo("anetts/x").exists()


def test_commit_failing_mid_way_leaves_the_repo_and_a_rerun_completes(hub, model_copy):
    repo_id = "anetts/flaky"
    assert publish_cli(hub, model_copy, repo_id).returncode == 0
    before = hub.head(repo_id)
    published = (model_copy / "publish" / "published.json").read_text()
    (model_copy / "parity_summary.md").write_text((model_copy / "parity_summary.md").read_text() + "\nrebuilt\n")
    hub.fail_next_commits(1)
    proc = publish_cli(hub, model_copy, repo_id)
    assert proc.returncode == 1 and "the Hub kept its previous state" in proc.stderr
    assert hub.head(repo_id) == before and hub.git(repo_id, "rev-list", "--count", "main") == "1"
    assert (model_copy / "publish" / "published.json").read_text() == published  # still the commit that exists
    proc = publish_cli(hub, model_copy, repo_id)
    assert proc.returncode == 0, proc.stderr
    after = hub.head(repo_id)
    assert after != before and hub.git(repo_id, "rev-parse", "main~1") == before
    assert json.loads((model_copy / "publish" / "published.json").read_text())["commit"] == after
    assert "M kokoro-tiny/parity_summary.md" in proc.stdout


def _lfs_object(hub, repo_id: str, path: str) -> Path:
    pointer = hub.git(repo_id, "show", f"main:{path}")
    oid = pointer.split("oid sha256:")[1].split()[0]
    return hub.repo(repo_id) / ".git" / "lfs" / "objects" / oid[:2] / oid[2:4] / oid


@pytest.mark.parametrize("damage", ["tampered", "truncated"])
def test_damaged_file_on_the_server_fails_load_naming_it(hub, model_copy, tmp_path, damage):
    from anetts.publish import fetch
    from anetts.runtime import IntegrityError

    repo_id = f"anetts/{damage}"
    assert publish_cli(hub, model_copy, repo_id).returncode == 0
    layout = json.loads((model_copy / "publish" / "tree" / "manifest.json").read_text())
    path = next(f["path"] for f in layout["files"] if f["path"].endswith("generator/3s.mlpackage/Data/com.apple.CoreML/weights/weight.bin"))
    obj = _lfs_object(hub, repo_id, path)
    data = bytearray(obj.read_bytes())
    if damage == "tampered":
        data[len(data) // 2] ^= 0x01
    else:
        data = data[: len(data) // 2]
    os.chmod(obj, 0o644)
    obj.write_bytes(bytes(data))
    with pytest.raises(IntegrityError) as e:
        fetch(f"hf://{repo_id}@main", backend="torch", endpoint=hub.read, cache_dir=tmp_path / "cache")
    assert path in str(e.value)
    assert ("sha256" if damage == "tampered" else "bytes") in str(e.value)


def test_unreachable_hub_on_load_is_a_clear_error_and_caches_nothing(tmp_path):
    from anetts.publish import HubFetchError, fetch

    with pytest.raises(HubFetchError, match=r"cannot download hf://anetts/kokoro-tiny@main"):
        fetch("hf://anetts/kokoro-tiny@main", endpoint="http://127.0.0.1:9", cache_dir=tmp_path / "cache")
    assert not list((tmp_path / "cache").rglob("snapshots/*"))
    with pytest.raises(HubFetchError, match="not a Hub model address"):
        fetch("hf://just-a-name")


def test_snakemake_publish_target(hub, built_workflow):
    from workflow_helpers import run_snakemake

    proc = run_snakemake(Path(built_workflow), "publish", check=False)
    (Path(built_workflow) / "artifacts" / "kokoro-tiny" / "publish" / "published.json").unlink(missing_ok=True)
    assert proc.returncode != 0 and "publishing needs a Hub repo" in proc.stdout + proc.stderr
    env = hub.env(hub.write)
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", "publish", "--config", "hf_repo=anetts/from-snakemake"],
                          cwd=built_workflow, env={**env, "PYTHONPATH": str(built_workflow)}, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((Path(built_workflow) / "artifacts" / "kokoro-tiny" / "publish" / "published.json").read_text())
    assert record["repo_id"] == "anetts/from-snakemake" and record["commit"] == hub.head("anetts/from-snakemake")
