"""Cheaper imports of third-party packages whose `__init__` loads far more than a build job uses.

A build job run cold (without the job server, anetts.jobserver) is a fresh Python process, so what a
package imports at start-up is paid once per job (benchmarks/results/startup_log.md has the measurements). Two mechanisms, both leaving the process able to import
the packages normally afterwards:

- `submodules(package, *names)`: import `package.<name>` without executing `package/__init__.py`
  (kokoro's `__init__` imports its text pipeline, misaki and spaCy, and `KModel`, which pulls
  transformers; the decoder needs only `kokoro.istftnet`). A later `import package` runs the real
  `__init__`, which finds these submodules already in `sys.modules` and reuses them, so there is
  one copy of each class in the process.
- `coremltools()`: `import coremltools` while its optional-dependency probes for scikit-learn and
  transformers (`coremltools/_deps`) find nothing. Only its sklearn model converters read the
  results; packages are written and read the same way.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType

# coremltools/_deps probes these at import; nothing this project calls in coremltools needs them
# (_HAS_SKLEARN gates coremltools.converters.sklearn only, _HAS_HF is read nowhere)
COREMLTOOLS_SKIPPED_PROBES = ("sklearn", "transformers")


class _BindSubmodules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Runs `package`'s real `__init__` when it is imported later, with the submodules imported
    before bound as its attributes first (Python binds a submodule to its parent only when it loads
    it, so `package.name` would otherwise be missing)."""

    def __init__(self, package: str):
        self.package = package
        self.spec = None

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.package:
            return None
        sys.meta_path.remove(self)  # one shot; find the real spec with the other finders
        real = importlib.util.find_spec(fullname)
        self.spec = real
        return importlib.util.spec_from_loader(fullname, self, origin=real.origin, is_package=True)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__spec__ = self.spec
        module.__path__ = list(self.spec.submodule_search_locations)
        module.__file__ = self.spec.origin
        module.__loader__ = self.spec.loader
        prefix = self.package + "."
        for name, sub in list(sys.modules.items()):
            if name.startswith(prefix) and "." not in name[len(prefix):]:
                setattr(module, name[len(prefix):], sub)
        self.spec.loader.exec_module(module)


def submodules(package: str, *names: str) -> list[ModuleType]:
    """`package.<name>` for each name, without running `package/__init__.py` unless it already ran."""
    if package in sys.modules:
        return [importlib.import_module(f"{package}.{n}") for n in names]
    spec = importlib.util.find_spec(package)
    if spec is None or spec.submodule_search_locations is None:
        raise ImportError(f"{package!r} is not an installed package")
    # the package object without executing its __init__: enough for the import system to find and
    # run submodules (their relative and absolute imports of siblings resolve through __path__)
    sys.modules[package] = importlib.util.module_from_spec(spec)
    try:
        loaded = [importlib.import_module(f"{package}.{n}") for n in names]
    finally:
        del sys.modules[package]
    if not any(isinstance(f, _BindSubmodules) and f.package == package for f in sys.meta_path):
        sys.meta_path.insert(0, _BindSubmodules(package))
    return loaded


def coremltools() -> ModuleType:
    """`import coremltools`, its scikit-learn and transformers probes skipped where neither is loaded."""
    if "coremltools" in sys.modules:
        return sys.modules["coremltools"]
    hidden = [name for name in COREMLTOOLS_SKIPPED_PROBES if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # `import name` raises ImportError, which _deps catches
    try:
        import coremltools as ct
    finally:
        for name in hidden:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]
    return ct
