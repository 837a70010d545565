"""Cloned voices kept, owned and capped (issue #42): the voice store's files (atomic, checksummed,
refused by name when bad), a server restarted over its --voice-dir, two API keys that cannot see each
other's voices, the caps as 4xx naming them, and inline references equal to registered ones. Real
uvicorn on loopback, the real `openai` client where it has the call, httpx where it does not."""
from __future__ import annotations

import base64
import io
import logging

import httpx
import numpy as np
import pytest
import soundfile as sf
from serve_helpers import live_server, openai_client

from anetts.runtime.speech import Reference
from anetts.serve.voices import (
    SUFFIX,
    StoredVoice,
    StoreFull,
    VoiceStore,
    decode_voice,
    encode_voice,
    new_id,
)

MODEL = "fish-tiny"
FRAMES = 6
KEY_A, KEY_B = "key-a-0123456789", "key-b-0123456789"


@pytest.fixture(scope="module")
def tts(model_dir):
    import anetts

    return anetts.load(model_dir, backend="torch", threads=1)


@pytest.fixture(scope="module")
def clip(reference_clip):
    return reference_clip[0]


def _voice(i: int, owner: str | None = None) -> StoredVoice:
    codes = np.random.default_rng(i).integers(0, 1024, size=(10, 7 + i)).astype(np.int64)
    return StoredVoice(new_id(), f"v{i} ünïcode", Reference(f"Transcript {i}.", codes), 1_700_000_000 + i, owner,
                       "consent note" if i % 2 else None)


def _same(a: StoredVoice, b: StoredVoice) -> bool:
    return (a.id, a.name, a.owner, a.created_at, a.consent, a.reference.text) == (
        b.id, b.name, b.owner, b.created_at, b.consent, b.reference.text) and \
        a.reference.codes.dtype == b.reference.codes.dtype and a.reference.codes.tobytes() == b.reference.codes.tobytes()


# ------------------------------------------------------------------------------------ the store alone

def test_fifty_voices_come_back_byte_equal_and_bad_files_are_refused_by_name(tmp_path, caplog):
    store = VoiceStore(tmp_path, max_per_owner=100)
    made = [store.add(_voice(i, owner="key_a" if i % 3 else None)) for i in range(50)]
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert sorted(files) == sorted(f"{v.id}{SUFFIX}" for v in made)  # one file per voice, no temporaries
    assert all(p.stat().st_mode & 0o077 == 0 for p in tmp_path.iterdir())  # the server's user's only
    again = VoiceStore(tmp_path, max_per_owner=100)
    assert len(again) == 50 and not again.refused
    for v in made:
        assert _same(again.get(v.id, v.owner), v)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files  # loading rewrites nothing

    truncated, corrupt, foreign, renamed = (tmp_path / f"{v.id}{SUFFIX}" for v in made[:4])
    truncated.write_bytes(files[truncated.name][:-10])
    data = bytearray(files[corrupt.name])
    data[-3] ^= 1
    corrupt.write_bytes(bytes(data))
    foreign.write_bytes(b"RIFF....WAVEfmt " + b"\0" * 64)
    renamed.write_bytes(files[made[4].id + SUFFIX])  # a good voice under another voice's name
    stray = tmp_path / "notes.txt"
    stray.write_text("mine")
    caplog.set_level(logging.WARNING, "anetts.serve")
    third = VoiceStore(tmp_path, max_per_owner=100)
    assert len(third) == 46 and len(third.refused) == 5 and stray.read_text() == "mine"
    warned = "\n".join(r.getMessage() for r in caplog.records)
    for p, why in ((truncated, "truncated"), (corrupt, "sha256"), (foreign, "not an ane-tts voice file"),
                   (renamed, "not the one its name says"), (stray, "not a voice file's name")):
        assert any(p.name in r and why in r for r in third.refused), (p.name, third.refused)
        assert p.name in warned
    assert all(_same(third.get(v.id, v.owner), v) for v in made[4:])


def test_owners_delete_and_caps_in_the_store(tmp_path):
    store = VoiceStore(tmp_path, max_per_owner=2, max_bytes=10_000)
    a = store.add(_voice(0, "key_a"))
    assert store.get(a.id, "key_b") is None and store.get(a.id, None) is None and store.list("key_b") == []
    assert store.get(a.name, "key_a") == a and not store.delete(a.id, "key_b")
    store.add(_voice(1, "key_a"))
    with pytest.raises(StoreFull, match="--max-voices 2") as e:
        store.add(_voice(2, "key_a"))
    assert e.value.cap == "max_voices"
    store.add(_voice(3, "key_b"))  # another owner has its own room
    big = StoredVoice(new_id(), "big", Reference("x", np.zeros((10, 1000), np.int64)), 0, "key_c")
    with pytest.raises(StoreFull, match="--max-voice-bytes 10000") as e:
        store.add(big)
    assert e.value.cap == "max_voice_bytes" and not (tmp_path / f"{big.id}{SUFFIX}").exists()
    assert store.delete(a.id, "key_a") and not (tmp_path / f"{a.id}{SUFFIX}").exists()
    assert store.get(a.id, "key_a") is None and len(list(tmp_path.iterdir())) == 2
    assert decode_voice(encode_voice(big), "x").reference.codes.shape == (10, 1000)


# ------------------------------------------------------------------------------------ the server

def _register(client, clip: bytes, name: str):
    return client.audio.voices.create(audio_sample=("ref.wav", clip, "audio/wav"), name=name, consent="said yes",
                                      extra_body={"text": "A reference."})


def _speak(url: str, key: str | None = None, **body) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{url}/v1/audio/speech", headers=headers, timeout=120,
                      json={"model": MODEL, "input": "Hi.", "response_format": "pcm", "seed": 3, **body})


def test_voices_survive_a_restart_and_a_truncated_file_is_refused(tts, model_dir, clip, tmp_path, caplog):
    voice_dir = tmp_path / "voices"
    with live_server([tts], model_dir, max_frames=FRAMES, voice_dir=voice_dir) as url:
        client = openai_client(url)
        made = [_register(client, clip, f"v{i}") for i in range(3)]
        spoken = {v.id: _speak(url, voice=v.id).content for v in made}
        listed = httpx.get(f"{url}/v1/audio/voices").json()
    files = {p.name: p.read_bytes() for p in voice_dir.iterdir()}
    assert sorted(files) == sorted(f"{v.id}{SUFFIX}" for v in made)
    kept = decode_voice(files[f"{made[0].id}{SUFFIX}"], "x")
    assert kept.consent == "said yes" and kept.owner is None and kept.reference.text == "A reference."

    with live_server([tts], model_dir, max_frames=FRAMES, voice_dir=voice_dir) as url:
        assert httpx.get(f"{url}/v1/audio/voices").json()["data"] == listed["data"]
        for v in made:
            assert httpx.get(f"{url}/v1/audio/voices/{v.id}").json() == {
                "id": v.id, "object": "audio.voice", "name": v.name, "created_at": v.created_at}
            assert _speak(url, voice=v.id).content == spoken[v.id]  # the same codes: the same speech
    assert {p.name: p.read_bytes() for p in voice_dir.iterdir()} == files

    bad = voice_dir / f"{made[1].id}{SUFFIX}"
    bad.write_bytes(files[bad.name][: len(files[bad.name]) // 2])
    caplog.set_level(logging.WARNING, "anetts.serve")
    with live_server([tts], model_dir, max_frames=FRAMES, voice_dir=voice_dir) as url:
        ids = [d["id"] for d in httpx.get(f"{url}/v1/audio/voices").json()["data"]]
        assert ids == [made[0].id, made[2].id] or sorted(ids) == sorted([made[0].id, made[2].id])
        assert _speak(url, voice=made[2].id).content == spoken[made[2].id]
    assert any(bad.name in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)


def test_a_server_without_a_voice_dir_or_keys_says_so(tts, model_dir, caplog):
    caplog.set_level(logging.WARNING, "anetts.serve")
    with live_server([tts], model_dir, max_frames=FRAMES):
        pass
    said = "\n".join(r.getMessage() for r in caplog.records)
    assert "in memory only" in said and "single-user" in said


def test_one_key_cannot_see_use_get_or_delete_anothers_voice(tts, model_dir, clip, tmp_path):
    voice_dir = tmp_path / "voices"
    with live_server([tts], model_dir, max_frames=FRAMES, voice_dir=voice_dir, api_keys=(KEY_A, KEY_B)) as url:
        a, b = openai_client(url, api_key=KEY_A), openai_client(url, api_key=KEY_B)
        va = _register(a, clip, "mine")
        hb = {"Authorization": f"Bearer {KEY_B}"}
        ha = {"Authorization": f"Bearer {KEY_A}"}
        assert va.id not in httpx.get(f"{url}/v1/audio/voices", headers=hb).json()["voices"]
        assert httpx.get(f"{url}/v1/audio/voices", headers=hb).json()["data"] == []
        assert [d["id"] for d in httpx.get(f"{url}/v1/audio/voices", headers=ha).json()["data"]] == [va.id]
        for voice in (va.id, "mine", {"id": va.id}):
            r = _speak(url, KEY_B, voice=voice)
            assert r.status_code == 400 and r.json()["error"]["param"] == "voice", r.text
        assert _speak(url, KEY_A, voice=va.id).status_code == 200
        r = httpx.get(f"{url}/v1/audio/voices/{va.id}", headers=hb)
        assert r.status_code == 404 and r.json()["error"]["code"] == "voice_not_found", r.text
        r = httpx.delete(f"{url}/v1/audio/voices/{va.id}", headers=hb)
        assert r.status_code == 404, r.text
        assert (voice_dir / f"{va.id}{SUFFIX}").is_file()
        assert httpx.get(f"{url}/v1/audio/voices/{va.id}", headers=ha).json()["name"] == "mine"
        # the file records an owner id, never the key
        raw = (voice_dir / f"{va.id}{SUFFIX}").read_bytes()
        assert KEY_A.encode() not in raw and decode_voice(raw, "x").owner.startswith("key_")
        vb = _register(b, clip, "mine")  # the same name under another key is another voice
        assert _speak(url, KEY_B, voice="mine").status_code == 200
        r = httpx.delete(f"{url}/v1/audio/voices/{va.id}", headers=ha)
        assert r.json() == {"id": va.id, "object": "audio.voice", "deleted": True}, r.text
        assert sorted(p.name for p in voice_dir.iterdir()) == [f"{vb.id}{SUFFIX}"]  # nothing of va remains
        assert httpx.get(f"{url}/v1/audio/voices/{va.id}", headers=ha).status_code == 404
        assert httpx.delete(f"{url}/v1/audio/voices/{va.id}", headers=ha).status_code == 404


def test_caps_are_4xx_naming_the_cap(tts, model_dir, clip, tmp_path):
    with live_server([tts], model_dir, max_frames=FRAMES, voice_dir=tmp_path / "a", max_voices=2) as url:
        client = openai_client(url)
        for i in range(2):
            _register(client, clip, f"v{i}")
        r = httpx.post(f"{url}/v1/audio/voices", files={"audio_sample": ("ref.wav", clip, "audio/wav")},
                       data={"name": "v2", "text": "A reference."})
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_voices", r.text
        assert "--max-voices 2" in r.json()["error"]["message"]
        assert len(list((tmp_path / "a").iterdir())) == 2
    with live_server([tts], model_dir, max_frames=FRAMES, voice_dir=tmp_path / "b", max_voice_bytes=100) as url:
        r = httpx.post(f"{url}/v1/audio/voices", files={"audio_sample": ("ref.wav", clip, "audio/wav")},
                       data={"name": "v", "text": "A reference."}, timeout=120)
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_voice_bytes", r.text
        assert "--max-voice-bytes 100" in r.json()["error"]["message"]
        assert list((tmp_path / "b").iterdir()) == []


def test_inline_references_speak_as_the_registered_clip_and_keep_nothing(tts, model_dir, clip, tmp_path):
    voice_dir = tmp_path / "voices"
    audio = base64.b64encode(clip).decode()
    with live_server([tts], model_dir, max_frames=FRAMES, voice_dir=voice_dir) as url:
        v = _register(openai_client(url), clip, "me")
        want = _speak(url, voice=v.id)
        assert want.status_code == 200 and len(want.content) > 0
        fish = _speak(url, references=[{"audio": audio, "text": "A reference."}])
        ours = _speak(url, ref_audio=audio, ref_text="A reference.", voice="default")
        assert fish.status_code == ours.status_code == 200, (fish.text, ours.text)
        assert fish.content == want.content and ours.content == want.content
        assert _speak(url, voice="default").content != want.content  # the reference matters
        with httpx.stream("POST", f"{url}/v1/audio/speech", timeout=120, json={
                "model": MODEL, "input": "Hi.", "response_format": "pcm", "seed": 3, "stream_format": "audio",
                "references": [{"audio": audio, "text": "A reference."}]}) as r:
            assert r.status_code == 200 and r.read() == want.content
        assert [p.name for p in voice_dir.iterdir()] == [f"{v.id}{SUFFIX}"]
        assert [d["id"] for d in httpx.get(f"{url}/v1/audio/voices").json()["data"]] == [v.id]

        for body, param, says in (
                ({"references": [{"audio": "%%%", "text": "A reference."}]}, "references", "base64"),
                ({"references": [{"audio": base64.b64encode(b"not audio").decode(), "text": "A."}]}, "references",
                 "not audio"),
                ({"ref_audio": audio}, "ref_text", "ref_text"),
                ({"ref_audio": audio, "ref_text": " "}, "ref_text", "empty"),
                ({"references": [{"audio": audio, "text": "A."}] * 2}, "references", "at most 1"),
                ({"references": [{"audio": audio, "text": "A."}], "voice": v.id}, "voice", "give one"),
                ({"ref_audio": audio, "ref_text": "A.", "references": [{"audio": audio, "text": "A."}]}, "references",
                 "both"),
                ({}, "voice", "required")):
            r = _speak(url, **body)
            assert r.status_code == 400, (body, r.text)
            err = r.json()["error"]
            assert err["param"] == param and says in err["message"], (body, err)
        long = np.zeros(tts.max_reference_samples + 1, np.float32)
        buf = io.BytesIO()
        sf.write(buf, long, 44100, format="WAV")
        r = _speak(url, ref_audio=base64.b64encode(buf.getvalue()).decode(), ref_text="A reference.")
        assert r.status_code == 400 and r.json()["error"]["param"] == "ref_audio", r.text
        assert "2.97 s" in r.json()["error"]["message"]


def test_the_cli_adds_lists_and_deletes_voices_on_a_running_server(tts, model_dir, clip, tmp_path, capsys):
    from anetts.cli import main

    (tmp_path / "a.keys").write_text(f"{KEY_A}\n")
    (tmp_path / "b.keys").write_text(f"{KEY_B}\n")
    (tmp_path / "ref.wav").write_bytes(clip)
    voice_dir = tmp_path / "voices"
    with live_server([tts], model_dir, max_frames=FRAMES, voice_dir=voice_dir, api_keys=(KEY_A, KEY_B)) as url:
        a, b = ("--url", url, "--api-key-file", str(tmp_path / "a.keys")), ("--url", url, "--api-key-file",
                                                                          str(tmp_path / "b.keys"))
        assert main(["voices", "add", str(tmp_path / "ref.wav"), "--name", "cli voice", "--text", "A reference.",
                     "--consent", "yes", *a]) == 0
        voice_id = capsys.readouterr().out.split("\t")[0]
        assert voice_id.startswith("voice_") and (voice_dir / f"{voice_id}{SUFFIX}").is_file()
        assert main(["voices", "list", *a]) == 0
        out = capsys.readouterr().out
        assert f"{voice_id}\tcli voice\t" in out and "default\t(built)" in out
        assert main(["voices", "list", *b]) == 0 and voice_id not in capsys.readouterr().out
        assert main(["voices", "delete", voice_id, *b]) == 1 and "404" in capsys.readouterr().err
        assert main(["voices", "list", "--url", url]) == 1 and "401" in capsys.readouterr().err
        assert main(["voices", "delete", voice_id, *a]) == 0 and f"deleted {voice_id}" in capsys.readouterr().out
        assert list(voice_dir.iterdir()) == []


def test_the_page_lists_adds_and_deletes_voices(tts, model_dir, clip, tmp_path):
    from playwright.sync_api import sync_playwright
    from report.test_report_browser import (
        chromium_binary,  # the report test's Chromium lookup
    )

    (tmp_path / "ref.wav").write_bytes(clip)
    voice_dir = tmp_path / "voices"
    with live_server([tts], model_dir, max_frames=FRAMES, voice_dir=voice_dir) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_binary(), args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page()
            page.goto(url, wait_until="load")
            page.wait_for_function("() => document.querySelector('#status').textContent === 'ready'", timeout=30_000)
            assert page.is_visible("#cloning") and page.eval_on_selector_all("#cloned li", "ls => ls.length") == 0
            page.set_input_files("#clip", str(tmp_path / "ref.wav"))
            page.fill("#cloneName", "page voice")
            page.fill("#cloneText", "A reference.")
            page.fill("#consent", "mine")
            page.click("#register")
            page.wait_for_function("() => document.querySelectorAll('#cloned li').length === 1", timeout=60_000)
            voice_id = page.get_attribute("#cloned li", "data-id")
            assert (voice_dir / f"{voice_id}{SUFFIX}").is_file()
            assert decode_voice((voice_dir / f"{voice_id}{SUFFIX}").read_bytes(), "x").consent == "mine"
            options = page.eval_on_selector_all("#voice option", "os => os.map(o => [o.value, o.text])")
            assert options == [["default", "default"], [voice_id, "page voice"]]
            page.click("#cloned li button")
            page.wait_for_function("() => document.querySelectorAll('#cloned li').length === 0", timeout=30_000)
            assert page.text_content("#status") == "deleted page voice"
        finally:
            browser.close()
    assert list(voice_dir.iterdir()) == []


def test_a_foreign_page_cannot_delete_and_odd_ids_are_not_found(tts, model_dir, clip, tmp_path):
    voice_dir = tmp_path / "voices"
    (tmp_path / "outside.voice").write_text("keep me")
    with live_server([tts], model_dir, max_frames=FRAMES, voice_dir=voice_dir) as url:
        v = _register(openai_client(url), clip, "me")
        r = httpx.delete(f"{url}/v1/audio/voices/{v.id}", headers={"Origin": "http://evil.example"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed", r.text
        for odd in ("..%2Foutside", "..%2F..%2Foutside.voice", "me", "voice_" + "0" * 16, v.id.upper()):
            assert httpx.delete(f"{url}/v1/audio/voices/{odd}").status_code == 404, odd
            assert httpx.get(f"{url}/v1/audio/voices/{odd}").status_code in (404,), odd
        assert (voice_dir / f"{v.id}{SUFFIX}").is_file() and (tmp_path / "outside.voice").read_text() == "keep me"
