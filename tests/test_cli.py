"""The `anetts` command line: inspect and run-mil delegate to their modules; errors exit non-zero."""
from __future__ import annotations

import json

from anetts.cli import main


def test_inspect_command(built_workflow, tmp_path, capsys):
    pkg = built_workflow / "artifacts" / "kokoro-tiny" / "packages" / "generator" / "3s.mlpackage"
    out = tmp_path / "inspect.json"
    assert main(["inspect", str(pkg), "--json", str(out)]) == 0
    info = json.loads(out.read_text())
    assert info["functions"]["main"]["ops"]["conv_transpose"] > 0
    assert main(["inspect", str(tmp_path / "missing.mlpackage")]) != 0


def test_unknown_command_is_a_usage_error():
    assert main(["no-such-command"]) == 2
