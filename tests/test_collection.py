"""Every tests/**/test_*.py file is collected by the plain `pytest` run that CI makes.

pytest's default `norecursedirs` once hid a whole folder (`tests/build/`): a test that never runs is
worse than none, so a file left out of collection (or failing to import) fails here.
"""
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def test_every_test_file_is_collected():
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, f"collection failed:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}"
    collected = {line.split("::", 1)[0] for line in done.stdout.splitlines() if "::" in line}
    on_disk = {str(p.relative_to(ROOT)) for p in TESTS.rglob("test_*.py")}
    missing = sorted(on_disk - collected)
    assert not missing, f"test files not collected: {missing}"
