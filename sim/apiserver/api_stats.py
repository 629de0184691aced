"""What each client costs the emulator: requests and response bytes by user, verb and resource.

The user is the client's identity as the emulator knows it (`identify` in security.py): the
authenticated user in secure mode; otherwise the ServiceAccount of a bearer token the TokenRequest
API issued, or `system:anonymous`. Counted per (user, verb, resource, status code):

- requests and response bytes (a watch's bytes as each event is written, not when it closes);
- full LISTs: the first page of a cluster-wide list with no label or field selector, which reads
  every object of the kind (a paginated full list counts once, on its first page);
- 429s, the answers of flow control (flowcontrol.py) or of an injected fault.

Served as JSON at `GET /sim/api-stats` (`DELETE` starts over; `karpflow sim api-stats` prints it)
and, beside kube-apiserver's own series, on the emulator's `/metrics` (metrics.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from pydantic import BaseModel


@dataclass(frozen=True, slots=True)
class StatsKey:
    user: str
    verb: str
    resource: str  # "pods", "pods/eviction"; "" for non-resource paths (discovery, /healthz)


@dataclass(slots=True)
class Counts:
    requests: int = 0
    response_bytes: int = 0
    full_lists: int = 0
    rejected: int = 0  # answered 429


class StatsRow(BaseModel):
    """One (user, verb, resource) of `GET /sim/api-stats`."""

    user: str
    verb: str
    resource: str
    requests: int
    response_bytes: int
    full_lists: int
    rejected: int


class StatsDoc(BaseModel):
    """`GET /sim/api-stats`: the counts since `since` (unix seconds), `seconds` ago."""

    since: float
    seconds: float
    rows: list[StatsRow]


class ApiStats:
    """Counters by (user, verb, resource). Thread-safe: the threaded emulator and its callers share it."""

    def __init__(self) -> None:
        self._counts: dict[StatsKey, Counts] = {}
        self._codes: dict[tuple[StatsKey, int], int] = {}
        self._lock = threading.Lock()
        self.since = time.time()

    def _entry(self, key: StatsKey) -> Counts:
        counts = self._counts.get(key)
        if counts is None:
            counts = self._counts[key] = Counts()
        return counts

    def record(self, key: StatsKey, status: int, response_bytes: int, *, full_list: bool = False) -> None:
        """One answered request (a watch's bytes come through `add_bytes` as they are written)."""
        with self._lock:
            counts = self._entry(key)
            counts.requests += 1
            counts.response_bytes += response_bytes
            counts.full_lists += full_list
            counts.rejected += status == 429
            code = (key, status)
            self._codes[code] = self._codes.get(code, 0) + 1

    def add_bytes(self, key: StatsKey, count: int) -> None:
        with self._lock:
            self._entry(key).response_bytes += count

    def clear(self) -> None:
        with self._lock:
            self._counts.clear()
            self._codes.clear()
            self.since = time.time()

    def rows(self) -> list[StatsRow]:
        with self._lock:
            items = [
                (key, Counts(c.requests, c.response_bytes, c.full_lists, c.rejected))
                for key, c in self._counts.items()
            ]
        return [
            StatsRow(
                user=key.user,
                verb=key.verb,
                resource=key.resource,
                requests=c.requests,
                response_bytes=c.response_bytes,
                full_lists=c.full_lists,
                rejected=c.rejected,
            )
            for key, c in sorted(items, key=lambda item: (item[0].user, item[0].verb, item[0].resource))
        ]

    def by_code(self) -> Iterator[tuple[StatsKey, int, int]]:
        """(key, status code, requests), for the metrics endpoint."""
        with self._lock:
            items = list(self._codes.items())
        for (key, code), count in items:
            yield key, code, count

    def doc(self) -> StatsDoc:
        return StatsDoc(since=self.since, seconds=round(time.time() - self.since, 3), rows=self.rows())
