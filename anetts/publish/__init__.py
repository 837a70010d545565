"""Publish a verified build to the Hugging Face Hub, and load it back (``hf://OWNER/REPO@REVISION``).

    >>> from anetts.publish import publish, fetch
    >>> publish("artifacts/kokoro-82m", "me/kokoro-82m-coreml", dry_run=True)   # gate, stage, plan
    >>> fetch("hf://me/kokoro-82m-coreml@<sha>").model_dir                       # download + verify

Layout on the Hub: :mod:`anetts.publish.layout`; the commit: :mod:`anetts.publish.upload`;
download and verification: :mod:`anetts.publish.download` (imported on use: it needs the runtime).
"""
from anetts.publish.errors import PublishError
from anetts.publish.layout import check_gate, stage_tree
from anetts.publish.upload import Plan, publish, publish_dir

__all__ = ["HubFetchError", "HubModel", "Plan", "PublishError", "check_gate", "fetch", "publish", "publish_dir",
           "stage_tree", "verify_snapshot"]


def __getattr__(name):
    if name in ("HubFetchError", "HubModel", "fetch", "verify_snapshot"):
        from anetts.publish import download

        return getattr(download, name)
    raise AttributeError(f"module 'anetts.publish' has no attribute {name!r}")
