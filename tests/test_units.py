"""The one byte formatter (report, publish card, inspect CLI): binary units, labelled as such; the one
count formatter (MACs: inspect CLI, report): decimal units, 3 significant digits."""
from anetts.units import format_bytes, format_count


def test_format_bytes_uses_binary_units_and_marks_missing():
    assert format_bytes(None) == "—"
    assert format_bytes(0) == "0 B"
    assert format_bytes(1023) == "1023 B"
    assert format_bytes(1024) == "1.0 KiB"
    assert format_bytes(3_840_000) == "3.7 MiB"
    assert format_bytes(5 * 1024**4) == "5120.0 GiB"  # GiB is the largest unit
    assert format_bytes(-2048) == "-2.0 KiB"


def test_format_count_uses_decimal_units_and_three_digits():
    assert format_count(None) == "—"
    assert format_count(0) == "0"
    assert format_count(999) == "999"
    assert format_count(1000) == "1.00 k"
    assert format_count(25_136) == "25.1 k"
    assert format_count(999_999) == "1.00 M"  # rounds into the next unit, never "1000 k"
    assert format_count(1.25e9) == "1.25 G"
    assert format_count(2.5e15) == "2500 T"  # T is the largest unit
    assert format_count(-2e6) == "-2.00 M"
