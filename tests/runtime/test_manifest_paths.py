"""Every path a manifest lists stays inside its model directory (issue 21, item 1).

A copied model dir whose manifest lists ``../../victim_dir`` (a package) and ``../../victim.txt``
(an asset) made the runtime load from outside the dir and `anetts verify --repair` remove both.
The manifest is checked when it is read, before anything it lists is opened or removed; a bad
path is an error naming the entry. (Publishing and the Hub download: tests/publish/test_publish_paths.py.)
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from anetts.cli import main
from anetts.loader import load
from anetts.runtime import ArtifactError
from anetts.runtime.manifest import manifest_paths
from rt_common import copy_model_dir


def _edit_manifest(model_dir: Path, edit) -> None:
    manifest = json.loads((model_dir / "manifest.json").read_text())
    edit(manifest)
    (model_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))


@pytest.fixture
def escaping_copy(model_dir, tmp_path):
    """A copy at tmp/a/b/kokoro-tiny whose first package is ../../victim_dir and first asset ../../victim.txt:
    each victim a real copy of what it replaces, so everything but its place looks right."""
    copy = copy_model_dir(model_dir, tmp_path / "a" / "b" / "kokoro-tiny")
    manifest = json.loads((copy / "manifest.json").read_text())
    package = manifest["packages"][0]["path"]
    victim_dir, victim_txt = tmp_path / "a" / "victim_dir", tmp_path / "a" / "victim.txt"
    shutil.copytree(copy / manifest["packages"][0]["path"], victim_dir)
    shutil.copy(copy / manifest["assets"][0]["path"], victim_txt)

    def edit(m):
        m["packages"][0]["path"] = "../../victim_dir"
        m["assets"][0]["path"] = "../../victim.txt"
        # a digest that no longer matches: what makes --repair remove a file
        m["packages"][0]["sha256"] = m["assets"][0]["sha256"] = "0" * 64

    _edit_manifest(copy, edit)
    return copy, victim_dir, victim_txt, package


def test_runtime_refuses_a_manifest_path_outside_the_model_dir(escaping_copy):
    copy, victim_dir, victim_txt, _ = escaping_copy
    with pytest.raises(ArtifactError, match=r"packages\[0\]\.path: path '\.\./\.\./victim_dir' points outside "
                                            r"the model directory"):
        load(copy, backend="torch")
    _edit_manifest(copy, lambda m: m["packages"][0].update(path="packages/../../../victim_dir"))
    with pytest.raises(ArtifactError, match=r"packages\[0\]\.path: path 'packages/\.\./\.\./\.\./victim_dir' is not "
                                            r"a normalized relative path"):
        load(copy, backend="torch")
    _edit_manifest(copy, lambda m: m["packages"][0].update(path=str(victim_dir)))  # absolute
    with pytest.raises(ArtifactError, match=r"packages\[0\]\.path: .* is not a normalized relative path"):
        load(copy, backend="torch")


def test_verify_repair_never_removes_outside_the_model_dir(escaping_copy, capsys):
    copy, victim_dir, victim_txt, package = escaping_copy
    before = sorted(p.name for p in victim_dir.rglob("*"))
    assert main(["verify", str(copy), "--repair"]) == 2
    err = capsys.readouterr().err
    assert "packages[0].path: path '../../victim_dir' points outside the model directory" in err
    assert victim_dir.is_dir() and sorted(p.name for p in victim_dir.rglob("*")) == before and victim_txt.is_file()
    assert (copy / "manifest.json").is_file()  # refused before anything was removed
    # the asset alone: named too
    _edit_manifest(copy, lambda m: m["packages"][0].update(path=package))
    assert main(["verify", str(copy), "--repair"]) == 2
    assert "assets[0].path: path '../../victim.txt' points outside" in capsys.readouterr().err
    assert victim_txt.is_file()


def test_a_symlink_out_of_the_model_dir_is_refused(model_dir, tmp_path, capsys):
    copy = copy_model_dir(model_dir, tmp_path / "m")
    manifest = json.loads((copy / "manifest.json").read_text())
    asset = copy / manifest["assets"][0]["path"]
    outside = tmp_path / "outside"
    shutil.move(asset, outside)
    os.symlink(outside, asset)
    with pytest.raises(ArtifactError, match=rf"assets\[0\]\.path: path '{re.escape(manifest['assets'][0]['path'])}' "
                                            rf"resolves to {re.escape(str(outside))}, outside .* \(a symlink out of the "
                                            rf"model directory\)"):
        load(copy, backend="torch")
    assert main(["verify", str(copy), "--repair"]) == 2 and "a symlink out of the model directory" in capsys.readouterr().err
    assert outside.is_file() and asset.is_symlink()
    # a package directory that is a link out: the same
    asset.unlink()
    shutil.move(outside, asset)
    package = copy / manifest["packages"][0]["path"]
    shutil.move(package, tmp_path / "pkg")
    os.symlink(tmp_path / "pkg", package)
    with pytest.raises(ArtifactError, match=r"packages\[0\]\.path: .* \(a symlink out of the model directory\)"):
        load(copy, backend="torch")


def test_a_variant_reaches_its_model_dir_and_no_further(tmp_path):
    """A variant's manifest (<model>/variants/<v>/) lists its model's uncompressed packages as ../../<path>."""
    variant = tmp_path / "kokoro-tiny" / "variants" / "int8"
    variant.mkdir(parents=True)
    ok = {"variant": {"name": "int8"}, "weights_dir": "../../weights",
          "packages": [{"path": "../../packages/duration/t32.mlpackage", "torchscript": "../../export/duration/t32.functions",
                        "parity": {"report": "../../parity/duration/t32.json"}},
                       {"path": "packages/generator/3s.mlpackage", "parity": {"report": "parity/generator/3s.json"}}]}
    got = manifest_paths(variant, ok, "m")
    assert [w for w, _ in got] == ["m weights_dir", "m packages[0].path", "m packages[0].torchscript",
                                   "m packages[0].parity.report", "m packages[1].path", "m packages[1].parity.report"]
    assert all(os.path.normpath(p).startswith(str(tmp_path / "kokoro-tiny")) for _, p in got)
    with pytest.raises(ArtifactError, match=r"m weights_dir: path '\.\./\.\./\.\./weights' points outside"):
        manifest_paths(variant, {**ok, "weights_dir": "../../../weights"}, "m")
    with pytest.raises(ArtifactError, match=r"m weights_dir: path '\.\./\.\.' points outside"):  # the model dir itself
        manifest_paths(variant, {**ok, "weights_dir": "../.."}, "m")
    # the same ../../ from a directory that is not a variant's: outside
    with pytest.raises(ArtifactError, match=r"m weights_dir: path '\.\./\.\./weights' points outside"):
        manifest_paths(tmp_path / "kokoro-tiny", ok, "m")
