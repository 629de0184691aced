"""Go-style durations ("720h", "1h30m", "15s", "Never") as used by Karpenter's API fields."""

from __future__ import annotations

import re
from datetime import timedelta

NEVER = "Never"

_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


class DurationError(ValueError):
    pass


def parse_duration(value: str | int | float | timedelta) -> timedelta:
    """Parse a Go duration string. Plain numbers are seconds. Raises DurationError with the text."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, int | float):
        return timedelta(seconds=value)
    text = value.strip()
    if text in ("0", ""):
        if text == "":
            raise DurationError("empty duration")
        return timedelta(0)
    sign = 1
    if text[0] in "+-":
        sign = -1 if text[0] == "-" else 1
        text = text[1:]
    pos = 0
    seconds = 0.0
    for match in _PART.finditer(text):
        if match.start() != pos:
            break
        seconds += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text) or pos == 0:
        raise DurationError(
            f"invalid duration {value!r} (expected Go syntax such as 30s, 15m, 720h or 1h30m)"
        )
    return timedelta(seconds=sign * seconds)


def parse_optional_duration(value: str | None) -> timedelta | None:
    """None for "Never" (or a missing value), otherwise the parsed duration."""
    if value is None or value == NEVER:
        return None
    return parse_duration(value)


def format_duration(delta: timedelta | None) -> str:
    """The shortest Go-style text for a duration; "Never" for None."""
    if delta is None:
        return NEVER
    total = delta.total_seconds()
    if total == 0:
        return "0s"
    sign = "-" if total < 0 else ""
    total = abs(total)
    hours, rest = divmod(total, 3600)
    minutes, seconds = divmod(rest, 60)
    text = ""
    if hours:
        text += f"{int(hours)}h"
    if minutes:
        text += f"{int(minutes)}m"
    if seconds:
        text += f"{seconds:g}s"
    return sign + text
