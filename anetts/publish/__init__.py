"""Publish a verified build to the Hugging Face Hub, and load it back (``hf://OWNER/REPO@REVISION``).

    >>> from anetts.publish import publish, fetch
    >>> publish("artifacts/kokoro-82m", "me/kokoro-82m-coreml", dry_run=True)   # gate, stage, plan
    >>> fetch("hf://me/kokoro-82m-coreml@<sha>").model_dir                       # download + verify

Layout on the Hub: :mod:`anetts.publish.layout`; the commit: :mod:`anetts.publish.upload`;
download and verification: :mod:`anetts.publish.download`. Each is imported on first use, so the
loader can read the layout's names without the upload or the runtime.
"""
import importlib

_HOME = {"PublishError": "errors", "check_gate": "layout", "stage_tree": "layout", "Plan": "upload", "publish": "upload",
         "publish_dir": "upload", "HubFetchError": "download", "HubModel": "download", "fetch": "download",
         "verify_snapshot": "download"}
__all__ = sorted(_HOME)


def __getattr__(name):
    if name in _HOME:
        return getattr(importlib.import_module(f"anetts.publish.{_HOME[name]}"), name)
    raise AttributeError(f"module 'anetts.publish' has no attribute {name!r}")
