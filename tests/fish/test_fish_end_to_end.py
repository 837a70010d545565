"""The Fish end-to-end gate (rule end_to_end): the runtime over the compiled packages against upstream
greedy generation. The build records a passed verdict in its manifest; the same gate fails the
runtime's loop with a decode position off by one, a KV state not carried between calls, or the fast
AR's state reset at every pass (each on its logits' SNR); a recorded near-tie passes only within
its gap in units of its step's logit noise."""
from __future__ import annotations

import json

import pytest

from anetts.models.fish.end_to_end import check_end_to_end, gate_rows

FAULT_PARAMS = {"texts": ["Hello there."], "max_frames": 8}


@pytest.fixture(scope="module")
def gate():
    from fish_helpers import fish_config

    return fish_config()["families"]["fish"]["end_to_end"]["gate"]


@pytest.fixture(scope="module")
def report(model_dir) -> dict:
    manifest = json.loads((model_dir / "manifest.json").read_text())
    [verdict] = manifest["end_to_end"]
    assert verdict["passed"], verdict
    return json.loads((model_dir / verdict["report"]).read_text())


@pytest.fixture(scope="module")
def tts(model_dir):
    import anetts

    return anetts.load(model_dir, backend="mil", threads=1)


def test_the_build_records_a_passed_end_to_end_verdict(report, gate):
    assert report["passed"] and report["backend"] == "mil" and report["gate"] == gate
    assert set(report["checks"]) == {"codes_equal", "logits_db", "slow_hidden_db", "audio_snr_db"}
    peaks = report["peak_rss_mib"]  # the process's peak after each phase: monotone, so it says where it rose
    assert list(peaks) == ["upstream_generation", "runtime_decode", "audio"] and list(peaks.values()) == sorted(peaks.values())
    for row in report["texts"]:
        print({k: row[k] for k in ("text", "frames", "frames_all_codes_equal", "max_divergence_gap",
                                   "slow_hidden_min_db", "audio_snr_db")})
        assert row["frames"] >= 8 and row["codes_fed_equal"]
        assert row["frames"] == row["budget"] or row["upstream_stop"] == "im_end"
        assert all(0 <= d["upstream_gap"] and d["gap_in_noise"] <= gate["max_tie_noise"] for d in row["divergences"])
        assert min(row["head_logits_min_db"], row["fast_logits_min_db"]) >= gate["min_logits_db"]
        assert row["slow_hidden_min_db"] >= gate["min_slow_hidden_db"]
        assert row["audio_snr_db"] >= gate["min_audio_snr_db"] and row["audio_samples"] == row["frames"] * 2048


def test_a_near_tie_passes_only_within_its_gap_in_noise_units(report):
    rows = report["texts"]
    divergences = [d for r in rows for d in r["divergences"]]
    assert divergences, "expected fp16 to flip a near-tie on fish-tiny's flat logits (measured: 3 picks of 960)"
    for d in divergences:  # the gap in noise units is the gap over the step's logit noise
        assert d["logit_noise"] > 0 and d["gap_in_noise"] == pytest.approx(d["upstream_gap"] / d["logit_noise"])
    widest = max(d["gap_in_noise"] for d in divergences)
    assert gate_rows(rows, {"max_tie_noise": widest})["codes_equal"]
    assert not gate_rows(rows, {"max_tie_noise": widest * 0.999})["codes_equal"]
    assert not gate_rows(rows, {})["codes_equal"]  # no tie set: no divergence allowed


class _Fault:
    """A stage package with one fault injected between the decode loop and the package."""

    def __init__(self, program, fault: str):
        self.program, self.fault = program, fault

    def __getattr__(self, name):  # functions, default_function: the package's own
        return getattr(self.program, name)

    def new_state(self):
        return self.program.new_state()

    def run(self, function, inputs, state=None):
        slow = "hidden" in inputs and "code" not in inputs and "pos" in inputs
        if self.fault == "position_off_by_one" and slow and function == "decode":
            inputs = {**inputs, "pos": inputs["pos"] + 1}
        if self.fault == "state_not_carried" and slow and function == "decode":
            state = self.program.new_state()
        if self.fault == "fast_state_reset_per_pass" and "code" in inputs:
            state = self.program.new_state()
        return self.program.run(function, inputs, state)


@pytest.fixture
def faulty(tts):
    program = tts.decoder.program

    def inject(fault: str):
        tts.decoder.program = lambda stage: _Fault(program(stage), fault)
        if fault == "fast_state_reset_per_pass":  # a state reset between passes needs the stepped passes
            tts.decoder.fast_function = "decode"

    yield inject
    tts.decoder.program, tts.decoder.fast_function = program, None


def test_unload_drops_a_stages_programs_and_the_next_call_loads_them_again(tts):
    """What the check does before its audio phase (the AR packages are not needed for it)."""
    backend = tts.backend
    last = tts.chunk_stages[-1]
    head, fast = backend.program(last, tts.bucket), backend.program("fast_ar", tts.fast_bucket)
    backend.unload([last])
    assert backend.program("fast_ar", tts.fast_bucket) is fast  # another stage's program stays loaded
    again = backend.program(last, tts.bucket)
    assert again is not head and backend.program(last, tts.bucket) is again


def test_the_gate_passes_the_runtime_as_built(tts, model_dir, gate):
    """The baseline of the fault tests below: the same text and frames pass."""
    r = check_end_to_end(tts, model_dir / "weights", FAULT_PARAMS, gate)
    assert r["passed"], r["checks"]


@pytest.mark.parametrize("fault", ["position_off_by_one", "state_not_carried", "fast_state_reset_per_pass"])
def test_the_gate_fails_a_wrong_decode_loop(tts, model_dir, gate, faulty, fault):
    faulty(fault)
    r = check_end_to_end(tts, model_dir / "weights", FAULT_PARAMS, gate)
    print(fault, r["checks"], r["worst"])
    # a wrong loop's logits are far from upstream's (measured on fish-tiny: 15.1, -3.5 and -3.2 dB
    # against >= 47 dB as built); its flips then look like ties of that much noise, so it is the
    # logits' SNR, not the codes, that fails it
    assert not r["passed"] and not r["checks"]["logits_db"]
    assert r["worst"]["logits_db"] < gate["min_logits_db"]


@pytest.mark.parametrize("params, message", [
    ({}, "no texts"),
    ({"texts": ["Hi."], "seed": 0}, r"unknown settings \['seed'\]"),
])
def test_bad_settings_are_named(tts, model_dir, params, message):
    with pytest.raises(ValueError, match=message):
        check_end_to_end(tts, model_dir / "weights", params, {})


def test_unknown_gate_keys_are_named():
    with pytest.raises(ValueError, match=r"unknown keys \['durations_equal'\]"):
        gate_rows([], {"durations_equal": True})
