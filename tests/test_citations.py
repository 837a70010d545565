"""Comments and rule/lint sources cite only what is in the repository."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CITATION = re.compile(r"([\w./-]+\.md) §")


def _sources():
    for folder in ("anetts", "rules", "workflow_scripts", "benchmarks"):
        yield from (ROOT / folder).rglob("*.py")
    yield from (ROOT / "rules").glob("*.smk")
    yield ROOT / "config.yaml"
    yield ROOT / "Snakefile"


def test_every_cited_note_is_in_the_repository():
    bad = []
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        if "/work/" in text:
            bad.append(f"{path.relative_to(ROOT)}: absolute path into the development machine")
        for m in CITATION.finditer(text):
            if not (ROOT / m.group(1)).is_file():
                bad.append(f"{path.relative_to(ROOT)}: cites {m.group(1)}, which is not in the repository")
    assert not bad, "\n".join(bad)
