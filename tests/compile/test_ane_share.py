"""The ANE-eligible share (anetts.compile.ane_share) and Kokoro's audio seconds per bucket."""
from __future__ import annotations

import pytest

from anetts.compile.ane_share import ane_share, one_call_macs, why_not_eligible
from anetts.models.kokoro.runtime import SAMPLE_RATE, SAMPLES_PER_FRAME, TOKENS_PER_SECOND
from anetts.models.kokoro.share import audio_seconds

FP32 = {"rule": "fp32_compute", "severity": "warn", "count": 3}
LSTM = {"rule": "ane_unfriendly_ops", "severity": "warn", "count": 2, "op_type": "lstm"}
EXP = {"rule": "ane_unfriendly_ops", "severity": "info", "count": 1, "op_type": "exp"}


def _pkg(stage, bucket, frames, macs, units="CPU_AND_NE", precision="fp16", lint=()):
    return {"stage": stage, "bucket": bucket, "geometry": {"frames": frames}, "compute_units": units,
            "precision": precision, "lint": list(lint), "macs": macs}


def test_why_not_eligible_names_every_failed_condition():
    assert why_not_eligible("CPU_AND_NE", "fp16", []) == []
    assert why_not_eligible("CPU_AND_NE", "fp16", [EXP]) == []  # an info finding is a note, not a rule broken
    assert why_not_eligible("CPU_AND_GPU", "fp32", [LSTM, FP32, EXP]) == [
        "compute units CPU_AND_GPU", "precision fp32", "lint ane_unfriendly_ops (lstm) x2", "lint fp32_compute x3"]
    assert why_not_eligible("CPU_AND_NE", "fp16", [FP32]) == ["lint fp32_compute x3"]


def test_share_takes_each_stage_at_its_largest_bucket():
    pkgs = [_pkg("a", "3s", 120, 300), _pkg("a", "30s", 1200, 3600),  # 100 and 120 MAC/s: 30s counts
            _pkg("b", "3s", 120, 600, units="CPU_AND_GPU"), _pkg("b", "30s", 1200, 6000, units="CPU_AND_GPU"),
            _pkg("c", "3s", 120, 90, lint=[LSTM]), _pkg("c", "30s", 1200, 900, lint=[FP32]),  # any bad bucket spoils c
            _pkg("d", "3s", 120, 30, lint=[{**FP32, "count": 9}]), _pkg("d", "30s", 1200, 300, lint=[FP32])]
    share = ane_share(pkgs, audio_seconds)
    st = {s["stage"]: s for s in share["stages"]}
    assert {s: (x["bucket"], x["audio_seconds"], x["macs_per_second"]) for s, x in st.items()} == {
        "a": ("30s", 30.0, 120.0), "b": ("30s", 30.0, 200.0), "c": ("30s", 30.0, 30.0), "d": ("30s", 30.0, 10.0)}
    assert st["a"]["by_bucket"] == {"3s": 100.0, "30s": 120.0}
    assert [st[s]["eligible"] for s in "abcd"] == [True, False, False, False]
    assert st["b"]["why_not"] == ["compute units CPU_AND_GPU"]
    # the counted bucket's reasons with its counts, then those of other buckets, named
    assert st["c"]["why_not"] == ["lint fp32_compute x3", "lint ane_unfriendly_ops (lstm) x2 (at 3s)"]
    assert st["d"]["why_not"] == ["lint fp32_compute x3"]
    assert share["macs_per_second"] == 360.0 and share["eligible_macs_per_second"] == 120.0
    assert share["share"] == pytest.approx(120 / 360)
    assert sum(s["share_of_total"] for s in share["stages"]) == pytest.approx(1.0)


def test_share_is_undefined_without_the_macs_of_every_package():
    share = ane_share([_pkg("a", "3s", 120, 300), _pkg("a", "7s", 280, None)], audio_seconds)
    assert share["share"] is None and "a/7s" in share["undefined"]
    assert one_call_macs(None) is None
    assert one_call_macs({"prefill": {"total": 5}, "decode": {"total": 1}}) is None  # not a bucket of audio
    assert one_call_macs({"main": {"total": 5, "by_op": {"conv": 5}}}) == 5


def test_kokoro_audio_seconds_come_from_the_runtimes_constants():
    assert audio_seconds("generator", {"seconds": 3, "frames": 120}) == 120 * SAMPLES_PER_FRAME / SAMPLE_RATE == 3.0
    assert audio_seconds("duration", {"tokens": 64}) == 64 / TOKENS_PER_SECOND
    with pytest.raises(ValueError, match="neither frames nor tokens"):
        audio_seconds("x", {"context": 320})


def test_the_manifest_defines_the_share_only_for_families_that_say_their_audio_seconds():
    from anetts.compile.manifest import _ane_share

    fish = _ane_share("fish", [{**_pkg("codec", "f8", 8, 10), "geometry": {"frames": 8}}])
    assert fish["share"] is None and "family fish declares no audio seconds" in fish["undefined"]
    kokoro = _ane_share("kokoro", [_pkg("decoder_pre", "3s", 120, 300), _pkg("generator", "3s", 120, 900,
                                                                             units="CPU_AND_GPU")])
    assert kokoro["share"] == pytest.approx(0.25)
