"""README's table of the server's limits says what `anetts/serve/config.py` does: each row's default is
the constant the server uses, and each flag named is one `anetts serve` takes with that default."""
from __future__ import annotations

import re
from pathlib import Path

from anetts.serve import config as C

README = Path(__file__).resolve().parents[2] / "README.md"


def _rows() -> dict[str, tuple[str, str]]:
    text = README.read_text(encoding="utf-8")
    table = text[text.index("| limit | default | set with |"):]
    rows = {}
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        name, default, flag = (c.strip() for c in line.strip("|").split("|"))
        rows[name] = (default, flag)
    return rows


def _number(text: str) -> float:
    return float(re.match(r"[\d.]+", text).group())


def test_readme_states_the_servers_limits():
    rows = _rows()
    assert _number(rows["`input`"][0]) == C.MAX_INPUT_CHARS
    assert _number(rows["request body"][0]) * (1 << 20) == C.MAX_BODY_BYTES
    assert _number(rows["request time, waiting included"][0]) == C.TIMEOUT_S
    assert _number(rows["requests waiting for a worker"][0]) == C.QUEUE
    assert _number(rows["a request's head"][0]) == C.HEADER_TIMEOUT_S
    voice = rows["`voice` (a name, id or blend)"][0]
    assert voice == f"{C.MAX_VOICE_CHARS} characters, {C.MAX_BLEND_TERMS} voices per blend"
    assert _number(rows["`model`, `response_format`, a voice's `name`"][0]) == C.MAX_NAME_CHARS
    assert _number(rows["`instructions`"][0]) == C.MAX_INSTRUCTIONS_CHARS
    from anetts.models.kokoro.frontend import MAX_WORD_CHARS

    assert _number(rows["a word in `input` (Kokoro, languages with spaces)"][0]) == MAX_WORD_CHARS
    assert _number(rows["a reference clip's transcript (Fish)"][0]) == C.MAX_TRANSCRIPT_CHARS
    assert _number(rows["cloned voices per owner (Fish)"][0]) == C.MAX_VOICES
    assert _number(rows["the voice store, all owners (Fish)"][0]) * (1 << 20) == C.MAX_VOICE_BYTES
    assert _number(rows["inline references in one speech request (Fish)"][0]) == C.MAX_REFERENCES


def test_the_flags_named_have_those_defaults():
    from anetts.cli import _parser

    serve = _parser()._subparsers._group_actions[0].choices["serve"]
    defaults = {a.option_strings[0]: a.default for a in serve._actions if a.option_strings}
    flags = {"--max-input-chars": C.MAX_INPUT_CHARS, "--max-body-bytes": C.MAX_BODY_BYTES, "--timeout": C.TIMEOUT_S,
             "--queue": C.QUEUE, "--header-timeout": C.HEADER_TIMEOUT_S, "--max-voices": C.MAX_VOICES,
             "--max-voice-bytes": C.MAX_VOICE_BYTES}
    named = {re.match(r"`(--[\w-]+)`", flag).group(1) for _, flag in _rows().values() if flag}
    assert named == set(flags)
    assert {f: defaults[f] for f in flags} == flags
