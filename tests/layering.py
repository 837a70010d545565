"""What a user's process imports: `import anetts` and loading a model for a runtime backend must
import no torch and no build module (issue #22's layering), checked in a fresh interpreter."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# build-side modules: the workflow, compile/verify/publish, the families' stage wrappers and upstream code
BUILD = ("torch", "coremltools", "anetts.compile", "anetts.verify", "anetts.publish", "anetts.workflow",
         "anetts.mil", "anetts.models.kokoro.impl", "anetts.models.kokoro.weights", "anetts.models.kokoro.reference",
         "anetts.models.fish.stages", "anetts.models.fish.impl", "anetts.models.fish.reference",
         "anetts.models.fish.codec")

PROBE = """
import json, sys
import anetts
after_import = sorted(sys.modules)
error = None
try:
    tts = anetts.load(sys.argv[1], backend=sys.argv[2])
except Exception as e:  # the coreml backend off macOS: refused after the runtime's imports
    error = f"{type(e).__name__}: {e}"
print(json.dumps({"import": after_import, "load": sorted(sys.modules), "error": error}))
"""


def build_modules(names) -> list[str]:
    return sorted(n for n in names if any(n == b or n.startswith(b + ".") for b in BUILD))


def probe(model_dir: Path, backend: str) -> dict:
    """Modules loaded after `import anetts` and after `anetts.load(model_dir, backend)`, in a fresh process."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", PROBE, str(model_dir), backend], capture_output=True, text=True,
                          env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def runtime_imports() -> dict[str, list[str]]:
    """The anetts modules each file of anetts/runtime/ imports (anywhere in it, lazily too)."""
    import ast

    out = {}
    for path in sorted((REPO / "anetts" / "runtime").glob("*.py")):
        names = []
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.append(node.module)
            elif isinstance(node, ast.Import):
                names += [a.name for a in node.names]
        out[path.name] = sorted(n for n in names if n.startswith("anetts"))
    return out
