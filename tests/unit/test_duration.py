from datetime import timedelta

import pytest

from api.duration import DurationError, format_duration, parse_duration, parse_optional_duration


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("720h", timedelta(hours=720)),
        ("1h30m", timedelta(minutes=90)),
        ("15s", timedelta(seconds=15)),
        ("1.5h", timedelta(minutes=90)),
        ("500ms", timedelta(milliseconds=500)),
        ("0", timedelta(0)),
        ("0s", timedelta(0)),
        ("-5m", timedelta(minutes=-5)),
    ],
)
def test_go_durations_parse(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "5", "1d", "h", "1h 30m", "abc", "10mm"])
def test_invalid_durations_are_refused_with_the_text(text):
    with pytest.raises(DurationError):
        parse_duration(text)


def test_never_means_no_duration():
    assert parse_optional_duration("Never") is None
    assert parse_optional_duration(None) is None
    assert parse_optional_duration("1m") == timedelta(minutes=1)


def test_format_is_the_inverse_of_parse():
    for text in ("720h", "1h30m", "15s", "0s", "Never"):
        assert format_duration(parse_optional_duration(text) if text != "0s" else timedelta(0)) == text
