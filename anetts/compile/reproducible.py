"""Make a saved .mlpackage byte-for-byte reproducible.

coremltools 9.0 writes two things that differ between two saves of the same model in two
processes, while the weights (``weight.bin``) are identical:

- ``Manifest.json``: the package's item identifiers are random UUIDs (a new pair per save);
- ``Data/com.apple.CoreML/model.mlmodel``: the spec is serialized without ``deterministic=True``,
  and protobuf (upb) writes map fields (``userDefined`` metadata, MIL op attributes, a multifunction
  program's ``functions``) in a per-process hash order, even with a fixed ``PYTHONHASHSEED``;
  and its metadata holds ``com.github.apple.coremltools.conversion_date``, the day of the save, so
  two builds either side of midnight differ (a CI run that crossed 00:00 UTC failed on this).

So the package's sha256 (``anetts.artifacts.tree_sha256``, recorded in ``manifest.json``) changed
with every build of the same inputs. :func:`stabilize_package` rewrites both in place: the spec
re-serialized with map entries in key order and without the conversion date (the build's
time is the manifest's business), and each identifier a name-based UUID (uuid5) of the
item's path, which is unique within a package as a random one is. The content is unchanged:
the same spec message, the same items.
"""
from __future__ import annotations

import json
import uuid
from pathlib import Path

# written by coremltools' save with today's date; the one input of a package that is not an input
CONVERSION_DATE_KEY = "com.github.apple.coremltools.conversion_date"

# uuid5 namespace for package item identifiers (any fixed UUID; this one is uuid5(URL, "anetts"))
ITEM_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "anetts")


def item_identifier(item_path: str) -> str:
    return str(uuid.uuid5(ITEM_NAMESPACE, item_path))


def stabilize_package(path) -> None:
    """Rewrite a saved .mlpackage's Manifest.json identifiers and model spec deterministically."""
    from coremltools.proto import Model_pb2

    pkg = Path(path)
    manifest_file = pkg / "Manifest.json"
    info = json.loads(manifest_file.read_text(encoding="utf-8"))
    items = info.get("itemInfoEntries", {})
    renamed = {old: item_identifier(entry["path"]) for old, entry in items.items()}
    if len(set(renamed.values())) != len(renamed):
        raise ValueError(f"{pkg}: two items of Manifest.json share a path")
    info["itemInfoEntries"] = {renamed[old]: entry for old, entry in items.items()}
    root = info.get("rootModelIdentifier")
    if root in renamed:
        info["rootModelIdentifier"] = renamed[root]
        spec_file = pkg / "Data" / items[root]["path"]
        spec = Model_pb2.Model()
        spec.ParseFromString(spec_file.read_bytes())
        spec.description.metadata.userDefined.pop(CONVERSION_DATE_KEY, None)
        spec_file.write_bytes(spec.SerializeToString(deterministic=True))
    # the layout coremltools writes (4-space indent, sorted keys, a final newline)
    manifest_file.write_text(json.dumps(info, indent=4, sort_keys=True) + "\n", encoding="utf-8")
