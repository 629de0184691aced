"""Go-style durations ("720h", "1h30m", "15s", "Never") as used by Karpenter's API fields.

`karpenter_duration` is the one check for every duration karpflow reads from a cluster object
(NodePool and NodeClaim fields, karpflow.dev/* annotations, budget durations, the pod
do-not-disrupt annotation, Provisioner-era TTLs through `ttl_seconds`): Go syntax, as Karpenter's
controllers parse it, and never negative. Its callers decide what an invalid value drives: always
the reading that disrupts nothing (fail closed), reported as a problem.
"""

from __future__ import annotations

import functools
import re
from datetime import timedelta
from functools import partial
from typing import Annotated

from pydantic import AfterValidator

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
        return _seconds(value, value)
    return _parse_text(value)


@functools.lru_cache(maxsize=1024)  # a pass reads the same few texts for every node
def _parse_text(value: str) -> timedelta:
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
    return _seconds(sign * seconds, value)


def _seconds(seconds: float, value: object) -> timedelta:
    # Karpenter's CRD pattern admits "99999999999h"; Go refuses it as out of range, and so must we,
    # as a DurationError: an OverflowError would escape every caller's handling of bad input.
    try:
        return timedelta(seconds=seconds)
    except (OverflowError, ValueError):
        raise DurationError(f"duration {value!r} is out of range") from None


def karpenter_duration(value: object, *, never_ok: bool = True) -> timedelta | None:
    """A duration read from a cluster object: Go syntax and not negative; "Never" is None where the
    field allows it (`never_ok`). Raises DurationError naming the value and what is wrong.

    Karpenter's CRDs only admit `^([0-9]+(s|m|h))+$` (and Never), but older CRDs, annotations and
    snapshots admit anything: a negative value would expire or consolidate at once, so it is refused
    here rather than trusted."""
    if not isinstance(value, str):
        raise DurationError(f"{value!r} is not a duration (expected a string such as 30s, 15m or 720h)")
    if value == NEVER:
        if never_ok:
            return None
        raise DurationError(f"{value!r} is not allowed here (expected a duration such as 30s, 15m or 48h)")
    delta = parse_duration(value)
    if delta < timedelta(0):
        raise DurationError(f"invalid duration {value!r}: must not be negative")
    return delta


def ttl_seconds(value: object) -> timedelta:
    """A Provisioner-era TTL (ttlSecondsAfterEmpty, ttlSecondsUntilExpired): whole seconds, not negative."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise DurationError(f"{value!r} is not a whole number of seconds")
    if value < 0:
        raise DurationError(f"{value} seconds: must not be negative")
    return timedelta(seconds=value)


def _checked(value: str, never_ok: bool) -> str:
    karpenter_duration(value, never_ok=never_ok)
    return value


# The same check as pydantic field types, for models of cluster objects (they keep the text).
KarpenterDuration = Annotated[str, AfterValidator(partial(_checked, never_ok=False))]
KarpenterDurationOrNever = Annotated[str, AfterValidator(partial(_checked, never_ok=True))]


def parse_optional_duration(value: str | None) -> timedelta | None:
    """None for "Never" (or a missing value), otherwise the parsed duration."""
    if value is None or value == NEVER:
        return None
    return parse_duration(value)


def format_duration(delta: timedelta | None) -> str:
    """The shortest Go-style text for a duration; "Never" for None."""
    if delta is None:
        return NEVER
    # Whole microseconds (timedelta's resolution), so the text parses back to the same duration:
    # "%g" wrote 1e-06s (not Go syntax) and 12.3457s for 12.345678s.
    micros = delta // timedelta(microseconds=1)
    if micros == 0:
        return "0s"
    sign = "-" if micros < 0 else ""
    hours, rest = divmod(abs(micros), 3_600_000_000)
    minutes, rest = divmod(rest, 60_000_000)
    seconds, fraction = divmod(rest, 1_000_000)
    text = ""
    if hours:
        text += f"{hours}h"
    if minutes:
        text += f"{minutes}m"
    if fraction:
        text += f"{seconds}.{fraction:06d}".rstrip("0") + "s"
    elif seconds:
        text += f"{seconds}s"
    return sign + text
