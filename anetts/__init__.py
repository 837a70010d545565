"""ane-tts: compile text-to-speech models into Apple Neural Engine-friendly CoreML packages."""
from anetts._version import __version__

__all__ = ["__version__", "load"]


def __getattr__(name):
    # lazy, so `import anetts` (and Snakemake's config parsing) does not pay for the runtime
    if name == "load":
        from anetts.loader import load

        return load
    raise AttributeError(f"module 'anetts' has no attribute {name!r}")
