"""The one byte formatter (report, publish card, inspect CLI): binary units, labelled as such."""
from anetts.units import format_bytes


def test_format_bytes_uses_binary_units_and_marks_missing():
    assert format_bytes(None) == "—"
    assert format_bytes(0) == "0 B"
    assert format_bytes(1023) == "1023 B"
    assert format_bytes(1024) == "1.0 KiB"
    assert format_bytes(3_840_000) == "3.7 MiB"
    assert format_bytes(5 * 1024**4) == "5120.0 GiB"  # GiB is the largest unit
    assert format_bytes(-2048) == "-2.0 KiB"
