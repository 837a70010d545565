"""ane-tts: compile text-to-speech models into Apple Neural Engine-friendly CoreML packages."""
from anetts._version import __version__

__all__ = ["__version__"]
