"""parse_size / format_size / format_rate (wanxport.units)."""

import pytest

from wanxport.units import format_rate, format_size, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1GiB", 1 << 30),
        ("512 MiB", 512 << 20),
        ("10MB", 10_000_000),
        ("1500", 1500),
        (1500, 1500),
        ("1.5GiB", 3 << 29),
        ("2TiB", 2 << 40),
        ("1.1TB", 1_100_000_000_000),
        ("7B", 7),
        ("3 KB", 3000),
        ("0.5KiB", 512),
    ],
)
def test_parse_size_accepts(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("1gb", "valid units: B, KB"),
        ("1 GB/s", "cannot parse"),
        ("", "cannot parse"),
        ("-1", "cannot parse"),
        (-1, ">= 0"),
        ("1.5B", "whole number"),
        (True, "integer or a string"),
    ],
)
def test_parse_size_rejects_with_clear_message(text: str | int, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment) as info:
        parse_size(text)
    assert "\n" not in str(info.value)


def test_format_size_and_rate() -> None:
    assert format_size(100) == "100 B"
    assert format_size(1536) == "1.50 KiB"
    assert format_size(3 << 30) == "3.00 GiB"
    assert format_size(2 << 40) == "2.00 TiB"
    assert format_rate(2.5e8) == "250.0 Mb/s"
    assert format_rate(1e10) == "10.0 Gb/s"
    assert format_rate(12) == "12 b/s"
