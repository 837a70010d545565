"""Manifest paths outside the model directory, on the way to and from the Hub (issue 21, item 1).

`anetts speak --model hf://evil/repo@main` with a publish manifest listing ``../../../../victim2.txt``
deleted that file while "removing it from the cache", and a snapshot link pointing out of the cache
made the eviction delete its target. Publishing must refuse a build manifest with such a path.
Repos here are committed through the loopback Hub's commit protocol and downloaded through olah.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from anetts.publish import PublishError, check_gate
from anetts.runtime import IntegrityError
from publish_helpers import replace_file


def commit_files(hub, repo_id: str, files: dict[str, bytes]) -> None:
    """Commit ``files`` as they are (no gate, no staging): what anyone can push to a Hub repo."""
    import huggingface_hub.constants as hf_constants
    from huggingface_hub import CommitOperationAdd, HfApi

    before, hf_constants.ENDPOINT = hf_constants.ENDPOINT, hub.write  # commit URLs are built from it
    try:
        api = HfApi(endpoint=hub.write, token=hub.token)
        api.create_repo(repo_id, exist_ok=True)
        api.create_commit(repo_id, [CommitOperationAdd(path_in_repo=p, path_or_fileobj=data) for p, data in files.items()],
                          commit_message="files as given")
    finally:
        hf_constants.ENDPOINT = before


def layout(files: dict[str, bytes], listed: list[str]) -> bytes:
    """A publish manifest (anetts.publish.layout) whose variants list ``listed``."""
    return json.dumps({"layout_version": 1, "model": "m", "family": "kokoro", "model_dir": "m",
                       "variants": {"torch": listed, "coreml": listed},
                       "files": [{"path": p, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()}
                                 for p, d in files.items()]}).encode()


def test_speak_from_a_hub_manifest_listing_a_path_out_of_the_cache_deletes_nothing(hub, tmp_path):
    cache, victim = tmp_path / "cache", tmp_path / "victim2.txt"  # snapshots/<sha>/../../../../ is tmp_path
    victim.write_text("not yours")
    model = {"m/manifest.json": b"{}"}
    commit_files(hub, "evil/repo", {**model, "manifest.json": layout(model, ["../../../../victim2.txt"])})
    proc = subprocess.run([sys.executable, "-m", "anetts.cli", "speak", "Hello.", "-o", str(tmp_path / "o.wav"),
                           "--model", "hf://evil/repo@main", "--no-progress"], capture_output=True, text=True,
                          env=hub.env(hub.read, HF_HUB_CACHE=str(cache)), timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert "manifest.json variants.torch[0]: path '../../../../victim2.txt' points outside" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert victim.read_text() == "not yours" and not (tmp_path / "o.wav").exists()


def test_a_snapshot_link_out_of_the_cache_is_refused_not_followed(hub, tmp_path):
    from anetts.publish import fetch

    cache, victim = tmp_path / "cache", tmp_path / "victim3.txt"
    model = {"m/a.txt": b"the published bytes"}
    commit_files(hub, "evil/linked", {**model, "manifest.json": layout(model, ["m/a.txt"])})
    got = fetch("hf://evil/linked@main", variant="torch", endpoint=hub.read, cache_dir=cache)
    assert (got.model_dir / "a.txt").read_bytes() == b"the published bytes"
    # the cached file now links out of the cache, to a file of another size: a "bad file" to evict
    victim.write_text("not yours")
    link = got.snapshot / "m" / "a.txt"
    link.unlink()
    os.symlink(victim, link)
    with pytest.raises(IntegrityError, match=r"manifest.json files\[0\].path: path 'm/a.txt' resolves to .*victim3.txt, "
                                             r"outside .*models--evil--linked \(a symlink out of the model directory\)"):
        fetch("hf://evil/linked@main", variant="torch", endpoint=hub.read, cache_dir=cache)
    assert victim.read_text() == "not yours"


def test_publishing_refuses_a_manifest_path_outside_the_model_dir(hub, model_copy):
    manifest = json.loads((model_copy / "manifest.json").read_text())
    asset = manifest["assets"][0]
    # the file it names is a true copy under the same name (its sha256 matches): only its place is wrong
    name = Path(asset["path"]).name
    outside = model_copy.parent / name
    outside.write_bytes((model_copy / asset["path"]).read_bytes())
    asset["path"] = f"../{name}"
    replace_file(model_copy / "manifest.json", json.dumps(manifest, indent=2))
    says = f"assets[0].path: path '../{name}' points outside the model directory"
    with pytest.raises(PublishError, match=re.escape(says)):
        check_gate(model_copy)
    proc = subprocess.run([sys.executable, "-m", "anetts.cli", "publish", "--model-dir", str(model_copy),
                           "--repo-id", "anetts/escape"], capture_output=True, text=True,
                          env=hub.env(hub.write), timeout=300)
    assert proc.returncode == 1 and says in proc.stderr, proc.stderr
    assert not hub.repo("anetts/escape").exists() and outside.is_file()
