"""docs/faults.md names real tests: every `tests/<file>.py::<test>` it cites is a test function in
that file (a renamed or deleted test must take its row with it), and it lists at least 40 faults."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CATALOGUE = ROOT / "docs" / "faults.md"
CITED = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def test_every_cited_test_exists():
    text = CATALOGUE.read_text(encoding="utf-8")
    cited = CITED.findall(text)
    assert len(cited) >= 40
    missing = []
    for path, name in sorted(set(cited)):
        file = ROOT / path
        defined = set()
        if file.is_file():
            defined = {n.name for n in ast.walk(ast.parse(file.read_text(encoding="utf-8")))
                       if isinstance(n, ast.FunctionDef)}
        if name not in defined:
            missing.append(f"{path}::{name}")
    assert not missing, f"docs/faults.md cites tests that do not exist: {missing}"


def test_at_least_40_distinct_faults():
    rows = [line for line in CATALOGUE.read_text(encoding="utf-8").splitlines() if re.match(r"\| \d+ \|", line)]
    numbers = [int(line.split("|")[1]) for line in rows]
    assert numbers == list(range(1, len(rows) + 1)) and len(rows) >= 40
    faults = [line.split("|")[2].strip() for line in rows]
    assert len(set(faults)) == len(faults), "a fault is listed twice"
