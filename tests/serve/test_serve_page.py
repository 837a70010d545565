"""The server's page in Debian's headless Chromium (Playwright, as the report's browser test): it lists
the voices from the API, sends the chosen voice and speed, plays the SSE stream chunk by chunk as it
arrives, every sample of it, and highlights each word as the audio clock reaches it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from anetts.runtime.captions import spoken
from serve_helpers import live_server

TEXT = "The sun is out. We walk. Birds sing."


@pytest.fixture(scope="module")
def model_dir(built_workflow) -> Path:
    return Path(built_workflow) / "artifacts" / "kokoro-tiny"


def test_page_speaks_while_it_streams(model_dir):
    from anetts.loader import load

    from report.test_report_browser import chromium_binary  # the report test's Chromium lookup

    tts = load(model_dir, backend="torch", threads=1)
    chunks = list(tts.stream(TEXT, voice="syn_b", speed=1.25, sentences=True))
    want = [c.audio.size for c in chunks]
    sent = []
    with live_server([tts], model_dir) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_binary(),
                                    args=["--no-sandbox", "--disable-gpu", "--autoplay-policy=no-user-gesture-required"])
        try:
            page = browser.new_page()
            page.on("request", lambda r: sent.append(r.post_data) if r.url.endswith("/v1/audio/speech") else None)
            page.goto(url, wait_until="load")
            page.wait_for_function("() => document.querySelectorAll('#voice option').length === 2", timeout=30_000)
            assert page.eval_on_selector_all("#voice option", "os => os.map(o => o.value)") == ["syn_a", "syn_b"]
            page.select_option("#voice", "syn_b")
            page.fill("#text", TEXT)
            page.eval_on_selector("#speed", "e => { e.value = '1.25'; e.dispatchEvent(new Event('input')); }")
            page.click("#speak")
            page.wait_for_function("() => window.anettsPlayer.done || window.anettsPlayer.error", timeout=120_000)
            # words light up as the audio clock passes them
            page.wait_for_function("() => window.anettsPlayer.highlighted > 0 || window.anettsPlayer.error",
                                   timeout=30_000)
            player = page.evaluate("() => window.anettsPlayer")
            status = page.text_content("#status")
        finally:
            browser.close()
    assert player["error"] is None, player
    body = json.loads(sent[0])
    assert body["voice"] == "syn_b" and body["speed"] == 1.25 and body["stream_format"] == "sse"
    assert player["chunks"] == len(want) >= 3  # one scheduled buffer per sentence chunk, as it came
    assert player["samples"] == sum(want) and player["firstAudioMs"] is not None
    assert status.startswith("spoke ")
    assert player["words"] == sum(len(spoken(c.words)) for c in chunks) > 0 and player["highlighted"] > 0
