"""What every compiled package says about itself (Core ML `.mlpackage` and Core AI `.aimodel`):
author, licence, a one-line description and the `anetts.*` metadata the manifest and readers use."""
from __future__ import annotations

import json
from dataclasses import dataclass

from anetts._version import __version__

AUTHOR = "ane-tts"


@dataclass(frozen=True)
class PackageStamp:
    description: str
    licence: str
    metadata: dict[str, str]
    author: str = AUTHOR
    version: str = __version__


def package_stamp(model_meta: dict, stage: str, bucket: str, geometry: dict, precision: str,
                  **extra: str) -> PackageStamp:
    """The stamp of `stage` at `bucket` of the model `model_meta` (model, family, source, revision,
    licence); `extra`: further `anetts.<key>` entries (conversion options), before the version."""
    metadata = {
        "anetts.model": model_meta["model"],
        "anetts.family": model_meta.get("family", ""),
        "anetts.source": model_meta.get("source", ""),
        "anetts.revision": str(model_meta.get("revision") or ""),
        "anetts.stage": stage,
        "anetts.bucket": bucket,
        "anetts.geometry": json.dumps(geometry, sort_keys=True),
        "anetts.precision": precision,
        **{f"anetts.{k}": v for k, v in extra.items()},
        "anetts.version": __version__,
    }
    return PackageStamp(description=f"{model_meta['model']} {stage} stage, bucket {bucket}",
                        licence=model_meta.get("licence") or "see the model card", metadata=metadata)
