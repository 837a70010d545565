"""The report as a person sees it: Debian's headless Chromium (driven by Playwright) loads it from
disk, every image decodes, every audio element loads its clip, every chart has drawn bars, nothing
is fetched from elsewhere; a full-page screenshot is kept beside the report."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from playwright.sync_api import sync_playwright

# Debian's package (installed by `make test`); ANETTS_CHROMIUM names another binary.
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium_binary() -> str:
    env = os.environ.get("ANETTS_CHROMIUM")
    if env:
        return env
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    raise AssertionError(f"no Chromium found (tried {CANDIDATES} and $ANETTS_CHROMIUM); `make test` installs "
                         "Debian's chromium (apt-get install chromium)")


CHECK = """() => {
  const imgs = [...document.images].map(i => ({alt: i.alt, ok: i.complete && i.naturalWidth > 0,
                                               w: i.getBoundingClientRect().width}));
  const audio = [...document.querySelectorAll('audio')].map(a => ({id: a.dataset.audio, state: a.readyState,
                                                                  error: a.error && a.error.code, duration: a.duration}));
  const charts = [...document.querySelectorAll('svg.chart')].map(s => ({fig: s.dataset.figure,
      bars: [...s.querySelectorAll('rect.bar')].filter(r => r.getBBox().width > 0).length,
      w: s.getBoundingClientRect().width}));
  return {imgs, audio, charts, title: document.title};
}"""


def test_report_renders_in_headless_chromium(built_workflow):
    report = Path(built_workflow) / "artifacts" / "kokoro-tiny" / "report.html"
    shot = report.with_suffix(".png")
    requests = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_binary(), args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("request", lambda r: requests.append(r.url))
            page.goto(report.as_uri(), wait_until="load")
            page.wait_for_function("() => [...document.querySelectorAll('audio')]"
                                   ".every(a => a.readyState >= 1 || a.error)", timeout=30_000)
            seen = page.evaluate(CHECK)
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert seen["title"] == "ane-tts report: kokoro-tiny"
    assert seen["imgs"] and all(i["ok"] and i["w"] > 100 for i in seen["imgs"]), seen["imgs"]
    assert len(seen["audio"]) == 2
    for a in seen["audio"]:
        assert a["error"] is None and a["state"] >= 1 and 0 < a["duration"] <= 3.0, a
    figs = {c["fig"]: c for c in seen["charts"]}
    assert {"parity-snr", "bundle-parity-snr", "build-wall"} <= set(figs)
    assert all(c["bars"] > 0 for c in seen["charts"]), [c for c in seen["charts"] if not c["bars"]]
    assert figs["parity-snr"]["bars"] == 4
    elsewhere = [u for u in requests if not (u.startswith("file:") or u.startswith("data:"))]
    assert not elsewhere, elsewhere
    assert shot.stat().st_size > 20_000 and shot.read_bytes().startswith(b"\x89PNG")
