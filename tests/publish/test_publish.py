"""Publish -> load -> speak through real huggingface_hub clients and two loopback servers.

The write side is tests/publish/hub_server.py (the Hub's commit protocol into git), the read side
is olah serving the same git repos: each commit made here is downloaded through a real Hub mirror.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from anetts.publish import PublishError, check_gate, publish
from anetts.artifacts import file_sha256
from publish_helpers import replace_file
from workflow_helpers import small_config


PHONEMES = "hˈɛloʊ"


def cli(hub, endpoint: str, *args: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "anetts.cli", *args], capture_output=True, text=True,
                          env=hub.env(endpoint, **env), timeout=300)


def publish_cli(hub, model_dir: Path, repo_id: str, *extra: str) -> subprocess.CompletedProcess:
    return cli(hub, hub.write, "publish", "--model-dir", str(model_dir), "--repo-id", repo_id, *extra)


def hub_files(hub, repo_id: str) -> dict[str, str]:
    """path -> 'lfs' (a pointer file) or 'git' (content in git) at main, read straight from the git repo."""
    out = {}
    for line in hub.git(repo_id, "ls-tree", "-r", "main").splitlines():
        _mode, _kind, blob, path = line.split(None, 3)
        head = subprocess.run(["git", "-C", str(hub.repo(repo_id)), "cat-file", "blob", blob], capture_output=True,
                              check=True).stdout[:40]
        out[path] = "lfs" if head.startswith(b"version https://git-lfs") else "git"
    return out


@pytest.fixture(scope="module")
def published(hub, built_model):
    """kokoro-tiny published once through the CLI; (repo_id, commit, stdout)."""
    repo_id = "anetts/kokoro-tiny"
    proc = publish_cli(hub, built_model, repo_id)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    record = json.loads((built_model / "publish" / "published.json").read_text())
    return repo_id, record, proc.stdout


@pytest.fixture
def publish_here(hub):
    """publish() in this process. huggingface_hub parses the commit URL against its ENDPOINT constant,
    so that points at the write server during the call (and only then: download URLs use it too)."""
    import huggingface_hub.constants as hf_constants

    def run(model_dir, repo_id, echo=lambda *_: None, **kw):
        before, hf_constants.ENDPOINT = hf_constants.ENDPOINT, hub.write
        try:
            return publish(model_dir, repo_id, token=hub.token, endpoint=hub.write, echo=echo, **kw)
        finally:
            hf_constants.ENDPOINT = before

    return run


@pytest.fixture(scope="module")
def hf_cache(module_tmp) -> Path:
    """One Hugging Face cache for the load and speak tests: the tiny tree is downloaded once."""
    return module_tmp


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


def test_load_through_olah_downloads_the_variant_and_verifies_it(hub, built_model, published, hf_cache):
    from anetts.publish import fetch
    from anetts.loader import load

    repo_id, record, _ = published
    uri = f"hf://{repo_id}@{record['commit']}"
    got = fetch(uri, backend="torch", endpoint=hub.read, cache_dir=hf_cache)
    assert got.commit == record["commit"] and got.variant == "torch"
    assert got.snapshot.is_relative_to(hf_cache) and got.model_dir == got.snapshot / "kokoro-tiny"
    tts = load(uri, backend="torch", endpoint=hub.read, cache_dir=hf_cache)  # from the cache now
    assert tts.artifacts.model_dir == got.model_dir and tts.voices == ["syn_a", "syn_b"]
    for entry in tts.artifacts.packages.values():  # the build manifest's own sha256 of each package
        tts.artifacts.verify(entry, torchscript=True)
    for rel in ("manifest.json", "assets/voices/syn_a.npy"):
        assert file_sha256(got.model_dir / rel) == file_sha256(built_model / rel)


def test_speak_hf_uri_offline_from_the_cache(hub, published, hf_cache, tmp_path):
    """`anetts speak --model hf://` with the Hub gone (closed port, HF_HUB_OFFLINE=1): the verified cache is enough."""
    repo_id, record, _ = published
    uri = f"hf://{repo_id}@{record['commit']}"
    args = ("speak", "--phonemes", PHONEMES, "--voice", "syn_a", "--backend", "torch", "--model", uri, "--no-progress")
    env = {"HF_HUB_CACHE": str(hf_cache), "HF_HUB_OFFLINE": "1"}
    proc = cli(hub, "http://127.0.0.1:9", *args, "-o", str(tmp_path / "a.wav"), **env)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "a.wav").stat().st_size > 1000
    # a cache that lost a file is not a model: the missing file is named, nothing is spoken
    snap = hf_cache / "models--anetts--kokoro-tiny" / "snapshots" / record["commit"]
    victim = next(snap.glob("kokoro-tiny/assets/voices/*.npy"))
    victim.unlink()
    proc = cli(hub, "http://127.0.0.1:9", *args, "-o", str(tmp_path / "b.wav"), **env)
    assert proc.returncode == 1 and f"{victim.relative_to(snap).as_posix()} is missing" in proc.stderr
    assert not (tmp_path / "b.wav").exists()


def test_republishing_an_unchanged_tree_makes_no_commit(hub, built_model, published, publish_here):
    repo_id, record, _ = published
    lines = []
    again = publish_here(built_model, repo_id, echo=lines.append)
    assert again["commit"] == record["commit"] == hub.head(repo_id)
    assert any("0 added, 0 changed, 0 deleted" in line for line in lines) and any("no commit" in line for line in lines)


def test_dry_run_lists_changes_and_deletions_and_prints_the_card(hub, model_copy, published):
    repo_id, record, _ = published
    (model_copy / "assets" / "voices" / "syn_b.npy").unlink()  # a voice dropped from the build
    mf = json.loads((model_copy / "manifest.json").read_text())
    mf["assets"] = [a for a in mf["assets"] if a["name"] != "voices/syn_b.npy"]
    replace_file(model_copy / "manifest.json", json.dumps(mf, indent=2))
    proc = publish_cli(hub, model_copy, repo_id, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "  D kokoro-tiny/assets/voices/syn_b.npy" in proc.stdout
    assert "  M kokoro-tiny/manifest.json" in proc.stdout and "  M manifest.json" in proc.stdout
    assert "dry run: nothing was sent" in proc.stdout and "---- README.md (model card) ----" in proc.stdout
    assert "| stage | bucket | TorchScript | MIL executor |" in proc.stdout
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
    replace_file(weight, bytes(data))
    with pytest.raises(PublishError, match=r"package decoder_pre/3s: packages/decoder_pre/3s.mlpackage does not match"):
        check_gate(model_copy)
    proc = publish_cli(hub, model_copy, "anetts/refused")
    assert proc.returncode == 1 and "decoder_pre/3s" in proc.stderr and not hub.repo("anetts/refused").exists()


def test_missing_token_and_unreachable_hub_send_nothing(hub, built_model, tmp_path):
    proc = cli(hub, hub.write, "publish", "--model-dir", str(built_model), "--repo-id", "anetts/x",
               HF_TOKEN="", HF_HOME=str(tmp_path))
    assert proc.returncode == 1 and "no Hugging Face token" in proc.stderr
    with pytest.raises(PublishError, match=r"cannot reach the Hub at http://127.0.0.1:9 .*nothing was sent"):
        publish(built_model, "anetts/x", token=hub.token, endpoint="http://127.0.0.1:9")
    with pytest.raises(PublishError, match=r"refused the token \(401\)"):
        publish(built_model, "anetts/x", token="wrong", endpoint=hub.write)
    assert not hub.repo("anetts/x").exists()


def test_publishing_to_a_missing_branch_is_refused(hub, built_model, published, publish_here):
    repo_id, record, _ = published
    with pytest.raises(PublishError, match=r"branch 'nope' does not exist in anetts/kokoro-tiny; create it first"):
        publish_here(built_model, repo_id, revision="nope")
    assert hub.head(repo_id) == record["commit"]


def test_commit_failing_mid_way_leaves_the_repo_and_a_rerun_completes(hub, model_copy, publish_here):
    repo_id = "anetts/flaky"
    before = publish_here(model_copy, repo_id)["commit"]
    published = (model_copy / "publish" / "published.json").read_text()
    replace_file(model_copy / "parity_summary.md", (model_copy / "parity_summary.md").read_text() + "\nrebuilt\n")
    hub.fail_next_commits(1)
    with pytest.raises(PublishError, match="the Hub kept its previous state"):
        publish_here(model_copy, repo_id)
    assert hub.head(repo_id) == before and hub.git(repo_id, "rev-list", "--count", "main") == "1"
    assert (model_copy / "publish" / "published.json").read_text() == published  # still the commit that exists
    lines = []
    after = publish_here(model_copy, repo_id, echo=lines.append)["commit"]
    assert after == hub.head(repo_id) != before and hub.git(repo_id, "rev-parse", "main~1") == before
    assert json.loads((model_copy / "publish" / "published.json").read_text())["commit"] == after
    assert any("  M kokoro-tiny/parity_summary.md" in line for line in lines)


def _lfs_object(hub, repo_id: str, path: str) -> Path:
    pointer = hub.git(repo_id, "show", f"main:{path}")
    oid = pointer.split("oid sha256:")[1].split()[0]
    return hub.repo(repo_id) / ".git" / "lfs" / "objects" / oid[:2] / oid[2:4] / oid


def test_damaged_files_on_the_server_fail_load_naming_them(hub, built_model, publish_here, tmp_path):
    from anetts.publish import fetch
    from anetts.runtime import IntegrityError

    repo_id = "anetts/damaged"
    publish_here(built_model, repo_id)
    layout = json.loads((built_model / "publish" / "tree" / "manifest.json").read_text())
    shas = [f["sha256"] for f in layout["files"]]
    # a package weight whose content no other file shares (a bundle can hold the same bytes: one object)
    weight = next(f["path"] for f in layout["files"]
                  if f["path"].endswith("weights/weight.bin") and shas.count(f["sha256"]) == 1)
    voice = "kokoro-tiny/assets/voices/syn_b.npy"
    uri, cache = f"hf://{repo_id}@main", tmp_path / "cache"
    w_obj, v_obj = _lfs_object(hub, repo_id, weight), _lfs_object(hub, repo_id, voice)
    w_good, v_good = w_obj.read_bytes(), v_obj.read_bytes()
    tampered = bytearray(w_good)
    tampered[len(w_good) // 2] ^= 0x01  # same size, one bit
    replace_file(w_obj, bytes(tampered))
    replace_file(v_obj, v_good[:1000])  # truncated
    # files are checked in path order: the voice asset (assets/) comes before the bundle (bundles/)
    with pytest.raises(IntegrityError, match=rf"{voice} has 1000 bytes, the manifest says {len(v_good)}.*removed from the cache"):
        fetch(uri, variant="coreml", endpoint=hub.read, cache_dir=cache)
    # the coreml variant's download left the TorchScript exports on the Hub
    assert list(cache.rglob("weight.bin"))
    assert not [p for p in cache.rglob("*") if p.suffix == ".pt" and "export" in p.parts]
    # the server repaired: the evicted file comes again, the next bad one is named
    replace_file(v_obj, v_good)
    with pytest.raises(IntegrityError, match=rf"{weight} does not match manifest.json: sha256.*removed from the cache"):
        fetch(uri, variant="coreml", endpoint=hub.read, cache_dir=cache)
    replace_file(w_obj, w_good)
    got = fetch(uri, variant="coreml", endpoint=hub.read, cache_dir=cache)
    assert file_sha256(got.snapshot / weight) == file_sha256(built_model / weight.split("/", 1)[1])


def test_unreachable_hub_on_load_is_a_clear_error_and_caches_nothing(tmp_path, monkeypatch):
    import functools

    import huggingface_hub.file_download as fd

    from anetts.publish import HubFetchError, fetch

    # huggingface_hub retries a refused connection five times (~23 s); one try shows the same error
    monkeypatch.setattr(fd, "http_backoff", functools.partial(fd.http_backoff, max_retries=0))

    with pytest.raises(HubFetchError, match=r"cannot download hf://anetts/kokoro-tiny@main"):
        fetch("hf://anetts/kokoro-tiny@main", endpoint="http://127.0.0.1:9", cache_dir=tmp_path / "cache")
    assert not list((tmp_path / "cache").rglob("snapshots/*"))
    with pytest.raises(HubFetchError, match="not a Hub model address"):
        fetch("hf://just-a-name")


def test_publish_target_comes_from_hf_repo_or_the_publish_block():
    from anetts.workflow import ConfigError, WorkflowConfig

    cfg = small_config()
    with pytest.raises(ConfigError, match=r"publishing needs a Hub repo: --config hf_repo=OWNER/NAME"):
        WorkflowConfig(cfg).publish_target()
    cfg["publish"] = {"repo_id": "me/a", "private": True}
    assert WorkflowConfig(cfg).publish_target() == {"private": True, "repo_id": "me/a", "revision": "main"}
    cfg["hf_repo"] = "me/b"
    assert WorkflowConfig(cfg).publish_target()["repo_id"] == "me/b"


def test_snakemake_publish_target(hub, built_workflow):
    out = Path(built_workflow) / "artifacts" / "kokoro-tiny" / "publish" / "published.json"
    out.unlink(missing_ok=True)  # written by the CLI tests, outside Snakemake's records
    env = hub.env(hub.write, PYTHONPATH=str(built_workflow))
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", "publish", "--config", "hf_repo=anetts/from-snakemake"],
                          cwd=built_workflow, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "rule publish_model:" in proc.stderr + proc.stdout
    record = json.loads(out.read_text())
    assert record["repo_id"] == "anetts/from-snakemake" and record["commit"] == hub.head("anetts/from-snakemake")
