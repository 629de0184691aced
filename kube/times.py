"""Kubernetes time stamps: RFC 3339 text in objects, timezone-aware UTC datetimes in code."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache
from typing import Any


def parse_time(value: Any) -> datetime | None:
    """RFC 3339 as Kubernetes prints it (or a datetime); None for empty. Raises ValueError for garbage.
    Always UTC: budget schedules are read in the offset of the time they are given."""
    if not value:
        return None
    if isinstance(value, datetime):
        return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
    return _parse_text(str(value))


@lru_cache(maxsize=65536)
def _parse_text(text: str) -> datetime:
    # Timestamps have one-second resolution and pods of a rollout share them: memoise.
    parsed = datetime.fromisoformat(text)
    return parsed.astimezone(UTC) if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def rfc3339(when: datetime) -> str:
    """The form the API server writes (second resolution, `Z`)."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
